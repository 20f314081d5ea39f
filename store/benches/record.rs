//! Record JSON encode and decode (`lazyvault_schema::Record`), as `put`
//! writes and `get` reads it. The scan path's selective decoder (only the
//! fields a query needs) is private to the store; the `index` bench measures
//! it through `Store::scan_matching`.
//!
//! `cargo bench -p lazyvault-store --bench record`

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lazyvault_store::schema::Record;
use serde_json::{Map, Value};

fn bench(c: &mut Criterion) {
    common::assert_meta_size();
    let record = common::record(0);
    let json = record.to_json();
    assert_eq!(Record::from_json(&json).expect("decodes"), record);
    let meta_json = serde_json::to_vec(&record.meta).expect("serializes");

    let mut g = c.benchmark_group("record");
    g.throughput(Throughput::Bytes(json.len() as u64));
    g.bench_function("to_json", |b| b.iter(|| black_box(&record).to_json()));
    g.bench_function("from_json", |b| {
        b.iter(|| Record::from_json(black_box(&json)).expect("decodes"))
    });
    // The metadata alone, for comparison: the rest of a record is the array
    // entry and the layout (which repeats the metadata values).
    g.throughput(Throughput::Bytes(meta_json.len() as u64));
    g.bench_function("meta_from_json", |b| {
        b.iter(|| serde_json::from_slice::<Map<String, Value>>(black_box(&meta_json)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
