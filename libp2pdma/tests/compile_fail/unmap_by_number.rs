//! Releasing a mapping by its number: a controller's `Mapped` would lose
//! its pinned pages under a running command.
#![forbid(unsafe_code)]

use p2pdma::{queues::Mapped, Module};

fn release(module: &Module, mapped: &Mapped<'_>) {
    let _ = module.unmap(mapped.mapping().map_handle());
}

fn main() {
    let _ = release;
}
