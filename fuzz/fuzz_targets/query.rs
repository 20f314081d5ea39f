//! Fuzzes the query language: any UTF-8 text either parses, and then evaluates
//! against fixed records without panicking (with `not (q)` and `(q) and (q)`
//! meaning what they say), or fails with a `QueryError` whose column lies
//! inside the expression (or one past its end). The checks live in
//! `store/tests/common/fuzz_checks.rs`, shared with the stable smoke test.
//!
//! Run with `cargo +nightly fuzz run query -- -dict=fuzz/dicts/query.dict`
//! from the repository root (or `./dev fuzz`).

#![no_main]

#[path = "../../store/tests/common/fuzz_checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_query(data);
});
