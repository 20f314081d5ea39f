//! Fuzzes checkpoint column files (Arrow IPC, FORMAT.md "Column files"):
//! `read_column_file` on arbitrary bytes never panics out of the reader.
//! The check lives in `store/tests/common/fuzz_checks.rs`, shared with the
//! stable smoke test.
//!
//! Run with `cargo +nightly fuzz run columns` from the repository root (or
//! `./dev fuzz`).

#![no_main]

#[path = "../../store/tests/common/fuzz_checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_columns(data);
});
