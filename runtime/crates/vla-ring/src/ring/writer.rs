//! The single writer of a ring: creating a segment, taking over one left by a crashed
//! writer, replacing one that does not fit, and publishing.

use super::header::{check_header, check_seqs, write_static_header};
use super::item::SlotItem;
use super::monotonic_ns;
use crate::error::{CreateError, OpenError, PublishError};
use crate::layout::{
    Geometry, RingHeader, RingLayout, HEADER_SIZE, STATE_INITIALIZING, STATE_READY,
};
use crate::seqlock::RingCore;
use crate::shm::SharedMapping;
use core::marker::PhantomData;
use core::mem::offset_of;
use core::sync::atomic::{fence, Ordering};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Segment files are readable by everyone (readers map read-only) and writable by the
/// writer's user.
const SEGMENT_MODE: u32 = 0o644;

/// How [`RingWriter::create`] came by its segment.
#[derive(Debug)]
pub enum Origin {
    /// No usable file existed; a fresh segment was made.
    Created,
    /// A segment of the same kind, ABI and geometry was kept (e.g. after a crash):
    /// published data stays readable, seqs continue, the epoch was bumped.
    Reopened,
    /// A segment existed but did not fit (reason inside); it was replaced by a fresh file
    /// under the same path. Readers still mapping the old file see
    /// [`RingReader::is_replaced`](super::RingReader::is_replaced).
    Replaced(OpenError),
}

fn create_io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> CreateError + 'a {
    move |source| CreateError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Takes the writer lock; the kernel drops it when the holder dies, however it dies.
fn lock_writer(file: File, path: &Path) -> Result<Flock<File>, CreateError> {
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(locked),
        Err((file, Errno::EWOULDBLOCK)) => {
            let mut header = [0u8; HEADER_SIZE];
            let pid_offset = offset_of!(RingHeader, writer_pid);
            let pid = match file.read_exact_at(&mut header, 0) {
                Ok(()) => u32::from_ne_bytes([
                    header[pid_offset],
                    header[pid_offset + 1],
                    header[pid_offset + 2],
                    header[pid_offset + 3],
                ]),
                Err(_) => 0,
            };
            Err(CreateError::WriterActive {
                path: path.to_path_buf(),
                pid,
            })
        }
        Err((_, errno)) => Err(CreateError::Io {
            path: path.to_path_buf(),
            op: "flock",
            source: errno.into(),
        }),
    }
}

/// The single writer of one ring. Holds an exclusive flock on the segment for its lifetime.
pub struct RingWriter<T: SlotItem> {
    mapping: SharedMapping,
    layout: RingLayout,
    path: PathBuf,
    origin: Origin,
    epoch: u64,
    next_seq: u64,
    _lock: Flock<File>,
    _item: PhantomData<fn(&T)>,
}

impl<T: SlotItem> RingWriter<T> {
    /// Creates the segment at `path` (e.g. `/dev/shm/vla-actions`), or takes over an
    /// existing one of the same kind, ABI and geometry, keeping its data and bumping the
    /// writer epoch; an unusable existing file is replaced by a fresh one.
    pub fn create(
        path: impl AsRef<Path>,
        geometry: Geometry,
        slot_count: u32,
    ) -> Result<Self, CreateError> {
        Self::create_with_pause(path, geometry, slot_count, || {})
    }

    /// [`RingWriter::create`] calling `between` after opening the file and before locking
    /// it: lets a test replace the file in that window. Not for other uses.
    #[doc(hidden)]
    pub fn create_with_pause(
        path: impl AsRef<Path>,
        geometry: Geometry,
        slot_count: u32,
        mut between: impl FnMut(),
    ) -> Result<Self, CreateError> {
        let path = path.as_ref();
        let layout = RingLayout::new(T::KIND, geometry, slot_count).map_err(|source| {
            CreateError::Config {
                path: path.to_path_buf(),
                source,
            }
        })?;
        // The lock guards the file we opened, which another writer may have renamed away
        // (replacing it) or a cleanup unlinked between our open and our lock: then we
        // would be the writer of a file nobody can reach, beside the real one. After
        // locking, the path must still name the locked inode; else open it again.
        let mut attempts = 0;
        let locked = loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(SEGMENT_MODE)
                .open(path)
                .map_err(create_io(path, "open"))?;
            between();
            let locked = lock_writer(file, path)?;
            let held = locked.metadata().map_err(create_io(path, "stat"))?;
            match std::fs::metadata(path) {
                Ok(now) if (now.dev(), now.ino()) == (held.dev(), held.ino()) => break locked,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(create_io(path, "stat")(e)),
            }
            attempts += 1;
            if attempts == 8 {
                return Err(create_io(path, "lock")(io::Error::other(
                    "the path named another file after each of 8 locks",
                )));
            }
        };
        let file_len = locked.metadata().map_err(create_io(path, "stat"))?.len();

        if file_len == 0 {
            // A file no reader can have mapped (readers refuse empty files): size it and
            // initialize in place.
            locked
                .set_len(layout.total_size as u64)
                .map_err(create_io(path, "resize"))?;
            let mapping = SharedMapping::map_read_write(&locked, layout.total_size)
                .map_err(create_io(path, "mmap"))?;
            return Ok(Self::initialize_fresh(
                mapping,
                layout,
                path,
                locked,
                Origin::Created,
            ));
        }

