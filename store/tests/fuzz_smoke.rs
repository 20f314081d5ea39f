//! A fuzz smoke test on stable Rust, run by every `cargo test`: seeded random
//! mutations of valid inputs (numpy's own `.npy` headers, queries from
//! QUERY.md, record and manifest JSON, `.lvz` archives made by the archive
//! writer) fed to the same checks as the cargo-fuzz targets in `fuzz/`
//! (`common/fuzz_checks.rs`). Up to 10,000 inputs per target, at most 1.5 s
//! each (a few thousand in a debug build); the coverage-guided runs are
//! `./dev fuzz`.
//!
//! `LAZYVAULT_FUZZ_SEED=<u64>` replays or varies the run (the default seed is
//! fixed, so a plain `cargo test` is deterministic);
//! `LAZYVAULT_FUZZ_ITERATIONS=<n>` checks exactly n mutated inputs per target
//! whatever the time. A failing input is printed, escaped, before the panic
//! goes on.
//!
//! `LAZYVAULT_WRITE_FUZZ_SEEDS=<dir>` makes `write_fuzz_seeds` write the
//! valid inputs as seed files, one folder per target (this is how
//! `fuzz/seeds/` was made).

#[path = "common/fuzz_checks.rs"]
mod fuzz_checks;
#[path = "common/zip_build.rs"]
mod zip_build;

use std::io::{Cursor, Read, Write};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use lazyvault_store::archive::{write_archive_bytes, ARRAYS_PREFIX};
use lazyvault_store::npy::{parse_header, write_header, NUMPY_MAX_HEADER_LEN};
use lazyvault_store::schema::{ArrayEntry, Manifest, Record};
use lazyvault_store::{journal, ArraySource};
use serde_json::{json, Map, Value};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

/// Inputs per target, at most.
const ITERATIONS: usize = 10_000;
/// Time per target, at most (debug builds reach fewer inputs than release).
const BUDGET: Duration = Duration::from_millis(1_500);
const DEFAULT_SEED: u64 = 0x6c61_7a79_7661_756c; // "lazyvaul"

/// splitmix64: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn seed() -> u64 {
    match std::env::var("LAZYVAULT_FUZZ_SEED") {
        Ok(s) => s.parse().expect("LAZYVAULT_FUZZ_SEED is a u64"),
        Err(_) => DEFAULT_SEED,
    }
}

/// Bytes that mean something to the parsers: values at the edges of their
/// types, and numbers that make sizes and offsets overflow.
const INTERESTING: &[&[u8]] = &[
    b"0",
    b"-1",
    b"255",
    b"65535",
    b"4294967295",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"1e308",
    b"1e999",
    b"-0",
    b"\xff\xff\xff\xff",
    b"\x00\x00\x00\x00",
    b"\xc3\xa9",
    b"\xf0\x9f\x98\x80",
    b"\xe2\x80\xa8",
    b"\\u0000",
    b"\\ud800",
    b"\\U0001F600",
];

