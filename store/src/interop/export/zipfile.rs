//! A writer of uncompressed (stored) zip files laid out byte for byte as
//! CPython 3.11's `zipfile` writes them to a seekable file (so that `.npz`
//! exports are the files the former Python writer made): fixed 1980-01-01
//! timestamps, `create_system` 3 (Unix), versions 20 (45 once zip64 fields
//! appear), the UTF-8 flag for non-ASCII names, and zip64 fields by
//! `zipfile`'s own rules (see [`ZipLimits`]).
//!
//! Members are streamed: the local header is written first; when the CRC-32
//! is not known in advance, it is patched into that header after the data
//! (as `zipfile` does). Only the central directory entries (name and a few
//! numbers per member) stay in memory.
//!
//! Layout references: PKWARE APPNOTE 6.3.x sections 4.3.7 (local header),
//! 4.3.12 (central directory), 4.3.14-16 (end records), 4.5.3 (zip64 extra).

use std::io::{self, Seek, SeekFrom, Write};

/// Data alignment of aligned members, as `numpy` pads `.npy` headers.
pub(crate) const ALIGN: u64 = 64;
/// Extra-field id of alignment padding (the one Android's `zipalign` uses).
const ALIGN_EXTRA_ID: u16 = 0xD935;
/// The zip64 extended information extra-field id.
const ZIP64_EXTRA_ID: u16 = 1;
const LOCAL_SIG: &[u8; 4] = b"PK\x03\x04";
const CENTRAL_SIG: &[u8; 4] = b"PK\x01\x02";
const END_SIG: &[u8; 4] = b"PK\x05\x06";
const END64_SIG: &[u8; 4] = b"PK\x06\x06";
const END64_LOCATOR_SIG: &[u8; 4] = b"PK\x06\x07";
const LOCAL_HEADER_LEN: u64 = 30;
/// Offset of the CRC-32 within a local header.
const LOCAL_CRC_OFFSET: u64 = 14;
const VERSION: u8 = 20;
const ZIP64_VERSION: u8 = 45;
/// General purpose flag bit 11: the name is UTF-8.
const UTF8_FLAG: u16 = 0x800;
/// `create_system` 3: Unix (external attributes are a mode).
const CREATE_SYSTEM_UNIX: u8 = 3;
/// MS-DOS date of 1980-01-01 (time 00:00:00 is 0), as `zipfile` packs it.
const DOS_DATE_1980: u16 = 1 << 5 | 1;
/// External attributes: a regular file, mode 0644.
const EXTERNAL_ATTR: u32 = 0o644 << 16;

/// When zip64 fields are written. The defaults are `zipfile`'s
/// (`ZIP64_LIMIT` = 2^31 - 1 bytes, `ZIP_FILECOUNT_LIMIT` = 65,535
/// members): a member of more than `size / 1.05` bytes gets a zip64 local
/// header, one past `size` bytes or starting past `size` a zip64 central
/// entry, and an archive of more than `count` members, or whose central
/// directory starts or ends past `size`, the zip64 end records. Tests lower
/// them to reach those paths with small files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZipLimits {
    /// Bytes (sizes and offsets) past which zip64 fields are used.
    pub size: u64,
    /// Members past which the zip64 end records are written.
    pub count: u64,
}

impl Default for ZipLimits {
    fn default() -> Self {
        ZipLimits {
            size: (1 << 31) - 1,
            count: (1 << 16) - 1,
        }
    }
}

/// What the central directory needs of one member.
struct Entry {
    name: Vec<u8>,
    ascii: bool,
    /// The alignment padding, repeated in the central directory (empty
    /// without [`StoredZipWriter::central_padding`]).
    extra: Vec<u8>,
    crc: u32,
    size: u64,
    header_offset: u64,
    /// 45 when its local header carried zip64 fields, else 20.
    version: u8,
}

/// The member being written.
struct Open {
    declared: u64,
    written: u64,
    /// `None`: computed while writing, patched into the local header.
    crc: Option<u32>,
    hasher: crc32fast::Hasher,
}

