//! Fuzzes the `.lvz` reader: `ArchiveIndex::parse` on arbitrary bytes never
//! panics, and for a parsed archive every record/array goes through
//! `array_range`, `check_member_crc`, `verify_report` and queries without
//! panicking (also with bytes of another length than those parsed); an
//! archive that verifies is written back by the archive writer and must read
//! back to the same records and bytes. The checks live in
//! `store/tests/common/fuzz_checks.rs`, shared with the stable smoke test;
//! seeds (valid archives) are in `fuzz/seeds/archive`.
//!
//! Run with `cargo +nightly fuzz run archive fuzz/corpus/archive
//! fuzz/seeds/archive` from the repository root (or `./dev fuzz`).

#![no_main]

#[path = "../../store/tests/common/fuzz_checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_archive(data);
});
