//! Query parsing and evaluation (`lazyvault_store::query`) on one record of
//! about 1 KiB of metadata, every query matching it (so every condition is
//! evaluated: no `and` short-circuits).
//!
//! `cargo bench -p lazyvault-store --bench query`

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use lazyvault_store::query::{ArrayFacts, Map, Query, RecordView, Value};
use lazyvault_store::schema::Record;

/// The benchmark queries: (name, source).
const QUERIES: [(&str, &str); 5] = [
    ("compare_and", "temperature > 399.0 and material == 'Si'"),
    (
        "in_list",
        "material in ['Ge', 'GaAs', 'C', 'Si'] and n_atoms in [4096, 8192]",
    ),
    (
        "nested",
        "params.cutoff >= 6.0 and params.thermostat == 'nose-hoover' and params.kpoints[0] == 4",
    ),
    (
        "string_ops",
        "run_id.startswith('run-00') and description.contains('equilibrated') \
         and code_version.endswith('update3') and 'npt' in tags",
    ),
    (
        "array_facts",
        "positions.shape[0] == 512 and positions.dtype == 'float64'",
    ),
];

/// A decoded record as a query sees it.
struct View {
    key: String,
    record: Record,
}

impl RecordView for View {
    fn key(&self) -> &str {
        &self.key
    }
    fn meta(&self) -> &Map<String, Value> {
        &self.record.meta
    }
    fn array(&self, name: &str) -> Option<ArrayFacts<'_>> {
        self.record.arrays.get(name).map(ArrayFacts::from)
    }
}

fn bench(c: &mut Criterion) {
    common::assert_meta_size();
    let view = View {
        key: "run-000000".into(),
        record: common::record(0),
    };
    let queries: Vec<(&str, &str, Query)> = QUERIES
        .iter()
        .map(|&(name, src)| (name, src, Query::parse(src).expect("parses")))
        .collect();
    for (name, _, q) in &queries {
        assert!(q.matches(&view), "{name} must match the benchmark record");
    }

    let mut g = c.benchmark_group("query/parse");
    for (name, src, _) in &queries {
        g.bench_function(*name, |b| b.iter(|| Query::parse(black_box(src))));
    }
    g.finish();

    let mut g = c.benchmark_group("query/matches");
    for (name, _, q) in &queries {
        g.bench_function(*name, |b| b.iter(|| black_box(q).matches(black_box(&view))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
