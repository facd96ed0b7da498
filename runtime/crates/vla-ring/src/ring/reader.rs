//! A reader of a ring: opening and validating a segment read-only, and copying the latest
//! or a given slot into a caller-owned buffer without ever blocking the writer.

use super::header::{check_header, header_differs};
use super::item::Observation;
use super::item::SlotItem;
use super::monotonic_ns;
use crate::error::{OpenError, ReadError};
use crate::layout::{
    Geometry, ObservationSlotFixed, RingKind, RingLayout, HEADER_SIZE, STATE_READY,
};
use crate::seqlock::{LatestMiss, RingCore, SlotMiss};
use crate::shm::SharedMapping;
use core::marker::PhantomData;
use core::mem::offset_of;
use core::sync::atomic::{fence, AtomicU64, Ordering};
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How many times a read retries while the writer is inside the slot. A slot write is a
/// memcpy of at most a few hundred KiB, so a reader that still loses after this many
/// attempts is being lapped (too few slots) or facing a dead writer's odd slot.
pub const READ_ATTEMPTS: u32 = 16;

/// A reader of one ring; any number may read concurrently, none ever blocks the writer.
pub struct RingReader<T: SlotItem> {
    mapping: SharedMapping,
    layout: RingLayout,
    path: PathBuf,
    identity: (u64, u64),
    /// The writer epoch whose header was last checked against `layout`. A writer that
    /// starts on the same segment bumps the epoch and may rewrite the header (a C writer
    /// re-initializes a same-size segment of another geometry in place): every read checks
    /// the epoch and re-checks the header when it changed.
    checked_epoch: AtomicU64,
    _item: PhantomData<fn(&mut T)>,
}

impl<T: SlotItem> RingReader<T> {
    /// Opens the segment at `path` read-only and validates it against `geometry`.
    /// [`OpenError::is_retryable`] tells whether to try again (writer starting up).
    pub fn open(path: impl AsRef<Path>, geometry: Geometry) -> Result<Self, OpenError> {
        let path = path.as_ref();
        let io_err = |op: &'static str| {
            move |source: io::Error| OpenError::Io {
                path: path.to_path_buf(),
                op,
                source,
            }
        };
        geometry.validate().map_err(|source| OpenError::Config {
            path: path.to_path_buf(),
            source,
        })?;
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(OpenError::NotFound {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(io_err("open")(e)),
        };
        let meta = file.metadata().map_err(io_err("stat"))?;
        let file_len = meta.len();
        if file_len == 0 {
            // A writer creates the file empty, then sizes it.
            return Err(OpenError::Initializing {
                path: path.to_path_buf(),
            });
        }
        if file_len < HEADER_SIZE as u64 {
            return Err(OpenError::Truncated {
                path: path.to_path_buf(),
                expected: HEADER_SIZE as u64,
                found: file_len,
            });
        }
        let mapping =
            SharedMapping::map_read_only(&file, file_len as usize).map_err(io_err("mmap"))?;
        let h = mapping.header();
        let epoch = h.writer_epoch.load(Ordering::Acquire);
        let layout = check_header(h, path, T::KIND, &geometry, None, file_len, false)?;
        // A writer that started over while we validated may have changed abi_version:
        // the header is itself seqlocked by `initializing` and the epoch.
        fence(Ordering::Acquire);
        if h.initializing.load(Ordering::Relaxed) != STATE_READY
            || h.writer_epoch.load(Ordering::Relaxed) != epoch
        {
            return Err(OpenError::Initializing {
                path: path.to_path_buf(),
            });
        }
        Ok(RingReader {
            mapping,
            layout,
            path: path.to_path_buf(),
            identity: (meta.dev(), meta.ino()),
            checked_epoch: AtomicU64::new(epoch),
            _item: PhantomData,
        })
    }

