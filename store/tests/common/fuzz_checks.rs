// The checks behind every fuzz target, shared by the cargo-fuzz targets
// (`fuzz/fuzz_targets/*.rs`, through `#[path]`) and the stable smoke test
// (`store/tests/fuzz_smoke.rs`), so that both feed the same entry points and
// assert the same properties. Each `check_*` takes arbitrary bytes and panics
// only when a property is broken: a parser may refuse its input, never panic.
//
// Only the public API of `lazyvault-store` is used (no other dependency), since
// the fuzz crate depends on nothing else.

#![allow(dead_code)] // each fuzz target uses one check

use std::sync::LazyLock;

use lazyvault_store::archive::{write_archive_bytes, ArchiveIndex};
use lazyvault_store::npy::{
    descr_itemsize, parse_header, read_header, write_header, NpyError, NpyHeader, ALIGNMENT,
    NUMPY_MAX_HEADER_LEN,
};
use lazyvault_store::query::{ArrayFacts, Map, Query, RecordView, Value, MAX_QUERY_BYTES};
use lazyvault_store::schema::{Manifest, Record};
use lazyvault_store::{ArraySource, InteropError, StorageError};

// ---------------------------------------------------------------------------
// .npy headers

/// `parse_header` and `read_header` on arbitrary bytes: no panic, both agree,
/// and a parsed header is written again to a fixed point that parses the same.
/// Returns whether the bytes parsed as a header, or as a descr.
pub fn check_npy_header(data: &[u8]) -> bool {
    let mut accepted = false;
    // Both the default limit and none at all: a declared length beyond the
    // input must be a length error, never a big allocation.
    for limit in [NUMPY_MAX_HEADER_LEN, usize::MAX] {
        let parsed = parse_header(data, limit);
        let read = read_header(&mut &data[..], limit);
        match (&parsed, &read) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "parse_header and read_header disagree"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            _ => panic!("parse_header and read_header disagree: {parsed:?} vs {read:?}"),
        }
        if let Ok(header) = parsed {
            check_parsed_header(data, &header);
            accepted = true;
        }
    }
    // The descr helpers must not panic on arbitrary text either, and the
    // writer's validation must agree with the itemsize of what it writes.
    if let Ok(text) = std::str::from_utf8(data) {
        let itemsize = descr_itemsize(text);
        if let Ok(bytes) = write_header(text, false, &[2, 3]) {
            accepted = true;
            let back = parse_header(&bytes, NUMPY_MAX_HEADER_LEN).unwrap_or_else(|e| {
                panic!("write_header({text:?}) wrote an unparsable header: {e}")
            });
            assert_eq!(
                descr_itemsize(&back.descr),
                itemsize,
                "itemsize of {text:?} and of its canonical form {:?} differ",
                back.descr
            );
        }
    }
    accepted
}

fn check_parsed_header(data: &[u8], header: &NpyHeader) {
    assert!(header.data_offset as usize <= data.len());
    assert!(matches!(header.version, (1, 0) | (2, 0) | (3, 0)));
    let _ = header.len();
    let _ = header.nbytes();

    let bytes = match write_header(&header.descr, header.fortran_order, &header.shape) {
        Ok(bytes) => bytes,
        // The canonical text (or numpy's growth-axis spaces) can make the
        // rewritten header longer than numpy's default limit.
        Err(NpyError::HeaderTooLong { len, limit }) => {
            assert!(len > limit as u64);
            return;
        }
        Err(e) => panic!("a parsed header could not be written again: {e} ({header:?})"),
    };
    assert_eq!(bytes.len() % ALIGNMENT, 0);

    let again = parse_header(&bytes, NUMPY_MAX_HEADER_LEN)
        .unwrap_or_else(|e| panic!("a written header does not parse: {e} ({header:?})"));
    assert_eq!(again.descr, header.descr);
    assert_eq!(again.fortran_order, header.fortran_order);
    assert_eq!(again.shape, header.shape);
    assert_eq!(again.data_offset, bytes.len() as u64);
    assert_eq!(descr_itemsize(&again.descr), descr_itemsize(&header.descr));

    // Writing is a fixed point.
    let rewritten = write_header(&again.descr, again.fortran_order, &again.shape)
        .expect("rewriting a written header");
    assert_eq!(rewritten, bytes);
}

