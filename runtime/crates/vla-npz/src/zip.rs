//! The zip container as numpy uses it: reading the central directory (with zip64 end
//! records and extra fields, which `np.savez` writes through `force_zip64`), locating each
//! entry's data behind its local header, inflating deflated entries and checking CRC-32;
//! and writing stored, deterministic archives. Every offset and size read from the archive
//! is checked against the bytes present before it is used.

use std::borrow::Cow;
use std::io::{self, Write};

use miniz_oxide::inflate::core::{decompress, inflate_flags, DecompressorOxide};
use miniz_oxide::inflate::TINFLStatus;

use crate::NpzError;
use crc32fast::hash as crc32;

const LOCAL_HEADER_SIG: u32 = 0x0403_4b50;
const CENTRAL_HEADER_SIG: u32 = 0x0201_4b50;
const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const ZIP64_EXTRA_ID: u16 = 0x0001;

const LOCAL_HEADER_LEN: usize = 30;
const CENTRAL_HEADER_LEN: usize = 46;
const EOCD_LEN: usize = 22;
const ZIP64_EOCD_LEN: usize = 56;
const ZIP64_LOCATOR_LEN: usize = 20;
const MAX_COMMENT_LEN: usize = u16::MAX as usize;

const METHOD_STORED: u16 = 0;
const METHOD_DEFLATE: u16 = 8;
const FLAG_ENCRYPTED: u16 = 0x0001;
const FLAG_STRONG_ENCRYPTION: u16 = 0x0040;
const FLAG_UTF8_NAME: u16 = 0x0800;

/// Deflate cannot expand a stream by more than about 1032:1; a size claim beyond that is a
/// lie and is refused before allocating for it.
const MAX_DEFLATE_RATIO: usize = 1032;
const DEFLATE_RATIO_SLACK: usize = 1024;

/// One entry as the central directory describes it, with its data located.
#[derive(Clone, Debug)]
pub(crate) struct ZipEntry {
    pub name: String,
    pub flags: u16,
    pub method: u16,
    pub crc32: u32,
    pub compressed_size: usize,
    pub uncompressed_size: usize,
    pub data_offset: usize,
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    let raw = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes([raw[0], raw[1]]))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let raw = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let raw = bytes.get(at..at.checked_add(8)?)?;
    let mut le = [0u8; 8];
    le.copy_from_slice(raw);
    Some(u64::from_le_bytes(le))
}

struct ZipContext<'a> {
    file: &'a str,
}

impl ZipContext<'_> {
    fn corrupt(&self, entry: Option<&str>, reason: impl Into<String>) -> NpzError {
        NpzError::CorruptZip {
            file: self.file.to_string(),
            entry: entry.map(str::to_string),
            reason: reason.into(),
        }
    }

    fn unsupported(&self, entry: Option<&str>, reason: impl Into<String>) -> NpzError {
        NpzError::UnsupportedZip {
            file: self.file.to_string(),
            entry: entry.map(str::to_string),
            reason: reason.into(),
        }
    }
}

/// The end-of-central-directory record: searched backwards, since a comment may follow it.
fn find_eocd(bytes: &[u8]) -> Option<usize> {
    let last = bytes.len().checked_sub(EOCD_LEN)?;
    let first = last.saturating_sub(MAX_COMMENT_LEN);
    (first..=last).rev().find(|&pos| {
        u32_at(bytes, pos) == Some(EOCD_SIG)
            && u16_at(bytes, pos + 20)
                .is_some_and(|comment| pos + EOCD_LEN + usize::from(comment) <= bytes.len())
    })
}

struct Directory {
    entry_count: u64,
    offset: usize,
    size: usize,
    /// Where the end records start; the central directory must end before it.
    end: usize,
}

