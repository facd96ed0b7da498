//! The one place that touches raw shared memory: mapping a segment (MAP_SHARED) and
//! viewing it as the atomic header and atomic slot words of `layout.rs`. Everything above
//! this module works with `&RingHeader` and `&[AtomicU64]` only.
//!
//! A segment is a file other processes can write, so they can also shrink it under our
//! mapping; the kernel then answers an access to a page past the new end with SIGBUS,
//! which would kill the daemon. Every live mapping is therefore registered with a SIGBUS
//! handler (installed once, by the first mapping): a fault inside a registered mapping
//! replaces that whole mapping, in place, with private zero pages and marks it truncated,
//! and the faulting load or store is retried on them. A zeroed header reads as no
//! published slot and a wrong magic, so readers see nothing new (the daemon holds), and
//! [`SharedMapping::truncated`] tells the ring to report the segment gone. Any other
//! SIGBUS (a fault outside every mapping, or one sent by kill(2)) restores the default
//! action and raises it again, so it still ends the process.

// Shared memory: the mapping and the views of it, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::fs::File;
use std::io;
use std::sync::Once;

use nix::libc;

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
    /// Its entry in the SIGBUS handler's table.
    guard: usize,
}

/// Most ring mappings one process holds at once (the daemon: two, tests: a few dozen).
const MAX_MAPPINGS: usize = 256;
#[allow(clippy::declare_interior_mutable_const)] // each array element gets its own copy
const FREE: AtomicUsize = AtomicUsize::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const CLEAN: AtomicBool = AtomicBool::new(false);
/// Start address of each registered mapping (0: free entry), its length, and whether the
/// handler has replaced it. Plain atomics: the handler may only touch lock-free memory.
static STARTS: [AtomicUsize; MAX_MAPPINGS] = [FREE; MAX_MAPPINGS];
static LENGTHS: [AtomicUsize; MAX_MAPPINGS] = [FREE; MAX_MAPPINGS];
static TRUNCATED: [AtomicBool; MAX_MAPPINGS] = [CLEAN; MAX_MAPPINGS];
static HANDLER: Once = Once::new();

/// Registers `[start, start + len)`; returns its entry.
fn register(start: usize, len: usize) -> io::Result<usize> {
    install_handler()?;
    for (i, slot) in STARTS.iter().enumerate() {
        if slot
            .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            TRUNCATED[i].store(false, Ordering::Release);
            LENGTHS[i].store(len, Ordering::Release);
            return Ok(i);
        }
    }
    Err(io::Error::other(format!(
        "more than {MAX_MAPPINGS} ring mappings in one process"
    )))
}

fn unregister(i: usize) {
    LENGTHS[i].store(0, Ordering::Release);
    STARTS[i].store(0, Ordering::Release);
}

fn install_handler() -> io::Result<()> {
    let mut result = Ok(());
    HANDLER.call_once(|| {
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::SigAction(on_sigbus),
            nix::sys::signal::SaFlags::SA_SIGINFO,
            nix::sys::signal::SigSet::empty(),
        );
        // SAFETY: `on_sigbus` only loads and stores atomics and calls mmap(2), signal(2)
        // and raise(3), plain system calls on Linux (the same remap Wayland compositors
        // make for shared-memory clients); it takes no lock and allocates nothing.
        if let Err(e) = unsafe { nix::sys::signal::sigaction(nix::sys::signal::SIGBUS, &action) } {
            result = Err(io::Error::from(e));
        }
    });
    result
}

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid, aligned siginfo_t for an SA_SIGINFO handler.
    let info: &libc::siginfo_t = unsafe { &*info };
    // Only an access past the end of a mapped file is a truncation (the kernel's
    // BUS_ADRERR); a SIGBUS sent by kill(2) carries a pid where the address would be.
    if info.si_code == libc::BUS_ADRERR {
        // SAFETY: for a BUS_ADRERR the kernel filled the union's fault member, which
        // si_addr reads.
        let addr = unsafe { info.si_addr() } as usize;
        if remap_ring_page(addr) {
            return;
        }
    }
    // Not a ring's truncated page: the process ends as it would without this handler.
    // Resetting the disposition cannot leave later ring faults unhandled, since the
    // SIGBUS raised here (blocked until the handler returns) is delivered at once with
    // the default action and the process does not go on.
    // SAFETY: signal(2) with SIG_DFL is async-signal-safe.
    unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
    // SAFETY: raise(3) is async-signal-safe.
    unsafe { libc::raise(libc::SIGBUS) };
}

/// Replaces the registered mapping holding `addr` with zero pages and marks it truncated;
/// false when no registered mapping holds it (or the remap failed).
fn remap_ring_page(addr: usize) -> bool {
    for i in 0..MAX_MAPPINGS {
        let start = STARTS[i].load(Ordering::Acquire);
        let len = LENGTHS[i].load(Ordering::Acquire);
        // The entry may change between the two loads (unregistered, or reused by another
        // mapping): only a start seen again after its length describes one mapping.
        if start == 0 || len == 0 || STARTS[i].load(Ordering::Acquire) != start {
            continue;
        }
        if addr >= start && addr < start + len {
            // SAFETY: `[start, start + len)` is a mapping this module made and still owns:
            // entries are removed before unmapping, and the faulting access holds a borrow
            // of the `SharedMapping` (its header or slot views), so it cannot be dropped
            // meanwhile. MAP_FIXED replaces exactly it with private zero pages, so every
            // reference into it stays valid memory.
            let remapped = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if remapped != libc::MAP_FAILED {
                TRUNCATED[i].store(true, Ordering::Release);
                return true;
            }
        }
    }
    false
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
        // the atomics handed out below, never as plain Rust data. Truncation faults
        // (SIGBUS) and is answered by this module's handler (zero pages, see the module
        // doc), whoever shrinks the file.
        let map = unsafe { MmapOptions::new().len(len).populate().map_mut(file)? };
        let guard = register(map.as_ptr() as usize, map.len())?;
        Ok(SharedMapping {
            mapping: Mapping::ReadWrite(map),
            guard,
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
        let guard = register(map.as_ptr() as usize, map.len())?;
        Ok(SharedMapping {
            mapping: Mapping::ReadOnly(map),
            guard,
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

    /// The segment was shrunk under this mapping: its pages are zeros now, not the file.
    pub(crate) fn truncated(&self) -> bool {
        TRUNCATED[self.guard].load(Ordering::Acquire)
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // Before the field's drop unmaps the range: the handler never remaps memory that
        // may be reused by something else.
        unregister(self.guard);
    }
}