/// Writes a stored zip member by member (see the module doc). I/O errors are
/// returned as they are; the caller names the file.
pub(crate) struct StoredZipWriter<W: Write + Seek> {
    out: W,
    pos: u64,
    limits: ZipLimits,
    entries: Vec<Entry>,
    open: Option<Open>,
    /// The central directory repeats each member's alignment padding.
    central_padding: bool,
}

fn misuse(what: &str) -> io::Error {
    io::Error::other(format!("zip writer: {what}"))
}

impl<W: Write + Seek> StoredZipWriter<W> {
    /// A writer whose first member starts at the current position of `out`
    /// (0 for a new file).
    pub(crate) fn new(mut out: W, limits: ZipLimits) -> io::Result<Self> {
        let pos = out.stream_position()?;
        Ok(StoredZipWriter {
            out,
            pos,
            limits,
            entries: Vec::new(),
            open: None,
            central_padding: true,
        })
    }

    /// Whether the central directory repeats each member's alignment
    /// padding (the default, as CPython's `zipfile` writes an `extra` it
    /// was given; exports keep it). Without, the alignment field is in the
    /// local header only, as Android's `zipalign` and the `zip` crate write
    /// it (a member's local and central extra fields may differ): 6 to 69 bytes
    /// less per member, which packs of many small arrays save (FORMAT.md,
    /// "Packs").
    pub(crate) fn central_padding(mut self, repeat: bool) -> Self {
        self.central_padding = repeat;
        self
    }

    /// Starts member `name` of exactly `size` bytes. `align`: its data start
    /// at a multiple of [`ALIGN`] in the file (padding in the local extra
    /// field, as the former Python writer did). `crc`: the CRC-32 of the
    /// data when known (no seek back), or `None`.
    pub(crate) fn begin(
        &mut self,
        name: &str,
        size: u64,
        align: bool,
        crc: Option<u32>,
    ) -> io::Result<()> {
        if self.open.is_some() {
            return Err(misuse("a member is still open"));
        }
        // zipfile: compressed data may be larger than the input, so a zip64
        // local header is chosen from size * 1.05 (a float product, as there)
        let zip64 = size as f64 * 1.05 > self.limits.size as f64;
        let name_bytes = name.as_bytes().to_vec();
        let zip64_len = if zip64 { 20 } else { 0 };
        let mut extra = Vec::new();
        if align {
            let fixed = self.pos + LOCAL_HEADER_LEN + name_bytes.len() as u64 + zip64_len;
            let mut pad = (ALIGN - fixed % ALIGN) % ALIGN;
            if pad > 0 {
                // the smallest extra field is 6 bytes (id, length, alignment)
                if pad < 6 {
                    pad += ALIGN;
                }
                extra.extend_from_slice(&ALIGN_EXTRA_ID.to_le_bytes());
                extra.extend_from_slice(&((pad - 4) as u16).to_le_bytes());
                extra.extend_from_slice(&(ALIGN as u16).to_le_bytes());
                extra.resize(pad as usize, 0);
            }
        }
        let ascii = name.is_ascii();
        let version = if zip64 { ZIP64_VERSION } else { VERSION };
        let mut local_extra = extra.clone();
        let (size32, comp32) = if zip64 {
            local_extra.extend_from_slice(&ZIP64_EXTRA_ID.to_le_bytes());
            local_extra.extend_from_slice(&16u16.to_le_bytes());
            local_extra.extend_from_slice(&size.to_le_bytes());
            local_extra.extend_from_slice(&size.to_le_bytes());
            (u32::MAX, u32::MAX)
        } else {
            (size as u32, size as u32)
        };
        let mut header = Vec::with_capacity(30 + name_bytes.len() + local_extra.len());
        header.extend_from_slice(LOCAL_SIG);
        header.push(version);
        header.push(0); // reserved
        header.extend_from_slice(&flags(ascii).to_le_bytes());
        header.extend_from_slice(&0u16.to_le_bytes()); // stored
        header.extend_from_slice(&0u16.to_le_bytes()); // time 00:00:00
        header.extend_from_slice(&DOS_DATE_1980.to_le_bytes());
        header.extend_from_slice(&crc.unwrap_or(0).to_le_bytes());
        header.extend_from_slice(&comp32.to_le_bytes());
        header.extend_from_slice(&size32.to_le_bytes());
        header.extend_from_slice(&(name_bytes.len() as u16).to_le_bytes());
        header.extend_from_slice(&(local_extra.len() as u16).to_le_bytes());
        header.extend_from_slice(&name_bytes);
        header.extend_from_slice(&local_extra);
        self.out.write_all(&header)?;
        if !self.central_padding {
            extra.clear();
        }
        self.entries.push(Entry {
            name: name_bytes,
            ascii,
            extra,
            crc: crc.unwrap_or(0),
            size,
            header_offset: self.pos,
            version,
        });
        self.pos += header.len() as u64;
        self.open = Some(Open {
            declared: size,
            written: 0,
            crc,
            hasher: crc32fast::Hasher::new(),
        });
        Ok(())
    }

