//! Shared buffers: rpcmem memory registered with a context, so the HTP reads inputs and
//! writes outputs in place instead of through the copies QNN makes for client buffers.
//!
//! Ownership, enforced by types: a [`SharedBuffer`] owns one rpcmem allocation through an
//! `Arc`; each registration of a range of it with a context ([`Registration`]) holds
//! another `Arc` of the allocation and one of the context. A registration deregisters in
//! its `Drop`, before its fields go, so the memory is freed only after every handle to it
//! is deregistered, and the context (whose `contextFree` would invalidate the handles)
//! outlives them. Host code reads and writes the memory only through `&SharedBuffer` /
//! `&mut SharedBuffer`, and [`crate::Graph::execute_shared`] takes `&mut SharedBuffer`, so
//! no host slice is alive while the HTP writes.
//!
//! An arena shared by a chain of graphs is split into disjoint [`Region`]s
//! ([`SharedBuffer::into_regions`], which consumes the whole-buffer view). Borrows are then
//! per region: [`crate::Graph::execute_regions`] takes the regions its inputs lie in by
//! `&` and those its outputs lie in by `&mut`, so while one graph runs, another thread may
//! read a region that graph only reads (a `&Region` through an `Arc`), and nobody can
//! hold a view of a region it writes.

// FFI: calls into QNN's memRegister/memDeRegister, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use crate::binary::TensorInfo;
use crate::error::QnnError;
use crate::ffi::{self, qnn, ContextHandle, MemHandle};
use crate::rpcmem::RpcMem;
use core::ffi::c_void;
use core::ops::Range;
use core::ptr::NonNull;
use std::sync::Arc;

/// Where tensors start in a shared buffer: a multiple of the page size, so every region
/// starts where the allocation's own mapping granularity does (rpcmem allocations are
/// page-aligned; the HTP documentation states no finer rule).
pub const REGION_ALIGN: usize = 4096;

/// `len` rounded up to [`REGION_ALIGN`].
pub const fn align_region(len: usize) -> usize {
    len.div_ceil(REGION_ALIGN) * REGION_ALIGN
}

/// One rpcmem allocation, freed when the last `Arc` of it goes.
pub(crate) struct Allocation {
    rpc: Arc<RpcMem>,
    ptr: NonNull<u8>,
    len: usize,
    fd: i32,
}

// SAFETY: the pointer is to process memory from rpcmem that any thread may use; Rust code
// dereferences it only through `SharedBuffer`'s `&`/`&mut` methods.
unsafe impl Send for Allocation {}
// SAFETY: as above; shared `Arc`s (registrations) never dereference the pointer.
unsafe impl Sync for Allocation {}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `self.rpc`'s rpcmem_alloc and is freed once, here; the
        // last `Arc` is going, so no SharedBuffer (no slice) and no registration (each
        // deregistered in its own Drop before releasing its `Arc`) refers to it.
        unsafe { self.rpc.free(self.ptr) };
    }
}

/// An rpcmem allocation for the inputs and outputs of one or more graphs, each at an
/// offset ([`SharedBuffer::bytes_mut`]); registered with contexts by
/// [`crate::Graph::bind_shared`].
pub struct SharedBuffer {
    memory: Arc<Allocation>,
}

impl core::fmt::Debug for SharedBuffer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("len", &self.memory.len)
            .field("fd", &self.memory.fd)
            .finish_non_exhaustive()
    }
}