// ---------------------------------------------------------------------------
// Queries

/// A record for queries to run against: a key, JSON metadata and array facts.
pub struct FixedRecord {
    pub key: &'static str,
    pub meta: Map<String, Value>,
    pub arrays: Vec<FixedArray>,
}

pub struct FixedArray {
    pub name: &'static str,
    pub shape: Vec<u64>,
    pub dtype: &'static str,
    pub descr: &'static str,
    pub nbytes: u64,
}

impl RecordView for FixedRecord {
    fn key(&self) -> &str {
        self.key
    }

    fn meta(&self) -> &Map<String, Value> {
        &self.meta
    }

    fn array(&self, name: &str) -> Option<ArrayFacts<'_>> {
        self.arrays
            .iter()
            .find(|a| a.name == name)
            .map(|a| ArrayFacts {
                shape: &a.shape,
                dtype: a.dtype,
                descr: a.descr,
                nbytes: a.nbytes,
            })
    }
}

fn object(json: &str) -> Map<String, Value> {
    match json.parse::<Value>() {
        Ok(Value::Object(map)) => map,
        _ => panic!("fixture is not a JSON object: {json}"),
    }
}

fn array(
    name: &'static str,
    shape: &[u64],
    dtype: &'static str,
    descr: &'static str,
    nbytes: u64,
) -> FixedArray {
    FixedArray {
        name,
        shape: shape.to_vec(),
        dtype,
        descr,
        nbytes,
    }
}

/// A record with every kind of value, nested fields, big integers, Unicode
/// names and arrays at the top level, nested and in lists; a small plain one;
/// and an empty one.
pub static RECORDS: LazyLock<Vec<FixedRecord>> = LazyLock::new(|| {
    vec![
        FixedRecord {
            key: "mire-2/run-001",
            meta: object(
                r#"{
                    "temperature": 300.0, "material": "Si", "count": 7, "ok": true,
                    "nothing": null, "big": 9007199254740993, "umax": 18446744073709551615,
                    "imin": -9223372036854775808, "half": 0.5, "s": "it's \"q\" é 😀",
                    "params": {"lr": 0.001, "learning-rate": 0.01, "layers": [64, 32],
                               "name": "adam", "a": {"b": {"c": [1, [2, [3, {"d": 4}]]]}}},
                    "tags": ["a", "b", "c", 1, null, [1, 2], {"x": 1}],
                    "key": "meta-key", "meta": "meta-meta", "温度": 25,
                    "image": {"shape": [1, 2]}
                }"#,
            ),
            arrays: vec![
                array("image", &[480, 640], "uint8", "'|u1'", 307_200),
                array("params/w", &[3, 4], "float64", "'<f8'", 96),
                array("frames/0", &[10], "float32", "'<f4'", 40),
                array("scalar", &[], "int64", "'<i8'", 8),
                array("huge", &[u64::MAX, u64::MAX], "uint8", "'|u1'", u64::MAX),
            ],
        },
        FixedRecord {
            key: "run-2",
            meta: object(r#"{"temperature": 250, "material": "Ge", "tags": ["baseline"]}"#),
            arrays: vec![array("positions", &[1000, 3], "float64", "'<f8'", 24_000)],
        },
        FixedRecord {
            key: "",
            meta: Map::new(),
            arrays: Vec::new(),
        },
    ]
});

