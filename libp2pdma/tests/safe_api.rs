//! Safe code cannot describe DMA: each program in `compile_fail/` forbids
//! `unsafe` and tries one way to make a device write memory that is not
//! its to give (a `Vec` behind `&[u8]`, a mapping someone else holds, the
//! memory a raw handle or offset names), and must fail to compile for the
//! reason its `.stderr` pins; the program in `pass/` takes the safe path
//! (memory from the module, mapped for a controller, a command's payload)
//! and must compile and run.
//!
//! `TRYBUILD=overwrite cargo test -p libp2pdma --test safe_api` rewrites
//! the `.stderr` files after a change of compiler message.

#[test]
fn safe_code_cannot_describe_dma() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
    t.pass("tests/pass/*.rs");
}