impl SharedBuffer {
    /// Allocates `len` bytes (zeroed) with `rpc` and finds its file descriptor.
    pub fn allocate(rpc: &Arc<RpcMem>, len: usize) -> Result<Self, QnnError> {
        let refused = |reason: String| QnnError::NotAvailable {
            what: "a shared buffer",
            reason,
        };
        // rpcmem_alloc takes an int.
        let Ok(size) = core::ffi::c_int::try_from(len) else {
            return Err(refused(format!(
                "{len} bytes is more than rpcmem_alloc's int size allows"
            )));
        };
        if size == 0 {
            return Err(refused("an empty buffer was asked for".into()));
        }
        let Some(ptr) = rpc.alloc(size) else {
            return Err(refused(format!(
                "rpcmem_alloc of {len} bytes from {} returned NULL",
                rpc.origin().display()
            )));
        };
        let fd = rpc.to_fd(ptr);
        let memory = Arc::new(Allocation {
            rpc: rpc.clone(),
            ptr,
            len,
            fd: fd.unwrap_or(ffi::MEM_INVALID_FD),
        });
        if fd.is_none() {
            // `memory` frees the allocation as it goes.
            return Err(refused(
                "rpcmem_to_fd found no file descriptor for a fresh allocation".into(),
            ));
        }
        let mut buffer = Self { memory };
        buffer.as_bytes_mut().fill(0);
        Ok(buffer)
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.memory.len
    }

    /// Never true: an empty buffer is refused at allocation.
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }

    /// The allocation's file descriptor (what QNN registers).
    pub fn fd(&self) -> i32 {
        self.memory.fd
    }

    /// The whole buffer.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes (held by `memory`), zeroed at
        // allocation so every byte is initialized; the only other writer is the HTP during
        // `execute_shared`, which takes `&mut self`, so not while this borrow lives.
        unsafe { core::slice::from_raw_parts(self.memory.ptr.as_ptr(), self.memory.len) }
    }

    /// The whole buffer, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_bytes`, and `&mut self` makes this the only Rust view of it
        // (SharedBuffer is not Clone; registrations never dereference the pointer).
        unsafe { core::slice::from_raw_parts_mut(self.memory.ptr.as_ptr(), self.memory.len) }
    }

    /// The bytes of `range` (a tensor's region), or `None` when it is out of bounds.
    pub fn bytes(&self, range: Range<usize>) -> Option<&[u8]> {
        self.as_bytes().get(range)
    }

    /// The bytes of `range`, writable, or `None` when it is out of bounds.
    pub fn bytes_mut(&mut self, range: Range<usize>) -> Option<&mut [u8]> {
        self.as_bytes_mut().get_mut(range)
    }

    /// Whether `other` is a view of the same allocation (a registration's memory).
    pub(crate) fn memory(&self) -> &Arc<Allocation> {
        &self.memory
    }
}

impl SharedBuffer {
    /// Splits the buffer into disjoint regions at `ranges` (each non-empty and inside the
    /// buffer; checked). The whole-buffer view goes: from now on the memory is reached only
    /// region by region, so a borrow of one region says nothing of the others.
    pub fn into_regions(self, ranges: &[Range<usize>]) -> Result<Vec<Region>, QnnError> {
        let bad = |reason: String| QnnError::NotAvailable {
            what: "a shared buffer region",
            reason,
        };
        for (i, r) in ranges.iter().enumerate() {
            if r.start >= r.end || r.end > self.len() {
                return Err(bad(format!(
                    "bytes {r:?} are not a non-empty part of the {}-byte buffer",
                    self.len()
                )));
            }
            if let Some(o) = ranges[..i]
                .iter()
                .find(|o| o.start < r.end && r.start < o.end)
            {
                return Err(bad(format!("bytes {r:?} overlap bytes {o:?}")));
            }
        }
        Ok(ranges
            .iter()
            .map(|r| Region {
                memory: self.memory.clone(),
                range: r.clone(),
            })
            .collect())
    }
}

/// A part of a shared buffer that no other [`Region`] overlaps ([`SharedBuffer::into_regions`]).
/// Reading takes `&self`, writing `&mut self`; the HTP writes it only inside
/// [`crate::Graph::execute_regions`], which holds it by `&mut`. `Sync`: many threads may
/// read one region (e.g. through an `Arc`) while a graph that only reads it runs.
pub struct Region {
    memory: Arc<Allocation>,
    range: Range<usize>,
}

impl core::fmt::Debug for Region {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Region")
            .field("fd", &self.memory.fd)
            .field("range", &self.range)
            .finish()
    }
}

