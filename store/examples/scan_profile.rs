//! Times full-scan queries on an existing store, for profiling the scan
//! (`valgrind --tool=callgrind`, `perf record`): the Rust side only, no
//! Python. Build a store first, e.g. with `benches/find.py --dir DIR`.
//!
//! Usage: `cargo run --release -p lazyvault-store --example scan_profile --
//! STORE [REPEAT] [QUERY]` (default query: the one of benches/find.py).

use std::time::Instant;

use lazyvault_store::query::Query;
use lazyvault_store::{Mode, Store};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: scan_profile STORE [REPEAT] [QUERY]");
    let repeat: usize = args.next().map_or(5, |r| r.parse().expect("REPEAT"));
    let text = args
        .next()
        .unwrap_or_else(|| "temperature > 399.0 and material == 'Si'".to_owned());
    let query = Query::parse(&text).expect("query parses");
    let store = Store::open(&path, Mode::ReadOnly).expect("store opens");
    let mut times = Vec::with_capacity(repeat);
    let mut records = 0;
    let mut hits = 0;
    for _ in 0..repeat {
        let start = Instant::now();
        hits = store.count(&query).expect("count");
        times.push(start.elapsed().as_secs_f64());
        records = store.len().expect("len");
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "{records} records, {hits} hits: median {:.1} ms, min {:.1} ms ({:.3} µs/record)",
        median * 1e3,
        times[0] * 1e3,
        times[0] * 1e6 / records.max(1) as f64
    );
}
