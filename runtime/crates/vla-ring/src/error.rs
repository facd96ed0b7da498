//! Typed errors of the ring: configuration, creating (writer), opening (reader), reading
//! and publishing. Each Display is one line naming the file and field involved.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::layout::RingKind;

/// A geometry or slot count that cannot make a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A geometry field that must be at least 1 is 0.
    Zero {
        /// Name of the zero field (`action_dims`, `chunk_len`, or a frame dimension when
        /// `cameras > 0`).
        field: &'static str,
    },
    /// The slot count is outside `MIN_SLOTS..=MAX_SLOTS`.
    SlotCount {
        /// The slot count asked for.
        found: u32,
    },
    /// A derived size overflows the ABI's integer fields.
    TooLarge {
        /// Which size overflowed (`"camera frames"`, `"slot"`, `"segment"`).
        what: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Zero { field } => write!(f, "ring geometry field {field} must not be 0"),
            ConfigError::SlotCount { found } => write!(
                f,
                "ring slot count {found} out of range {}..={}",
                crate::layout::MIN_SLOTS,
                crate::layout::MAX_SLOTS
            ),
            ConfigError::TooLarge { what } => {
                write!(f, "ring {what} size does not fit the ABI's size fields")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a writer could not create or take over a ring segment.
#[derive(Debug)]
#[non_exhaustive]
pub enum CreateError {
    /// The geometry or slot count passed to the writer cannot make a ring.
    Config {
        /// The segment file.
        path: PathBuf,
        /// What is wrong with the geometry.
        source: ConfigError,
    },
    /// A file operation on the segment failed (open, stat, lock, resize, mmap, create or
    /// remove the replacement's temporary file).
    Io {
        /// The file the operation was on (the segment, or the temporary file of its replacement).
        path: PathBuf,
        /// The operation, e.g. `"open"`, `"flock"`, `"mmap"`.
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// Another live process holds the writer lock (an flock, released by the kernel when
    /// its holder dies, so a killed writer never blocks its successor).
    WriterActive {
        /// The segment file.
        path: PathBuf,
        /// Process id the header records for the writer holding the lock.
        pid: u32,
    },
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::Config { path, source } => write!(f, "{}: {source}", path.display()),
            CreateError::Io { path, op, source } => {
                write!(f, "{}: {op} failed: {source}", path.display())
            }
            CreateError::WriterActive { path, pid } => write!(
                f,
                "{}: another writer (pid {pid}) holds this ring",
                path.display()
            ),
        }
    }
}

// Each message names its cause (the `source` fields are written into it), so `source()`
// does not hand the cause out a second time for a printer to de-duplicate.
impl std::error::Error for CreateError {}

/// Why a reader could not open (attach to) a ring segment.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// The reader's own expected geometry is unusable.
    Config {
        /// The segment file.
        path: PathBuf,
        /// What is wrong with the expected geometry.
        source: ConfigError,
    },
    /// No such file (yet): the writer has not started. Retry.
    NotFound {
        /// The segment file.
        path: PathBuf,
    },
    /// A file operation on the segment failed (open, stat or mmap).
    Io {
        /// The segment file.
        path: PathBuf,
        /// The operation, e.g. `"open"`, `"stat"`, `"mmap"`.
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// The file is shorter than the header or than its header says.
    Truncated {
        /// The segment file.
        path: PathBuf,
        /// Bytes the header (or the header size) requires.
        expected: u64,
        /// Bytes the file has.
        found: u64,
    },
    /// A writer is (re)writing the header, or died doing so. Retry.
    Initializing {
        /// The segment file.
        path: PathBuf,
    },
    /// The magic is not a ring magic at all.
    BadMagic {
        /// The segment file.
        path: PathBuf,
        /// The magic of the ring kind the reader opened.
        expected: u64,
        /// The `magic` word in the header.
        found: u64,
    },
    /// The segment is the other ring.
    WrongKind {
        /// The segment file.
        path: PathBuf,
        /// The kind the reader opened.
        expected: RingKind,
        /// The kind the segment's magic names.
        found: RingKind,
    },
    /// The ABI major differs: the layout is not ours.
    AbiMajor {
        /// The segment file.
        path: PathBuf,
        /// This reader's [`ABI_MAJOR`](crate::ABI_MAJOR).
        expected: u32,
        /// The header's `abi_major`.
        found: u32,
    },
    /// The writer needs a newer reader than this one.
    AbiTooOld {
        /// The segment file.
        path: PathBuf,
        /// This reader's [`ABI_VERSION`](crate::ABI_VERSION).
        reader_version: u32,
        /// The header's `abi_lowest_compatible`, above `reader_version`.
        lowest_compatible: u32,
    },
    /// A header field (geometry, slot size, sizes) differs from what this reader expects.
    Mismatch {
        /// The segment file.
        path: PathBuf,
        /// Header field name as in the layout table (`slot_size`, `cameras`, ...).
        field: &'static str,
        /// The value this reader's layout needs.
        expected: u64,
        /// The value in the header.
        found: u64,
    },
    /// `published` or a slot's seqlock word holds a seq that leaves no next seq up to
    /// [`MAX_SEQ`](crate::seqlock::MAX_SEQ): the segment is corrupt and a writer cannot
    /// continue it.
    SeqOutOfRange {
        /// The segment file.
        path: PathBuf,
        /// The newest seq that `published` or any slot holds, at or past `MAX_SEQ`.
        found: u64,
    },
}

impl OpenError {
    /// True for states a starting writer passes through: the caller should retry.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            OpenError::NotFound { .. } | OpenError::Initializing { .. }
        )
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Config { path, source } => write!(f, "{}: {source}", path.display()),
            OpenError::NotFound { path } => {
                write!(f, "{}: ring segment does not exist (writer not started?)", path.display())
            }
            OpenError::Io { path, op, source } => {
                write!(f, "{}: {op} failed: {source}", path.display())
            }
            OpenError::Truncated { path, expected, found } => write!(
                f,
                "{}: ring segment truncated: expected at least {expected} bytes, found {found}",
                path.display()
            ),
            OpenError::Initializing { path } => {
                write!(f, "{}: ring segment is being initialized by its writer", path.display())
            }
            OpenError::BadMagic { path, expected, found } => write!(
                f,
                "{}: field magic: expected {expected:#018x}, found {found:#018x} (not a ring segment)",
                path.display()
            ),
            OpenError::WrongKind { path, expected, found } => write!(
                f,
                "{}: field magic: expected an {expected} ring, found an {found} ring",
                path.display()
            ),
            OpenError::AbiMajor { path, expected, found } => write!(
                f,
                "{}: field abi_major: expected {expected}, found {found}",
                path.display()
            ),
            OpenError::AbiTooOld { path, reader_version, lowest_compatible } => write!(
                f,
                "{}: field abi_lowest_compatible: writer needs reader version >= {lowest_compatible}, this reader is {reader_version}",
                path.display()
            ),
            OpenError::Mismatch { path, field, expected, found } => write!(
                f,
                "{}: field {field}: expected {expected}, found {found}",
                path.display()
            ),
            OpenError::SeqOutOfRange { path, found } => write!(
                f,
                "{}: corrupt ring: holds seq {found}, leaving no seq to continue with (the largest is {})",
                path.display(),
                crate::seqlock::MAX_SEQ
            ),
        }
    }
}