impl Region {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Never true: empty regions are refused.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// Where it lies in its buffer.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `range` lies inside the live allocation `memory` holds (checked by
        // `into_regions`), zeroed at allocation; no other Region overlaps it and the
        // whole-buffer view was consumed, so the only writers are `&mut self` below and
        // the HTP inside `Graph::execute_regions`, which holds this region by `&mut`
        // while any registration inside it is an output: neither while this borrow lives.
        unsafe { core::slice::from_raw_parts(self.start(), self.range.len()) }
    }

    /// Its bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_bytes`; `&mut self` makes this the only view of these bytes
        // (Region is not Clone and no other Region overlaps it).
        unsafe { core::slice::from_raw_parts_mut(self.start(), self.range.len()) }
    }

    /// The region's first byte (inside the allocation: `into_regions` checked the range).
    fn start(&self) -> *mut u8 {
        self.memory.ptr.as_ptr().wrapping_add(self.range.start)
    }

    pub(crate) fn memory(&self) -> &Arc<Allocation> {
        &self.memory
    }
}

/// memRegister and memDeRegister of the chosen provider.
#[derive(Clone, Copy)]
pub(crate) struct MemFns {
    pub register: ffi::MemRegisterFn,
    pub deregister: ffi::MemDeRegisterFn,
}

/// One range of a shared buffer registered with one context; deregistered on drop.
pub(crate) struct Registration {
    handle: MemHandle,
    deregister: ffi::MemDeRegisterFn,
    range: Range<usize>,
    // Released after `drop` deregistered the handle: the memory outlives the handle and
    // the context (through which the library stays loaded) outlives both.
    memory: Arc<Allocation>,
    _context: Arc<dyn Send + Sync>,
}

impl Registration {
    /// The QNN handle a MEMHANDLE tensor carries.
    pub fn handle(&self) -> MemHandle {
        self.handle
    }
    /// The registered bytes of the buffer.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }
    /// Whether this registers memory of `buffer`.
    pub fn is_in(&self, buffer: &SharedBuffer) -> bool {
        Arc::ptr_eq(&self.memory, buffer.memory())
    }
    /// Whether the registered bytes lie inside `region`.
    pub fn is_within(&self, region: &Region) -> bool {
        Arc::ptr_eq(&self.memory, region.memory())
            && region.range.start <= self.range.start
            && self.range.end <= region.range.end
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: `deregister` is the memDeRegister of the library the context keeps
        // loaded (`_context`, dropped after this); the handle came from its memRegister
        // and is deregistered once, here, while memory and context are still alive.
        let rc = qnn!(unsafe self.deregister(&self.handle, 1));
        if rc != ffi::QNN_SUCCESS {
            log::warn!("QNN memDeRegister returned {}", ffi::error_code(rc));
        }
    }
}

/// Why a registration did not happen: QNN's return value, or a range QNN must not see.
pub(crate) enum RegisterError {
    /// `memRegister` failed with this error handle.
    Qnn(u64),
    /// The tensor's bytes do not fit the buffer at that offset (or overflow).
    OutOfBounds,
}

