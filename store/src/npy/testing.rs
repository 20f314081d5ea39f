//! Helpers for the tests of the `npy` modules: headers laid out by hand,
//! numpy's own bytes, and a global allocator that records the largest
//! allocation, to show that hostile lengths allocate nothing big.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use super::descr::parse_descr_literal;
use super::header::{prefix_len, write_prefix};
use super::literal::Lit;
use super::{parse_header, write_header, NpyError, NpyHeader, NUMPY_MAX_HEADER_LEN};

// -- Allocation tracking

struct TrackingAlloc;

thread_local! {
    static LARGEST_ALLOC: Cell<usize> = const { Cell::new(0) };
}

fn note_alloc(size: usize) {
    let _ = LARGEST_ALLOC.try_with(|m| m.set(m.get().max(size)));
}

// SAFETY: forwards to the system allocator; only records sizes.
unsafe impl GlobalAlloc for TrackingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc(new_size);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: TrackingAlloc = TrackingAlloc;

/// Runs `f` and returns its result with the largest single allocation it
/// made on this thread.
pub(super) fn largest_alloc_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST_ALLOC.with(|m| m.set(0));
    let out = f();
    (out, LARGEST_ALLOC.with(|m| m.get()))
}

// -- Headers

/// A header the way a given era of writer laid it out: magic + version +
/// length (a u16 for major version 1, else a u32), `text` padded with spaces
/// to a multiple of `align` bytes in all, '\n'.
pub(super) fn raw_header(version: (u8, u8), text: &[u8], align: usize) -> Vec<u8> {
    let prefix = prefix_len(version);
    let total = (prefix + text.len() + 1).div_ceil(align) * align;
    let mut out = Vec::with_capacity(total);
    write_prefix(&mut out, version, total - prefix).unwrap();
    out.extend_from_slice(text);
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out
}

/// A version 1.0 header, 64-byte aligned, with this dict text.
pub(super) fn v1(text: &str) -> Vec<u8> {
    raw_header((1, 0), text.as_bytes(), 64)
}

/// Parses with numpy's default limit.
pub(super) fn parse(bytes: &[u8]) -> Result<NpyHeader, NpyError> {
    parse_header(bytes, NUMPY_MAX_HEADER_LEN)
}

/// Parses a version 1.0 header with this dict text.
pub(super) fn parse_text(text: &str) -> Result<NpyHeader, NpyError> {
    parse(&v1(text))
}

/// A valid header with a structured descr.
pub(super) fn good_header() -> Vec<u8> {
    write_header("[('a', '<f4'), ('b', '|S3', (2,))]", false, &[3, 4]).unwrap()
}

/// Asserts that `result` is an error passing `check`, and returns it.
pub(super) fn assert_err<T: std::fmt::Debug>(
    result: Result<T, NpyError>,
    check: impl Fn(&NpyError) -> bool,
) -> NpyError {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => {
            assert!(check(&e), "unexpected error: {e:?} ({e})");
            e
        }
    }
}

// -- Literals

pub(super) fn lit_of(descr: &str) -> Lit {
    parse_descr_literal(descr).unwrap()
}

pub(super) fn s(x: &str) -> Lit {
    Lit::Str(x.to_owned())
}

pub(super) fn int(x: u64) -> Lit {
    Lit::Int {
        negative: false,
        magnitude: Some(x),
    }
}

// -- numpy's bytes

pub(super) type Fixture = (
    &'static str,
    &'static str,
    bool,
    &'static [u64],
    &'static [u8],
);

/// (name, repr(descr), fortran_order, shape, header bytes), all produced
/// by numpy 2.4 (`np.save`, header part only).
#[rustfmt::skip]
pub(super) const NUMPY_FIXTURES: &[Fixture] = &[
    ("f8_3x4", "'<f8'", false, &[3, 4], b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }                                                          \n"),
    ("f8_0d", "'<f8'", false, &[], b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (), }                                                              \n"),
    ("f8_5", "'<f8'", false, &[5], b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }                                                            \n"),
    ("bei4_fortran", "'>i4'", true, &[2, 3, 4], b"\x93NUMPY\x01\x00v\x00{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3, 4), }                                                        \n"),
    ("u1_big", "'|u1'", false, &[1099511627776, 3], b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (1099511627776, 3), }                                              \n"),
    ("structured", "[(('title', 'name'), '<i4', (2, 3)), ('s', [('a', '<M8[ns]'), ('b', '|S5')]), ('u', '<U3'), ('f3', '|V4')]", false, &[7], b"\x93NUMPY\x01\x00\xb6\x00{'descr': [(('title', 'name'), '<i4', (2, 3)), ('s', [('a', '<M8[ns]'), ('b', '|S5')]), ('u', '<U3'), ('f3', '|V4')], 'fortran_order': False, 'shape': (7,), }                       \n"),
    ("v3_alpha", "[('α', '<f4')]", false, &[2], b"\x93NUMPY\x03\x00t\x00\x00\x00{'descr': [('\xce\xb1', '<f4')], 'fortran_order': False, 'shape': (2,), }                                                \n"),
    ("latin1_e", "[('café', '<f4')]", false, &[2], b"\x93NUMPY\x01\x00v\x00{'descr': [('caf\xe9', '<f4')], 'fortran_order': False, 'shape': (2,), }                                                \n"),
    ("quote_name", "[(\"it's\", '<i2'), ('a\\\\b\\'\"\\n\\x85\\xa0', '|u1')]", false, &[1, 1], b"\x93NUMPY\x01\x00\xb6\x00{'descr': [(\"it's\", '<i2'), ('a\\\\b\\'\"\\n\\x85\\xa0', '|u1')], 'fortran_order': False, 'shape': (1, 1), }                                                                                \n"),
    ("empty_struct", "[]", false, &[3], b"\x93NUMPY\x01\x00v\x00{'descr': [], 'fortran_order': False, 'shape': (3,), }                                                               \n"),
    ("obj", "'|O'", false, &[2], b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (2,), }                                                             \n"),
    ("m8", "'<m8[D]'", false, &[4], b"\x93NUMPY\x01\x00v\x00{'descr': '<m8[D]', 'fortran_order': False, 'shape': (4,), }                                                         \n"),
    ("M8generic", "'<M8'", false, &[4], b"\x93NUMPY\x01\x00v\x00{'descr': '<M8', 'fortran_order': False, 'shape': (4,), }                                                            \n"),
    ("pad64", "[('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', '<f8')]", false, &[1], b"\x93NUMPY\x01\x00\xb6\x00{'descr': [('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', '<f8')], 'fortran_order': False, 'shape': (1,), }                                                                                    \n"),
];
