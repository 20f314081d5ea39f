//! Fuzz target for the `.npy` header parser.
//!
//! Feeds arbitrary bytes to `parse_header` (and the same bytes, as a stream,
//! to `read_header`); neither may panic, and both must agree. When parsing
//! succeeds, the header is written again and the result must parse to the
//! same descr, order and shape, be 64-byte aligned, and be a fixed point of
//! writing. The same bytes as descr text go to `descr_itemsize` and
//! `write_header`. The checks live in `store/tests/common/fuzz_checks.rs`,
//! shared with the stable smoke test `store/tests/fuzz_smoke.rs`.
//!
//! Run with `cargo +nightly fuzz run npy_header` from the repository root
//! (or `./dev fuzz`).

#![no_main]

#[path = "../../store/tests/common/fuzz_checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_npy_header(data);
});