/// Registers `tensor`'s bytes at `offset` of `buffer` with `context` as one HTP
/// SHARED_BUFFER descriptor (the buffer's fd, its whole size, the offset). `owner` keeps
/// the context alive as long as the registration.
pub(crate) fn register(
    fns: MemFns,
    context: ContextHandle,
    owner: Arc<dyn Send + Sync>,
    memory: &Arc<Allocation>,
    offset: usize,
    tensor: &TensorInfo,
) -> Result<Registration, RegisterError> {
    // QNN does not check sizes against the buffer: a region past its end would let the
    // HTP read or write memory that is not ours.
    let len = tensor.byte_len().ok_or(RegisterError::OutOfBounds)?;
    let end = offset.checked_add(len).ok_or(RegisterError::OutOfBounds)?;
    if end > memory.len || len == 0 {
        return Err(RegisterError::OutOfBounds);
    }
    let mut dims = tensor.dims.clone();
    let htp = ffi::HtpMemDescriptor {
        mem_type: ffi::HTP_MEM_SHARED_BUFFER,
        size: memory.len as u64,
        fd: memory.fd,
        offset: offset as u64,
    };
    let descriptor = ffi::MemDescriptor {
        mem_shape: ffi::MemShape {
            num_dim: dims.len() as u32,
            dim_size: dims.as_mut_ptr(),
            shape_config: core::ptr::null(),
        },
        data_type: tensor.data_type,
        mem_type: ffi::MEM_DESC_TYPE_CUSTOM,
        custom_info: &htp as *const ffi::HtpMemDescriptor as *const c_void,
    };
    let mut handle = MemHandle::NULL;
    // SAFETY: `register` is the provider's memRegister (a non-NULL slot of the checked
    // table) of the library `owner` keeps loaded, `context` a live context of it; one
    // descriptor whose dims and HTP descriptor are locals alive for the call, naming an
    // fd and an in-bounds range (checked above) of memory `memory` keeps allocated; one
    // handle slot, a local.
    let rc = qnn!(unsafe fns.register(context, &descriptor, 1, &mut handle));
    if rc != ffi::QNN_SUCCESS || handle.is_null() {
        return Err(RegisterError::Qnn(rc));
    }
    Ok(Registration {
        handle,
        deregister: fns.deregister,
        range: offset..end,
        memory: memory.clone(),
        _context: owner,
    })
}

#[cfg(test)]
mod tests {
    //! The binding against a stand-in QNN table and rpcmem (the x86_64 HTP emulator
    //! refuses every memRegister with 1000, "QnnMem API is not supported"): the calls, in
    //! order, and what each one is given.
    use super::*;
    use crate::binary::TensorKind;
    use std::sync::Mutex;

    static CALLS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static TURN: Mutex<()> = Mutex::new(());
    const CONTEXT: usize = 0xC0;

    fn log(s: String) {
        CALLS.lock().unwrap().push(s);
    }

    unsafe extern "C" fn alloc(
        heap: core::ffi::c_int,
        flags: u32,
        size: core::ffi::c_int,
    ) -> *mut c_void {
        log(format!("alloc heap={heap} flags={flags} size={size}"));
        let mut v = vec![0xAAu8; size as usize].into_boxed_slice();
        let p = v.as_mut_ptr();
        core::mem::forget(v);
        p as *mut c_void
    }
    unsafe extern "C" fn to_fd(_p: *mut c_void) -> core::ffi::c_int {
        log("to_fd".into());
        42
    }
    unsafe extern "C" fn free(_p: *mut c_void) {
        // The stand-in leaks the test's few bytes: it cannot know the size to rebuild the box.
        log("free".into());
    }
    unsafe extern "C" fn mem_register(
        context: ContextHandle,
        d: *const ffi::MemDescriptor,
        n: u32,
        out: *mut MemHandle,
    ) -> u64 {
        // SAFETY: register passes one valid descriptor.
        let d = unsafe { &*d };
        // SAFETY: a CUSTOM descriptor's union points at the HTP descriptor.
        let htp = unsafe { &*(d.custom_info as *const ffi::HtpMemDescriptor) };
        // SAFETY: `num_dim` dims at `dim_size`, alive for the call.
        let dims = unsafe {
            core::slice::from_raw_parts(d.mem_shape.dim_size, d.mem_shape.num_dim as usize)
        };
        log(format!(
            "register ctx={:?} n={n} type={} dtype={:#x} dims={dims:?} htp={} size={} fd={} offset={}",
            context, d.mem_type, d.data_type, htp.mem_type, htp.size, htp.fd, htp.offset
        ));
        if htp.offset == 8192 {
            return 8002;
        }
        // SAFETY: one out slot. A handle made of the offset, to tell them apart.
        let h: MemHandle = unsafe { core::mem::transmute(0x1000 + htp.offset as usize) };
        // SAFETY: as above.
        unsafe { *out = h };
        0
    }
    unsafe extern "C" fn mem_deregister(h: *const MemHandle, n: u32) -> u64 {
        // SAFETY: one handle.
        log(format!("deregister {:?} n={n}", unsafe { *h }));
        0
    }