/// One to four stacked mutations of `input`: byte and bit changes, inserted,
/// deleted, duplicated or truncated ranges, tokens of the target's dictionary
/// or [`INTERESTING`], and splices with another seed.
fn mutate(rng: &mut Rng, input: &[u8], seeds: &[Vec<u8>], dict: &[&[u8]]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = out.len();
        match rng.below(10) {
            0 if len > 0 => {
                let at = rng.below(len);
                out[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                out[at] = rng.next() as u8;
            }
            2 => {
                let at = rng.below(len + 1);
                let byte = *rng.pick(b"\x00\x7f\x80\xff\"'\\[](){},:. \n-+e");
                out.insert(at, byte);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(16));
                out.drain(at..at + n);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(32));
                let copy = out[at..at + n].to_vec();
                let to = rng.below(len + 1);
                out.splice(to..to, copy);
            }
            5 => out.truncate(rng.below(len + 1)),
            6 | 7 if !dict.is_empty() => {
                let token = *rng.pick(dict);
                let at = rng.below(len + 1);
                if rng.chance(2) && at < len {
                    let end = (at + token.len()).min(len);
                    out.splice(at..end, token.iter().copied());
                } else {
                    out.splice(at..at, token.iter().copied());
                }
            }
            8 => {
                let token = *rng.pick(INTERESTING);
                let at = rng.below(len + 1);
                out.splice(at..at, token.iter().copied());
            }
            9 if !seeds.is_empty() => {
                let other = rng.pick(seeds);
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    out
}

/// Escaped bytes, for a report that can be pasted into a test.
fn show(input: &[u8]) -> String {
    input.escape_ascii().to_string()
}

/// Runs `check` on `input`; on a panic prints the input, then panics on.
fn run_one(target: &str, seed: u64, input: &[u8], check: fn(&[u8]) -> bool) -> bool {
    match catch_unwind(AssertUnwindSafe(|| check(input))) {
        Ok(accepted) => accepted,
        Err(panic) => {
            eprintln!(
                "fuzz smoke target {target} (LAZYVAULT_FUZZ_SEED={seed}) failed on the input \
             ({} bytes):\nb\"{}\"",
                input.len(),
                show(input)
            );
            resume_unwind(panic);
        }
    }
}

/// What a smoke run did: inputs checked, and how many of them the parser
/// accepted (so that a run stuck at the first error is noticed).
#[derive(Debug)]
struct Stats {
    inputs: usize,
    accepted: usize,
}

/// Every seed as it is (each must be accepted), then mutations made by
/// `generate` until the budget runs out.
fn smoke(
    target: &str,
    seeds: &[Vec<u8>],
    check: fn(&[u8]) -> bool,
    mut generate: impl FnMut(&mut Rng) -> Vec<u8>,
) -> Stats {
    let seed = seed();
    let mut rng = Rng(seed ^ target.len() as u64);
    for (i, input) in seeds.iter().enumerate() {
        assert!(
            run_one(target, seed, input, check),
            "seed {i} of {target} is refused: b\"{}\"",
            show(input)
        );
    }
    // LAZYVAULT_FUZZ_ITERATIONS=<n>: exactly n mutated inputs, no time limit.
    let (limit, budget) = match std::env::var("LAZYVAULT_FUZZ_ITERATIONS") {
        Ok(n) => (
            n.parse::<usize>()
                .expect("LAZYVAULT_FUZZ_ITERATIONS is a count"),
            Duration::MAX,
        ),
        Err(_) => (ITERATIONS, BUDGET),
    };
    let start = Instant::now();
    let mut stats = Stats {
        inputs: 0,
        accepted: 0,
    };
    while stats.inputs < limit && start.elapsed() < budget {
        let input = generate(&mut rng);
        stats.accepted += usize::from(run_one(target, seed, &input, check));
        stats.inputs += 1;
    }
    eprintln!(
        "fuzz smoke {target}: {} mutated inputs in {:.2?}, {} accepted",
        stats.inputs,
        start.elapsed(),
        stats.accepted
    );
    stats
}

fn smoke_mutations(
    target: &str,
    seeds: &[Vec<u8>],
    dict: &[&[u8]],
    check: fn(&[u8]) -> bool,
) -> Stats {
    smoke(target, seeds, check, |rng| {
        let base = rng.pick(seeds);
        mutate(rng, base, seeds, dict)
    })
}

/// At least `inputs` mutated inputs checked, and some of them accepted.
fn assert_ran(stats: &Stats, inputs: usize) {
    assert!(stats.inputs >= inputs, "{stats:?}");
    assert!(stats.accepted >= stats.inputs / 200, "{stats:?}");
}

// ---------------------------------------------------------------------------
// Seeds

/// `.npy` headers byte for byte as numpy 2.4 writes them
/// (`numpy.lib.format.write_array_header_{1,2}_0`, `np.save`).
fn npy_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = [
        &b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }"[..],
        b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': True, 'shape': (3, 4), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '>i4', 'fortran_order': False, 'shape': (0,), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '<c16', 'fortran_order': True, 'shape': (2, 3, 4), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (1,), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '<m8[s]', 'fortran_order': False, 'shape': (2,), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '<U5', 'fortran_order': False, 'shape': (3, 4), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '|S3', 'fortran_order': False, 'shape': (1,), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': [('x', '<i4'), ('y', '>f8', (2,))], \
          'fortran_order': False, 'shape': (0,), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3, 4), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }",
        b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (3, 4), }",
        b"\x93NUMPY\x02\x00t\x00\x00\x00{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }",
        b"\x93NUMPY\x03\x00t\x00\x00\x00{'descr': [('\xe6\xb8\xa9\xe5\xba\xa6', '<f4')], \
          'fortran_order': False, 'shape': (2,), }",
    ]
    .iter()
    .map(|text| pad_npy(text))
    .collect();
    // Bare descr texts too: the same bytes go to descr_itemsize and write_header.
    for descr in [
        "'<f8'",
        "[('a', '<i4', (2, 3)), ('b', [('c', '|u1')])]",
        "'<U10'",
    ] {
        seeds.push(descr.as_bytes().to_vec());
    }
    seeds
}

