//! `.npy` headers: parsing and writing, versions 1.0, 2.0 and 3.0 (NEP 1,
//! the docstring of numpy/lib/format.py; the byte layout is in
//! schema/FORMAT.md, "Payload files").
//!
//! An `.npy` file starts with the magic `\x93NUMPY`, two version bytes, the
//! length of the header text (u16 little-endian for 1.0, u32 for 2.0 and 3.0),
//! then the header text itself: a Python dict literal with exactly the keys
//! `descr`, `fortran_order` and `shape`, padded with spaces and ending in
//! `'\n'`. Version 1.0 and 2.0 text is latin-1, 3.0 text is UTF-8. The array
//! data follows the header.
//!
//! The parser reads the dict literal without regex or `eval`, never panics
//! and never allocates from a length it has not checked against the
//! caller's limit (numpy's `max_header_size`, [`NUMPY_MAX_HEADER_LEN`] by
//! default). The writer produces byte for byte what numpy >= 1.14 writes for
//! the same array (`np.save`), including numpy's spare spaces for the growth
//! axis and its 64-byte alignment of the data start.
//!
//! One job per module:
//! - `header`: the prefix (magic, version, header length) and the header
//!   dict: [`parse_header`], [`read_header`];
//! - `write`: the header as numpy writes it: [`write_header`];
//! - `descr`: the descr (dtype) grammar, [`parse_descr`] and
//!   [`descr_itemsize`];
//! - `literal`: the Python-literal subset, parsed and rendered as `repr()`;
//! - `numpy`: what numpy makes of a descr: [`dtype_name`],
//!   [`descr_has_object`], and the arrays it refuses ([`numpy_refuses`]);
//! - `error`: [`NpyError`].

mod descr;
mod error;
mod header;
mod literal;
mod numpy;
#[cfg(test)]
mod testing;
mod write;

pub use descr::{descr_itemsize, parse_descr, Descr, DescrField, SubarrayShape};
pub use error::NpyError;
pub use header::{parse_header, read_header};
pub use numpy::{descr_has_object, dtype_name, numpy_refuses, NUMPY_MAX_DIMS};
pub use write::{write_header, write_header_with_limit};

/// numpy's default `max_header_size` (numpy/lib/format.py, after the DoS
/// report), in bytes: the longest header text (`HEADER_LEN`, after the 10- or
/// 12-byte prefix, padding and the final `'\n'` included) that `np.load`
/// reads without a larger `max_header_size` or `allow_pickle=True`. The
/// reader's default limit, and [`write_header`]'s.
pub const NUMPY_MAX_HEADER_LEN: usize = 10_000;

/// The longest header text the format can hold (version 2.0 and 3.0 store
/// its length in a u32), in bytes: the limit under which the store writes
/// its own payloads, as `np.save` does. A dtype of hundreds of fields needs
/// more than [`NUMPY_MAX_HEADER_LEN`]; `np.load` then reads the payload with
/// a larger `max_header_size`.
pub const FORMAT_MAX_HEADER_LEN: usize = u32::MAX as usize;

/// Alignment of the data start, in bytes, that numpy >= 1.14 writes and that
/// lazyvault requires of its payloads (the header is padded to it).
pub const ALIGNMENT: usize = 64;

/// A parsed `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Format version: (1, 0), (2, 0) or (3, 0).
    pub version: (u8, u8),
    /// Canonical Python-literal text of the descr, as `repr()` renders it
    /// (e.g. `'<f8'` or `[('x', '<i4'), ('y', '>f8', (2, 3))]`).
    pub descr: String,
    /// Whether the data is in Fortran (column-major) order rather than C
    /// (row-major) order.
    pub fortran_order: bool,
    /// Array shape, one dimension per axis; empty for a 0-d array.
    pub shape: Vec<u64>,
    /// Total header length including magic, in bytes: where the data starts.
    pub data_offset: u64,
}

impl NpyHeader {
    /// Number of elements (product of the shape; 1 for a 0-d array), or
    /// `None` when the product of the non-zero dimensions overflows a u64.
    pub fn len(&self) -> Option<u64> {
        shape_product(&self.shape)
    }

    /// Whether the array has no elements (some dimension is 0).
    pub fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// Size of the data in bytes: `len * itemsize`, or `None` if the itemsize
    /// of the descr is unknown or the product overflows.
    pub fn nbytes(&self) -> Option<u64> {
        self.len()?.checked_mul(descr_itemsize(&self.descr)?)
    }
}