    /// Before a read: the writer epoch, after re-checking the header against this
    /// reader's layout if a writer started since the last check.
    fn enter(&self) -> Result<u64, ReadError> {
        let h = self.mapping.header();
        let epoch = h.writer_epoch.load(Ordering::Acquire);
        if epoch == self.checked_epoch.load(Ordering::Relaxed) {
            return Ok(epoch);
        }
        self.recheck(epoch)
    }

    #[cold]
    fn recheck(&self, epoch: u64) -> Result<u64, ReadError> {
        let h = self.mapping.header();
        if h.initializing.load(Ordering::Acquire) != STATE_READY {
            return Err(ReadError::WriterStarting);
        }
        if let Some(field) = header_differs(h, &self.layout) {
            return Err(ReadError::Incompatible { epoch, field });
        }
        // The header is seqlocked by `initializing` and the epoch, as in `open`.
        fence(Ordering::Acquire);
        if h.initializing.load(Ordering::Relaxed) != STATE_READY
            || h.writer_epoch.load(Ordering::Relaxed) != epoch
        {
            return Err(ReadError::WriterStarting);
        }
        self.checked_epoch.store(epoch, Ordering::Relaxed);
        Ok(epoch)
    }

    /// After a read: the copy is only good if no writer started while it was made.
    fn leave(&self, epoch: u64) -> Result<(), ReadError> {
        let h = self.mapping.header();
        fence(Ordering::Acquire);
        if h.initializing.load(Ordering::Relaxed) != STATE_READY
            || h.writer_epoch.load(Ordering::Relaxed) != epoch
        {
            return Err(ReadError::WriterStarting);
        }
        Ok(())
    }

