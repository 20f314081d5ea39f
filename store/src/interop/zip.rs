//! Reading a zip's members (PKWARE's APPNOTE.TXT) one at a time through
//! one open file: the central directory with the `zip` crate (ZIP64 included), each member's
//! bytes copied (stored) or inflated (deflated, with `flate2`) on demand,
//! bounded by the size the directory declares and checked against its
//! CRC-32 at the end.
//!
//! A deflated member that inflates past its declared size is stopped at
//! once, one byte past it (a decompression bomb never gets further than
//! the size the caller accepted); one that ends before it is truncated.

use std::io::{self, Read, Seek, SeekFrom};

use flate2::read::DeflateDecoder;
use zip::{CompressionMethod, ZipArchive};

use super::{invalid, io_wrap};
use crate::error::Result;

/// Zip compression method numbers (APPNOTE 4.4.5) of the members we read.
const STORED: u16 = 0;
const DEFLATED: u16 = 8;

/// What the central directory says of one member.
#[derive(Debug, Clone)]
pub struct MemberInfo {
    /// Position in the central directory.
    pub index: usize,
    /// The name (UTF-8, or CP437 decoded as zip readers do).
    pub name: String,
    /// Compression method number (APPNOTE 4.4.5: 0 stored, 8 deflated,
    /// ...); only those two are read.
    pub method: u16,
    /// Whether the member is encrypted (unsupported).
    pub encrypted: bool,
    /// Bytes of the member's data in the zip (compressed, local header
    /// excluded).
    pub compressed_size: u64,
    /// Bytes of the member once inflated, as declared.
    pub size: u64,
    /// CRC-32 of the inflated bytes, as declared.
    pub crc32: u32,
}

impl MemberInfo {
    /// Whether the member is stored (not compressed).
    pub(crate) fn is_stored(&self) -> bool {
        self.method == STORED
    }

    /// Whether the member is deflated.
    pub(crate) fn is_deflated(&self) -> bool {
        self.method == DEFLATED
    }
}

/// A zip opened for reading its members one at a time, through `R` (one
/// open file).
pub struct ZipIn<R: Read + Seek> {
    zip: ZipArchive<R>,
    /// The file, for messages.
    what: String,
    /// The file's length.
    len: u64,
}

impl<R: Read + Seek> ZipIn<R> {
    /// Reads the central directory of the zip in `reader` (`what` names it).
    ///
    /// # Errors
    /// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) for anything the `zip` crate cannot
    /// read as a zip (truncated, not a zip) and for duplicate member names.
    pub fn new(mut reader: R, what: &str) -> Result<ZipIn<R>> {
        let len = reader
            .seek(SeekFrom::End(0))
            .and_then(|n| reader.seek(SeekFrom::Start(0)).map(|_| n))
            .map_err(|e| invalid(what, format!("cannot read: {e}")))?;
        let zip = ZipArchive::new(reader)
            .map_err(|e| invalid(what, format!("not a readable zip: {e}")))?;
        if zip.has_duplicate_names() {
            let start = zip.central_directory_start();
            let name = duplicate_member(zip.into_inner(), start).unwrap_or_default();
            return Err(invalid(
                what,
                format!(
                    "member {} occurs twice in the zip (which of them is meant is ambiguous)",
                    super::npz::quoted(&name)
                ),
            ));
        }
        let mut zip = zip;
        check_apart(&mut zip, what)?;
        Ok(ZipIn {
            zip,
            what: what.to_owned(),
            len,
        })
    }

    /// Every member, in central-directory order.
    pub fn members(&self) -> Vec<MemberInfo> {
        (0..self.zip.len())
            .filter_map(|index| self.zip.by_index_data(index).ok().map(|e| (index, e)))
            .map(|(index, e)| MemberInfo {
                index,
                name: e
                    .name()
                    .map(|n| n.into_owned())
                    .unwrap_or_else(|_| String::from_utf8_lossy(e.name_raw()).into_owned()),
                method: method_number(e.compression()),
                encrypted: e.encrypted(),
                compressed_size: e.compressed_size(),
                size: e.size(),
                crc32: e.crc32(),
            })
            .collect()
    }

    /// Whether a member is named `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.zip.index_for_name(name).is_some()
    }

    /// A reader of member `m`'s inflated bytes (`what` names it in errors):
    /// at most its declared size; at its end the CRC-32 is checked and,
    /// for a deflated member, that the stream ends there.
    ///
    /// # Errors
    /// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile) for a bad local header or a member that
    /// runs past the end of the file; the reader's errors are
    /// [`InteropError::InvalidFile`](crate::InteropError::InvalidFile)s carried in `io::Error`s (see
    /// `io_wrap` in the parent module): truncated, CRC mismatch, inflates past its
    /// declared size, corrupt deflate data.
    pub fn reader(&mut self, m: &MemberInfo, what: &str) -> Result<MemberReader<'_>> {
        let len = self.len;
        let raw = self
            .zip
            .by_index_raw(m.index)
            .map_err(|e| invalid(what, format!("bad local header: {e}")))?;
        let fits = raw
            .data_start()
            .and_then(|start| start.checked_add(m.compressed_size))
            .is_some_and(|end| end <= len);
        if !fits {
            return Err(invalid(
                what,
                "runs past the end of the file (truncated zip?)",
            ));
        }
        let inner: Box<dyn Read + '_> = if m.is_deflated() {
            Box::new(DeflateDecoder::new(raw))
        } else {
            Box::new(raw)
        };
        Ok(MemberReader {
            inner,
            left: m.size,
            size: m.size,
            crc: crc32fast::Hasher::new(),
            expected: m.crc32,
            what: what.to_owned(),
            check_end: m.is_deflated(),
            done: false,
        })
    }

    /// The file, for messages.
    pub(crate) fn what(&self) -> &str {
        &self.what
    }
}

