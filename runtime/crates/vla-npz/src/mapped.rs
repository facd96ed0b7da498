//! A `.npy` file memory-mapped read-only: its data is read in place from the page cache
//! (a bundle's embedding table, hundreds of megabytes at real size), never copied onto the
//! heap. The header is parsed and checked as [`crate::read_npy`] checks it.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::array::element_count;
use crate::npy::{array_name_for, parse_header};
use crate::{DType, NpzError};

/// The mapping, or a private anonymous copy when the file's inode has other names.
enum Backing {
    Mapped(memmap2::Mmap),
    Private(memmap2::Mmap),
}

/// `len` bytes of `reader` in private anonymous memory, read-only.
fn private_copy(
    mut reader: impl std::io::Read,
    len: u64,
    label: &str,
) -> Result<Backing, NpzError> {
    let io = |action: &'static str, source: std::io::Error| NpzError::Io {
        file: label.to_owned(),
        action,
        source,
    };
    let size = usize::try_from(len).map_err(|_| {
        io(
            "allocating a private copy of",
            std::io::Error::other(format!("{len} bytes")),
        )
    })?;
    // An empty file is refused by the header parse, which needs bytes.
    let mut anon = memmap2::MmapMut::map_anon(size.max(1))
        .map_err(|e| io("allocating a private copy of", e))?;
    reader
        .read_exact(&mut anon[..size])
        .map_err(|e| io("reading", e))?;
    let mut more = [0u8; 1];
    loop {
        match reader.read(&mut more) {
            Ok(0) => break,
            Ok(_) => {
                return Err(io(
                    "reading",
                    std::io::Error::other(format!("longer than its {len} bytes")),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io("reading", e)),
        }
    }
    Ok(Backing::Private(
        anon.make_read_only().map_err(|e| io("protecting", e))?,
    ))
}

/// A mapped `.npy` array.
pub struct MappedNpy {
    backing: Backing,
    dtype: DType,
    shape: Vec<usize>,
    data_offset: usize,
    label: String,
}

impl MappedNpy {
    /// Maps `path`. Only a file whose inode has a single link is mapped; one that shares
    /// its inode with another name (a store outside vlad's control could rewrite it in
    /// place) is read into private anonymous memory instead.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, NpzError> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let io = |action: &'static str, source: std::io::Error| NpzError::Io {
            file: label.clone(),
            action,
            source,
        };
        let mut file = std::fs::File::open(path).map_err(|e| io("opening", e))?;
        let meta = file.metadata().map_err(|e| io("reading metadata of", e))?;
        let backing = if meta.nlink() == 1 {
            // SAFETY: the mapping is read-only. Its bytes stay fixed only if nothing writes
            // or truncates the file while it is mapped. The inode has one link (checked just
            // above), so no store vlad does not control shares it; vlad's OTA store never
            // writes a file after placing it (updates go to a new directory, and deleting
            // the old one keeps a mapped inode alive). What remains is a process with write
            // permission on vlad's own bundle files, trusted as much as vlad's binary.
            let map =
                unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| io("mapping", e))?;
            Backing::Mapped(map)
        } else {
            private_copy(&mut file, meta.len(), &label)?
        };
        Self::parse(backing, label)
    }

    /// Reads exactly `len` bytes from `reader` into private anonymous memory (made
    /// read-only) and parses them: whatever the source becomes afterwards, the array is
    /// those bytes. For a caller that checks the bytes as they are read (e.g. a reader
    /// that hashes what it hands out); a reader shorter or longer than `len` is refused.
    /// `label` names the file in errors.
    pub fn read(reader: impl std::io::Read, len: u64, label: &str) -> Result<Self, NpzError> {
        let backing = private_copy(reader, len, label)?;
        Self::parse(backing, label.to_owned())
    }

    fn parse(backing: Backing, label: String) -> Result<Self, NpzError> {
        let bytes: &[u8] = match &backing {
            Backing::Mapped(m) | Backing::Private(m) => m,
        };
        let name = array_name_for(&label);
        let header = parse_header(bytes, &label, &name)?;
        let want = element_count(&header.shape)
            .and_then(|n| n.checked_mul(header.dtype.size()))
            .and_then(|n| n.checked_add(header.data_offset));
        if want != Some(bytes.len()) {
            return Err(NpzError::BadNpy {
                file: label.clone(),
                array: name,
                reason: format!(
                    "shape {:?} of {} needs {} bytes after the header, the file has {}",
                    header.shape,
                    header.dtype.name(),
                    want.map_or("more than usize".into(), |w| (w - header.data_offset)
                        .to_string()),
                    bytes.len() - header.data_offset.min(bytes.len())
                ),
            });
        }
        Ok(Self {
            backing,
            dtype: header.dtype,
            shape: header.shape,
            data_offset: header.data_offset,
            label,
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The file, for messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether the data is the file's own pages (not a private copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mapped(_))
    }

    /// The raw little-endian data, in place.
    pub fn data(&self) -> &[u8] {
        match &self.backing {
            Backing::Mapped(m) | Backing::Private(m) => &m[self.data_offset..],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{write_npy, Array};

    #[test]
    fn maps_a_single_link_file_and_copies_a_shared_one() {
        let dir = std::env::temp_dir().join(format!("vla-npz-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("wte.npy");
        let values = [1.0f32, -2.0, 3.5, 0.25, 7.0, 8.0];
        let array = Array::from_f32("wte", &[3, 2], &values).unwrap();
        std::fs::write(&path, write_npy(&array)).unwrap();
        let m = MappedNpy::open(&path).unwrap();
        assert!(m.is_mapped());
        assert_eq!((m.dtype(), m.shape()), (DType::F32, &[3usize, 2][..]));
        assert_eq!(m.data(), array.bytes());
        let other = dir.join("other.npy");
        std::fs::hard_link(&path, &other).unwrap();
        let shared = MappedNpy::open(&path).unwrap();
        assert!(!shared.is_mapped());
        assert_eq!(shared.data(), array.bytes());
        // A file cut short is refused, naming it.
        let bytes = write_npy(&array);
        std::fs::write(dir.join("short.npy"), &bytes[..bytes.len() - 4]).unwrap();
        let msg = MappedNpy::open(dir.join("short.npy"))
            .err()
            .unwrap()
            .to_string();
        assert!(msg.contains("short.npy") && msg.contains("bytes"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn read_takes_exactly_the_declared_bytes_into_private_memory() {
        let array = Array::from_f32("wte", &[2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        let bytes = write_npy(&array);
        let len = bytes.len() as u64;
        let m = MappedNpy::read(&bytes[..], len, "wte.npy").unwrap();
        assert!(!m.is_mapped());
        assert_eq!(m.data(), array.bytes());
        for (given, what) in [(&bytes[..bytes.len() - 1], "short"), (&bytes[..], "long")] {
            let declared = if what == "short" { len } else { len - 1 };
            let msg = MappedNpy::read(given, declared, "wte.npy")
                .err()
                .expect(what)
                .to_string();
            assert!(msg.contains("wte.npy") && !msg.contains('\n'), "{msg}");
        }
    }
}