fn read_directory_location(bytes: &[u8], ctx: &ZipContext<'_>) -> Result<Directory, NpzError> {
    let eocd = find_eocd(bytes).ok_or_else(|| NpzError::NotZip {
        file: ctx.file.to_string(),
        len: bytes.len(),
    })?;
    // The record was found with its full length in bounds, so these reads succeed.
    let field16 = |at| u64::from(u16_at(bytes, eocd + at).unwrap_or(0));
    let field32 = |at| u64::from(u32_at(bytes, eocd + at).unwrap_or(0));
    let mut disk = field16(4);
    let mut directory_disk = field16(6);
    let mut entries_on_disk = field16(8);
    let mut entry_count = field16(10);
    let mut size = field32(12);
    let mut offset = field32(16);
    let mut end = eocd;

    let has_locator = eocd >= ZIP64_LOCATOR_LEN
        && u32_at(bytes, eocd - ZIP64_LOCATOR_LEN) == Some(ZIP64_LOCATOR_SIG);
    if has_locator {
        let locator = eocd - ZIP64_LOCATOR_LEN;
        let record = u64_at(bytes, locator + 8)
            .and_then(|at| usize::try_from(at).ok())
            .filter(|&at| at.checked_add(ZIP64_EOCD_LEN).is_some_and(|e| e <= locator))
            .ok_or_else(|| ctx.corrupt(None, "zip64 end record offset points outside the file"))?;
        if u32_at(bytes, record) != Some(ZIP64_EOCD_SIG) {
            return Err(ctx.corrupt(
                None,
                format!("no zip64 end record signature at offset {record}"),
            ));
        }
        let read32 = |at| u64::from(u32_at(bytes, record + at).unwrap_or(0));
        let read64 = |at| u64_at(bytes, record + at).unwrap_or(0);
        disk = read32(16);
        directory_disk = read32(20);
        entries_on_disk = read64(24);
        entry_count = read64(32);
        size = read64(40);
        offset = read64(48);
        end = record;
    }

    if disk != 0 || directory_disk != 0 || entries_on_disk != entry_count {
        return Err(ctx.unsupported(None, "archive spans several disks"));
    }
    let offset = usize::try_from(offset).unwrap_or(usize::MAX);
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    if offset
        .checked_add(size)
        .is_none_or(|directory_end| directory_end > end)
    {
        return Err(ctx.corrupt(
            None,
            format!(
                "central directory ({size} bytes at offset {offset}) does not fit before the end \
                 record at offset {end}"
            ),
        ));
    }
    Ok(Directory {
        entry_count,
        offset,
        size,
        end,
    })
}

/// Sizes and offset after applying the zip64 extra field, which carries the true value of
/// each 32-bit field that holds the 0xFFFFFFFF marker, in this fixed order.
fn apply_zip64_extra(
    extra: &[u8],
    uncompressed: &mut u64,
    compressed: &mut u64,
    local_offset: &mut u64,
    ctx: &ZipContext<'_>,
    name: &str,
) -> Result<(), NpzError> {
    let mut pos = 0;
    while pos < extra.len() {
        let (Some(id), Some(len)) = (u16_at(extra, pos), u16_at(extra, pos + 2)) else {
            return Err(ctx.corrupt(Some(name), "extra field header is truncated"));
        };
        let body_start = pos + 4;
        let body = extra
            .get(body_start..body_start + usize::from(len))
            .ok_or_else(|| ctx.corrupt(Some(name), "extra field overruns its header"))?;
        if id == ZIP64_EXTRA_ID {
            let mut field = 0;
            for value in [uncompressed, compressed, local_offset] {
                if *value == u64::from(u32::MAX) {
                    *value = u64_at(body, field).ok_or_else(|| {
                        ctx.corrupt(
                            Some(name),
                            "zip64 extra field lacks a size or offset it must carry",
                        )
                    })?;
                    field += 8;
                }
            }
            return Ok(());
        }
        pos = body_start + usize::from(len);
    }
    Ok(())
}