    /// Stands in for the context: says when it goes.
    struct Owner;
    impl Drop for Owner {
        fn drop(&mut self) {
            log("context freed".into());
        }
    }

    fn tensor(dims: Vec<u32>) -> TensorInfo {
        TensorInfo {
            id: 1,
            name: "t".into(),
            kind: TensorKind::Input,
            dims,
            data_type: ffi::data_type::FLOAT_32,
            element: Some(vla_tensor::ElementType::F32),
            unsupported: None,
            quant_raw: ffi::QuantizeParams {
                encoding_definition: ffi::QUANT_UNDEFINED,
                quantization_encoding: ffi::QUANT_UNDEFINED,
                scale: 0.0,
                offset: 0,
                _rest_of_union: [0; 3],
            },
        }
    }

    fn context() -> ContextHandle {
        // SAFETY: an opaque value the stand-in only prints.
        unsafe { core::mem::transmute(CONTEXT) }
    }

    #[test]
    fn registrations_deregister_before_the_memory_is_freed_and_the_context_goes_last() {
        let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
        CALLS.lock().unwrap().clear();
        let rpc = RpcMem::from_fns(alloc, free, to_fd);
        let mut buffer = SharedBuffer::allocate(&rpc, 3 * REGION_ALIGN).unwrap();
        assert!(buffer.as_bytes().iter().all(|&b| b == 0), "zeroed");
        let fns = MemFns {
            register: mem_register,
            deregister: mem_deregister,
        };
        let owner: Arc<dyn Send + Sync> = Arc::new(Owner);
        let a = register(
            fns,
            context(),
            owner.clone(),
            buffer.memory(),
            0,
            &tensor(vec![2, 3]),
        )
        .ok()
        .unwrap();
        let b = register(
            fns,
            context(),
            owner.clone(),
            buffer.memory(),
            REGION_ALIGN,
            &tensor(vec![4]),
        )
        .ok()
        .unwrap();
        assert_eq!(a.range(), 0..24);
        assert_eq!(b.range(), 4096..4112);
        assert!(a.is_in(&buffer));
        // A tensor past the end never reaches QNN.
        let past = register(
            fns,
            context(),
            owner.clone(),
            buffer.memory(),
            3 * REGION_ALIGN - 8,
            &tensor(vec![4]),
        );
        assert!(matches!(past, Err(RegisterError::OutOfBounds)));
        // QNN's refusal is handed back, nothing registered.
        let refused = register(
            fns,
            context(),
            owner.clone(),
            buffer.memory(),
            8192,
            &tensor(vec![1]),
        );
        assert!(matches!(refused, Err(RegisterError::Qnn(8002))));
        buffer
            .bytes_mut(0..4)
            .unwrap()
            .copy_from_slice(&[1, 2, 3, 4]);
        drop(owner);
        // The buffer goes first: nothing is freed while registrations hold the memory.
        drop(buffer);
        drop(a);
        drop(b);
        let calls = CALLS.lock().unwrap().clone();
        assert_eq!(
            calls,
            vec![
                "alloc heap=25 flags=1 size=12288".to_string(),
                "to_fd".into(),
                "register ctx=ContextHandle(0xc0) n=1 type=2 dtype=0x232 dims=[2, 3] htp=1 size=12288 fd=42 offset=0".into(),
                "register ctx=ContextHandle(0xc0) n=1 type=2 dtype=0x232 dims=[4] htp=1 size=12288 fd=42 offset=4096".into(),
                "register ctx=ContextHandle(0xc0) n=1 type=2 dtype=0x232 dims=[1] htp=1 size=12288 fd=42 offset=8192".into(),
                "deregister MemHandle(0x1000) n=1".into(),
                "deregister MemHandle(0x2000) n=1".into(),
                "free".into(),
                "context freed".into(),
            ]
        );
    }