        let existing = if file_len >= HEADER_SIZE as u64 {
            let mapping = SharedMapping::map_read_write(&locked, file_len as usize)
                .map_err(create_io(path, "mmap"))?;
            check_header(
                mapping.header(),
                path,
                T::KIND,
                &geometry,
                Some(slot_count),
                file_len,
                true,
            )
            .and_then(|layout| check_seqs(&mapping, &layout, path))
            .map(|_| mapping)
        } else {
            Err(OpenError::Truncated {
                path: path.to_path_buf(),
                expected: HEADER_SIZE as u64,
                found: file_len,
            })
        };
        match existing {
            Ok(mapping) => Ok(Self::take_over(mapping, layout, path, locked)),
            // The old file may be mapped by readers of another geometry: never resize it
            // under them, build a new file and rename it over the path.
            Err(reason) => Self::replace(path, layout, reason),
        }
    }

    fn initialize_fresh(
        mapping: SharedMapping,
        layout: RingLayout,
        path: &Path,
        lock: Flock<File>,
        origin: Origin,
    ) -> Self {
        debug_assert!(mapping.is_writable());
        let h = mapping.header();
        h.initializing.store(STATE_INITIALIZING, Ordering::Relaxed);
        fence(Ordering::Release);
        write_static_header(h, &layout);
        h.writer_pid.store(std::process::id(), Ordering::Relaxed);
        h.writer_epoch.store(1, Ordering::Relaxed);
        h.writer_heartbeat_ns
            .store(monotonic_ns(), Ordering::Relaxed);
        h.published.store(0, Ordering::Relaxed);
        h.magic.store(layout.kind.magic(), Ordering::Relaxed);
        h.initializing.store(STATE_READY, Ordering::Release);
        RingWriter {
            mapping,
            layout,
            path: path.to_path_buf(),
            origin,
            epoch: 1,
            next_seq: 1,
            _lock: lock,
            _item: PhantomData,
        }
    }

    fn take_over(
        mapping: SharedMapping,
        layout: RingLayout,
        path: &Path,
        lock: Flock<File>,
    ) -> Self {
        let h = mapping.header();
        h.initializing.store(STATE_INITIALIZING, Ordering::Relaxed);
        fence(Ordering::Release);
        // A newer writer of the same major may change abi_version; the rest is identical.
        write_static_header(h, &layout);
        let epoch = h.writer_epoch.load(Ordering::Relaxed).wrapping_add(1);
        h.writer_epoch.store(epoch, Ordering::Relaxed);
        h.writer_pid.store(std::process::id(), Ordering::Relaxed);
        h.writer_heartbeat_ns
            .store(monotonic_ns(), Ordering::Relaxed);
        let mut writer = RingWriter {
            mapping,
            layout,
            path: path.to_path_buf(),
            origin: Origin::Reopened,
            epoch,
            next_seq: 0,
            _lock: lock,
            _item: PhantomData,
        };
        writer.next_seq = writer.core().next_seq_after_restart();
        writer
            .mapping
            .header()
            .initializing
            .store(STATE_READY, Ordering::Release);
        writer
    }

    fn replace(path: &Path, layout: RingLayout, reason: OpenError) -> Result<Self, CreateError> {
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let temp = path.with_file_name(format!(".{file_name}.new-{}", std::process::id()));
        match std::fs::remove_file(&temp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(create_io(&temp, "remove stale temporary")(e)),
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(SEGMENT_MODE)
            .open(&temp)
            .map_err(create_io(&temp, "create"))?;
        let locked = lock_writer(file, &temp)?;
        let result = locked
            .set_len(layout.total_size as u64)
            .map_err(create_io(&temp, "resize"))
            .and_then(|()| {
                SharedMapping::map_read_write(&locked, layout.total_size)
                    .map_err(create_io(&temp, "mmap"))
            });
        let mapping = match result {
            Ok(mapping) => mapping,
            Err(e) => {
                let _ = std::fs::remove_file(&temp);
                return Err(e);
            }
        };
        let writer =
            Self::initialize_fresh(mapping, layout, path, locked, Origin::Replaced(reason));
        // The old file's lock (still held by our caller's frame until it returns) keeps a
        // concurrent writer from racing this rename.
        if let Err(e) = std::fs::rename(&temp, path) {
            let _ = std::fs::remove_file(&temp);
            return Err(create_io(path, "rename")(e));
        }
        Ok(writer)
    }

    fn core(&self) -> RingCore<'_> {
        let words = self
            .mapping
            .slot_words(self.layout.total_size)
            .expect("mapping covers total_size: checked when created");
        RingCore::new(
            &self.mapping.header().published,
            words,
            self.layout.slot_words(),
        )
    }

    /// Publishes `item` as the next seq and returns that seq. `item.seq` and
    /// `item.writer_epoch` are ignored (the writer assigns them). Never allocates.
    pub fn publish(&mut self, item: &T) -> Result<u64, PublishError> {
        if let Some((field, expected, found)) = item.length_mismatch(&self.layout) {
            return Err(PublishError::Length {
                field,
                expected,
                found,
            });
        }
        let seq = self.next_seq;
        let (epoch, layout) = (self.epoch, self.layout);
        self.core()
            .publish(seq, |out| item.store(seq, epoch, &layout, out));
        self.heartbeat();
        self.next_seq += 1;
        Ok(seq)
    }

    /// Refreshes the heartbeat without publishing (call it while idle).
    pub fn heartbeat(&self) {
        self.mapping
            .header()
            .writer_heartbeat_ns
            .store(monotonic_ns(), Ordering::Relaxed);
    }

    /// This writer's epoch, one more than the segment's previous writer's.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The seq the next publish will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// How this writer found the segment: created, reopened, or replaced (with why).
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The layout this writer sized the segment for.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// The segment file this writer holds.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True once the segment was shrunk under this writer's mapping: what it publishes
    /// now lands in zero pages (or past the file's end) no reader sees.
    pub fn is_truncated(&self) -> bool {
        self.mapping.truncated()
            || self
                ._lock
                .metadata()
                .is_ok_and(|m| m.len() < self.mapping.len() as u64)
    }
}
