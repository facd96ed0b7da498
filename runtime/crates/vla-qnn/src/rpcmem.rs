//! rpcmem from libcdsprpc.so, `dlopen`ed at run time: memory the cDSP maps directly.
//!
//! Qualcomm's HTP shared-buffer tutorial, ONNX Runtime's QNN EP, ExecuTorch, mllm and
//! ggml's QNN backend all take `rpcmem_alloc(int heapid, u32 flags, int size)`,
//! `rpcmem_free(void*)` and `rpcmem_to_fd(void*)` from libcdsprpc.so with heap 25
//! (`RPCMEM_HEAP_ID_SYSTEM`) and flags 1 (`RPCMEM_DEFAULT_FLAGS`, cached). The library is
//! opened here and nowhere at link time, so vlad's binary still needs glibc alone and
//! starts where the library is absent (the emulator, CI), falling back to client buffers.

// FFI: calls into libcdsprpc.so, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use crate::error::QnnError;
use crate::ffi::qnn;
use core::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `RPCMEM_HEAP_ID_SYSTEM`: non-contiguous memory behind the SMMU, what the cDSP uses.
pub const RPCMEM_HEAP_ID_SYSTEM: c_int = 25;
/// `RPCMEM_DEFAULT_FLAGS`: cached (`ION_FLAG_CACHED`).
pub const RPCMEM_DEFAULT_FLAGS: u32 = 1;

/// `void* rpcmem_alloc(int heapid, uint32 flags, int size)`.
pub type RpcMemAllocFn = unsafe extern "C" fn(c_int, u32, c_int) -> *mut c_void;
/// `void rpcmem_free(void* po)`.
pub type RpcMemFreeFn = unsafe extern "C" fn(*mut c_void);
/// `int rpcmem_to_fd(void* po)`: the allocation's file descriptor, negative if `po` is
/// not an rpcmem allocation.
pub type RpcMemToFdFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The names libcdsprpc goes by, tried in order when no path is configured: fastrpc's
/// versioned name on Linux images, then the unversioned one of the Android/QAIRT layout.
pub const LIBRARY_NAMES: [&str; 2] = ["libcdsprpc.so.1", "libcdsprpc.so"];

/// libcdsprpc.so's rpcmem functions; the library stays loaded while this lives (every
/// [`crate::SharedBuffer`] holds an `Arc` of it).
pub struct RpcMem {
    alloc: RpcMemAllocFn,
    free: RpcMemFreeFn,
    to_fd: RpcMemToFdFn,
    origin: PathBuf,
    // Dropped last: the function pointers above point into it. `None` only for the
    // in-crate tests' stand-in functions.
    _lib: Option<libloading::Library>,
}

// SAFETY: plain function pointers into a library kept loaded for the struct's life;
// rpcmem's functions are thread-safe (FastRPC serializes its own tables).
unsafe impl Send for RpcMem {}
// SAFETY: as above; nothing is mutated after construction.
unsafe impl Sync for RpcMem {}

impl core::fmt::Debug for RpcMem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RpcMem")
            .field("library", &self.origin)
            .finish_non_exhaustive()
    }
}

fn symbol<F: Copy>(lib: &libloading::Library, name: &[u8], path: &Path) -> Result<F, QnnError> {
    // SAFETY: the caller names an rpcmem symbol and `F` its documented C signature
    // (rpcmem.h); the pointer is copied out and used only while `lib` stays loaded
    // (`RpcMem` owns it).
    let sym: libloading::Symbol<F> =
        unsafe { lib.get(name) }.map_err(|e| QnnError::LibraryLoad {
            path: path.to_owned(),
            reason: format!(
                "no symbol {}",
                String::from_utf8_lossy(&name[..name.len() - 1])
            ),
            source: Some(e),
        })?;
    Ok(*sym)
}

impl RpcMem {
    /// Opens libcdsprpc from `path` (absolute, or a bare name the loader searches for).
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Self>, QnnError> {
        let path = path.as_ref();
        // SAFETY: loading runs the library's initializers; libcdsprpc is the vendor's
        // FastRPC client library, chosen by configuration or by its standard name.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| QnnError::LibraryLoad {
            path: path.to_owned(),
            reason: "dlopen failed".into(),
            source: Some(e),
        })?;
        let alloc = symbol::<RpcMemAllocFn>(&lib, b"rpcmem_alloc\0", path)?;
        let free = symbol::<RpcMemFreeFn>(&lib, b"rpcmem_free\0", path)?;
        let to_fd = symbol::<RpcMemToFdFn>(&lib, b"rpcmem_to_fd\0", path)?;
        Ok(Arc::new(Self {
            alloc,
            free,
            to_fd,
            origin: path.to_owned(),
            _lib: Some(lib),
        }))
    }

    /// Opens libcdsprpc by its standard names ([`LIBRARY_NAMES`], in order); the error
    /// names every one tried and keeps the last one's loader error.
    pub fn load_default() -> Result<Arc<Self>, QnnError> {
        let mut last = None;
        for name in LIBRARY_NAMES {
            match Self::load(name) {
                Ok(r) => return Ok(r),
                Err(QnnError::LibraryLoad { source, .. }) => last = source,
                Err(other) => return Err(other),
            }
        }
        Err(QnnError::LibraryLoad {
            path: PathBuf::from(LIBRARY_NAMES[LIBRARY_NAMES.len() - 1]),
            reason: format!("dlopen failed (tried {})", LIBRARY_NAMES.join(", then ")),
            source: last,
        })
    }

    /// The in-crate tests' stand-in: functions without a library.
    #[cfg(test)]
    pub(crate) fn from_fns(
        alloc: RpcMemAllocFn,
        free: RpcMemFreeFn,
        to_fd: RpcMemToFdFn,
    ) -> Arc<Self> {
        Arc::new(Self {
            alloc,
            free,
            to_fd,
            origin: PathBuf::from("(test functions)"),
            _lib: None,
        })
    }

    /// Where the functions came from (the path or name loaded).
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// `rpcmem_alloc` from the system heap, cached; `None` when it returns NULL.
    pub(crate) fn alloc(&self, len: c_int) -> Option<core::ptr::NonNull<u8>> {
        // SAFETY: `alloc` is rpcmem_alloc from the library `self` keeps loaded (or a
        // test's stand-in with its signature); the heap id and flags are the documented
        // ones and `len` a positive int (checked by the caller).
        let p = qnn!(unsafe self.alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, len));
        core::ptr::NonNull::new(p as *mut u8)
    }

    /// `rpcmem_to_fd` of an allocation this struct made; `None` when it has none.
    pub(crate) fn to_fd(&self, p: core::ptr::NonNull<u8>) -> Option<c_int> {
        // SAFETY: `p` was returned by `self.alloc` and not yet freed (the caller's
        // allocation owns it); rpcmem_to_fd only looks it up.
        let fd = qnn!(unsafe self.to_fd(p.as_ptr() as *mut c_void));
        (fd >= 0).then_some(fd)
    }

    /// `rpcmem_free` of an allocation this struct made.
    ///
    /// # Safety
    /// `p` came from [`RpcMem::alloc`] of this struct, is freed once, and nothing (no
    /// slice, no QNN registration) refers to it any more.
    pub(crate) unsafe fn free(&self, p: core::ptr::NonNull<u8>) {
        // SAFETY: the caller's contract.
        let () = qnn!(unsafe self.free(p.as_ptr() as *mut c_void));
    }
}