/// Any UTF-8 text either parses, and then evaluates against [`RECORDS`]
/// without panicking, generically and through `dyn RecordView` alike, with
/// `not (q)` and `(q) and (q)` meaning what they say; or fails with a
/// `QueryError` whose column lies inside the expression (or one past it).
/// Returns whether the text parsed.
pub fn check_query(data: &[u8]) -> bool {
    let Ok(source) = std::str::from_utf8(data) else {
        return false;
    };
    match Query::parse(source) {
        Ok(query) => {
            assert_eq!(query.source(), source);
            assert_eq!(query.to_string(), source);
            let results: Vec<bool> = RECORDS
                .iter()
                .map(|record| {
                    let dynamic: &dyn RecordView = record;
                    let hit = query.matches(record);
                    assert_eq!(hit, query.matches(dynamic));
                    hit
                })
                .collect();
            // (text, whether it negates the source)
            let derived = [
                (format!("not ({source})"), true),
                (format!("({source}) and ({source})"), false),
            ];
            for (text, negated) in derived {
                match Query::parse(&text) {
                    Ok(q) => {
                        for (record, &hit) in RECORDS.iter().zip(&results) {
                            assert_eq!(
                                q.matches(record),
                                hit != negated,
                                "{text:?} on {:?}",
                                record.key
                            );
                        }
                    }
                    // Wrapping adds a level of nesting and a few bytes.
                    Err(e) => assert!(
                        e.message.contains("nested too deeply")
                            || (text.len() > MAX_QUERY_BYTES && e.message.contains("too long")),
                        "{source:?} parses but {text:?} does not: {e}"
                    ),
                }
            }
            true
        }
        Err(error) => {
            let chars = source.chars().count();
            assert!(
                (1..=chars + 1).contains(&error.column),
                "column {} outside 1..={}",
                error.column,
                chars + 1
            );
            assert_eq!(error.expression, source);
            assert!(!error.message.is_empty());
            let shown = error.to_string();
            assert!(shown.contains(&error.message));
            false
        }
    }
}

// ---------------------------------------------------------------------------
// Records and manifests

/// `Record::from_json`, `Manifest::from_json` and the journal entry decoder
/// (`journal::decode`) on arbitrary bytes: no panic;
/// what decodes re-encodes to JSON that decodes to an equal value, and
/// encoding is then a fixed point. Returns whether either decoded.
pub fn check_record(data: &[u8]) -> bool {
    let mut accepted = false;
    if let Ok(record) = Record::from_json(data) {
        accepted = true;
        let json = record.to_json();
        let again = Record::from_json(&json).unwrap_or_else(|e| {
            panic!(
                "a re-encoded record does not decode: {e}\n{}",
                String::from_utf8_lossy(&json)
            )
        });
        assert_eq!(again, record, "record changed in a JSON round trip");
        assert_eq!(
            again.to_json(),
            json,
            "record encoding is not a fixed point"
        );
        for (name, entry) in &record.arrays {
            assert!(!name.is_empty());
            // A validated id only ever names a file two levels under arrays/.
            let path = entry.relpath();
            let parts: Vec<&str> = path.split('/').collect();
            assert_eq!(parts.len(), 3, "{path}");
            assert_eq!(parts[0], "arrays");
            assert!(parts[1..].iter().all(|p| !p.is_empty() && *p != ".."));
            assert_eq!(entry.data_offset % ALIGNMENT as u64, 0);
            assert_eq!(entry.is_empty(), entry.len() == Some(0));
        }
    }
    // The record journal's entries: what decodes re-encodes to the same bytes.
    if let Ok((entry, used)) = lazyvault_store::journal::decode(data) {
        accepted = true;
        assert!(used <= data.len());
        assert_eq!(
            lazyvault_store::journal::encode(&entry),
            &data[..used],
            "journal entry encoding is not a fixed point"
        );
    }
    if let Ok(manifest) = Manifest::from_json(data) {
        accepted = true;
        let version = manifest.check().expect("a decoded manifest checks");
        let json = manifest.to_json();
        let again = Manifest::from_json(&json).unwrap_or_else(|e| {
            panic!(
                "a re-encoded manifest does not decode: {e}\n{}",
                String::from_utf8_lossy(&json)
            )
        });
        assert_eq!(again, manifest, "manifest changed in a JSON round trip");
        assert_eq!(again.check().expect("checks again"), version);
        assert_eq!(
            again.to_json(),
            json,
            "manifest encoding is not a fixed point"
        );
    }
    accepted
}

// ---------------------------------------------------------------------------
// .lvz archives

/// Queries run over a parsed archive's records.
const ARCHIVE_QUERIES: &[&str] = &[
    "exists(i)",
    "material == 'Si' or i > 1",
    "key.startswith('run')",
    "positions.shape[0] >= 1 and not exists(missing)",
];

