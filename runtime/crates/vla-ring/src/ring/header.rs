//! The header of a mapped segment: checking it against what a writer or reader expects,
//! the cheap per-read re-check, and writing the fixed part of a fresh one.

use crate::error::OpenError;
use crate::layout::{
    Geometry, RingHeader, RingKind, RingLayout, ABI_LOWEST_COMPATIBLE, ABI_MAJOR, ABI_VERSION,
    HEADER_SIZE, STATE_READY,
};
use crate::seqlock::{RingCore, MAX_SEQ};
use crate::shm::SharedMapping;
use core::sync::atomic::{AtomicU32, Ordering};
use std::path::Path;

pub(super) fn raw_geometry_fields(h: &RingHeader) -> [&AtomicU32; 7] {
    let g = &h.geometry;
    [
        &g.cameras,
        &g.height,
        &g.width,
        &g.channels,
        &g.state_dims,
        &g.action_dims,
        &g.chunk_len,
    ]
}

/// Checks a mapped header against what the caller expects and returns the segment's
/// layout. `slot_count` is `None` for readers (the writer chooses it). A writer taking
/// over a segment passes `during_takeover` to look past a predecessor that died with
/// `initializing` set.
pub(super) fn check_header(
    h: &RingHeader,
    path: &Path,
    kind: RingKind,
    geometry: &Geometry,
    slot_count: Option<u32>,
    file_len: u64,
    during_takeover: bool,
) -> Result<RingLayout, OpenError> {
    let path_buf = || path.to_path_buf();
    let initializing = h.initializing.load(Ordering::Acquire);
    let magic = h.magic.load(Ordering::Relaxed);
    if !during_takeover && (magic == 0 || initializing != STATE_READY) {
        return Err(OpenError::Initializing { path: path_buf() });
    }
    if magic != kind.magic() {
        return Err(match RingKind::from_magic(magic) {
            Some(found) => OpenError::WrongKind {
                path: path_buf(),
                expected: kind,
                found,
            },
            None => OpenError::BadMagic {
                path: path_buf(),
                expected: kind.magic(),
                found: magic,
            },
        });
    }
    let abi_major = h.abi_major.load(Ordering::Relaxed);
    if abi_major != ABI_MAJOR {
        return Err(OpenError::AbiMajor {
            path: path_buf(),
            expected: ABI_MAJOR,
            found: abi_major,
        });
    }
    let lowest_compatible = h.abi_lowest_compatible.load(Ordering::Relaxed);
    if ABI_VERSION < lowest_compatible {
        return Err(OpenError::AbiTooOld {
            path: path_buf(),
            reader_version: ABI_VERSION,
            lowest_compatible,
        });
    }
    let mismatch = |field: &'static str, expected: u64, found: u64| OpenError::Mismatch {
        path: path_buf(),
        field,
        expected,
        found,
    };
    let header_size = h.header_size.load(Ordering::Relaxed);
    if header_size as usize != HEADER_SIZE {
        return Err(mismatch(
            "header_size",
            HEADER_SIZE as u64,
            header_size as u64,
        ));
    }
    for ((field, expected), raw) in geometry.fields().into_iter().zip(raw_geometry_fields(h)) {
        let found = raw.load(Ordering::Relaxed);
        if found != expected {
            return Err(mismatch(field, expected as u64, found as u64));
        }
    }
    let found_slots = h.slot_count.load(Ordering::Relaxed);
    if let Some(expected) = slot_count {
        if found_slots != expected {
            return Err(mismatch("slot_count", expected as u64, found_slots as u64));
        }
    }
    let layout =
        RingLayout::new(kind, *geometry, found_slots).map_err(|source| OpenError::Config {
            path: path_buf(),
            source,
        })?;
    let slot_size = h.slot_size.load(Ordering::Relaxed);
    if slot_size as usize != layout.slot_size {
        return Err(mismatch(
            "slot_size",
            layout.slot_size as u64,
            slot_size as u64,
        ));
    }
    let total_size = h.total_size.load(Ordering::Relaxed);
    if total_size != layout.total_size as u64 {
        return Err(mismatch("total_size", layout.total_size as u64, total_size));
    }
    if file_len < total_size {
        return Err(OpenError::Truncated {
            path: path_buf(),
            expected: total_size,
            found: file_len,
        });
    }
    Ok(layout)
}

/// A writer continues after the newest seq the segment holds; a segment where no seq can
/// follow (corrupt: seqlock words would overflow) is replaced instead.
pub(super) fn check_seqs(
    mapping: &SharedMapping,
    layout: &RingLayout,
    path: &Path,
) -> Result<(), OpenError> {
    let Some(words) = mapping.slot_words(layout.total_size) else {
        return Err(OpenError::Truncated {
            path: path.to_path_buf(),
            expected: layout.total_size as u64,
            found: mapping.len() as u64,
        });
    };
    let newest =
        RingCore::new(&mapping.header().published, words, layout.slot_words()).newest_seq();
    if newest >= MAX_SEQ {
        return Err(OpenError::SeqOutOfRange {
            path: path.to_path_buf(),
            found: newest,
        });
    }
    Ok(())
}

/// Writes every static header field for `layout` (the same values on every start).
pub(super) fn write_static_header(h: &RingHeader, layout: &RingLayout) {
    h.abi_major.store(ABI_MAJOR, Ordering::Relaxed);
    h.abi_version.store(ABI_VERSION, Ordering::Relaxed);
    h.abi_lowest_compatible
        .store(ABI_LOWEST_COMPATIBLE, Ordering::Relaxed);
    h.header_size.store(HEADER_SIZE as u32, Ordering::Relaxed);
    h.total_size
        .store(layout.total_size as u64, Ordering::Relaxed);
    h.slot_count.store(layout.slot_count, Ordering::Relaxed);
    h.slot_size
        .store(layout.slot_size as u32, Ordering::Relaxed);
    for ((_, value), raw) in layout
        .geometry
        .fields()
        .into_iter()
        .zip(raw_geometry_fields(h))
    {
        raw.store(value, Ordering::Relaxed);
    }
    h.geometry.reserved.store(0, Ordering::Relaxed);
}

/// The first header field that differs from `layout`, if any (no allocation: read path).
pub(super) fn header_differs(h: &RingHeader, layout: &RingLayout) -> Option<&'static str> {
    if h.magic.load(Ordering::Relaxed) != layout.kind.magic() {
        return Some("magic");
    }
    if h.abi_major.load(Ordering::Relaxed) != ABI_MAJOR {
        return Some("abi_major");
    }
    if ABI_VERSION < h.abi_lowest_compatible.load(Ordering::Relaxed) {
        return Some("abi_lowest_compatible");
    }
    if h.header_size.load(Ordering::Relaxed) as usize != HEADER_SIZE {
        return Some("header_size");
    }
    for ((field, expected), raw) in layout
        .geometry
        .fields()
        .into_iter()
        .zip(raw_geometry_fields(h))
    {
        if raw.load(Ordering::Relaxed) != expected {
            return Some(field);
        }
    }
    if h.slot_count.load(Ordering::Relaxed) != layout.slot_count {
        return Some("slot_count");
    }
    if h.slot_size.load(Ordering::Relaxed) as usize != layout.slot_size {
        return Some("slot_size");
    }
    if h.total_size.load(Ordering::Relaxed) != layout.total_size as u64 {
        return Some("total_size");
    }
    None
}