/// Parses the central directory and every local header it points to.
pub(crate) fn read_entries(bytes: &[u8], file: &str) -> Result<Vec<ZipEntry>, NpzError> {
    let ctx = ZipContext { file };
    let directory = read_directory_location(bytes, &ctx)?;
    let records = &bytes[directory.offset..directory.offset + directory.size];

    let plausible_count = records.len() / CENTRAL_HEADER_LEN;
    let mut entries = Vec::with_capacity(plausible_count.min(directory.entry_count as usize));
    let mut pos = 0;
    while pos < records.len() {
        let index = entries.len();
        let truncated = || {
            ctx.corrupt(
                None,
                format!("central directory record {index} is truncated"),
            )
        };
        if u32_at(records, pos) != Some(CENTRAL_HEADER_SIG) {
            return Err(ctx.corrupt(
                None,
                format!(
                    "no central directory signature at offset {}",
                    directory.offset + pos
                ),
            ));
        }
        let field16 = |at: usize| u16_at(records, pos + at).ok_or_else(truncated);
        let field32 = |at: usize| u32_at(records, pos + at).ok_or_else(truncated);
        let flags = field16(8)?;
        let method = field16(10)?;
        let crc = field32(16)?;
        let mut compressed = u64::from(field32(20)?);
        let mut uncompressed = u64::from(field32(24)?);
        let name_len = usize::from(field16(28)?);
        let extra_len = usize::from(field16(30)?);
        let comment_len = usize::from(field16(32)?);
        let mut local_offset = u64::from(field32(42)?);
        let name_start = pos + CENTRAL_HEADER_LEN;
        let extra_start = name_start + name_len;
        let record_end = extra_start + extra_len + comment_len;
        if record_end > records.len() {
            return Err(truncated());
        }
        let raw_name = &records[name_start..extra_start];
        let name = String::from_utf8_lossy(raw_name).into_owned();
        let extra = &records[extra_start..extra_start + extra_len];
        apply_zip64_extra(
            extra,
            &mut uncompressed,
            &mut compressed,
            &mut local_offset,
            &ctx,
            &name,
        )?;

        let data_offset = locate_data(
            bytes,
            &directory,
            local_offset,
            compressed,
            raw_name,
            &ctx,
            &name,
        )?;
        entries.push(ZipEntry {
            name,
            flags,
            method,
            crc32: crc,
            // Bounded by the archive length in `locate_data`.
            compressed_size: compressed as usize,
            uncompressed_size: usize::try_from(uncompressed).unwrap_or(usize::MAX),
            data_offset,
        });
        pos = record_end;
    }
    if entries.len() as u64 != directory.entry_count {
        return Err(ctx.corrupt(
            None,
            format!(
                "end record counts {} entries, central directory holds {}",
                directory.entry_count,
                entries.len()
            ),
        ));
    }
    Ok(entries)
}

/// Follows an entry's local header to the start of its data, checking that the data lies
/// before the central directory.
fn locate_data(
    bytes: &[u8],
    directory: &Directory,
    local_offset: u64,
    compressed: u64,
    central_name: &[u8],
    ctx: &ZipContext<'_>,
    name: &str,
) -> Result<usize, NpzError> {
    let header = usize::try_from(local_offset)
        .ok()
        .filter(|&at| u32_at(bytes, at) == Some(LOCAL_HEADER_SIG))
        .ok_or_else(|| {
            ctx.corrupt(
                Some(name),
                format!("no local header at offset {local_offset}"),
            )
        })?;
    let (Some(name_len), Some(extra_len)) =
        (u16_at(bytes, header + 26), u16_at(bytes, header + 28))
    else {
        return Err(ctx.corrupt(Some(name), "local header is truncated"));
    };
    let name_start = header + LOCAL_HEADER_LEN;
    let local_name = bytes.get(name_start..name_start + usize::from(name_len));
    if local_name != Some(central_name) {
        return Err(ctx.corrupt(
            Some(name),
            "local header names a different entry than the central directory",
        ));
    }
    let data_offset = name_start + usize::from(name_len) + usize::from(extra_len);
    let fits = usize::try_from(compressed)
        .ok()
        .and_then(|len| data_offset.checked_add(len))
        .is_some_and(|data_end| data_end <= directory.offset.min(directory.end));
    if !fits {
        return Err(ctx.corrupt(
            Some(name),
            format!(
                "{compressed} bytes of data at offset {data_offset} run past the central directory \
                 at offset {}",
                directory.offset
            ),
        ));
    }
    Ok(data_offset)
}

