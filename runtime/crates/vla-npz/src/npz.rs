//! [`Npz`]: a parsed `.npz` archive whose arrays are decoded on demand, and
//! [`write_npz`]/[`npz_bytes`] which produce stored, reproducible archives numpy reads.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::npy::{npy_header, read_npy_owned, read_npy_slice};
use crate::zip::{entry_data, read_entries, write_stored_zip, NewEntry, ZipEntry};
use crate::{Array, DType, NpzError};

const NPY_SUFFIX: &str = ".npy";

/// Distinguishes temporary files of concurrent writes from one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// An opened `.npz`. The central directory is parsed and checked up front (so a broken
/// archive fails at open); each array is inflated, CRC-checked and parsed when asked for,
/// which keeps memory at one copy of the file plus the arrays in use.
pub struct Npz {
    label: String,
    path: Option<PathBuf>,
    bytes: Vec<u8>,
    /// Archive order; `name` has the `.npy` suffix stripped.
    entries: Vec<(String, ZipEntry)>,
}

/// Shows what the archive is and holds, not its bytes.
impl fmt::Debug for Npz {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Npz")
            .field("label", &self.label)
            .field("len", &self.bytes.len())
            .field("arrays", &self.names().collect::<Vec<_>>())
            .finish()
    }
}

impl Npz {
    /// Reads and indexes the archive at `path`; errors name the path.
    pub fn open(path: impl AsRef<Path>) -> Result<Npz, NpzError> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let bytes = fs::read(path).map_err(|source| NpzError::Io {
            file: label.clone(),
            action: "reading",
            source,
        })?;
        let mut npz = Npz::from_bytes(bytes, &label)?;
        npz.path = Some(path.to_path_buf());
        Ok(npz)
    }

    /// Indexes an archive held in memory; `label` stands for the file in errors.
    pub fn from_bytes(bytes: Vec<u8>, label: &str) -> Result<Npz, NpzError> {
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        for entry in read_entries(&bytes, label)? {
            // Directory entries carry no array; numpy never writes them but zip tools do.
            if entry.name.ends_with('/') {
                continue;
            }
            let name = entry
                .name
                .strip_suffix(NPY_SUFFIX)
                .unwrap_or(&entry.name)
                .to_string();
            if !seen.insert(name.clone()) {
                return Err(NpzError::DuplicateArray {
                    file: label.to_string(),
                    name,
                });
            }
            entries.push((name, entry));
        }
        Ok(Npz {
            label: label.to_string(),
            path: None,
            bytes,
            entries,
        })
    }

    /// The path given to [`Npz::open`], if it was opened from a file.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// What errors call this archive: its path, or the label given to [`Npz::from_bytes`].
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Array names in archive order, without the `.npy` suffix.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(name, _)| name.as_str())
    }

    /// Number of arrays in the archive (directory entries are not counted).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the archive holds no arrays.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the archive holds an array of that name (without the `.npy` suffix).
    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|(candidate, _)| candidate == name)
    }

    /// Decodes one array. Errors name the archive and the array; a missing name lists what
    /// the archive has.
    pub fn array(&self, name: &str) -> Result<Array, NpzError> {
        let Some((_, entry)) = self.entries.iter().find(|(candidate, _)| candidate == name) else {
            return Err(NpzError::MissingArray {
                file: self.label.clone(),
                name: name.to_string(),
                available: self.names().map(str::to_string).collect(),
            });
        };
        match entry_data(&self.bytes, entry, &self.label)? {
            Cow::Borrowed(npy) => read_npy_slice(npy, &self.label, name),
            Cow::Owned(npy) => read_npy_owned(npy, &self.label, name),
        }
    }

    /// Decodes one array and requires its dtype and shape; errors name expected and found.
    pub fn expect(&self, name: &str, dtype: DType, shape: &[usize]) -> Result<Array, NpzError> {
        let array = self.array(name)?;
        array.check(dtype, shape)?;
        Ok(array)
    }
}

/// Builds the `.npz` bytes for `arrays` (stored entries `<name>.npy`, fixed timestamps: the
/// same arrays always give the same bytes).
pub fn npz_bytes(arrays: &[&Array]) -> Result<Vec<u8>, NpzError> {
    let mut out = Vec::new();
    write_archive(&mut out, arrays, crate::array::IN_MEMORY, false).map_err(|source| {
        NpzError::Io {
            file: crate::array::IN_MEMORY.to_string(),
            action: "encoding",
            source,
        }
    })??;
    Ok(out)
}