    /// The offset in the output of the next byte written: after
    /// [`Self::begin`], where the member's data start.
    pub(crate) fn position(&self) -> u64 {
        self.pos
    }

    /// Appends `data` to the open member (never past its declared size).
    pub(crate) fn write(&mut self, data: &[u8]) -> io::Result<()> {
        let open = self.open.as_mut().ok_or_else(|| misuse("no open member"))?;
        if open.written + data.len() as u64 > open.declared {
            return Err(misuse("more data than the member's declared size"));
        }
        if open.crc.is_none() {
            open.hasher.update(data);
        }
        self.out.write_all(data)?;
        open.written += data.len() as u64;
        self.pos += data.len() as u64;
        Ok(())
    }

    /// Ends the open member: checks its size and, when its CRC was not
    /// given, patches it into the local header.
    pub(crate) fn end(&mut self) -> io::Result<()> {
        let open = self.open.take().ok_or_else(|| misuse("no open member"))?;
        if open.written != open.declared {
            return Err(misuse("member shorter than its declared size"));
        }
        if open.crc.is_none() {
            let crc = open.hasher.finalize();
            let entry = self.entries.last_mut().expect("begin pushed it");
            entry.crc = crc;
            self.out
                .seek(SeekFrom::Start(entry.header_offset + LOCAL_CRC_OFFSET))?;
            self.out.write_all(&crc.to_le_bytes())?;
            self.out.seek(SeekFrom::Start(self.pos))?;
        }
        Ok(())
    }

    /// Writes a whole member from memory (CRC computed first: no seek).
    pub(crate) fn add(&mut self, name: &str, data: &[u8], align: bool) -> io::Result<()> {
        self.begin(name, data.len() as u64, align, Some(crc32fast::hash(data)))?;
        self.write(data)?;
        self.end()
    }

    /// Writes the central directory and the end records; returns the
    /// output (not flushed).
    pub(crate) fn finish(mut self) -> io::Result<W> {
        if self.open.is_some() {
            return Err(misuse("a member is still open"));
        }
        let cd_start = self.pos;
        let mut cd = Vec::with_capacity(1 << 16);
        for e in &self.entries {
            central_entry(&mut cd, e, self.limits.size);
            if cd.len() >= 1 << 16 {
                self.out.write_all(&cd)?;
                self.pos += cd.len() as u64;
                cd.clear();
            }
        }
        self.out.write_all(&cd)?;
        self.pos += cd.len() as u64;
        let end = end_records(self.entries.len() as u64, cd_start, self.pos, self.limits);
        self.out.write_all(&end)?;
        Ok(self.out)
    }
}

