//! The store's index path (`Store::put`, `get`, `scan_matching`) in a
//! temporary directory: one store per group, opened once, costs per
//! operation. Records are [`common::record`]-shaped: about 1 KiB of
//! metadata, one 4 KiB float64 array.
//!
//! `cargo bench -p lazyvault-store --bench index`

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lazyvault_store::query::Query;
use lazyvault_store::{Mode, Store};

/// Records in the store that `get` and the scans read.
const RECORDS: u64 = 10_000;

fn key(i: u64) -> String {
    format!("run-{i:06}")
}

fn put_one(store: &Store, key: &str, i: u64, array: Option<&[u8]>) {
    let meta = common::meta(i);
    let layout = common::layout(&meta);
    let arrays: Vec<_> = array.map(common::array_source).into_iter().collect();
    store
        .put(key, meta, layout, &arrays, None)
        .expect("put succeeds");
}

fn bench_put(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("put.lv"), Mode::Create).expect("opens");
    let data = common::array_bytes();
    let mut g = c.benchmark_group("index/put");
    // An array put fsyncs its payload file and directory: milliseconds.
    g.sample_size(20);
    // New keys each time (the common case; a replace also decodes the old
    // record to retire its payloads). Building the metadata is not timed.
    let mut n = 0u64;
    g.bench_function("meta_only", |b| {
        b.iter_batched(
            || {
                n += 1;
                let meta = common::meta(n);
                let layout = common::layout(&meta);
                (key(n), meta, layout)
            },
            |(k, meta, layout)| store.put(&k, meta, layout, &[], None).expect("put"),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("one_4k_array", |b| {
        b.iter_batched(
            || {
                n += 1;
                let meta = common::meta(n);
                let layout = common::layout(&meta);
                (key(n), meta, layout)
            },
            |(k, meta, layout)| {
                store
                    .put(&k, meta, layout, &[common::array_source(&data)], None)
                    .expect("put")
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
    store.close().expect("closes");
}

fn bench_read(c: &mut Criterion) {
    common::assert_meta_size();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("read.lv"), Mode::Create).expect("opens");
    let data = common::array_bytes();
    for i in 0..RECORDS {
        put_one(&store, &key(i), i, Some(&data));
    }
    store.flush().expect("flushes");
    assert_eq!(store.len().expect("len"), RECORDS);

    let mut g = c.benchmark_group("index/get");
    // Keys in a scattered but fixed order (an LCG over 0..RECORDS).
    let mut at = 0u64;
    let mut next_key = || {
        at = (at * 7919 + 104_729) % RECORDS;
        key(at)
    };
    g.bench_function("get_json", |b| {
        b.iter_batched(
            &mut next_key,
            |k| store.get_json(&k).expect("get").expect("present"),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("get_decoded", |b| {
        b.iter_batched(
            &mut next_key,
            |k| store.get(&k).expect("get").expect("present"),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();

    let scans = [
        ("all_keys", None),
        (
            "compare_and",
            Some("temperature > 399.0 and material == 'Si'"),
        ),
        (
            "nested_string_ops",
            Some("params.thermostat == 'nose-hoover' and description.contains('Si ')"),
        ),
        (
            "array_facts",
            Some("positions.shape[0] == 512 and n_atoms > 6000"),
        ),
    ];
    let mut g = c.benchmark_group("index/scan_10k");
    g.sample_size(10);
    g.throughput(Throughput::Elements(RECORDS));
    for (name, src) in scans {
        let query = src.map(|s| Query::parse(s).expect("parses"));
        let mut hits = 0u64;
        store
            .scan_matching(query.as_ref(), |_| {
                hits += 1;
                Ok(())
            })
            .expect("scans");
        // Each query keeps some records and drops others.
        assert!(
            hits > 0 && (hits < RECORDS || query.is_none()),
            "{name}: {hits}"
        );
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut hits = 0u64;
                store
                    .scan_matching(query.as_ref(), |k| {
                        black_box(k);
                        hits += 1;
                        Ok(())
                    })
                    .expect("scans");
                hits
            })
        });
    }
    g.finish();

    // The same comparison narrowed by a secondary index on `material`: a
    // quarter of the records are candidates, read and evaluated.
    store.create_index("material").expect("indexes");
    let query = Query::parse("material == 'Si' and temperature > 399.0").expect("parses");
    assert!(store
        .explain(&query)
        .expect("explains")
        .starts_with("index material"));
    let mut g = c.benchmark_group("index/indexed_10k");
    g.sample_size(10);
    g.bench_function("material_eq_and_compare", |b| {
        b.iter(|| store.count(&query).expect("counts"))
    });
    g.finish();
    store.close().expect("closes");
}

criterion_group!(benches, bench_put, bench_read);
criterion_main!(benches);