/// numpy's padding: spaces up to a 64-byte boundary, less one, then `'\n'`
/// (the length field above is already the padded one for each seed).
fn pad_npy(text: &[u8]) -> Vec<u8> {
    let mut out = text.to_vec();
    while !(out.len() + 1).is_multiple_of(64) {
        out.push(b' ');
    }
    out.push(b'\n');
    out
}

fn query_seeds() -> Vec<Vec<u8>> {
    [
        "temperature > 250 and material == 'Si'",
        "params.lr < 1e-3 and 'baseline' in tags",
        "positions.shape[0] > 1000 and positions.dtype == 'float64'",
        "key.startswith('mire-2/') and not exists(failed)",
        "material in ['Si', 'Ge'] or params['learning-rate'] >= 0.01",
        "0 < count <= 10",
        "tags[-1] == 'c' or tags[5] == [1, 2]",
        "meta.key != key and meta['meta'].endswith('meta')",
        "image.shape == [480, 640] and image.ndim == 2 and image.size > 0",
        "params.a.b.c[1][1][1].d == 4",
        "温度 >= 25 and s.contains('😀')",
        "big == 9007199254740993 and umax > imin and half == 5e-1",
        "nothing == None and ok == True and not ok == False",
        "scalar.nbytes == 8 and huge.size > 0 and params.w.ndim != 2",
        "x not in [1, 'a', [true, null], -2.5E+3,]",
        "s == 'it\\'s \\\"q\\\" \\u00e9 \\uD83D\\uDE00'",
        "((a == 1) or (b != 2)) and not (c < 3)",
    ]
    .iter()
    .map(|q| q.as_bytes().to_vec())
    .collect()
}

fn entry(id: &str, descr: &str, shape: Vec<u64>, nbytes: u64) -> ArrayEntry {
    ArrayEntry {
        id: id.into(),
        descr: descr.into(),
        dtype: "float64".into(),
        shape,
        fortran_order: false,
        nbytes,
        data_offset: 128,
        pickled: false,
        checksum: None,
    }
}