/// Appends the central directory entry of `e` to `cd`: zip64 fields (sizes,
/// offset) only for the values past `limit`, before the alignment padding.
fn central_entry(cd: &mut Vec<u8>, e: &Entry, limit: u64) {
    let mut zip64 = Vec::new();
    let size32 = if e.size > limit {
        zip64.extend([e.size, e.size]);
        u32::MAX
    } else {
        e.size as u32
    };
    let offset32 = if e.header_offset > limit {
        zip64.push(e.header_offset);
        u32::MAX
    } else {
        e.header_offset as u32
    };
    let mut extra = Vec::new();
    if !zip64.is_empty() {
        extra.extend_from_slice(&ZIP64_EXTRA_ID.to_le_bytes());
        extra.extend_from_slice(&(8 * zip64.len() as u16).to_le_bytes());
        for v in &zip64 {
            extra.extend_from_slice(&v.to_le_bytes());
        }
    }
    extra.extend_from_slice(&e.extra);
    let version = if zip64.is_empty() {
        e.version
    } else {
        ZIP64_VERSION
    };
    cd.extend_from_slice(CENTRAL_SIG);
    cd.push(version); // version made by
    cd.push(CREATE_SYSTEM_UNIX);
    cd.push(version); // version needed to extract
    cd.push(0); // reserved
    cd.extend_from_slice(&flags(e.ascii).to_le_bytes());
    cd.extend_from_slice(&0u16.to_le_bytes()); // stored
    cd.extend_from_slice(&0u16.to_le_bytes()); // time
    cd.extend_from_slice(&DOS_DATE_1980.to_le_bytes());
    cd.extend_from_slice(&e.crc.to_le_bytes());
    cd.extend_from_slice(&size32.to_le_bytes());
    cd.extend_from_slice(&size32.to_le_bytes());
    cd.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
    cd.extend_from_slice(&(extra.len() as u16).to_le_bytes());
    cd.extend_from_slice(&0u16.to_le_bytes()); // comment length
    cd.extend_from_slice(&0u16.to_le_bytes()); // disk number
    cd.extend_from_slice(&0u16.to_le_bytes()); // internal attributes
    cd.extend_from_slice(&EXTERNAL_ATTR.to_le_bytes());
    cd.extend_from_slice(&offset32.to_le_bytes());
    cd.extend_from_slice(&e.name);
    cd.extend_from_slice(&extra);
}

/// The end of central directory record of `count` members whose directory
/// spans `cd_start..cd_end`, preceded by the zip64 end record and locator
/// when a value is past `limits`.
fn end_records(count: u64, cd_start: u64, cd_end: u64, limits: ZipLimits) -> Vec<u8> {
    let cd_size = cd_end - cd_start;
    let mut end = Vec::with_capacity(98);
    if count > limits.count || cd_start > limits.size || cd_size > limits.size {
        end.extend_from_slice(END64_SIG);
        end.extend_from_slice(&44u64.to_le_bytes()); // size of the rest
        end.extend_from_slice(&u16::from(ZIP64_VERSION).to_le_bytes());
        end.extend_from_slice(&u16::from(ZIP64_VERSION).to_le_bytes());
        end.extend_from_slice(&0u32.to_le_bytes()); // this disk
        end.extend_from_slice(&0u32.to_le_bytes()); // disk of the directory
        end.extend_from_slice(&count.to_le_bytes());
        end.extend_from_slice(&count.to_le_bytes());
        end.extend_from_slice(&cd_size.to_le_bytes());
        end.extend_from_slice(&cd_start.to_le_bytes());
        end.extend_from_slice(END64_LOCATOR_SIG);
        end.extend_from_slice(&0u32.to_le_bytes());
        end.extend_from_slice(&cd_end.to_le_bytes());
        end.extend_from_slice(&1u32.to_le_bytes()); // disks
    }
    let count16 = count.min(0xFFFF) as u16;
    end.extend_from_slice(END_SIG);
    end.extend_from_slice(&0u16.to_le_bytes());
    end.extend_from_slice(&0u16.to_le_bytes());
    end.extend_from_slice(&count16.to_le_bytes());
    end.extend_from_slice(&count16.to_le_bytes());
    end.extend_from_slice(&(cd_size.min(0xFFFF_FFFF) as u32).to_le_bytes());
    end.extend_from_slice(&(cd_start.min(0xFFFF_FFFF) as u32).to_le_bytes());
    end.extend_from_slice(&0u16.to_le_bytes()); // comment length
    end
}