/// `ArchiveIndex::parse` on arbitrary bytes: no panic; when it parses, every
/// record is consistent, and `array_range`, `check_member_crc`,
/// `verify_report`, `verify_all`, `find` and `count` answer without panicking,
/// also when handed bytes of another length than those parsed; when it
/// verifies, the archive writer writes it back to the same records. Returns
/// whether the bytes parsed as an archive.
pub fn check_archive(data: &[u8]) -> bool {
    let Ok(index) = ArchiveIndex::parse(data, "fuzz") else {
        return false;
    };
    assert_eq!(index.len(), index.records().len());
    assert_eq!(index.is_empty(), index.records().is_empty());
    assert_eq!(index.keys().len(), index.len());
    let shorter = &data[..data.len() / 2];
    for record in index.records() {
        assert!(!record.key.is_empty());
        let found = index.get(&record.key).expect("every key is found");
        assert!(
            std::ptr::eq(found, record),
            "key {:?} maps to another record",
            record.key
        );
        assert_eq!(record.pickle.is_some(), record.record.pickle);
        assert_eq!(Record::from_json(&record.json).as_ref(), Ok(&record.record));
        for entry in record.record.arrays.values() {
            if let Ok(range) = index.array_range(data, entry) {
                assert!(range.start <= range.end && range.end <= data.len());
                assert_eq!(range.start % ALIGNMENT, 0);
                assert_eq!(range.len() as u64, entry.nbytes);
            }
            let _ = index.check_member_crc(data, entry);
            // Not the bytes that were parsed: errors, never a panic.
            assert!(index.array_range(shorter, entry).is_err());
            let _ = index.check_member_crc(shorter, entry);
        }
    }
    let (records, arrays, problems) = index.verify_report(data);
    assert_eq!(records, index.len() as u64);
    let total: usize = index.records().iter().map(|r| r.record.arrays.len()).sum();
    assert_eq!(arrays, total as u64);
    assert_eq!(problems.is_empty(), index.verify_all(data).is_ok());
    for text in ARCHIVE_QUERIES {
        let query = Query::parse(text).expect("fixed query parses");
        let found = index.find(&query);
        assert_eq!(found.len(), index.count(&query));
    }
    if problems.is_empty() {
        check_archive_writes_back(data, &index);
    }
    true
}

/// What the reader accepts in full, the writer writes back, and reading
/// that gives the same records and array bytes (payload ids and header
/// padding may differ).
fn check_archive_writes_back(data: &[u8], index: &ArchiveIndex) {
    let written = write_archive_bytes(|w| {
        for record in index.records() {
            let arrays: Vec<ArraySource<'_>> = record
                .record
                .arrays
                .iter()
                .map(|(name, entry)| ArraySource {
                    name: name.clone(),
                    descr: entry.descr.clone(),
                    dtype: entry.dtype.clone(),
                    shape: entry.shape.clone(),
                    fortran_order: entry.fortran_order,
                    data: &data[index.array_range(data, entry).expect("verified")],
                    pickled: entry.pickled,
                })
                .collect();
            w.add_record(
                &record.key,
                record.record.meta.clone(),
                record.record.layout.clone(),
                &arrays,
                record.pickle.as_deref(),
            )?;
        }
        Ok(())
    });
    let bytes = match written {
        Ok(bytes) => bytes,
        // The canonical header may be longer than the one read.
        Err(e) if e.to_string().contains("too long") => return,
        Err(e) => panic!("an archive that reads in full cannot be written back: {e}"),
    };
    let again = ArchiveIndex::parse(&bytes, "written back")
        .unwrap_or_else(|e| panic!("a written-back archive does not parse: {e}"));
    again
        .verify_all(&bytes)
        .expect("a written-back archive verifies");
    assert_eq!(again.keys(), index.keys());
    for (old, new) in index.records().iter().zip(again.records()) {
        assert_eq!(new.record.meta, old.record.meta);
        assert_eq!(new.record.layout, old.record.layout);
        assert_eq!(new.pickle, old.pickle);
        assert_eq!(new.record.arrays.len(), old.record.arrays.len());
        for ((name, a), (new_name, b)) in old.record.arrays.iter().zip(&new.record.arrays) {
            assert_eq!(new_name, name);
            assert_eq!(
                (
                    &b.descr,
                    &b.dtype,
                    &b.shape,
                    b.fortran_order,
                    b.pickled,
                    b.nbytes
                ),
                (
                    &a.descr,
                    &a.dtype,
                    &a.shape,
                    a.fortran_order,
                    a.pickled,
                    a.nbytes
                ),
                "array {name:?} of {:?}",
                old.key
            );
            let old_bytes = &data[index.array_range(data, a).expect("verified")];
            let new_bytes = &bytes[again.array_range(&bytes, b).expect("verified")];
            assert!(old_bytes == new_bytes, "array {name:?} of {:?}", old.key);
        }
    }
}