fn record_seeds() -> Vec<Vec<u8>> {
    let mut arrays = indexmap_of([
        (
            "positions",
            entry("00112233445566778899aabbccddeeff", "'<f8'", vec![8, 3], 192),
        ),
        (
            "frames/0",
            ArrayEntry {
                fortran_order: true,
                pickled: true,
                ..entry("ffeeddccbbaa99887766554433221100", "'|O'", vec![], 17)
            },
        ),
    ]);
    let full = Record {
        meta: meta(json!({
            "temperature": 300.5, "n": -7, "u": 18_446_744_073_709_551_615u64,
            "s": "é 😀 \u{2028}", "nested": {"a": [1, [2.5e-300, null], {"b": true}]},
        })),
        arrays: arrays.clone(),
        layout: json!({"dict": {"temperature": 0, "positions": {"array": "positions"}}}),
        pickle: true,
    };
    arrays.clear();
    let empty = Record {
        meta: Map::new(),
        arrays,
        layout: Value::Null,
        pickle: false,
    };
    let mut seeds = vec![full.to_json(), empty.to_json()];
    // Record journal entries: a put with a pickle, a delete, a commit.
    for (key, change) in [
        (
            "run/1",
            journal::Change::Put {
                record: full.to_json(),
                pickle: Some(b"\x80\x05N.".to_vec()),
            },
        ),
        ("run/1", journal::Change::Delete),
        ("", journal::Change::Commit),
    ] {
        seeds.push(journal::encode(&journal::Entry {
            key: key.into(),
            change,
        }));
    }
    seeds.push(br#"{"meta":{},"arrays":{},"layout":null,"from_a_newer_minor":1}"#.to_vec());
    seeds.push(Manifest::new("lazyvault 0.1.0").to_json());
    seeds.push(
        br#"{"format":"lazyvault","format_version":"1.7","created_by":"x","extra":[1]}"#.to_vec(),
    );
    // Records as an archive stores them.
    for (name, body) in zip_members(&archive_seed()) {
        if name.ends_with(".jsonl") {
            for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let line: Value = serde_json::from_slice(line).expect("record line");
                seeds.push(serde_json::to_vec(&line["record"]).unwrap());
            }
        }
    }
    seeds
}

fn indexmap_of<const N: usize>(
    items: [(&str, ArrayEntry); N],
) -> indexmap::IndexMap<String, ArrayEntry> {
    items.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

fn meta(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

fn source<'a>(name: &str, descr: &str, shape: Vec<u64>, data: &'a [u8]) -> ArraySource<'a> {
    ArraySource {
        name: name.into(),
        descr: descr.into(),
        dtype: "x".into(),
        shape,
        fortran_order: false,
        data,
        pickled: false,
    }
}

/// A valid archive from the archive writer: three records, with a 0-d, a
/// zero-size, a Fortran-order, a structured and a pickled array, and
/// pickled remainders.
fn archive_seed() -> Vec<u8> {
    let f8: Vec<u8> = (0..48u8).collect();
    let u1: Vec<u8> = (0..6u8).collect();
    let structured: Vec<u8> = (0..24u8).collect();
    write_archive_bytes(|w| {
        w.add_record(
            "run-0",
            meta(json!({"i": 0, "material": "Si", "tags": ["a"]})),
            json!({"dict": {"i": 0}}),
            &[
                source("positions", "'<f8'", vec![2, 3], &f8),
                source("scalar", "'<f8'", vec![], &f8[..8]),
                source("empty", "'<i4'", vec![3, 0], &[]),
            ],
            Some(b"\x80\x05pickle."),
        )?;
        w.add_record(
            "run-1/é",
            meta(json!({"i": 1, "material": "Ge"})),
            Value::Null,
            &[
                ArraySource {
                    fortran_order: true,
                    ..source("f", "'|u1'", vec![2, 3], &u1)
                },
                source("s", "[('x', '<i4'), ('y', '>f8')]", vec![2], &structured),
                ArraySource {
                    pickled: true,
                    ..source("obj", "'|O'", vec![2], b"\x80\x04not really")
                },
            ],
            None,
        )?;
        w.add_record("k", Map::new(), json!([1, 2]), &[], None)
    })
    .expect("the seed archive is written")
}

/// The members of a zip, in order.
fn zip_members(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut zip = ZipArchive::new(Cursor::new(bytes)).expect("a zip");
    (0..zip.len())
        .map(|i| {
            let mut file = zip.by_index(i).expect("member");
            let mut body = Vec::new();
            file.read_to_end(&mut body).expect("member bytes");
            (String::from_utf8_lossy(file.name_raw()).into_owned(), body)
        })
        .collect()
}

/// The members of a zip whose members may be deflated (read with the
/// importer's own zip reader: the zip crate is built without codecs).
fn npz_members(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    use lazyvault_store::interop::zip::ZipIn;
    let mut zip = ZipIn::new(Cursor::new(bytes), "seed").expect("a zip");
    zip.members()
        .iter()
        .map(|m| {
            let mut body = Vec::new();
            let mut reader = zip.reader(m, "seed member").expect("member");
            reader.read_to_end(&mut body).expect("member bytes");
            (m.name.clone(), body)
        })
        .collect()
}

