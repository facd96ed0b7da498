//! The one error type of this crate: every variant names the file (or label) it came from
//! and, where one is involved, the array or zip entry, so a single line tells what is wrong.

use std::fmt;
use std::io;
use vla_oneline::OneLine;

use crate::DType;

/// Everything that can go wrong reading, checking or writing `.npy`/`.npz` data.
///
/// `file` is the path (for [`crate::Npz::open`]/[`crate::write_npz`]) or the caller's label
/// (for in-memory parsing); `array` is the array name without the `.npy` suffix and
/// `entry` the raw zip entry name.
#[derive(Debug)]
#[non_exhaustive]
pub enum NpzError {
    /// Reading or writing the file itself failed.
    Io {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// What was being done when it failed (`"reading"`, `"encoding"`, ...), for the message.
        action: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// No end-of-central-directory record: the bytes are not a zip archive.
    NotZip {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// Length of the bytes searched for the end-of-central-directory record.
        len: usize,
    },
    /// The archive structure is inconsistent: bad signatures, offsets or sizes that point
    /// outside the file, sizes that disagree.
    CorruptZip {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The zip entry at fault, or `None` when the archive as a whole is.
        entry: Option<String>,
        /// What is inconsistent, for the message.
        reason: String,
    },
    /// A zip feature this reader deliberately does not implement (encryption, spanning,
    /// compression methods other than stored and deflate).
    UnsupportedZip {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The zip entry using the feature, or `None` when the archive as a whole does.
        entry: Option<String>,
        /// Which feature, for the message.
        reason: String,
    },
    /// An entry's data does not match the CRC-32 the central directory records.
    CrcMismatch {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The zip entry whose data failed the check.
        entry: String,
        /// The CRC-32 the central directory records.
        recorded: u32,
        /// The CRC-32 of the data as read (after inflating).
        computed: u32,
    },
    /// Two entries map to the same array name.
    DuplicateArray {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The array name (without `.npy`) two entries share.
        name: String,
    },
    /// The `.npy` payload is malformed (magic, header dict, data length).
    BadNpy {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The array whose `.npy` payload is malformed.
        array: String,
        /// What is malformed, for the message.
        reason: String,
    },
    /// A well-formed `.npy` this reader does not handle: big-endian or non-numeric dtypes,
    /// `fortran_order: True`.
    UnsupportedNpy {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The array using the unsupported layout.
        array: String,
        /// What is unsupported, for the message.
        reason: String,
    },
    /// The archive has no array of that name.
    MissingArray {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The name asked for.
        name: String,
        /// The array names the archive does hold, so the message can list them.
        available: Vec<String>,
    },
    /// An array has a different element type than the caller requires.
    DTypeMismatch {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The array that was checked.
        array: String,
        /// The dtype the caller requires.
        expected: DType,
        /// The dtype the array is stored as.
        found: DType,
    },
    /// An array has a different shape than the caller requires.
    ShapeMismatch {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The array that was checked.
        array: String,
        /// The shape the caller requires.
        expected: Vec<usize>,
        /// The shape the array has.
        found: Vec<usize>,
    },
    /// An array being built or written is inconsistent (data length vs shape, bad name).
    InvalidArray {
        /// Path or caller's label of the archive (see the enum doc).
        file: String,
        /// The array being built or written.
        array: String,
        /// What is inconsistent, for the message.
        reason: String,
    },
}

fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(", "))
}

fn entry_prefix(f: &mut impl fmt::Write, file: &str, entry: &Option<String>) -> fmt::Result {
    match entry {
        Some(entry) => write!(f, "{file}: entry `{entry}`: "),
        None => write!(f, "{file}: "),
    }
}

impl fmt::Display for NpzError {
    // Names, entries and header text come from the file: a `\n` in an entry name must not
    // break the one-line message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_message(&mut OneLine(f))
    }
}

impl NpzError {
    fn write_message(&self, f: &mut impl fmt::Write) -> fmt::Result {
        match self {
            NpzError::Io {
                file,
                action,
                source,
            } => write!(f, "{file}: {action} failed: {source}"),
            NpzError::NotZip { file, len } => write!(
                f,
                "{file}: not a zip/npz archive (no end-of-central-directory record in {len} bytes)"
            ),
            NpzError::CorruptZip {
                file,
                entry,
                reason,
            } => {
                entry_prefix(f, file, entry)?;
                write!(f, "corrupt zip: {reason}")
            }
            NpzError::UnsupportedZip {
                file,
                entry,
                reason,
            } => {
                entry_prefix(f, file, entry)?;
                write!(f, "unsupported zip feature: {reason}")
            }
            NpzError::CrcMismatch {
                file,
                entry,
                recorded,
                computed,
            } => write!(
                f,
                "{file}: entry `{entry}`: CRC-32 mismatch (recorded {recorded:#010x}, data has \
                 {computed:#010x})"
            ),
            NpzError::DuplicateArray { file, name } => {
                write!(f, "{file}: array `{name}` appears more than once")
            }
            NpzError::BadNpy {
                file,
                array,
                reason,
            } => write!(f, "{file}: array `{array}`: malformed .npy: {reason}"),
            NpzError::UnsupportedNpy {
                file,
                array,
                reason,
            } => write!(f, "{file}: array `{array}`: unsupported .npy: {reason}"),
            NpzError::MissingArray {
                file,
                name,
                available,
            } => write!(
                f,
                "{file}: no array `{name}` (has: {})",
                if available.is_empty() {
                    "nothing".to_string()
                } else {
                    available.join(", ")
                }
            ),
            NpzError::DTypeMismatch {
                file,
                array,
                expected,
                found,
            } => write!(
                f,
                "{file}: array `{array}`: expected dtype {expected}, found {found}"
            ),
            NpzError::ShapeMismatch {
                file,
                array,
                expected,
                found,
            } => write!(
                f,
                "{file}: array `{array}`: expected shape {}, found {}",
                shape_text(expected),
                shape_text(found)
            ),
            NpzError::InvalidArray {
                file,
                array,
                reason,
            } => write!(f, "{file}: array `{array}`: {reason}"),
        }
    }
}

// Each message names its cause (the `source` fields are written into it), so `source()`
// does not hand the cause out a second time for a printer to de-duplicate.
impl std::error::Error for NpzError {}