/// Refuses a zip whose members share bytes: each member's local header and
/// data must lie apart, so that the ratio cap on each member bounds the
/// expansion of the whole file (a directory pointing many members at one
/// deflated stream is the "overlapping files" zip bomb). Members whose
/// local header cannot be read are left to [`ZipIn::reader`], which names
/// them.
fn check_apart<R: Read + Seek>(zip: &mut ZipArchive<R>, what: &str) -> Result<()> {
    let mut spans = Vec::with_capacity(zip.len());
    for index in 0..zip.len() {
        let Ok(f) = zip.by_index_raw(index) else {
            continue;
        };
        let start = f.header_start();
        if let Some(end) = f
            .data_start()
            .and_then(|d| d.checked_add(f.compressed_size()))
        {
            spans.push((start, end, index));
        }
    }
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
        if start < end {
            let mut name = |i: usize| {
                zip.by_index_raw(i)
                    .ok()
                    .and_then(|f| f.name().ok().map(|n| n.into_owned()))
                    .unwrap_or_default()
            };
            let (first, second) = (name(a), name(b));
            return Err(invalid(
                what,
                format!(
                    "members {first:?} and {second:?} share bytes of the file (overlapping members: a zip bomb's trick)"
                ),
            ));
        }
    }
    Ok(())
}

/// The first member name the central directory at `start` of the zip in
/// `reader` lists twice, if any (the zip crate keeps one entry per name and
/// says only that it dropped some). Reads the entries' fixed parts and
/// names (APPNOTE 4.3.12), stopping at the first thing that is not one.
pub fn duplicate_member<R: Read + Seek>(mut reader: R, start: u64) -> Option<String> {
    const CENTRAL_SIG: u32 = 0x0201_4b50;
    reader.seek(SeekFrom::Start(start)).ok()?;
    let mut seen = std::collections::HashSet::new();
    let mut fixed = [0u8; 46];
    while reader.read_exact(&mut fixed).is_ok() {
        if u32::from_le_bytes(fixed[..4].try_into().expect("4 bytes")) != CENTRAL_SIG {
            break;
        }
        let field = |at: usize| u16::from_le_bytes([fixed[at], fixed[at + 1]]);
        let (name_len, extra_len, comment_len) = (field(28), field(30), field(32));
        let mut name = vec![0u8; usize::from(name_len)];
        reader.read_exact(&mut name).ok()?;
        let skip = i64::from(extra_len) + i64::from(comment_len);
        reader.seek(SeekFrom::Current(skip)).ok()?;
        let name = String::from_utf8_lossy(&name).into_owned();
        if !seen.insert(name.clone()) {
            return Some(name);
        }
    }
    None
}

/// Whether the zip in `reader` names a member `name` (`false` for anything
/// that is not a readable zip).
pub(crate) fn has_member<R: Read + Seek>(reader: R, name: &str) -> bool {
    ZipArchive::new(reader).is_ok_and(|z| z.index_for_name(name).is_some())
}

fn method_number(m: CompressionMethod) -> u16 {
    // The method number as stored; deflate is a number here because the
    // zip crate is built without its own codecs (flate2 inflates).
    #[allow(deprecated)]
    m.to_u16()
}

/// The inflated bytes of one member; see [`ZipIn::reader`].
pub struct MemberReader<'a> {
    inner: Box<dyn Read + 'a>,
    /// Declared bytes not read yet.
    left: u64,
    size: u64,
    crc: crc32fast::Hasher,
    expected: u32,
    what: String,
    /// Whether to check that the stream ends at the declared size (deflate;
    /// a stored member's raw reader is already limited to it).
    check_end: bool,
    /// Whether the end was checked.
    done: bool,
}

impl MemberReader<'_> {
    fn fail(&self, detail: String) -> io::Error {
        io_wrap(invalid(&self.what, detail))
    }

    /// The checks at the declared end: nothing more, and the CRC-32.
    fn finish(&mut self) -> io::Result<()> {
        self.done = true;
        if self.check_end {
            let mut probe = [0u8; 1];
            if self.read_inner(&mut probe)? != 0 {
                return Err(self.fail(format!(
                    "bad member: inflates to more than the {} bytes the zip declares \
                     (decompression bomb or corrupt file); stopped there",
                    self.size
                )));
            }
        }
        let crc = std::mem::take(&mut self.crc).finalize();
        if crc != self.expected {
            return Err(self.fail(format!(
                "CRC mismatch (damaged member): CRC-32 {crc:08x}, the zip says {:08x}",
                self.expected
            )));
        }
        Ok(())
    }

    fn read_inner(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.inner.read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // flate2 reports a bad stream as InvalidInput/InvalidData
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData
                    ) =>
                {
                    return Err(self.fail(format!("corrupt deflate data: {e}")))
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Read for MemberReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            if !self.done {
                self.finish()?;
            }
            return Ok(0);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.read_inner(&mut buf[..want])?;
        if n == 0 {
            return Err(self.fail(format!(
                "truncated ({} of {} bytes)",
                self.size - self.left,
                self.size
            )));
        }
        self.crc.update(&buf[..n]);
        self.left -= n as u64;
        if self.left == 0 {
            self.finish()?;
        }
        Ok(n)
    }
}