/// A zip of stored `members`, with correct CRCs and sizes, so that mutations
/// reach past the zip layer; data 64-byte aligned unless `unaligned`.
fn zip_of(members: &[(String, Vec<u8>)], unaligned: bool) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for (name, body) in members {
        let mut options =
            SimpleFileOptions::default().compression_method(CompressionMethod::Stored);
        if !unaligned {
            options = options.with_alignment(64);
        }
        zip.start_file(name.as_str(), options).expect("member");
        zip.write_all(body).expect("member bytes");
    }
    zip.finish().expect("zip").into_inner()
}

// ---------------------------------------------------------------------------
// Tests

#[test]
fn npy_header_smoke() {
    let dict: &[&[u8]] = &[
        b"\x93NUMPY",
        b"'descr'",
        b"'fortran_order'",
        b"'shape'",
        b"True",
        b"False",
        b"(",
        b")",
        b"(1,)",
        b"[(",
        b"')]",
        b"'<f8'",
        b"'|O'",
        b"'>U'",
        b"'V0'",
        b"'M8[10us]'",
        b"\\x00",
        b"\\u00e9",
        b"\x01\x00",
        b"\x02\x00",
        b"\x03\x00",
    ];
    let seeds = npy_seeds();
    for seed in seeds.iter().filter(|s| s.starts_with(b"\x93NUMPY")) {
        let header = parse_header(seed, NUMPY_MAX_HEADER_LEN).expect("every header seed parses");
        assert_eq!(header.data_offset, 128, "{}", show(seed));
        // The writer gives numpy's bytes (numpy writes 2.0 only when 1.0 cannot hold the header).
        if header.version != (2, 0) {
            let written = write_header(&header.descr, header.fortran_order, &header.shape).unwrap();
            assert_eq!(show(&written), show(seed));
        }
    }
    let stats = smoke_mutations("npy_header", &seeds, dict, fuzz_checks::check_npy_header);
    assert_ran(&stats, 200);
}

#[test]
fn query_smoke() {
    let dict: &[&[u8]] = &[
        b" and ",
        b" or ",
        b"not ",
        b" in ",
        b" not in ",
        b"==",
        b"!=",
        b"<=",
        b">=",
        b"exists(",
        b".startswith(",
        b".endswith(",
        b".contains(",
        b".shape[",
        b".dtype",
        b".ndim",
        b".nbytes",
        b".size",
        b"key",
        b"meta.",
        b"meta[",
        b"[-1]",
        b"'",
        b"\"",
        b"\\u",
        b"\\U",
        b"1e-3",
        b"None",
        b"true",
        b"(",
        b")",
        b",",
    ];
    let seeds = query_seeds();
    let stats = smoke_mutations("query", &seeds, dict, fuzz_checks::check_query);
    assert_ran(&stats, 200);
}

#[test]
fn record_smoke() {
    let dict: &[&[u8]] = &[
        b"\"meta\":",
        b"\"arrays\":",
        b"\"layout\":",
        b"\"pickle\":true",
        b"\"pickled\":true",
        b"\"id\":",
        b"\"data_offset\":",
        b"\"shape\":",
        b"\"00112233445566778899aabbccddeeff\"",
        b"\"../../../../etc/passwd\"",
        b"\"format\":\"lazyvault\"",
        b"\"format_version\":\"1.0\"",
        b"\"created_by\":",
        b"{}",
        b"[]",
        b"null",
        b"64",
        b"1.5",
        b",",
        b":",
    ];
    let seeds = record_seeds();
    for seed in &seeds {
        if serde_json::from_slice::<Value>(seed).is_ok_and(|v| v.get("meta").is_some()) {
            Record::from_json(seed).expect("every record seed is valid");
        }
    }
    let stats = smoke_mutations("record", &seeds, dict, fuzz_checks::check_record);
    assert_ran(&stats, 200);
}