    fn core(&self) -> RingCore<'_> {
        let words = self
            .mapping
            .slot_words(self.layout.total_size)
            .expect("mapping covers total_size: checked when opened");
        RingCore::new(
            &self.mapping.header().published,
            words,
            self.layout.slot_words(),
        )
    }

    fn check_buffer(&self, buf: &T) -> Result<(), ReadError> {
        match buf.length_mismatch(&self.layout) {
            Some((field, expected, found)) => Err(ReadError::BufferMismatch {
                field,
                expected,
                found,
            }),
            None => Ok(()),
        }
    }

    fn finish(&self, seq: u64, buf: &T, load: Result<(), u32>) -> Result<(), ReadError> {
        load.map_err(|found| match T::KIND {
            RingKind::Instruction => ReadError::TextTooLong { seq, len: found },
            _ => ReadError::InvalidStatus { seq, found },
        })?;
        if buf.seq() != seq {
            // The seqlock word and the seq field disagree: a foreign writer broke the ABI.
            return Err(ReadError::Inconsistent {
                published: seq,
                lock_word: self.core().slot_for(seq).lock_word(),
            });
        }
        Ok(())
    }

    /// Copies the newest complete slot into `buf` and returns its seq. A slot the writer
    /// is in (or died in) is never returned.
    pub fn read_latest(&self, buf: &mut T) -> Result<u64, ReadError> {
        self.check_buffer(buf)?;
        let epoch = self.enter()?;
        let layout = self.layout;
        let (seq, load) = self
            .core()
            .read_latest(READ_ATTEMPTS, |from| buf.load(&layout, from))
            .map_err(latest_miss)?;
        self.leave(epoch)?;
        self.finish(seq, buf, load)?;
        Ok(seq)
    }

    /// Copies slot `seq` into `buf`.
    pub fn read_seq(&self, seq: u64, buf: &mut T) -> Result<(), ReadError> {
        self.check_buffer(buf)?;
        let epoch = self.enter()?;
        let layout = self.layout;
        let load = self
            .core()
            .read_seq(seq, READ_ATTEMPTS, |from| buf.load(&layout, from))
            .map_err(|miss| match miss {
                SlotMiss::NotYetWritten => ReadError::NotYetWritten {
                    seq,
                    published: self.published(),
                },
                SlotMiss::InProgress => ReadError::InProgress { seq },
                SlotMiss::Overwritten { by } => ReadError::Overwritten { seq, by },
                SlotMiss::Torn => ReadError::Contended {
                    attempts: READ_ATTEMPTS,
                },
            })?;
        self.leave(epoch)?;
        self.finish(seq, buf, load)
    }

    /// Seq of the newest complete slot (0 = none yet).
    pub fn published(&self) -> u64 {
        self.mapping.header().published.load(Ordering::Acquire)
    }

    /// Changes whenever a writer (re)starts on this segment.
    pub fn writer_epoch(&self) -> u64 {
        self.mapping.header().writer_epoch.load(Ordering::Acquire)
    }

    /// Process id of the writer that last started (it may have exited since).
    pub fn writer_pid(&self) -> u32 {
        self.mapping.header().writer_pid.load(Ordering::Relaxed)
    }

    /// CLOCK_MONOTONIC ns of the writer's last publish or heartbeat.
    pub fn writer_heartbeat_ns(&self) -> u64 {
        self.mapping
            .header()
            .writer_heartbeat_ns
            .load(Ordering::Relaxed)
    }

    /// Time since the writer's last sign of life; a dead writer's age grows without bound.
    pub fn heartbeat_age(&self) -> Duration {
        Duration::from_nanos(monotonic_ns().saturating_sub(self.writer_heartbeat_ns()))
    }

    /// True while a writer is (re)writing the header (or died doing so).
    pub fn is_initializing(&self) -> bool {
        self.mapping.header().initializing.load(Ordering::Acquire) != STATE_READY
    }

    /// True if `path` now names another file than the one mapped (a writer replaced the
    /// segment, e.g. after a geometry change): reopen to follow it.
    pub fn is_replaced(&self) -> io::Result<bool> {
        match std::fs::metadata(&self.path) {
            Ok(meta) => Ok((meta.dev(), meta.ino()) != self.identity),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// True once the segment was shrunk under this reader's mapping (by anyone who can
    /// write the file): its pages past the end read as zeros now (a whole page lost was
    /// remapped when touched; a cut inside the last page reads as zeros too), nothing
    /// new will be read: reopen.
    pub fn is_truncated(&self) -> bool {
        self.mapping.truncated()
            || std::fs::metadata(&self.path).is_ok_and(|m| {
                (m.dev(), m.ino()) == self.identity && m.len() < self.mapping.len() as u64
            })
    }

    /// The layout this reader validated the segment against.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// The segment file this reader opened.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl RingReader<Observation> {
    /// The seq and `instruction_id` of the newest complete observation, copying only that
    /// word (no frames): cheap enough to follow the robot's instruction every few ms.
    pub fn latest_instruction_id(&self) -> Result<(u64, u32), ReadError> {
        let epoch = self.enter()?;
        let (seq, (slot_seq, id)) = self
            .core()
            .read_latest(READ_ATTEMPTS, |from| {
                (
                    from.load_u64(offset_of!(ObservationSlotFixed, seq)),
                    from.load_u32_pair(offset_of!(ObservationSlotFixed, instruction_id))
                        .0,
                )
            })
            .map_err(latest_miss)?;
        self.leave(epoch)?;
        if slot_seq != seq {
            return Err(ReadError::Inconsistent {
                published: seq,
                lock_word: self.core().slot_for(seq).lock_word(),
            });
        }
        Ok((seq, id))
    }
}

/// A missed latest read as the reader's error (`READ_ATTEMPTS` tries).
fn latest_miss(miss: LatestMiss) -> ReadError {
    match miss {
        LatestMiss::Empty => ReadError::Empty,
        LatestMiss::Contended => ReadError::Contended {
            attempts: READ_ATTEMPTS,
        },
        LatestMiss::Inconsistent {
            published,
            lock_word,
        } => ReadError::Inconsistent {
            published,
            lock_word,
        },
    }
}
