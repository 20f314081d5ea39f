// Zips built byte by byte for the import tests and the fuzz smoke test:
// stored or deflated members whose declared sizes, CRCs, flags and methods
// can lie, which no zip writer would produce (bombs, damaged members).

#![allow(dead_code)] // each test uses part of it

use std::io::Write;

/// One member to write.
#[derive(Clone)]
pub struct Member {
    pub name: String,
    pub body: Vec<u8>,
    pub deflate: bool,
    /// Declared uncompressed size instead of the body's.
    pub size: Option<u32>,
    /// Declared CRC-32 instead of the body's.
    pub crc: Option<u32>,
    /// General purpose flags (bit 0: encrypted).
    pub flags: u16,
    /// Compression method instead of 0 or 8.
    pub method: Option<u16>,
}

impl Member {
    pub fn stored(name: &str, body: &[u8]) -> Member {
        Member {
            name: name.to_owned(),
            body: body.to_vec(),
            deflate: false,
            size: None,
            crc: None,
            flags: 0,
            method: None,
        }
    }

    pub fn deflated(name: &str, body: &[u8]) -> Member {
        Member {
            deflate: true,
            ..Member::stored(name, body)
        }
    }
}

fn deflate(body: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(body).unwrap();
    e.finish().unwrap()
}

/// The zip holding `members` (no ZIP64: every size below 4 GiB).
pub fn zip_bytes(members: &[Member]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for m in members {
        let data = if m.deflate {
            deflate(&m.body)
        } else {
            m.body.clone()
        };
        let crc = m.crc.unwrap_or_else(|| crc32fast::hash(&m.body));
        let size = m.size.unwrap_or(m.body.len() as u32);
        let method = m.method.unwrap_or(if m.deflate { 8 } else { 0 });
        let offset = out.len() as u32;
        let name = m.name.as_bytes();
        let fixed = |sig: u32, out: &mut Vec<u8>| {
            out.extend_from_slice(&sig.to_le_bytes());
        };
        fixed(0x0403_4b50, &mut out);
        for v in [20u16, m.flags, method, 0, 0x21] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [crc, data.len() as u32, size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [name.len() as u16, 0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(name);
        out.extend_from_slice(&data);
        fixed(0x0201_4b50, &mut central);
        for v in [20u16, 20, m.flags, method, 0, 0x21] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        for v in [crc, data.len() as u32, size] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        for v in [name.len() as u16, 0, 0, 0, 0] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        central.extend_from_slice(&0u32.to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name);
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    let n = members.len() as u16;
    for v in [0u16, 0, n, n] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// A `.npy` file (numpy's header for `descr`, C order, `shape`) of `data`.
pub fn npy_file(descr: &str, shape: &[u64], data: &[u8]) -> Vec<u8> {
    let mut out = lazyvault_store::npy::write_header(descr, false, shape).unwrap();
    out.extend_from_slice(data);
    out
}