/// The entry's uncompressed bytes, CRC-checked: borrowed for stored entries, inflated into
/// an exactly-sized buffer for deflated ones.
pub(crate) fn entry_data<'a>(
    archive: &'a [u8],
    entry: &ZipEntry,
    file: &str,
) -> Result<Cow<'a, [u8]>, NpzError> {
    let ctx = ZipContext { file };
    let name = Some(entry.name.as_str());
    if entry.flags & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION) != 0 {
        return Err(ctx.unsupported(name, "encrypted entry"));
    }
    let raw = &archive[entry.data_offset..entry.data_offset + entry.compressed_size];
    let data = match entry.method {
        METHOD_STORED => {
            if entry.uncompressed_size != entry.compressed_size {
                return Err(ctx.corrupt(
                    name,
                    format!(
                        "stored entry has compressed size {} but uncompressed size {}",
                        entry.compressed_size, entry.uncompressed_size
                    ),
                ));
            }
            Cow::Borrowed(raw)
        }
        METHOD_DEFLATE => Cow::Owned(inflate(raw, entry.uncompressed_size, &ctx, &entry.name)?),
        other => {
            return Err(ctx.unsupported(
                name,
                format!("compression method {other} (only stored and deflate are read)"),
            ))
        }
    };
    let computed = crc32(&data);
    if computed != entry.crc32 {
        return Err(NpzError::CrcMismatch {
            file: file.to_string(),
            entry: entry.name.clone(),
            recorded: entry.crc32,
            computed,
        });
    }
    Ok(data)
}

fn inflate(
    raw: &[u8],
    expected_len: usize,
    ctx: &ZipContext<'_>,
    name: &str,
) -> Result<Vec<u8>, NpzError> {
    let ceiling = raw
        .len()
        .saturating_mul(MAX_DEFLATE_RATIO)
        .saturating_add(DEFLATE_RATIO_SLACK);
    if expected_len > ceiling {
        return Err(ctx.corrupt(
            Some(name),
            format!(
                "claims {expected_len} bytes inflated from {} deflated bytes, more than deflate can \
                 produce",
                raw.len()
            ),
        ));
    }
    let mut out = vec![0u8; expected_len];
    let mut decompressor = Box::<DecompressorOxide>::default();
    let (status, _, written) = decompress(
        &mut decompressor,
        raw,
        &mut out,
        0,
        inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF,
    );
    match status {
        TINFLStatus::Done if written == expected_len => Ok(out),
        TINFLStatus::Done => Err(ctx.corrupt(
            Some(name),
            format!("inflates to {written} bytes, the directory records {expected_len}"),
        )),
        TINFLStatus::HasMoreOutput => Err(ctx.corrupt(
            Some(name),
            format!("inflates to more than the {expected_len} bytes the directory records"),
        )),
        TINFLStatus::NeedsMoreInput | TINFLStatus::FailedCannotMakeProgress => Err(ctx.corrupt(
            Some(name),
            format!("deflate stream ends early (after {written} bytes)"),
        )),
        failed => Err(ctx.corrupt(
            Some(name),
            format!("deflate stream is invalid ({failed:?})"),
        )),
    }
}

/// One entry to write: its name and its content as consecutive parts (header, data).
pub(crate) struct NewEntry<'a> {
    pub name: &'a str,
    pub parts: [&'a [u8]; 2],
    pub crc32: u32,
}

impl NewEntry<'_> {
    fn len(&self) -> u64 {
        self.parts.iter().map(|part| part.len() as u64).sum()
    }
}

const ZIP64_MARKER: u32 = u32::MAX;
const VERSION_PLAIN: u16 = 20;
const VERSION_ZIP64: u16 = 45;
const HOST_UNIX: u16 = 3 << 8;
/// A regular file with mode 0644, as `zipfile` records it.
const EXTERNAL_ATTRIBUTES: u32 = 0o100644 << 16;
/// 1980-01-01 00:00, the earliest DOS date: a fixed timestamp keeps archives reproducible.
const DOS_DATE: u16 = (1 << 5) | 1;
const DOS_TIME: u16 = 0;