// ---------------------------------------------------------------------------
// .npz (zip directory, member headers and readers, lazyvault's manifest)

/// The zip directory reader and `read_npz` on arbitrary bytes: no panic,
/// only `InvalidFile`/`Io` errors; every member reader gives exactly the
/// declared size or an error, never more (a bomb stops there); what
/// `read_npz` accepts names only members of the zip, and a manifest names
/// only accepted members. Returns whether the bytes read as an npz.
pub fn check_npz(data: &[u8]) -> bool {
    use lazyvault_store::interop::{npz, zip::ZipIn, ImportOptions};
    use lazyvault_store::Error;
    use std::io::{Cursor, Read};

    let Ok(mut zip) = ZipIn::new(Cursor::new(data), "fuzz") else {
        return false;
    };
    let members = zip.members();
    for m in members.iter().take(64).filter(|m| m.size <= 1 << 24) {
        let Ok(reader) = zip.reader(m, "fuzz member") else {
            continue;
        };
        let mut out = Vec::new();
        let read = reader.take(m.size + 1).read_to_end(&mut out);
        assert!(
            out.len() as u64 <= m.size,
            "a member reader went past its size"
        );
        if read.is_ok() {
            assert_eq!(
                out.len() as u64,
                m.size,
                "a member read short without an error"
            );
        }
    }
    let parsed = npz::read_npz(
        &mut zip,
        std::path::Path::new("fuzz"),
        &ImportOptions::default(),
    );
    let contents = match parsed {
        Ok(c) => c,
        Err(e) => {
            assert!(
                matches!(
                    e,
                    Error::Interop(InteropError::InvalidFile { .. })
                        | Error::Storage(StorageError::Io { .. })
                ),
                "unexpected error kind: {e}"
            );
            return false;
        }
    };
    let arrays = contents.arrays();
    for (name, descr, _shape) in &arrays {
        assert!(members.iter().any(|m| &m.name == name));
        assert!(!descr.is_empty());
    }
    for record in contents.manifest.iter().flatten() {
        assert!(!record.key.is_empty());
        for member in record.arrays.values() {
            assert!(arrays.iter().any(|(n, _, _)| n == member));
        }
    }
    true
}

// ---------------------------------------------------------------------------
// .safetensors headers

/// The safetensors header reader on arbitrary bytes (as a file, and as the
/// JSON text alone): no panic; an accepted header's tensors lie inside the
/// data section, do not overlap, and span what their shape and dtype need.
/// Returns whether the bytes read as a safetensors file.
pub fn check_safetensors(data: &[u8]) -> bool {
    use lazyvault_store::interop::safetensors::{parse_header, read_header};

    let _ = parse_header(data, data.len() as u64, "fuzz");
    let Ok(header) = read_header(&mut &data[..], data.len() as u64, "fuzz") else {
        return false;
    };
    let data_len = data.len() as u64 - header.data_start;
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for t in &header.tensors {
        assert!(
            t.begin <= t.end && t.end <= data_len,
            "{t:?} outside the data"
        );
        let item = match t.tag.as_str() {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            _ => 1,
        };
        let len: Option<u64> = if t.shape.contains(&0) {
            Some(0)
        } else {
            t.shape.iter().try_fold(item, |a: u64, &d| a.checked_mul(d))
        };
        assert_eq!(len, Some(t.end - t.begin), "{t:?}");
        if t.end > t.begin {
            spans.push((t.begin, t.end));
        }
    }
    spans.sort_unstable();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlapping tensors accepted");
    }
    true
}

// ---------------------------------------------------------------------------
// Checkpoint column files (Arrow IPC)

/// `read_column_file` on arbitrary bytes: no panic (a damaged file is an
/// error). Returns whether the bytes read as a column file.
pub fn check_columns(data: &[u8]) -> bool {
    lazyvault_store::read_column_file(data).is_ok()
}
