//! Fuzzes the `.npz` reader of the importer: the zip directory (`ZipIn`),
//! every member's reader (stored or inflated, bounded by its declared size,
//! CRC-checked) and `read_npz` (member headers, declared sizes, the ratio
//! cap, lazyvault's manifest) on arbitrary bytes never panic; a member never
//! yields more than its declared size. The checks live in
//! `store/tests/common/fuzz_checks.rs`, shared with the stable smoke test;
//! seeds (foreign and lazyvault `.npz` files) are in `fuzz/seeds/npz`.
//!
//! Run with `cargo +nightly fuzz run npz fuzz/corpus/npz fuzz/seeds/npz`
//! from the repository root (or `./dev fuzz`).

#![no_main]

#[path = "../../store/tests/common/fuzz_checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_npz(data);
});