#[test]
fn archive_smoke() {
    let valid = archive_seed();
    let members = zip_members(&valid);
    let texts: Vec<Vec<u8>> = members.iter().map(|(_, body)| body.clone()).collect();
    let dict: &[&[u8]] = &[
        b"PK\x03\x04",
        b"PK\x01\x02",
        b"PK\x05\x06",
        b"PK\x06\x06",
        b"\"key\":",
        b"\"record\":",
        b"\"pickle\":\"AAAA\"",
        b"\"records\":",
        b"\"kind\":\"archive\"",
        b"\"data_offset\":",
        b"\"nbytes\":",
        b"\"shape\":[]",
        b"\"id\":\"00000000000000000000000000000001\"",
        b"'shape': (",
        b"'descr': '",
        b"\n",
    ];
    let stats = smoke(
        "archive",
        std::slice::from_ref(&valid),
        fuzz_checks::check_archive,
        |rng| match rng.below(4) {
            // Raw bytes: mostly stopped by the zip layer and the CRCs.
            0 => mutate(rng, &valid, std::slice::from_ref(&valid), dict),
            // One member mutated, then zipped again with correct CRCs.
            1 | 2 => {
                let mut members = members.clone();
                let at = rng.below(members.len());
                members[at].1 = mutate(rng, &members[at].1, &texts, dict);
                zip_of(&members, rng.chance(8))
            }
            // Members dropped, duplicated, swapped or renamed.
            _ => {
                let mut members = members.clone();
                let at = rng.below(members.len());
                match rng.below(4) {
                    0 => {
                        members.remove(at);
                    }
                    1 => {
                        let mut copy = members[at].clone();
                        copy.0 = format!("{ARRAYS_PREFIX}{:032x}.npy", rng.next());
                        members.push(copy);
                    }
                    2 => {
                        let other = rng.below(members.len());
                        let body = members[other].1.clone();
                        members[at].1 = body;
                    }
                    _ => {
                        let name = mutate(rng, members[at].0.as_bytes(), &[], dict);
                        members[at].0 = String::from_utf8_lossy(&name).into_owned();
                    }
                }
                zip_of(&members, false)
            }
        },
    );
    assert_ran(&stats, 100);
}

/// `.npz` files: a foreign one (stored and deflated members, a 0-d, an
/// empty and a structured array) and lazyvault's own (with its manifest).
fn npz_seeds() -> Vec<Vec<u8>> {
    use zip_build::{npy_file, zip_bytes, Member};
    let f8: Vec<u8> = (0..48u8).collect();
    let foreign = zip_bytes(&[
        Member::stored("a.npy", &npy_file("'<f8'", &[2, 3], &f8)),
        Member::deflated("b.npy", &npy_file("'<f8'", &[6], &f8)),
        Member::deflated("s.npy", &npy_file("'|u1'", &[], &[7])),
        Member::stored("e.npy", &npy_file("'<i4'", &[0, 3], &[])),
        Member::deflated(
            "r.npy",
            &npy_file("[('x', '<i4'), ('y', '>f8')]", &[2], &f8[..24]),
        ),
    ]);
    let manifest = json!({"format": "lazyvault-npz", "version": 1, "records": [
        {"key": "run-1", "meta": {"t": 1.5, "tags": ["a"]}, "arrays": {"w": "run-1/w.npy"},
         "layout": {"dict": {"t": 1.5, "tags": {"list": ["a"]}, "w": {"array": "w"}}}},
        {"key": "run-2", "meta": {"n": 2}, "arrays": {"x": "run-2/x.npy"}}
    ]});
    let ours = zip_bytes(&[
        Member::stored("__lazyvault__.json", manifest.to_string().as_bytes()),
        Member::stored("run-1/w.npy", &npy_file("'<f8'", &[6], &f8)),
        Member::deflated("run-2/x.npy", &npy_file("'<u2'", &[3], &f8[..6])),
    ]);
    vec![foreign, ours]
}