fn flags(ascii: bool) -> u16 {
    if ascii {
        0
    } else {
        UTF8_FLAG
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Cursor, Read};

    fn build(limits: ZipLimits, members: &[(&str, Vec<u8>, bool, bool)]) -> Vec<u8> {
        let mut z = StoredZipWriter::new(Cursor::new(Vec::new()), limits).unwrap();
        for (name, data, align, streamed) in members {
            if *streamed {
                z.begin(name, data.len() as u64, *align, None).unwrap();
                for chunk in data.chunks(7) {
                    z.write(chunk).unwrap();
                }
                z.end().unwrap();
            } else {
                z.add(name, data, *align).unwrap();
            }
        }
        z.finish().unwrap().into_inner()
    }

    fn read_back(bytes: &[u8]) -> Vec<(String, Vec<u8>, u64)> {
        let mut zip = zip::ZipArchive::new(Cursor::new(bytes)).unwrap();
        (0..zip.len())
            .map(|i| {
                let mut f = zip.by_index(i).unwrap();
                let mut data = Vec::new();
                f.read_to_end(&mut data).unwrap();
                let start = f.data_start().unwrap();
                (f.name().unwrap().into_owned(), data, start)
            })
            .collect()
    }

    fn members() -> Vec<(&'static str, Vec<u8>, bool, bool)> {
        vec![
            ("__lazyvault__.json", b"{}".to_vec(), false, false),
            ("a/x.npy", (0..200u8).collect(), true, true),
            ("名前/y.npy", vec![7; 3], true, false),
            ("e.npy", Vec::new(), true, true),
        ]
    }

    #[test]
    fn members_round_trip_through_the_zip_crate_aligned() {
        let bytes = build(ZipLimits::default(), &members());
        let back = read_back(&bytes);
        assert_eq!(back.len(), 4);
        for ((name, data, align, _), (got_name, got, start)) in members().iter().zip(&back) {
            assert_eq!(name, got_name);
            assert_eq!(data, got);
            if *align {
                assert_eq!(start % ALIGN, 0, "{name}");
            }
        }
        // no zip64 end record below the limits
        assert!(!bytes.windows(4).any(|w| w == END64_SIG));
    }

    #[test]
    fn without_central_padding_the_alignment_field_is_local_only() {
        let mut z = StoredZipWriter::new(Cursor::new(Vec::new()), ZipLimits::default())
            .unwrap()
            .central_padding(false);
        for (name, data, align, _) in members() {
            z.add(name, &data, align).unwrap();
        }
        let bytes = z.finish().unwrap().into_inner();
        let padded = build(ZipLimits::default(), &members());
        // the same local headers and data, a shorter central directory
        let mut zip = zip::ZipArchive::new(Cursor::new(&bytes)).unwrap();
        zip.validate_header_consistency().unwrap();
        let cd = zip.central_directory_start() as usize;
        assert_eq!(bytes[..cd], padded[..cd]);
        assert!(bytes.len() < padded.len());
        for i in 0..zip.len() {
            assert_eq!(zip.by_index_raw(i).unwrap().extra_data(), None);
        }
        for ((name, data, align, _), (got_name, got, start)) in
            members().iter().zip(read_back(&bytes))
        {
            assert_eq!((name, data), (&got_name.as_str(), &got));
            if *align {
                assert_eq!(start % ALIGN, 0, "{name}");
            }
        }
    }

    #[test]
    fn zip64_paths_with_small_limits() {
        // every size and offset past the limit, more members than the count
        let limits = ZipLimits { size: 0, count: 2 };
        let bytes = build(limits, &members());
        assert!(bytes.windows(4).any(|w| w == END64_SIG));
        let back = read_back(&bytes);
        for ((name, data, align, _), (got_name, got, start)) in members().iter().zip(&back) {
            assert_eq!((name, data), (&got_name.as_str(), got));
            if *align {
                assert_eq!(start % ALIGN, 0, "{name}");
            }
        }
        // only the count past its limit
        let bytes = build(
            ZipLimits {
                size: u64::from(u32::MAX),
                count: 1,
            },
            &members(),
        );
        assert!(bytes.windows(4).any(|w| w == END64_SIG));
        assert_eq!(read_back(&bytes).len(), 4);
    }

    #[test]
    fn a_member_of_the_wrong_size_is_refused() {
        let mut z = StoredZipWriter::new(Cursor::new(Vec::new()), ZipLimits::default()).unwrap();
        z.begin("a", 3, false, None).unwrap();
        z.write(b"ab").unwrap();
        assert!(z.write(b"cd").is_err());
        assert!(z.end().is_err());
    }
}
