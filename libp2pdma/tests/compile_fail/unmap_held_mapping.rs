//! Releasing a mapping someone else holds: a `DmaMapping` is not `Clone`,
//! so a borrowed one cannot be handed to `unmap`.
#![forbid(unsafe_code)]

use p2pdma::{queues::Mapped, Module};

fn release(module: &Module, mapped: &Mapped<'_>) {
    let _ = module.unmap(mapped.mapping().clone());
}

fn main() {
    let _ = release;
}