    #[test]
    fn regions_are_disjoint_parts_of_the_buffer_and_registrations_know_theirs() {
        let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
        let rpc = RpcMem::from_fns(alloc, free, to_fd);
        let whole = || SharedBuffer::allocate(&rpc, 3 * REGION_ALIGN).unwrap();
        for (ranges, says) in [
            (vec![0..10, 5..20], "overlap bytes 0..10"),
            (
                vec![0..10, 10..3 * REGION_ALIGN + 1],
                "not a non-empty part",
            ),
            (vec![4..4, 8..9], "not a non-empty part"),
        ] {
            let e = whole().into_regions(&ranges).unwrap_err().to_string();
            assert!(e.contains(says), "{ranges:?}: {e}");
        }
        let mut regions = whole()
            .into_regions(&[0..8, REGION_ALIGN..REGION_ALIGN + 16])
            .unwrap();
        regions[1].as_bytes_mut().copy_from_slice(&[7; 16]);
        assert_eq!(
            regions[0].as_bytes(),
            &[0; 8],
            "writes stay in their region"
        );
        assert_eq!(regions[1].range(), REGION_ALIGN..REGION_ALIGN + 16);
        let fns = MemFns {
            register: mem_register,
            deregister: mem_deregister,
        };
        let owner: Arc<dyn Send + Sync> = Arc::new(Owner);
        let r = register(
            fns,
            context(),
            owner,
            regions[1].memory(),
            REGION_ALIGN + 8,
            &tensor(vec![2]),
        )
        .ok()
        .unwrap();
        assert!(r.is_within(&regions[1]) && !r.is_within(&regions[0]));
        let all = 0..3 * REGION_ALIGN;
        let other = whole().into_regions(core::slice::from_ref(&all)).unwrap();
        assert!(!r.is_within(&other[0]), "another buffer's region");
    }

    #[test]
    fn sizes_rpcmem_cannot_take_are_refused_before_it_is_called() {
        let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
        CALLS.lock().unwrap().clear();
        let rpc = RpcMem::from_fns(alloc, free, to_fd);
        for len in [0, 1usize << 31] {
            let e = SharedBuffer::allocate(&rpc, len).unwrap_err().to_string();
            assert!(e.starts_with("a shared buffer is not available: "), "{e}");
        }
        assert!(CALLS.lock().unwrap().is_empty());
    }

    #[test]
    fn a_memhandle_tensor_carries_memtype_1_at_88_and_the_handle_at_96() {
        let t = tensor(vec![4]);
        let mut q = ffi::QnnTensor {
            version: 1,
            v1: ffi::TensorV1 {
                id: 1,
                name: core::ptr::null(),
                tensor_type: ffi::TENSOR_TYPE_APP_WRITE,
                data_format: ffi::DATA_FORMAT_DENSE,
                data_type: t.data_type,
                quantize_params: t.quant_raw,
                rank: 0,
                dimensions: core::ptr::null_mut(),
                mem_type: ffi::MEM_TYPE_RAW,
                client_buf: ffi::ClientBuffer {
                    data: core::ptr::null_mut(),
                    data_size: 7,
                },
            },
            _v2_tail: [0; 3],
        };
        // SAFETY: an opaque value, only stored.
        let handle: MemHandle = unsafe { core::mem::transmute(0x1234_5678usize) };
        q.v1.set_mem_handle(handle);
        let base = &q as *const ffi::QnnTensor as *const u8;
        // SAFETY: offsets of initialized fields inside `q` (memType, the union's words).
        let mem_type: u32 = unsafe { ffi::read_at(base, 8 + 88) };
        // SAFETY: as above.
        let word: u64 = unsafe { ffi::read_at(base, 8 + 96) };
        // SAFETY: as above.
        let size: u32 = unsafe { ffi::read_at(base, 8 + 104) };
        assert_eq!((mem_type, word, size), (1, 0x1234_5678, 0));
        q.v1.clear_data();
        assert_eq!(q.v1.mem_type, ffi::MEM_TYPE_RAW);
        assert!(q.v1.client_buf.data.is_null());
    }
}