/// `.safetensors` files: tensors of several dtypes (raw-bit BF16 and F8
/// among them), an empty one, `__metadata__` with our marker.
fn safetensors_seeds() -> Vec<Vec<u8>> {
    let file = |header: Value, data: &[u8]| {
        let mut text = header.to_string().into_bytes();
        while !text.len().is_multiple_of(8) {
            text.push(b' ');
        }
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&text);
        out.extend_from_slice(data);
        out
    };
    let marker = json!({"version": 1, "json": ["t"], "fields": ["t"]}).to_string();
    let data: Vec<u8> = (0..40u8).collect();
    vec![
        file(
            json!({
                "__metadata__": {"format": "pt", "t": "300.0", "lazyvault": marker},
                "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
                "q": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [32, 36]},
                "m": {"dtype": "BOOL", "shape": [4], "data_offsets": [36, 40]},
                "e": {"dtype": "I64", "shape": [0, 5], "data_offsets": [40, 40]}
            }),
            &data,
        ),
        file(json!({}), &[]),
    ]
}

#[test]
fn npz_smoke() {
    use zip_build::{zip_bytes, Member};
    let seeds = npz_seeds();
    let dict: &[&[u8]] = &[
        b"PK\x03\x04",
        b"PK\x01\x02",
        b"PK\x05\x06",
        b"\x93NUMPY",
        b"'shape': (",
        b"'descr': '",
        b"\"records\":",
        b"\"arrays\":",
        b"\"layout\":",
        b"__lazyvault__.json",
        b".npy",
        b"\xff\xff\xff\xff",
    ];
    // Members of the seeds, to rezip with correct sizes and CRCs.
    let members: Vec<(String, Vec<u8>)> = seeds.iter().flat_map(|s| npz_members(s)).collect();
    let texts: Vec<Vec<u8>> = members.iter().map(|(_, b)| b.clone()).collect();
    let stats = smoke("npz", &seeds, fuzz_checks::check_npz, |rng| {
        match rng.below(3) {
            // Raw bytes: the zip layer, the local headers, the inflater.
            0 => {
                let base = rng.pick(&seeds).clone();
                mutate(rng, &base, &seeds, dict)
            }
            // One member mutated, then zipped again (stored or deflated).
            _ => {
                let mut picked: Vec<(String, Vec<u8>)> = (0..1 + rng.below(4))
                    .map(|_| rng.pick(&members).clone())
                    .collect();
                let at = rng.below(picked.len());
                picked[at].1 = mutate(rng, &picked[at].1, &texts, dict);
                let zipped: Vec<Member> = picked
                    .iter()
                    .map(|(name, body)| {
                        if rng.chance(2) {
                            Member::deflated(name, body)
                        } else {
                            Member::stored(name, body)
                        }
                    })
                    .collect();
                zip_bytes(&zipped)
            }
        }
    });
    assert_ran(&stats, 100);
}

#[test]
fn safetensors_smoke() {
    let dict: &[&[u8]] = &[
        b"\"dtype\":",
        b"\"shape\":",
        b"\"data_offsets\":",
        b"\"__metadata__\":",
        b"\"BF16\"",
        b"\"F8_E5M2\"",
        b"\"F4\"",
        b"\"U64\"",
        b"[0,0]",
        b"18446744073709551615",
        b"-1",
        b"1e400",
        b"{}",
    ];
    let seeds = safetensors_seeds();
    let stats = smoke_mutations("safetensors", &seeds, dict, fuzz_checks::check_safetensors);
    assert_ran(&stats, 200);
}