fn needs_zip64(value: u64) -> bool {
    value >= u64::from(ZIP64_MARKER)
}

fn field32(value: u64, zip64: bool) -> u32 {
    if zip64 {
        ZIP64_MARKER
    } else {
        value as u32
    }
}

/// Writes a stored (uncompressed) archive. Zip64 fields appear only where a size, offset or
/// count needs them, unless `force_zip64` asks for them everywhere (as numpy writes).
pub(crate) fn write_stored_zip(
    out: &mut impl Write,
    entries: &[NewEntry<'_>],
    force_zip64: bool,
) -> io::Result<()> {
    struct Written {
        offset: u64,
        len: u64,
    }
    let mut position = 0u64;
    let mut written = Vec::with_capacity(entries.len());
    for entry in entries {
        let len = entry.len();
        let size_zip64 = force_zip64 || needs_zip64(len);
        let flags = if entry.name.is_ascii() {
            0
        } else {
            FLAG_UTF8_NAME
        };
        let mut header = Vec::with_capacity(LOCAL_HEADER_LEN + entry.name.len() + 20);
        header.extend_from_slice(&LOCAL_HEADER_SIG.to_le_bytes());
        header.extend_from_slice(
            &(if size_zip64 {
                VERSION_ZIP64
            } else {
                VERSION_PLAIN
            })
            .to_le_bytes(),
        );
        header.extend_from_slice(&flags.to_le_bytes());
        header.extend_from_slice(&METHOD_STORED.to_le_bytes());
        header.extend_from_slice(&DOS_TIME.to_le_bytes());
        header.extend_from_slice(&DOS_DATE.to_le_bytes());
        header.extend_from_slice(&entry.crc32.to_le_bytes());
        header.extend_from_slice(&field32(len, size_zip64).to_le_bytes());
        header.extend_from_slice(&field32(len, size_zip64).to_le_bytes());
        header.extend_from_slice(&(entry.name.len() as u16).to_le_bytes());
        header.extend_from_slice(&(if size_zip64 { 20u16 } else { 0 }).to_le_bytes());
        header.extend_from_slice(entry.name.as_bytes());
        if size_zip64 {
            // The local zip64 field always carries both sizes.
            header.extend_from_slice(&ZIP64_EXTRA_ID.to_le_bytes());
            header.extend_from_slice(&16u16.to_le_bytes());
            header.extend_from_slice(&len.to_le_bytes());
            header.extend_from_slice(&len.to_le_bytes());
        }
        out.write_all(&header)?;
        for part in entry.parts {
            out.write_all(part)?;
        }
        written.push(Written {
            offset: position,
            len,
        });
        position += header.len() as u64 + len;
    }

    let directory_offset = position;
    let mut directory = Vec::new();
    for (entry, placed) in entries.iter().zip(&written) {
        let size_zip64 = force_zip64 || needs_zip64(placed.len);
        let offset_zip64 = force_zip64 || needs_zip64(placed.offset);
        let mut extra = Vec::new();
        if size_zip64 {
            extra.extend_from_slice(&placed.len.to_le_bytes());
            extra.extend_from_slice(&placed.len.to_le_bytes());
        }
        if offset_zip64 {
            extra.extend_from_slice(&placed.offset.to_le_bytes());
        }
        let version = if extra.is_empty() {
            VERSION_PLAIN
        } else {
            VERSION_ZIP64
        };
        let flags = if entry.name.is_ascii() {
            0
        } else {
            FLAG_UTF8_NAME
        };
        directory.extend_from_slice(&CENTRAL_HEADER_SIG.to_le_bytes());
        directory.extend_from_slice(&(HOST_UNIX | version).to_le_bytes());
        directory.extend_from_slice(&version.to_le_bytes());
        directory.extend_from_slice(&flags.to_le_bytes());
        directory.extend_from_slice(&METHOD_STORED.to_le_bytes());
        directory.extend_from_slice(&DOS_TIME.to_le_bytes());
        directory.extend_from_slice(&DOS_DATE.to_le_bytes());
        directory.extend_from_slice(&entry.crc32.to_le_bytes());
        directory.extend_from_slice(&field32(placed.len, size_zip64).to_le_bytes());
        directory.extend_from_slice(&field32(placed.len, size_zip64).to_le_bytes());
        directory.extend_from_slice(&(entry.name.len() as u16).to_le_bytes());
        let extra_len = if extra.is_empty() { 0 } else { extra.len() + 4 };
        directory.extend_from_slice(&(extra_len as u16).to_le_bytes());
        directory.extend_from_slice(&0u16.to_le_bytes()); // comment length
        directory.extend_from_slice(&0u16.to_le_bytes()); // disk number
        directory.extend_from_slice(&0u16.to_le_bytes()); // internal attributes
        directory.extend_from_slice(&EXTERNAL_ATTRIBUTES.to_le_bytes());
        directory.extend_from_slice(&field32(placed.offset, offset_zip64).to_le_bytes());
        directory.extend_from_slice(entry.name.as_bytes());
        if !extra.is_empty() {
            directory.extend_from_slice(&ZIP64_EXTRA_ID.to_le_bytes());
            directory.extend_from_slice(&(extra.len() as u16).to_le_bytes());
            directory.extend_from_slice(&extra);
        }
    }
    out.write_all(&directory)?;

    let count = entries.len() as u64;
    let directory_size = directory.len() as u64;
    let end_zip64 = force_zip64
        || count >= u64::from(u16::MAX)
        || needs_zip64(directory_size)
        || needs_zip64(directory_offset);
    let mut end = Vec::with_capacity(ZIP64_EOCD_LEN + ZIP64_LOCATOR_LEN + EOCD_LEN);
    if end_zip64 {
        let record_offset = directory_offset + directory_size;
        end.extend_from_slice(&ZIP64_EOCD_SIG.to_le_bytes());
        end.extend_from_slice(&((ZIP64_EOCD_LEN - 12) as u64).to_le_bytes());
        end.extend_from_slice(&(HOST_UNIX | VERSION_ZIP64).to_le_bytes());
        end.extend_from_slice(&VERSION_ZIP64.to_le_bytes());
        end.extend_from_slice(&0u32.to_le_bytes()); // this disk
        end.extend_from_slice(&0u32.to_le_bytes()); // directory disk
        end.extend_from_slice(&count.to_le_bytes());
        end.extend_from_slice(&count.to_le_bytes());
        end.extend_from_slice(&directory_size.to_le_bytes());
        end.extend_from_slice(&directory_offset.to_le_bytes());
        end.extend_from_slice(&ZIP64_LOCATOR_SIG.to_le_bytes());
        end.extend_from_slice(&0u32.to_le_bytes()); // disk of the zip64 record
        end.extend_from_slice(&record_offset.to_le_bytes());
        end.extend_from_slice(&1u32.to_le_bytes()); // total disks
    }
    let count16 = u16::try_from(count).unwrap_or(u16::MAX);
    end.extend_from_slice(&EOCD_SIG.to_le_bytes());
    end.extend_from_slice(&0u16.to_le_bytes());
    end.extend_from_slice(&0u16.to_le_bytes());
    end.extend_from_slice(&count16.to_le_bytes());
    end.extend_from_slice(&count16.to_le_bytes());
    end.extend_from_slice(&field32(directory_size, needs_zip64(directory_size)).to_le_bytes());
    end.extend_from_slice(&field32(directory_offset, needs_zip64(directory_offset)).to_le_bytes());
    end.extend_from_slice(&0u16.to_le_bytes()); // comment length
    out.write_all(&end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_is_zips_crc32() {
        // IEEE 802.3, reflected: the standard check value, and zero for nothing.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        let mut split = crc32fast::Hasher::new();
        split.update(b"1234");
        split.update(b"56789");
        assert_eq!(
            split.finalize(),
            0xCBF4_3926,
            "incremental over a header and its data"
        );
    }

    fn archive(entries: &[(&str, &[u8])], force_zip64: bool) -> Vec<u8> {
        let new: Vec<NewEntry<'_>> = entries
            .iter()
            .map(|(name, data)| NewEntry {
                name,
                parts: [&data[..1.min(data.len())], &data[1.min(data.len())..]],
                crc32: crc32(data),
            })
            .collect();
        let mut out = Vec::new();
        write_stored_zip(&mut out, &new, force_zip64).unwrap();
        out
    }

    #[test]
    fn written_archives_read_back_with_and_without_zip64() {
        let files: [(&str, &[u8]); 3] = [("a.npy", b"alpha"), ("b/c.npy", b""), ("é.npy", b"x")];
        for force in [false, true] {
            let bytes = archive(&files, force);
            let entries = read_entries(&bytes, "t.zip").unwrap();
            assert_eq!(entries.len(), 3);
            for (entry, (name, data)) in entries.iter().zip(files) {
                assert_eq!(entry.name, name);
                assert_eq!(&*entry_data(&bytes, entry, "t.zip").unwrap(), data);
            }
            assert_eq!(
                bytes
                    .windows(4)
                    .any(|w| w == ZIP64_LOCATOR_SIG.to_le_bytes()),
                force
            );
        }
    }

    #[test]
    fn deflated_entry_inflates_and_lies_are_caught() {
        let payload: Vec<u8> = (0..5000u32).map(|i| (i % 13) as u8).collect();
        let deflated = miniz_oxide::deflate::compress_to_vec(&payload, 6);
        let entry = ZipEntry {
            name: "d.npy".into(),
            flags: 0,
            method: METHOD_DEFLATE,
            crc32: crc32(&payload),
            compressed_size: deflated.len(),
            uncompressed_size: payload.len(),
            data_offset: 0,
        };
        assert_eq!(&*entry_data(&deflated, &entry, "t").unwrap(), &payload[..]);

        let too_short = ZipEntry {
            uncompressed_size: payload.len() - 1,
            ..entry.clone()
        };
        let err = entry_data(&deflated, &too_short, "t").unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        let too_long = ZipEntry {
            uncompressed_size: payload.len() + 1,
            ..entry.clone()
        };
        assert!(entry_data(&deflated, &too_long, "t").is_err());
        let bomb = ZipEntry {
            uncompressed_size: usize::MAX,
            ..entry.clone()
        };
        let err = entry_data(&deflated, &bomb, "t").unwrap_err();
        assert!(
            err.to_string().contains("more than deflate can produce"),
            "{err}"
        );
        let cut = ZipEntry {
            compressed_size: deflated.len() / 2,
            ..entry.clone()
        };
        assert!(entry_data(&deflated, &cut, "t").is_err());
        let other_method = ZipEntry {
            method: 12,
            ..entry.clone()
        };
        let err = entry_data(&deflated, &other_method, "t").unwrap_err();
        assert!(matches!(err, NpzError::UnsupportedZip { .. }), "{err}");
        let encrypted = ZipEntry {
            flags: FLAG_ENCRYPTED,
            ..entry
        };
        assert!(entry_data(&deflated, &encrypted, "t")
            .unwrap_err()
            .to_string()
            .contains("encrypted"));
    }

    #[test]
    fn archive_comment_is_skipped_when_finding_the_end_record() {
        let mut bytes = archive(&[("a.npy", b"1")], false);
        let comment = b"made by hand, PK\x05\x06 inside";
        let len = bytes.len();
        bytes[len - 2..].copy_from_slice(&(comment.len() as u16).to_le_bytes());
        bytes.extend_from_slice(comment);
        assert_eq!(read_entries(&bytes, "t").unwrap().len(), 1);
    }

    #[test]
    fn entry_count_must_match_the_directory() {
        let mut bytes = archive(&[("a.npy", b"1")], false);
        let len = bytes.len();
        bytes[len - 12..len - 10].copy_from_slice(&2u16.to_le_bytes());
        bytes[len - 14..len - 12].copy_from_slice(&2u16.to_le_bytes());
        let err = read_entries(&bytes, "t").unwrap_err();
        assert!(err.to_string().contains("counts 2 entries"), "{err}");
    }
}
