//! Fuzzes the safetensors header reader of the importer: `read_header` (the
//! 8-byte length against the file and the 100 MB cap, strict JSON, every
//! tensor's dtype, shape and offsets) and `parse_header` on arbitrary bytes
//! never panic, and an accepted header's tensors lie inside the data
//! section, span what shape and dtype need, and do not overlap. The checks
//! live in `store/tests/common/fuzz_checks.rs`; seeds are in
//! `fuzz/seeds/safetensors`.
//!
//! Run with `cargo +nightly fuzz run safetensors fuzz/corpus/safetensors
//! fuzz/seeds/safetensors` from the repository root (or `./dev fuzz`).

#![no_main]

#[path = "../../store/tests/common/fuzz_checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_safetensors(data);
});