/// Column files written by a store: the metadata of a few records of every
/// kind of value (a column of each type, JSON text, array facts,
/// tombstones).
fn columns_seeds() -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lv");
    let store = lazyvault_store::Store::open(&path, lazyvault_store::Mode::Append).unwrap();
    let metas = [
        json!({"t": 1.5, "m": "Si", "n": 3, "ok": true, "p": {"lr": 0.1}}),
        json!({"t": 2, "m": "Ge", "l": [1, 2], "at": {"$datetime": "2024-03-01T12:00:00+01:00"}}),
        json!({"t": {"$float": "nan"}, "m": null, "d": {"$datetime": "2024-03-01T12:00:00"}}),
    ];
    let data = [1u8, 2, 3, 4];
    for (i, m) in metas.iter().enumerate() {
        let arrays = [source("x", "'|u1'", vec![4], &data)];
        store
            .put(
                &format!("k{i}"),
                meta(m.clone()),
                Value::Null,
                &arrays,
                None,
            )
            .unwrap();
    }
    store.close().unwrap();
    let store = lazyvault_store::Store::open(&path, lazyvault_store::Mode::Append).unwrap();
    store.delete("k1").unwrap();
    store.close().unwrap();
    let mut seeds = Vec::new();
    for entry in std::fs::read_dir(path.join(lazyvault_store::CHECKPOINT_DIR)).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "arrow") {
            seeds.push(std::fs::read(p).unwrap());
        }
    }
    assert!(!seeds.is_empty());
    seeds
}

#[test]
fn columns_smoke() {
    let seeds = columns_seeds();
    for seed in &seeds {
        lazyvault_store::read_column_file(seed).expect("every column file seed reads");
    }
    let dict: &[&[u8]] = &[
        b"ARROW1",
        b"\xff\xff\xff\xff",
        b"lazyvault.kind",
        b"\x00\x00\x00\x00",
    ];
    let stats = smoke_mutations("columns", &seeds, dict, fuzz_checks::check_columns);
    assert_ran(&stats, 200);
}

/// Writes the valid inputs above as seed files for the cargo-fuzz targets,
/// when `LAZYVAULT_WRITE_FUZZ_SEEDS` names a directory; does nothing
/// otherwise.
#[test]
fn write_fuzz_seeds() {
    let Some(dir) = std::env::var_os("LAZYVAULT_WRITE_FUZZ_SEEDS") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let sets = [
        ("npy_header", npy_seeds()),
        ("query", query_seeds()),
        ("record", record_seeds()),
        ("archive", vec![archive_seed()]),
        ("npz", npz_seeds()),
        ("safetensors", safetensors_seeds()),
        ("columns", columns_seeds()),
    ];
    for (target, seeds) in sets {
        let folder = dir.join(target);
        std::fs::create_dir_all(&folder).unwrap();
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(folder.join(format!("seed-{i:02}")), seed).unwrap();
        }
    }
}

/// Replays files through a target's check, when `LAZYVAULT_FUZZ_REPLAY` is
/// `<target>:<file or directory>` (e.g. a cargo-fuzz artifact or corpus;
/// a relative path is taken from `store/`, where cargo runs the test),
/// so that a finding reproduces on stable Rust; does nothing otherwise.
#[test]
fn replay_fuzz_inputs() {
    let Ok(spec) = std::env::var("LAZYVAULT_FUZZ_REPLAY") else {
        return;
    };
    let (target, path) = spec
        .split_once(':')
        .expect("LAZYVAULT_FUZZ_REPLAY is <target>:<path>");
    let check: fn(&[u8]) -> bool = match target {
        "npy_header" => fuzz_checks::check_npy_header,
        "query" => fuzz_checks::check_query,
        "record" => fuzz_checks::check_record,
        "archive" => fuzz_checks::check_archive,
        "npz" => fuzz_checks::check_npz,
        "safetensors" => fuzz_checks::check_safetensors,
        "columns" => fuzz_checks::check_columns,
        other => panic!("unknown fuzz target {other:?}"),
    };
    let path = std::path::Path::new(path);
    let files: Vec<std::path::PathBuf> = if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut accepted = 0;
    for file in &files {
        // A running fuzzer may remove corpus files meanwhile.
        let Ok(input) = std::fs::read(file) else {
            continue;
        };
        match catch_unwind(|| run_one(target, 0, &input, check)) {
            Ok(ok) => accepted += usize::from(ok),
            Err(panic) => {
                eprintln!("(that input is {})", file.display());
                resume_unwind(panic);
            }
        }
    }
    eprintln!(
        "replayed {} inputs for {target}, {accepted} accepted",
        files.len()
    );
}