/// Writes `arrays` as a stored `.npz` at `path`. The archive is written to a temporary file
/// beside it and renamed into place, so an existing file is replaced only by a complete one.
pub fn write_npz(path: impl AsRef<Path>, arrays: &[&Array]) -> Result<(), NpzError> {
    let path = path.as_ref();
    let label = path.display().to_string();
    let io_error = |action: &'static str| {
        let label = label.clone();
        move |source| NpzError::Io {
            file: label,
            action,
            source,
        }
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| NpzError::Io {
            file: label.clone(),
            action: "naming the output",
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no file name"),
        })?
        .to_string_lossy();
    let temp = path.with_file_name(format!(
        ".{file_name}.tmp{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let file = fs::File::create(&temp).map_err(io_error("creating a temporary file"))?;
        let mut writer = BufWriter::new(file);
        write_archive(&mut writer, arrays, &label, false).map_err(io_error("writing"))??;
        let file = writer
            .into_inner()
            .map_err(|err| io_error("writing")(err.into_error()))?;
        file.sync_all().map_err(io_error("syncing"))?;
        fs::rename(&temp, path).map_err(io_error("renaming the temporary file into place"))?;
        // The rename is durable only once the directory is synced. The new file is already
        // complete and in place, so a filesystem that cannot sync directories is not an error.
        let directory = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        if let Ok(directory) = fs::File::open(directory) {
            let _ = directory.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        // Best effort: the temporary file is garbage either way and the error says why.
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Validates names and writes the archive. The outer `Result` is the sink's I/O, the inner
/// one the arrays' validity, so callers can label each.
pub(crate) fn write_archive(
    out: &mut impl Write,
    arrays: &[&Array],
    file: &str,
    force_zip64: bool,
) -> std::io::Result<Result<(), NpzError>> {
    let invalid = |array: &Array, reason: &str| NpzError::InvalidArray {
        file: file.to_string(),
        array: array.name().to_string(),
        reason: reason.to_string(),
    };
    let mut seen = HashSet::new();
    let mut names = Vec::with_capacity(arrays.len());
    for array in arrays {
        if array.name().is_empty() {
            return Ok(Err(invalid(array, "an array name must not be empty")));
        }
        if array.name().ends_with('/') {
            return Ok(Err(invalid(array, "an array name must not end in '/'")));
        }
        let entry_name = format!("{}{NPY_SUFFIX}", array.name());
        if entry_name.len() > usize::from(u16::MAX) {
            return Ok(Err(invalid(
                array,
                "the array name is longer than zip allows",
            )));
        }
        if !seen.insert(array.name()) {
            return Ok(Err(NpzError::DuplicateArray {
                file: file.to_string(),
                name: array.name().to_string(),
            }));
        }
        names.push(entry_name);
    }
    let headers: Vec<Vec<u8>> = arrays.iter().map(|array| npy_header(array)).collect();
    let entries: Vec<NewEntry<'_>> = arrays
        .iter()
        .zip(&headers)
        .zip(&names)
        .map(|((array, header), name)| {
            let mut crc = crc32fast::Hasher::new();
            crc.update(header);
            crc.update(array.bytes());
            NewEntry {
                name,
                parts: [header, array.bytes()],
                crc32: crc.finalize(),
            }
        })
        .collect();
    write_stored_zip(out, &entries, force_zip64)?;
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_zip64_archive_reads_back() {
        let a = Array::from_f32("a", &[2], &[1.0, 2.0]).unwrap();
        let b = Array::from_u8("b", &[], &[3]).unwrap();
        let mut bytes = Vec::new();
        write_archive(&mut bytes, &[&a, &b], "z64", true)
            .unwrap()
            .unwrap();
        if let Some(export) = std::env::var_os("VLA_NPZ_EXPORT_DIR") {
            // Lets a developer check numpy's view of the zip64 layout by hand.
            fs::write(PathBuf::from(export).join("forced_zip64.npz"), &bytes).unwrap();
        }
        let npz = Npz::from_bytes(bytes, "z64").unwrap();
        assert_eq!(npz.array("a").unwrap(), a);
        assert_eq!(npz.array("b").unwrap(), b);
    }
}
