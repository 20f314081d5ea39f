//! Fuzzes the schema's JSON documents: `Record::from_json` and
//! `Manifest::from_json` on arbitrary bytes never panic, and what decodes
//! re-encodes to JSON that decodes to an equal value (encoding then being a
//! fixed point). The checks live in `store/tests/common/fuzz_checks.rs`,
//! shared with the stable smoke test.
//!
//! Run with `cargo +nightly fuzz run record` from the repository root (or
//! `./dev fuzz`).

#![no_main]

#[path = "../../store/tests/common/fuzz_checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_record(data);
});
