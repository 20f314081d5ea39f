//! `.npy` header parsing and writing (`lazyvault_store::npy`): what every
//! first access of an array pays once before mapping it.
//!
//! `cargo bench -p lazyvault-store --bench npy_header`

use std::hint::black_box;
use std::io::Cursor;

use criterion::{criterion_group, criterion_main, Criterion};
use lazyvault_store::npy::{self, NUMPY_MAX_HEADER_LEN};

/// A version 2.0 header with the same dictionary as the version 1.0 header
/// `v1`: a 4-byte length, padded so the data stays 64-aligned. numpy writes
/// 2.0 only past 65535 bytes of text, but reads any 2.0 header.
fn as_v2(v1: &[u8]) -> Vec<u8> {
    let text = std::str::from_utf8(&v1[10..]).expect("latin-1 ASCII");
    let dict = text.trim_end();
    let mut out = b"\x93NUMPY\x02\x00".to_vec();
    let total = (12 + dict.len() + 1).div_ceil(64) * 64;
    let header_len = u32::try_from(total - 12).expect("fits");
    out.extend_from_slice(&header_len.to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out
}

fn headers() -> Vec<(&'static str, Vec<u8>)> {
    let typical = npy::write_header("'<f8'", false, &[1000, 3]).expect("valid");
    let fortran = npy::write_header("'|u1'", true, &[480, 640, 3]).expect("valid");
    // 32 axes (numpy allows 64): three long ones, then ones, so that the
    // byte count still fits a u64.
    let long_shape: Vec<u64> = [1_000_003, 65_537, 4099]
        .into_iter()
        .chain(std::iter::repeat_n(1, 29))
        .collect();
    let v2 = as_v2(&npy::write_header("'<c16'", false, &long_shape).expect("valid"));
    let structured = npy::write_header(
        "[('x', '<f8'), ('y', '<f8'), ('z', '<f8'), ('id', '<i4'), \
         ('name', '<U16'), ('vel', '<f4', (3,)), ('flags', [('ok', '|b1'), ('hot', '|b1')])]",
        false,
        &[100_000],
    )
    .expect("valid");
    vec![
        ("v1_f8_2d", typical),
        ("v1_u1_3d_fortran", fortran),
        ("v2_c16_32d", v2),
        ("v1_structured", structured),
    ]
}

fn bench(c: &mut Criterion) {
    let headers = headers();
    // Each input must parse, and the v2 one must really be read as 2.0.
    for (name, bytes) in &headers {
        let h = npy::parse_header(bytes, NUMPY_MAX_HEADER_LEN)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(h.data_offset as usize, bytes.len(), "{name}");
        assert_eq!(h.version.0, if name.starts_with("v2") { 2 } else { 1 });
        assert!(h.nbytes().is_some(), "{name}");
    }

    let mut g = c.benchmark_group("npy_header/parse");
    for (name, bytes) in &headers {
        g.bench_function(*name, |b| {
            b.iter(|| npy::parse_header(black_box(bytes), NUMPY_MAX_HEADER_LEN))
        });
    }
    g.finish();

    let typical = &headers[0].1;
    c.bench_function("npy_header/read_v1_f8_2d", |b| {
        b.iter(|| npy::read_header(&mut Cursor::new(black_box(typical)), NUMPY_MAX_HEADER_LEN))
    });
    c.bench_function("npy_header/write_v1_f8_2d", |b| {
        b.iter(|| npy::write_header(black_box("'<f8'"), false, black_box(&[1000, 3])))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