// Each message names its cause (the `source` fields are written into it), so `source()`
// does not hand the cause out a second time for a printer to de-duplicate.
impl std::error::Error for OpenError {}

/// Why a read returned no data. Carries no path so that reads never allocate; the caller
/// knows which ring it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadError {
    /// Nothing published yet.
    Empty,
    /// `seq` is newer than anything written.
    NotYetWritten {
        /// The seq asked for.
        seq: u64,
        /// The newest seq published when the read was made.
        published: u64,
    },
    /// `seq`'s slot now holds the newer seq `by`: the reader fell behind.
    Overwritten {
        /// The seq asked for.
        seq: u64,
        /// The newer seq now in its slot.
        by: u64,
    },
    /// The writer was inside `seq`'s slot on every attempt (or died there).
    InProgress {
        /// The seq asked for.
        seq: u64,
    },
    /// Every attempt overlapped a write.
    Contended {
        /// How many read attempts were made.
        attempts: u32,
    },
    /// An instruction slot's `len` exceeds [`crate::MAX_TEXT_BYTES`]: a foreign writer.
    TextTooLong {
        /// The seq of the slot read.
        seq: u64,
        /// The slot's `len` field.
        len: u32,
    },
    /// An action slot's status word is none of ok / hold / fault.
    InvalidStatus {
        /// The seq of the slot read.
        seq: u64,
        /// The raw status word.
        found: u32,
    },
    /// `published` names a seq that its slot never reached: the segment is corrupt.
    Inconsistent {
        /// The header's `published` seq.
        published: u64,
        /// The seqlock word its slot holds instead of `2 * published` or later.
        lock_word: u64,
    },
    /// The caller's buffer does not match the ring geometry.
    BufferMismatch {
        /// Which buffer: `"state"`, `"frames"` or `"values"`.
        field: &'static str,
        /// Elements (f32 values or frame bytes) the geometry needs.
        expected: usize,
        /// Elements the caller's buffer has.
        found: usize,
    },
    /// A writer is starting on the segment (or died doing so): retry.
    WriterStarting,
    /// A writer started on the segment (epoch `epoch`) with a header that no longer
    /// matches this reader (header field `field`): reopen with the right geometry.
    Incompatible {
        /// The writer epoch the header now carries.
        epoch: u64,
        /// The first header field that no longer matches this reader's layout.
        field: &'static str,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Empty => write!(f, "ring is empty: nothing published yet"),
            ReadError::NotYetWritten { seq, published } => {
                write!(f, "seq {seq} not written yet (published {published})")
            }
            ReadError::Overwritten { seq, by } => {
                write!(f, "seq {seq} was overwritten by seq {by}")
            }
            ReadError::InProgress { seq } => {
                write!(
                    f,
                    "seq {seq} is being written (or its writer died mid-write)"
                )
            }
            ReadError::Contended { attempts } => {
                write!(f, "every one of {attempts} read attempts raced the writer")
            }
            ReadError::TextTooLong { seq, len } => write!(
                f,
                "seq {seq}: field len: {len} bytes of text, at most {} fit a slot",
                crate::MAX_TEXT_BYTES
            ),
            ReadError::InvalidStatus { seq, found } => {
                write!(
                    f,
                    "seq {seq}: field status: {found} is none of ok=0, hold=1, fault=2"
                )
            }
            ReadError::Inconsistent {
                published,
                lock_word,
            } => write!(
                f,
                "corrupt ring: published seq {published} but its slot's seqlock word is {lock_word}"
            ),
            ReadError::BufferMismatch {
                field,
                expected,
                found,
            } => {
                write!(
                    f,
                    "buffer field {field}: expected {expected} elements, found {found}"
                )
            }
            ReadError::WriterStarting => {
                write!(f, "a writer is starting on the ring (or died doing so)")
            }
            ReadError::Incompatible { epoch, field } => write!(
                f,
                "writer epoch {epoch} re-initialized the ring: header field {field} no longer matches this reader"
            ),
        }
    }
}

impl std::error::Error for ReadError {}

/// Why a publish was refused (nothing was written).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishError {
    /// A variable-length field does not match the ring geometry.
    Length {
        /// Which field: `"state"`, `"frames"` or `"values"`.
        field: &'static str,
        /// Elements (f32 values or frame bytes) the geometry needs.
        expected: usize,
        /// Elements the item carries.
        found: usize,
    },
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishError::Length {
                field,
                expected,
                found,
            } => write!(
                f,
                "publish field {field}: expected {expected} elements, found {found}"
            ),
        }
    }
}

impl std::error::Error for PublishError {}
