//! Fuzz target for the `.npy` header parser.
//!
//! Feeds arbitrary bytes to `parse_header` (and the same bytes, as a stream,
//! to `read_header`); neither may panic, and both must agree. When parsing
//! succeeds, the header is written again and the result must parse to the
//! same descr, order and shape, be 64-byte aligned, and be a fixed point of
//! writing.

#![no_main]

use lazyvault_store::npy::{
    descr_itemsize, parse_header, read_header, write_header, NpyError, NpyHeader, ALIGNMENT,
    NUMPY_MAX_HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Exercise both the default limit and no limit at all: a declared length
    // beyond the input must be a length error, never a big allocation.
    for limit in [NUMPY_MAX_HEADER_LEN, usize::MAX] {
        let parsed = parse_header(data, limit);
        let read = read_header(&mut &data[..], limit);
        match (&parsed, &read) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "parse_header and read_header disagree"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            _ => panic!("parse_header and read_header disagree: {parsed:?} vs {read:?}"),
        }
        if let Ok(header) = parsed {
            check_header(data, &header);
        }
    }
    // The descr helper must not panic on arbitrary text either.
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = descr_itemsize(text);
    }
});

fn check_header(data: &[u8], header: &NpyHeader) {
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
