//! The one place that touches raw shared memory: mapping a segment (MAP_SHARED) and
//! viewing it as the atomic header and atomic slot words of `layout.rs`. Everything above
//! this module works with `&RingHeader` and `&[AtomicU64]` only.

// Shared memory: the mapping and the views of it, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use core::sync::atomic::AtomicU64;
use std::fs::File;
use std::io;

use memmap2::{Mmap, MmapMut, MmapOptions};

use crate::layout::{RingHeader, HEADER_SIZE};

enum Mapping {
    /// Writers map read-write.
    ReadWrite(MmapMut),
    /// Readers map read-only, so a reader bug cannot corrupt what the firmware sees.
    ReadOnly(Mmap),
}

/// A MAP_SHARED mapping of a whole ring segment, at least [`HEADER_SIZE`] bytes long.
pub(crate) struct SharedMapping {
    mapping: Mapping,
}

fn too_short(len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("mapping of {len} bytes cannot hold the {HEADER_SIZE}-byte ring header"),
    )
}

impl SharedMapping {
    /// Maps the first `len` bytes of `file` read-write, pre-faulted.
    pub(crate) fn map_read_write(file: &File, len: usize) -> io::Result<Self> {
        if len < HEADER_SIZE {
            return Err(too_short(len));
        }
        // SAFETY: memmap2 declares mapping unsafe because other processes may change or
        // truncate the file. Changes are the point here and are only ever observed through
        // the atomics handed out below, never as plain Rust data. Truncation would fault
        // (SIGBUS): writers of this crate never shrink a segment in place, they replace
        // it under a new inode (see `ring/writer.rs`), so mapped readers keep their pages.
        let map = unsafe { MmapOptions::new().len(len).populate().map_mut(file)? };
        Ok(SharedMapping {
            mapping: Mapping::ReadWrite(map),
        })
    }

    /// Maps the first `len` bytes of `file` read-only, pre-faulted. Only loads may be
    /// issued through the views of a read-only mapping.
    pub(crate) fn map_read_only(file: &File, len: usize) -> io::Result<Self> {
        if len < HEADER_SIZE {
            return Err(too_short(len));
        }
        // SAFETY: as in `map_read_write`; the segment changes under us by design and is
        // only read through atomic loads.
        let map = unsafe { MmapOptions::new().len(len).populate().map(file)? };
        Ok(SharedMapping {
            mapping: Mapping::ReadOnly(map),
        })
    }

    fn base(&self) -> *const u8 {
        match &self.mapping {
            Mapping::ReadWrite(m) => m.as_ptr(),
            Mapping::ReadOnly(m) => m.as_ptr(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match &self.mapping {
            Mapping::ReadWrite(m) => m.len(),
            Mapping::ReadOnly(m) => m.len(),
        }
    }

    /// The header at offset 0.
    pub(crate) fn header(&self) -> &RingHeader {
        // SAFETY: the mapping is page aligned (>= align_of::<RingHeader>() == 8) and at
        // least HEADER_SIZE == size_of::<RingHeader>() bytes long (checked when mapped).
        // RingHeader consists of atomics only, so shared references to memory that other
        // processes write concurrently are sound, and every bit pattern is a valid value.
        // The reference lives no longer than `self`, which owns the mapping.
        unsafe { &*(self.base() as *const RingHeader) }
    }

    /// The slot area: the words from [`HEADER_SIZE`] up to `end` bytes into the segment.
    /// Returns `None` if `end` lies outside the mapping or is not word aligned.
    pub(crate) fn slot_words(&self, end: usize) -> Option<&[AtomicU64]> {
        if end > self.len() || end < HEADER_SIZE || end % 8 != 0 {
            return None;
        }
        let words = (end - HEADER_SIZE) / 8;
        // SAFETY: HEADER_SIZE <= end <= the mapping's length (checked above), so the
        // offset stays inside the mapping.
        let first = unsafe { self.base().add(HEADER_SIZE) } as *const AtomicU64;
        // SAFETY: HEADER_SIZE is a multiple of 8 and the base is page aligned, so the
        // pointer is 8-byte aligned as AtomicU64 requires on every supported target; the
        // range [HEADER_SIZE, end) lies inside the mapping (checked above). AtomicU64 has
        // the size of u64 and accepts any bit pattern; concurrent writes by other
        // processes are atomic stores (this crate and vla_ring.h use nothing else).
        // Lifetime bound to `self` as in `header`.
        Some(unsafe { core::slice::from_raw_parts(first, words) })
    }

    pub(crate) fn is_writable(&self) -> bool {
        matches!(self.mapping, Mapping::ReadWrite(_))
    }
}