/// Product of a shape; `None` if the product of its non-zero dimensions
/// overflows (numpy refuses such shapes even when a dimension is 0).
fn shape_product(shape: &[u64]) -> Option<u64> {
    let mut product: u64 = 1;
    let mut zero = false;
    for &dim in shape {
        if dim == 0 {
            zero = true;
        } else {
            product = product.checked_mul(dim)?;
        }
    }
    Some(if zero { 0 } else { product })
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::descr::{canonical_descr, parse_descr_literal};
    use super::literal::Lit;
    use super::testing::{int, parse, raw_header, s, NUMPY_FIXTURES};
    use super::write::build_header;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_numpy_fixtures() {
        for &(name, descr, fortran_order, shape, bytes) in NUMPY_FIXTURES {
            let written = write_header(descr, fortran_order, shape).unwrap();
            assert_eq!(written, bytes, "{name}: written bytes differ from numpy's");
            let h = parse(bytes).unwrap();
            assert_eq!(h.descr, descr, "{name}");
            assert_eq!(h.fortran_order, fortran_order, "{name}");
            assert_eq!(h.shape, shape, "{name}");
            assert_eq!(h.data_offset, bytes.len() as u64, "{name}");
            assert_eq!(h.data_offset % ALIGNMENT as u64, 0, "{name}");
            let expected_version = if name == "v3_alpha" { (3, 0) } else { (1, 0) };
            assert_eq!(h.version, expected_version, "{name}");
        }
    }

    #[test]
    fn len_and_nbytes() {
        let header = |descr: &str, shape: &[u64]| NpyHeader {
            version: (1, 0),
            descr: descr.to_owned(),
            fortran_order: false,
            shape: shape.to_vec(),
            data_offset: 128,
        };
        assert_eq!(header("'<f8'", &[]).len(), Some(1));
        assert_eq!(header("'<f8'", &[]).nbytes(), Some(8));
        assert_eq!(header("'<f8'", &[3, 4]).nbytes(), Some(96));
        assert_eq!(header("'<U2'", &[5]).nbytes(), Some(40));
        assert_eq!(header("'<f8'", &[0, 4]).nbytes(), Some(0));
        assert!(header("'<f8'", &[0, 4]).is_empty());
        assert_eq!(header("'<f8'", &[1 << 62]).len(), Some(1 << 62));
        assert_eq!(header("'<f8'", &[1 << 62]).nbytes(), None);
        assert_eq!(header("'<f8'", &[1 << 32, 1 << 32]).len(), None);
        assert_eq!(header("'<q8'", &[3]).nbytes(), None);
    }

    // -- Property tests

    #[derive(Debug, Clone)]
    enum TDescr {
        Simple(&'static str, u64),
        Struct(Vec<TField>),
        /// `(descr, shape)`: a subarray dtype, as numpy writes a field whose
        /// dtype is itself a subarray.
        Sub(Box<TDescr>, TShape),
    }

    #[derive(Debug, Clone)]
    struct TField {
        name: String,
        title: Option<String>,
        descr: TDescr,
        shape: Option<TShape>,
    }

    #[derive(Debug, Clone)]
    enum TShape {
        Int(u64),
        Tuple(Vec<u64>),
    }

    const SIMPLE: &[(&str, u64)] = &[
        ("<f8", 8),
        ("|u1", 1),
        (">i2", 2),
        ("=f4", 4),
        ("<c16", 16),
        ("|b1", 1),
        ("<f16", 16),
        ("<M8[ns]", 8),
        ("<m8", 8),
        ("|S5", 5),
        ("<U3", 12),
        ("|V16", 16),
        ("|O", 8),
    ];

    impl TShape {
        fn count(&self) -> u64 {
            match self {
                TShape::Int(n) => *n,
                TShape::Tuple(dims) => dims.iter().product(),
            }
        }

        fn lit(&self) -> Lit {
            match self {
                TShape::Int(n) => int(*n),
                TShape::Tuple(dims) => Lit::Tuple(dims.iter().map(|d| int(*d)).collect()),
            }
        }

        fn loose_text(&self, out: &mut String) {
            match self {
                TShape::Int(n) => {
                    let _ = write!(out, "{n}L");
                }
                TShape::Tuple(dims) => {
                    out.push('(');
                    for d in dims {
                        let _ = write!(out, "{d} ,");
                    }
                    out.push(')');
                }
            }
        }
    }

    impl TDescr {
        fn itemsize(&self) -> u64 {
            match self {
                TDescr::Simple(_, size) => *size,
                TDescr::Sub(descr, shape) => descr.itemsize() * shape.count(),
                TDescr::Struct(fields) => fields
                    .iter()
                    .map(|f| f.descr.itemsize() * f.shape.as_ref().map_or(1, TShape::count))
                    .sum(),
            }
        }

        /// The value the descr text must evaluate to.
        fn lit(&self) -> Lit {
            match self {
                TDescr::Simple(t, _) => s(t),
                TDescr::Sub(descr, shape) => Lit::Tuple(vec![descr.lit(), shape.lit()]),
                TDescr::Struct(fields) => Lit::List(
                    fields
                        .iter()
                        .map(|f| {
                            let mut items = vec![
                                match &f.title {
                                    None => s(&f.name),
                                    Some(t) => Lit::Tuple(vec![s(t), s(&f.name)]),
                                },
                                f.descr.lit(),
                            ];
                            items.extend(f.shape.as_ref().map(TShape::lit));
                            Lit::Tuple(items)
                        })
                        .collect(),
                ),
            }
        }

        /// Non-canonical text: double quotes, every non-alphanumeric
        /// character as a \U escape, extra spaces and trailing commas.
        fn loose_text(&self, out: &mut String) {
            fn quoted(x: &str, out: &mut String) {
                out.push('"');
                for c in x.chars() {
                    if c.is_ascii_alphanumeric() {
                        out.push(c);
                    } else {
                        let _ = write!(out, "\\U{:08x}", u32::from(c));
                    }
                }
                out.push('"');
            }
            match self {
                TDescr::Simple(t, _) => quoted(t, out),
                TDescr::Sub(descr, shape) => {
                    out.push_str("( ");
                    descr.loose_text(out);
                    out.push_str(" ,");
                    shape.loose_text(out);
                    out.push_str(" , )");
                }
                TDescr::Struct(fields) => {
                    out.push_str("[ ");
                    for f in fields {
                        out.push_str("( ");
                        match &f.title {
                            None => quoted(&f.name, out),
                            Some(t) => {
                                out.push('(');
                                quoted(t, out);
                                out.push(',');
                                quoted(&f.name, out);
                                out.push(')');
                            }
                        }
                        out.push_str(" ,\n");
                        f.descr.loose_text(out);
                        if let Some(shape) = &f.shape {
                            out.push_str(", ");
                            shape.loose_text(out);
                        }
                        out.push_str(" , ) ,");
                    }
                    out.push(']');
                }
            }
        }
    }

    fn name_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => "[a-z_][a-z0-9_]{0,6}",
            1 => Just(String::new()),
            1 => "[ -~]{0,6}",
            1 => "[\u{80}-\u{ff}'\"\\\\]{1,4}",
            1 => any::<String>(),
        ]
    }

    fn some_shape_strategy() -> impl Strategy<Value = TShape> {
        prop_oneof![
            (0u64..5).prop_map(TShape::Int),
            prop::collection::vec(0u64..4, 0..3).prop_map(TShape::Tuple),
        ]
    }

    fn shape_strategy() -> impl Strategy<Value = Option<TShape>> {
        prop::option::weighted(0.4, some_shape_strategy())
    }

    fn descr_strategy() -> impl Strategy<Value = TDescr> {
        let leaf = prop::sample::select(SIMPLE).prop_map(|(t, n)| TDescr::Simple(t, n));
        leaf.prop_recursive(3, 24, 4, |inner| {
            let sub = (inner.clone(), some_shape_strategy())
                .prop_map(|(descr, shape)| TDescr::Sub(Box::new(descr), shape));
            let fields = prop::collection::vec(
                (
                    name_strategy(),
                    prop::option::weighted(0.2, name_strategy()),
                    inner,
                    shape_strategy(),
                )
                    .prop_map(|(name, title, descr, shape)| TField {
                        name,
                        title,
                        descr,
                        shape,
                    }),
                0..4,
            )
            .prop_map(TDescr::Struct);
            prop_oneof![3 => fields, 1 => sub]
        })
    }

    fn array_shape_strategy() -> impl Strategy<Value = Vec<u64>> {
        prop_oneof![
            4 => prop::collection::vec(0u64..2000, 0..5),
            1 => any::<u64>().prop_map(|d| vec![d]),
            1 => (0u64..=u64::from(u32::MAX), 0u64..=u64::from(u32::MAX)).prop_map(|(a, b)| vec![a, b]),
        ]
    }

    /// Writes with numpy's limit, or with no limit when the header is too
    /// long for it.
    fn write_any(descr: &str, fortran_order: bool, shape: &[u64]) -> Vec<u8> {
        match write_header(descr, fortran_order, shape) {
            Ok(bytes) => bytes,
            Err(NpyError::HeaderTooLong { len, .. }) => {
                assert!(len > NUMPY_MAX_HEADER_LEN as u64);
                build_header(descr, fortran_order, shape, usize::MAX).unwrap()
            }
            Err(e) => panic!("write failed: {e}"),
        }
    }

    /// What the fuzz target checks: a header that parses is rewritten to a
    /// header that parses to the same fields.
    fn check_rewrite(h: &NpyHeader) {
        let bytes = write_any(&h.descr, h.fortran_order, &h.shape);
        let again = parse_header(&bytes, usize::MAX).unwrap();
        assert_eq!(again.descr, h.descr);
        assert_eq!(again.fortran_order, h.fortran_order);
        assert_eq!(again.shape, h.shape);
        assert_eq!(again.data_offset, bytes.len() as u64);
        assert_eq!(descr_itemsize(&again.descr), descr_itemsize(&h.descr));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn round_trip(
            descr in descr_strategy(),
            fortran_order in any::<bool>(),
            shape in array_shape_strategy(),
        ) {
            let mut text = String::new();
            descr.loose_text(&mut text);
            let bytes = write_any(&text, fortran_order, &shape);
            prop_assert_eq!(bytes.len() % ALIGNMENT, 0);

            let h = parse_header(&bytes, usize::MAX).unwrap();
            prop_assert_eq!(parse_descr_literal(&h.descr).unwrap(), descr.lit());
            prop_assert_eq!(h.fortran_order, fortran_order);
            prop_assert_eq!(&h.shape, &shape);
            prop_assert_eq!(h.data_offset, bytes.len() as u64);
            prop_assert_eq!(h.len(), Some(shape.iter().product::<u64>()));
            prop_assert_eq!(descr_itemsize(&h.descr), Some(descr.itemsize()));
            let latin1 = h.descr.chars().all(|c| u32::from(c) <= 0xff);
            let expected_version = match (latin1, bytes.len() <= 65_535 + 10) {
                (true, true) => (1, 0),
                (true, false) => (2, 0),
                (false, _) => (3, 0),
            };
            prop_assert_eq!(h.version, expected_version);

            // The canonical text is a fixed point and rewrites to the same bytes.
            prop_assert_eq!(canonical_descr(&h.descr).unwrap(), h.descr.clone());
            prop_assert_eq!(write_any(&h.descr, fortran_order, &shape), bytes.clone());

            // The reader agrees with the slice parser, and data after the header is ignored.
            let mut file = bytes.clone();
            file.extend_from_slice(b"\x00\x01\x02");
            prop_assert_eq!(&parse_header(&file, usize::MAX).unwrap(), &h);
            prop_assert_eq!(&read_header(&mut &file[..], usize::MAX).unwrap(), &h);
        }

        #[test]
        fn arbitrary_header_text_never_panics(
            version in prop::sample::select(&[(1u8, 0u8), (2, 0), (3, 0)][..]),
            text in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            let bytes = raw_header(version, &text, 64);
            if let Ok(h) = parse(&bytes) {
                check_rewrite(&h);
            }
        }

        #[test]
        fn mutated_headers_never_panic(
            descr in descr_strategy(),
            shape in array_shape_strategy(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
        ) {
            let mut text = String::new();
            descr.loose_text(&mut text);
            let mut bytes = write_any(&text, false, &shape);
            for (index, byte, op) in edits {
                if bytes.is_empty() {
                    break;
                }
                let i = index.index(bytes.len());
                match op {
                    0 => bytes[i] = byte,
                    1 => { bytes.remove(i); }
                    _ => bytes.insert(i, byte),
                }
            }
            let parsed = parse_header(&bytes, usize::MAX);
            let read = read_header(&mut &bytes[..], usize::MAX);
            match (&parsed, &read) {
                (Ok(a), Ok(b)) => {
                    prop_assert_eq!(a, b);
                    check_rewrite(a);
                }
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                _ => prop_assert!(false, "parse and read disagree: {:?} vs {:?}", parsed, read),
            }
            let _ = descr_itemsize(&String::from_utf8_lossy(&bytes));
        }
    }
}
