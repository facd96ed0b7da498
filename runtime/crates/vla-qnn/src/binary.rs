//! Context binaries: the read-only mapping of a `.bin` and its metadata.
//!
//! The file is memory-mapped (never copied into the heap) and described through
//! libQnnSystem's binary info. Everything the library returns is copied into owned Rust
//! types before the system context that owns it is freed. The mapping is never locked in
//! RAM (a process under `mlockall` would otherwise pin gigabytes of page cache) and is
//! dropped once a context exists: contexts are created without QNN's persistent-binary
//! option, so the backend keeps its own copy of what it needs.
//!
//! A caller that must know the bytes QNN gets (a signed bundle's digest) reads them once
//! into a [`BinaryImage`] instead, checking each chunk as it arrives, and hands the image
//! to [`ContextBinary::from_image`]: what it checked is what QNN receives. For a group
//! of binaries it describes each from its metadata first and gives its bytes only as its
//! context is created ([`ContextBinary::with_bytes_at_creation`]): one image at a time.

// FFI: calls into the QNN libraries, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use crate::error::QnnError;
use crate::ffi::{
    self, binary_info as bi, data_type as dt, graph_info as gi, qnn, read_at, SystemContextHandle,
};
use crate::library::{ApiVersion, QnnLibrary};
use core::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use vla_tensor::{ElementType, Quantization};

/// Direction of a graph tensor as the application sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// Written by the application (`QNN_TENSOR_TYPE_APP_WRITE`).
    Input,
    /// Read by the application (`QNN_TENSOR_TYPE_APP_READ`).
    Output,
    /// Any other `Qnn_TensorType_t` (its code).
    Other(u32),
}

/// One graph input or output, as described by the binary.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The id `graphExecute` matches tensors by.
    pub id: u32,
    /// The tensor's name in the graph.
    pub name: String,
    /// Input, output or other.
    pub kind: TensorKind,
    /// Dimensions, outermost first.
    pub dims: Vec<u32>,
    /// QNN data type code (`Qnn_DataType_t`).
    pub data_type: u32,
    /// The element type when this runtime can execute it.
    pub element: Option<ElementType>,
    /// Why `element` is `None`.
    pub unsupported: Option<String>,
    pub(crate) quant_raw: ffi::QuantizeParams,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }

    /// Buffer size in bytes, when the element type is supported.
    pub fn byte_len(&self) -> Option<usize> {
        self.element.map(|e| self.elements() * e.size())
    }

    /// `[1, 2, 729, 588]`-style shape text.
    pub fn shape_text(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        format!("[{}]", dims.join(","))
    }

    /// Dims as `usize`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().map(|&d| d as usize).collect()
    }
}

/// Human name of a QNN data type code.
pub fn data_type_name(code: u32) -> &'static str {
    match code {
        dt::INT_8 => "int8",
        dt::INT_16 => "int16",
        dt::INT_32 => "int32",
        dt::INT_64 => "int64",
        dt::UINT_8 => "uint8",
        dt::UINT_16 => "uint16",
        dt::UINT_32 => "uint32",
        dt::UINT_64 => "uint64",
        dt::FLOAT_16 => "float16",
        dt::FLOAT_32 => "float32",
        dt::FLOAT_64 => "float64",
        dt::BFLOAT_16 => "bfloat16",
        dt::SFIXED_POINT_8 => "sfixed8",
        dt::SFIXED_POINT_16 => "sfixed16",
        dt::SFIXED_POINT_32 => "sfixed32",
        dt::UFIXED_POINT_8 => "ufixed8",
        dt::UFIXED_POINT_16 => "ufixed16",
        dt::UFIXED_POINT_32 => "ufixed32",
        dt::BOOL_8 => "bool8",
        dt::STRING => "string",
        _ => "unknown",
    }
}

fn element_type(data_type: u32, q: &ffi::QuantizeParams) -> Result<ElementType, String> {
    let quant = || -> Result<Quantization, String> {
        if q.encoding_definition != ffi::QUANT_DEFINITION_DEFINED
            || q.quantization_encoding != ffi::QUANT_ENCODING_SCALE_OFFSET
        {
            return Err(format!(
                "{} with quantization encoding {:#x} (only per-tensor scale/offset is supported)",
                data_type_name(data_type),
                q.quantization_encoding
            ));
        }
        if !(q.scale.is_finite() && q.scale > 0.0) {
            return Err(format!(
                "{} with invalid scale {}",
                data_type_name(data_type),
                q.scale
            ));
        }
        Ok(Quantization {
            scale: q.scale,
            offset: q.offset,
        })
    };
    Ok(match data_type {
        dt::FLOAT_32 => ElementType::F32,
        dt::FLOAT_16 => ElementType::F16,
        dt::INT_32 => ElementType::I32,
        dt::UINT_8 => ElementType::U8,
        dt::BOOL_8 => ElementType::Bool,
        dt::UFIXED_POINT_8 => ElementType::UFixed8(quant()?),
        dt::UFIXED_POINT_16 => ElementType::UFixed16(quant()?),
        dt::SFIXED_POINT_8 => ElementType::SFixed8(quant()?),
        dt::SFIXED_POINT_16 => ElementType::SFixed16(quant()?),
        other => {
            return Err(format!(
                "data type {} ({other:#x}) is not supported",
                data_type_name(other)
            ))
        }
    })
}

/// A copy of the C string at `ptr` (`None` for NULL).
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string alive for the call (strings in a
/// binary's info live as long as the system context that read it).
unsafe fn c_str(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL, and NUL-terminated and alive for the call by the caller's contract.
    Some(
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Upper bounds that keep a hostile binary from making us walk wild pointers forever.
const MAX_GRAPHS: u32 = 1024;
const MAX_TENSORS: u32 = 4096;
const MAX_RANK: u32 = 16;
/// Size of the widest element type a tensor can have (`Qnn_DataType_t` 64-bit types).
const MAX_ELEMENT_BYTES: usize = 8;

/// Copies one `Qnn_Tensor_t` (v1 or v2; the v1 prefix is common) out of library memory.
///
/// # Safety
/// `t` must point to a tensor struct owned by a live system context.
unsafe fn read_tensor(t: *const u8, path: &Path) -> Result<TensorInfo, QnnError> {
    let bad = |reason: String| QnnError::Metadata {
        path: path.to_owned(),
        reason,
    };
    // SAFETY: per the caller, `t` is a valid Qnn_Tensor_t: `u32 version` @0.
    let version: u32 = unsafe { read_at(t, 0) };
    // SAFETY: as above: the v1 struct @8, the prefix common to v1 and v2.
    let v1: ffi::TensorV1 = unsafe { read_at(t, 8) };
    if version != 1 && version != 2 {
        return Err(bad(format!("tensor struct version {version}")));
    }
    // SAFETY: a tensor name in the metadata of the live system context (the caller's).
    let name =
        unsafe { c_str(v1.name) }.ok_or_else(|| bad(format!("tensor id {} has no name", v1.id)))?;
    if v1.rank > MAX_RANK || (v1.rank > 0 && v1.dimensions.is_null()) {
        return Err(bad(format!(
            "tensor `{name}` has rank {} without dimensions",
            v1.rank
        )));
    }
    let dims: Vec<u32> = if v1.rank == 0 {
        Vec::new()
    } else {
        // SAFETY: `dimensions` holds `rank` u32 values (non-NULL, checked above), owned
        // by the live system context; copied at once.
        unsafe { core::slice::from_raw_parts(v1.dimensions, v1.rank as usize) }.to_vec()
    };
    // Buffers are sized from these dims (`elements`, `byte_len`): a product that
    // overflows would size them wrong, so such a tensor is refused here.
    let bytes = dims
        .iter()
        .try_fold(MAX_ELEMENT_BYTES, |acc, &d| acc.checked_mul(d as usize))
        .filter(|&b| b <= isize::MAX as usize);
    if bytes.is_none() {
        return Err(bad(format!(
            "tensor `{name}` has dims {dims:?}, too large for any buffer"
        )));
    }
    let kind = match v1.tensor_type {
        ffi::TENSOR_TYPE_APP_WRITE => TensorKind::Input,
        ffi::TENSOR_TYPE_APP_READ => TensorKind::Output,
        other => TensorKind::Other(other),
    };
    let (element, unsupported) = match element_type(v1.data_type, &v1.quantize_params) {
        Ok(e) => (Some(e), None),
        Err(why) => (None, Some(why)),
    };
    Ok(TensorInfo {
        id: v1.id,
        name,
        kind,
        dims,
        data_type: v1.data_type,
        element,
        unsupported,
        quant_raw: v1.quantize_params,
    })
}

/// One graph of a context binary.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphInfo {
    /// The graph's name (what `graphRetrieve` takes).
    pub name: String,
    /// Its inputs, in the graph's order.
    pub inputs: Vec<TensorInfo>,
    /// Its outputs, in the graph's order.
    pub outputs: Vec<TensorInfo>,
    /// HTP spill-fill buffer the graph needs (graph info v2/v3 blob info, v1), if reported.
    pub spill_fill_bytes: Option<u64>,
}

/// What libQnnSystem reports about a context binary.
#[derive(Clone, Debug, PartialEq)]
pub struct BinaryInfo {
    /// The binary info struct's version (1-3; QNN 2.51 writes 3).
    pub info_version: u32,
    /// The build id of the QNN that compiled the binary (`v2.51.0...`).
    pub build_id: Option<String>,
    /// The core API version the binary was compiled against.
    pub core_api: ApiVersion,
    /// The backend API version the binary was compiled against.
    pub backend_api: ApiVersion,
    /// Context blob version (binary info v3 only).
    pub blob_version: Option<ApiVersion>,
    /// Context blob size in bytes (binary info v3 only).
    pub blob_size: Option<u64>,
    /// SoC model the binary was compiled for (binary info v3 only; 77 = QCS9075/QCS9100).
    pub soc_model: Option<u32>,
    /// The binary's graphs.
    pub graphs: Vec<GraphInfo>,
}

impl BinaryInfo {
    /// The largest spill-fill buffer any graph of the binary reports (0 when none does).
    pub fn spill_fill_bytes(&self) -> u64 {
        self.graphs
            .iter()
            .filter_map(|g| g.spill_fill_bytes)
            .max()
            .unwrap_or(0)
    }
}

/// Owns a `QnnSystemContext_Handle_t` and frees it on every path.
struct SystemContext<'a> {
    lib: &'a QnnLibrary,
    handle: SystemContextHandle,
}

impl Drop for SystemContext<'_> {
    fn drop(&mut self) {
        // SAFETY: created by this library's systemContextCreate and freed once.
        let _ = qnn!(unsafe self.lib.system.context_free(self.handle));
    }
}

/// Reads the metadata of the binary in `bytes` (which libQnnSystem only reads).
pub(crate) fn read_binary_info(
    lib: &QnnLibrary,
    bytes: &[u8],
    path: &Path,
) -> Result<BinaryInfo, QnnError> {
    let subject = || path.display().to_string();
    let mut handle = SystemContextHandle::NULL;
    // SAFETY: `context_create` is a slot of the system provider table `QnnLibrary::load`
    // checked, kept mapped by `lib` (borrowed for this call); `handle` is a local it writes.
    let rc = qnn!(unsafe lib.system.context_create(&mut handle));
    lib.check(rc, "systemContextCreate", subject)?;
    let sys = SystemContext { lib, handle };

    let mut info: *const c_void = core::ptr::null();
    let mut info_size: u64 = 0;
    // SAFETY: getBinaryInfo only reads the buffer (documented and checked with a
    // read-only mapping); `bytes.len()` is its exact size, as the API requires.
    let rc = qnn!(unsafe lib.system.context_get_binary_info(
        sys.handle,
        bytes.as_ptr() as *mut c_void,
        bytes.len() as u64,
        &mut info,
        &mut info_size,
    ));
    lib.check(rc, "systemContextGetBinaryInfo", subject)?;
    if info.is_null() {
        return Err(QnnError::Metadata {
            path: path.to_owned(),
            reason: "no binary info returned".into(),
        });
    }
    // SAFETY: `info` points to the library's BinaryInfo of `info_size` bytes (0: not
    // reported), owned by `sys`, which lives until the end of this function.
    unsafe { copy_binary_info(info as *const u8, info_size, path) }
}

/// Copies a `QnnSystemContext_BinaryInfo_t` (versions 1 to 3) out of library memory.
///
/// # Safety
/// `base` points to a binary info struct owned by a system context that outlives the
/// call, and `info_size` is the size the library reported for it (0 when it did not).
unsafe fn copy_binary_info(
    base: *const u8,
    info_size: u64,
    path: &Path,
) -> Result<BinaryInfo, QnnError> {
    let bad = |reason: String| QnnError::Metadata {
        path: path.to_owned(),
        reason,
    };
    // SAFETY: every version starts with `u32 version` @0.
    let version: u32 = unsafe { read_at(base, bi::VERSION) };
    let need = if version >= 3 {
        bi::V3_MIN_SIZE
    } else {
        bi::V1_GRAPHS + 8
    };
    if info_size != 0 && (info_size as usize) < need {
        return Err(bad(format!(
            "binary info v{version} is {info_size} bytes, need {need}"
        )));
    }
    // The union's layout depends on the version: read no field of an unknown one.
    let (num_graphs_at, graphs_at) = match version {
        1 | 2 => (bi::V1_NUM_GRAPHS, bi::V1_GRAPHS),
        3 => (bi::V3_NUM_GRAPHS, bi::V3_GRAPHS),
        v => return Err(bad(format!("binary info version {v} is not supported"))),
    };
    // Every read below is a field of `version`'s layout at its documented offset, inside
    // the `need` bytes that `info_size` covers when the library reports it.
    // SAFETY: buildId (`const char*`), common to versions 1-3.
    let build_id: *const c_char = unsafe { read_at(base, bi::BUILD_ID) };
    // SAFETY: NULL or the library's NUL-terminated string, alive with the system context.
    let build_id = unsafe { c_str(build_id) };
    // SAFETY: coreApiVersion (3 x u32), common to versions 1-3.
    let core: [u32; 3] = unsafe { read_at(base, bi::CORE_API) };
    // SAFETY: backendApiVersion (3 x u32), common to versions 1-3.
    let backend: [u32; 3] = unsafe { read_at(base, bi::BACKEND_API) };
    // SAFETY: numGraphs (u32) of this version.
    let num_graphs: u32 = unsafe { read_at(base, num_graphs_at) };
    // SAFETY: graphs (`QnnSystemContext_GraphInfo_t*`) of this version.
    let graphs_ptr: *const u8 = unsafe { read_at(base, graphs_at) };
    let (blob_version, blob_size, soc_model) = if version == 3 {
        // SAFETY: contextBlobVersion (3 x u32) of v3.
        let bv: [u32; 3] = unsafe { read_at(base, bi::V3_BLOB_VERSION) };
        // SAFETY: contextBlobSize (u64) of v3.
        let size: u64 = unsafe { read_at(base, bi::V3_BLOB_SIZE) };
        // SAFETY: socModel (u32) of v3, the last field `need` covers.
        let soc: u32 = unsafe { read_at(base, bi::V3_SOC_MODEL) };
        (
            Some(ApiVersion::new(bv[0], bv[1], bv[2])),
            Some(size),
            Some(soc),
        )
    } else {
        (None, None, None)
    };
    if num_graphs == 0 || num_graphs > MAX_GRAPHS || graphs_ptr.is_null() {
        return Err(bad(format!("{num_graphs} graphs")));
    }
    let mut graphs = Vec::with_capacity(num_graphs as usize);
    for g in 0..num_graphs as usize {
        // SAFETY: `graphs_ptr` is the library's array of `num_graphs` graph infos, each
        // `gi::STRIDE` bytes (the layouts up to NEWEST_KNOWN_SYSTEM_API).
        let gp = unsafe { graphs_ptr.add(g * gi::STRIDE) };
        // SAFETY: a graph info of the system context that outlives the call.
        graphs.push(unsafe { copy_graph_info(gp, g, path) }?);
    }
    Ok(BinaryInfo {
        info_version: version,
        build_id,
        core_api: ApiVersion::new(core[0], core[1], core[2]),
        backend_api: ApiVersion::new(backend[0], backend[1], backend[2]),
        blob_version,
        blob_size,
        soc_model,
        graphs,
    })
}

/// Copies graph `g`'s `QnnSystemContext_GraphInfo_t` (versions 1 to 3) out of library
/// memory.
///
/// # Safety
/// `gp` points to a graph info struct (`gi::STRIDE` bytes) owned by a system context
/// that outlives the call.
unsafe fn copy_graph_info(gp: *const u8, g: usize, path: &Path) -> Result<GraphInfo, QnnError> {
    let bad = |reason: String| QnnError::Metadata {
        path: path.to_owned(),
        reason,
    };
    // SAFETY: every graph-info version starts with `u32 version` @0.
    let graph_version: u32 = unsafe { read_at(gp, 0) };
    // The union's layout depends on the version: read no field of an unknown one.
    if !(1..=3).contains(&graph_version) {
        return Err(bad(format!("graph {g} info version {graph_version}")));
    }
    // SAFETY: graphName (`const char*`), common to versions 1-3.
    let name: *const c_char = unsafe { read_at(gp, gi::NAME) };
    // SAFETY: NULL or the library's NUL-terminated name, alive with the system context.
    let name = unsafe { c_str(name) }.ok_or_else(|| bad(format!("graph {g} has no name")))?;
    // SAFETY: `gp` is a graph info of versions 1-3, per this function's contract.
    let inputs = unsafe { copy_tensors(gp, gi::NUM_INPUTS, gi::INPUTS, &name, path) }?;
    // SAFETY: as above.
    let outputs = unsafe { copy_tensors(gp, gi::NUM_OUTPUTS, gi::OUTPUTS, &name, path) }?;
    // Only v3 graph infos carry graphBlobInfoSize/graphBlobInfo (v2 ends with the
    // updateable tensors @56): reading @64/@72 of a v2 struct would take whatever
    // follows it for a pointer.
    let spill_fill_bytes = if graph_version >= 3 {
        // SAFETY: `gp` is a v3 graph info (checked above) of a live system context.
        unsafe { spill_fill_bytes(gp) }
    } else {
        None
    };
    Ok(GraphInfo {
        name,
        inputs,
        outputs,
        spill_fill_bytes,
    })
}

/// Copies the tensor array whose count is the u32 at `gp + count_at` and whose pointer
/// is at `gp + array_at` (a graph's inputs or outputs).
///
/// # Safety
/// `gp` points to a graph info of versions 1-3 owned by a system context that outlives
/// the call, and the offsets are its inputs' or its outputs' fields.
unsafe fn copy_tensors(
    gp: *const u8,
    count_at: usize,
    array_at: usize,
    graph: &str,
    path: &Path,
) -> Result<Vec<TensorInfo>, QnnError> {
    // SAFETY: numGraphInputs/numGraphOutputs (u32), per the contract.
    let n: u32 = unsafe { read_at(gp, count_at) };
    // SAFETY: graphInputs/graphOutputs (`Qnn_Tensor_t*`), per the contract.
    let p: *const u8 = unsafe { read_at(gp, array_at) };
    if n > MAX_TENSORS || (n > 0 && p.is_null()) {
        return Err(QnnError::Metadata {
            path: path.to_owned(),
            reason: format!("graph `{graph}` lists {n} tensors"),
        });
    }
    (0..n as usize)
        .map(|i| {
            // SAFETY: `p` is the library's array of `n` tensor structs, each the size of
            // `Qnn_Tensor_t` (the union of the versions up to NEWEST_KNOWN_CORE_API).
            let t = unsafe { p.add(i * core::mem::size_of::<ffi::QnnTensor>()) };
            // SAFETY: a tensor struct of the system context that outlives the call.
            unsafe { read_tensor(t, path) }
        })
        .collect()
}

/// The spill-fill buffer size a v3 graph info's HTP blob info reports, if any.
///
/// # Safety
/// `gp` points to a graph info of version 3 owned by a system context that outlives the
/// call.
unsafe fn spill_fill_bytes(gp: *const u8) -> Option<u64> {
    // SAFETY: graphBlobInfoSize (u32) of a v3 graph info.
    let size: u32 = unsafe { read_at(gp, gi::BLOB_INFO_SIZE) };
    // SAFETY: graphBlobInfo (`void*`) of a v3 graph info.
    let blob: *const u8 = unsafe { read_at(gp, gi::BLOB_INFO) };
    // QnnHtpSystemContext_GraphBlobInfo_t: u32 version @0, spillFillBufferSize first in
    // both v1 and v2 @8; read only when the reported size covers it.
    if blob.is_null() || (size as usize) < gi::BLOB_INFO_SPILL_FILL + 8 {
        return None;
    }
    // SAFETY: `blob` and `size` are the library's own description of a live blob-info
    // struct, non-NULL and at least 16 bytes (checked above): its u32 version @0.
    let version: u32 = unsafe { read_at(blob, 0) };
    // SAFETY: as above: spillFillBufferSize (u64) @8 of blob info v1 and v2.
    matches!(version, 1 | 2).then(|| unsafe { read_at::<u64>(blob, gi::BLOB_INFO_SPILL_FILL) })
}

impl QnnLibrary {
    /// Reads the metadata of a context binary held in memory exactly as
    /// [`ContextBinary::open`] does for a file, for bytes that never were a file (received
    /// over a link, or a fuzzer's input). `origin` names the bytes in errors. Refuses
    /// empty input as `open` refuses an empty file, before libQnnSystem sees it.
    pub fn inspect_bytes(
        &self,
        bytes: &[u8],
        origin: impl AsRef<Path>,
    ) -> Result<BinaryInfo, QnnError> {
        let origin = origin.as_ref();
        if bytes.is_empty() {
            return Err(QnnError::Binary {
                path: origin.to_owned(),
                reason: "empty file".into(),
            });
        }
        read_binary_info(self, bytes, origin)
    }
}

/// Chunk size of [`BinaryImage::read`]: large enough that the reads cost nothing next to
/// the hashing, small enough that a caller's per-chunk work stays in cache.
const IMAGE_CHUNK: usize = 4 << 20;

/// A context binary's bytes in private, read-only anonymous memory, read from an open
/// file (or any reader) once.
///
/// Unlike a mapping of the file, no other process can change these bytes (a write to
/// the file, or a truncation, after the read changes nothing here), so what the caller
/// inspected while they were read is what QNN gets ([`ContextBinary::from_image`]). The
/// memory costs the binary's size until its context exists (contexts are created
/// without the persistent-binary option: the bytes are freed then; [`ImageCensus`]
/// counts it), and is never
/// locked by `mlockall`. It is not the heap: GB-sized binaries get their own mapping,
/// returned to the system at once when freed.
pub struct BinaryImage {
    map: memmap2::Mmap,
    /// The census of the thread that read the image, told when the image is freed.
    census: std::sync::Arc<std::sync::Mutex<ImageCensus>>,
}

/// The private images ([`BinaryImage`]) one thread has read: how many are alive and how
/// many bytes they hold, and the most of each at once since the last
/// [`BinaryImage::reset_census_peak`]. What a load costs in anonymous memory beyond what
/// QNN keeps; an image freed on another thread still counts against its reader's census.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImageCensus {
    /// Images alive now.
    pub live: usize,
    /// Their bytes.
    pub live_bytes: u64,
    /// The most images alive at once.
    pub peak: usize,
    /// The most bytes alive at once.
    pub peak_bytes: u64,
}

thread_local! {
    static CENSUS: std::sync::Arc<std::sync::Mutex<ImageCensus>> = Default::default();
}

/// The census, also after a panic of a thread that held its lock (plain counters).
fn census_of(c: &std::sync::Mutex<ImageCensus>) -> std::sync::MutexGuard<'_, ImageCensus> {
    c.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Drop for BinaryImage {
    fn drop(&mut self) {
        let mut c = census_of(&self.census);
        c.live -= 1;
        c.live_bytes -= self.map.len() as u64;
    }
}

impl core::fmt::Debug for BinaryImage {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BinaryImage")
            .field("len", &self.map.len())
            .finish()
    }
}

impl BinaryImage {
    /// Reads exactly `len` bytes of `reader` into fresh anonymous memory, handing each
    /// chunk to `each` as it lies there once read (so `each` sees the very bytes that
    /// are kept, not a copy the reader could still change), then makes the memory
    /// read-only. A reader shorter or longer than `len` (a file changed since its size
    /// was taken) is an error naming `path`.
    pub fn read(
        mut reader: impl std::io::Read,
        len: u64,
        path: &Path,
        mut each: impl FnMut(&[u8]),
    ) -> Result<Self, QnnError> {
        let err = |reason: String| QnnError::Binary {
            path: path.to_owned(),
            reason,
        };
        if len == 0 {
            return Err(err("empty file".into()));
        }
        let size = usize::try_from(len).map_err(|_| err(format!("{len} bytes")))?;
        let mut anon = memmap2::MmapMut::map_anon(size)
            .map_err(|e| err(format!("anonymous map of {len} bytes: {e}")))?;
        // Transient memory: never locked by mlockall(MCL_FUTURE) (see `ContextBinary::open`).
        anon.unlock().map_err(|e| err(format!("munlock: {e}")))?;
        let mut at = 0usize;
        while at < size {
            let end = size.min(at + IMAGE_CHUNK);
            match reader.read(&mut anon[at..end]) {
                Ok(0) => {
                    return Err(err(format!(
                        "ended after {at} of {len} bytes (changed while read)"
                    )))
                }
                Ok(n) => {
                    each(&anon[at..at + n]);
                    at += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(err(e.to_string())),
            }
        }
        let mut more = [0u8; 1];
        loop {
            match reader.read(&mut more) {
                Ok(0) => break,
                Ok(_) => {
                    return Err(err(format!(
                        "longer than its {len} bytes (changed while read)"
                    )))
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(err(e.to_string())),
            }
        }
        let map = anon
            .make_read_only()
            .map_err(|e| err(format!("mprotect: {e}")))?;
        let census = CENSUS.with(std::sync::Arc::clone);
        {
            let mut c = census_of(&census);
            c.live += 1;
            c.live_bytes += len;
            c.peak = c.peak.max(c.live);
            c.peak_bytes = c.peak_bytes.max(c.live_bytes);
        }
        Ok(Self { map, census })
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The census of the images the calling thread read.
    pub fn census() -> ImageCensus {
        CENSUS.with(|c| *census_of(c))
    }

    /// Starts the calling thread's census peaks over from what is alive now.
    pub fn reset_census_peak() {
        CENSUS.with(|c| {
            let mut c = census_of(c);
            c.peak = c.live;
            c.peak_bytes = c.live_bytes;
        });
    }
}

/// A binary's bytes while held: a mapping of its file, or a private image.
enum Held {
    File(memmap2::Mmap),
    Image(BinaryImage),
}

impl Held {
    fn bytes(&self) -> &[u8] {
        match self {
            Held::File(map) => map,
            Held::Image(image) => image.bytes(),
        }
    }
}

/// Gives a binary's bytes when its context is about to be created; its error says why
/// they were refused (e.g. not the digest a signed manifest lists).
pub type TakeBytes = Box<
    dyn FnOnce() -> Result<BinaryImage, Box<dyn std::error::Error + Send + Sync>> + Send + Sync,
>;

/// A context binary file, mapped read-only, with its metadata.
pub struct ContextBinary {
    path: PathBuf,
    /// `None` once a context was created from it, or until `take` gave them.
    held: Option<Held>,
    /// Gives the bytes immediately before the context is created (see
    /// [`ContextBinary::with_bytes_at_creation`]); `None` once called.
    take: Option<TakeBytes>,
    /// The bytes map the file (one link); otherwise they are a private copy.
    maps_the_file: bool,
    size: usize,
    info: BinaryInfo,
}

impl core::fmt::Debug for ContextBinary {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ContextBinary")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("mapped", &self.held.is_some())
            .field("deferred", &self.take.is_some())
            .finish()
    }
}

/// The file's metadata, refusing what cannot be a context binary.
fn checked_metadata(file: &std::fs::File, path: &Path) -> Result<std::fs::Metadata, QnnError> {
    let err = |reason: String| QnnError::Binary {
        path: path.to_owned(),
        reason,
    };
    let meta = file.metadata().map_err(|e| err(e.to_string()))?;
    if !meta.is_file() {
        return Err(err("not a regular file".into()));
    }
    if meta.len() == 0 {
        return Err(err("empty file".into()));
    }
    Ok(meta)
}

impl ContextBinary {
    /// Maps `path` and reads its metadata; rejects missing, non-regular, empty, truncated
    /// and corrupted files with an error naming the file.
    ///
    /// Only a file whose inode has a single link is mapped. A file with more links shares
    /// its inode with another name, typically a RAUC artifact repository that
    /// `vlad ota install --link` linked from, and vlad does not control what writes there:
    /// an in-place write under a mapping changes bytes QNN is reading (undefined
    /// behaviour for the `&[u8]` this type hands out) and a truncation faults (SIGBUS).
    /// Such a file is read into a private copy instead (transient: freed once the
    /// context exists). Unmapping after context creation alone leaves the window from
    /// here to `contextCreateFromBinary`, seconds for a large binary.
    pub fn open(lib: &QnnLibrary, path: impl AsRef<Path>) -> Result<Self, QnnError> {
        use std::os::unix::fs::MetadataExt;
        let path = path.as_ref().to_owned();
        let err = |reason: String| QnnError::Binary {
            path: path.clone(),
            reason,
        };
        let file = std::fs::File::open(&path).map_err(|e| err(e.to_string()))?;
        let meta = checked_metadata(&file, &path)?;
        if meta.nlink() > 1 {
            return Self::read_shared(lib, file, meta, path);
        }
        // SAFETY: the mapping is read-only. Its bytes stay fixed only if nothing writes or
        // truncates the file while it is mapped, which is checked as far as it depends on
        // other programs: the inode has one link (re-checked after mapping below), so no
        // store vlad does not control shares it; vlad's OTA store never writes a file
        // after placing it (updates go to a new directory; old ones are deleted, which
        // keeps a mapped inode alive). What remains is a process with write permission
        // on vlad's own bundle files, trusted as much as vlad's binary.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }
            .map_err(|e| err(format!("mmap: {e}")))?;
        let now = file.metadata().map_err(|e| err(e.to_string()))?;
        if now.nlink() > 1 {
            drop(map);
            return Self::read_shared(lib, file, now, path);
        }
        // Under mlockall(MCL_FUTURE | MCL_ONFAULT) the new mapping would lock every page
        // QNN reads; the binary is page cache the kernel may drop, never pinned memory.
        map.unlock().map_err(|e| err(format!("munlock: {e}")))?;
        let info = read_binary_info(lib, &map, &path)?;
        Ok(Self::new(path, Held::File(map), info, true))
    }

    /// [`ContextBinary::open`] of a file whose inode other names share: a private copy.
    fn read_shared(
        lib: &QnnLibrary,
        file: std::fs::File,
        meta: std::fs::Metadata,
        path: PathBuf,
    ) -> Result<Self, QnnError> {
        use std::os::unix::fs::MetadataExt;
        log::info!(
            "{}: {} names share this file (e.g. a RAUC artifact repository): reading a private copy instead of mapping it",
            path.display(),
            meta.nlink()
        );
        Self::read_file(lib, file, meta, path)
    }

    /// As [`ContextBinary::open`], but reads the file into anonymous memory instead of
    /// mapping it (what a runtime that "loads the file" does): for comparing load time
    /// and resident memory against the mapping.
    pub fn read(lib: &QnnLibrary, path: impl AsRef<Path>) -> Result<Self, QnnError> {
        let path = path.as_ref().to_owned();
        let file = std::fs::File::open(&path).map_err(|e| QnnError::Binary {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let meta = checked_metadata(&file, &path)?;
        Self::read_file(lib, file, meta, path)
    }

    fn read_file(
        lib: &QnnLibrary,
        mut file: std::fs::File,
        meta: std::fs::Metadata,
        path: PathBuf,
    ) -> Result<Self, QnnError> {
        let image = BinaryImage::read(&mut file, meta.len(), &path, |_| {})?;
        Self::from_image(lib, image, path)
    }

    /// A context binary from bytes already taken into private memory ([`BinaryImage`]):
    /// the bytes the caller checked (e.g. hashed as they were read) are the bytes
    /// libQnnSystem describes and `contextCreateFromBinary` receives; nothing changes
    /// them after, whatever happens to the file. `path` names the binary in errors.
    pub fn from_image(
        lib: &QnnLibrary,
        image: BinaryImage,
        path: impl AsRef<Path>,
    ) -> Result<Self, QnnError> {
        let path = path.as_ref().to_owned();
        let info = read_binary_info(lib, &image.map, &path)?;
        Ok(Self::new(path, Held::Image(image), info, false))
    }

    fn new(path: PathBuf, held: Held, info: BinaryInfo, maps_the_file: bool) -> Self {
        Self {
            path,
            size: held.bytes().len(),
            held: Some(held),
            take: None,
            info,
            maps_the_file,
        }
    }

    /// This binary, described by the metadata already read (a planning description),
    /// with its bytes dropped now and taken from `take` only immediately before its
    /// context is created, then freed once it exists: a group of binaries loaded one
    /// context after the other holds one binary's bytes at a time. The metadata of the
    /// bytes `take` gives must equal this description, else the context is refused
    /// ([`QnnError::Refused`]), as it is when `take` fails.
    pub fn with_bytes_at_creation(mut self, take: TakeBytes) -> Self {
        self.held = None;
        self.take = Some(take);
        self.maps_the_file = false;
        self
    }

    /// Takes the bytes from `take` if they are still to be taken, checked as
    /// [`ContextBinary::with_bytes_at_creation`] says. Nothing once they are held.
    pub(crate) fn take_bytes(&mut self, lib: &QnnLibrary) -> Result<(), QnnError> {
        let Some(take) = self.take.take() else {
            return Ok(());
        };
        let refused = |source| QnnError::Refused {
            path: self.path.clone(),
            source,
        };
        let image = take().map_err(refused)?;
        let info = read_binary_info(lib, image.bytes(), &self.path)?;
        if info != self.info || image.bytes().len() != self.size {
            return Err(refused(
                "its metadata or size differs from the description its load was planned with"
                    .into(),
            ));
        }
        self.held = Some(Held::Image(image));
        Ok(())
    }

    /// Whether the bytes are a mapping of the file (else a private copy in memory).
    pub fn maps_the_file(&self) -> bool {
        self.maps_the_file
    }

    /// Unmaps the bytes (the context made from them no longer needs them).
    pub(crate) fn release_bytes(&mut self) {
        self.held = None;
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// What libQnnSystem reported about the binary.
    pub fn info(&self) -> &BinaryInfo {
        &self.info
    }
    /// The binary's bytes; `None` once a context was created from them (unmapped).
    pub fn bytes(&self) -> Option<&[u8]> {
        self.held.as_ref().map(Held::bytes)
    }
    /// Whether the bytes are still held (see [`ContextBinary::bytes`]).
    pub fn is_mapped(&self) -> bool {
        self.held.is_some()
    }
    /// Size of the file in bytes (also after unmapping).
    pub fn size(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::BinaryImage;
    use std::path::Path;

    /// A reader handing out a few bytes per call, as a pipe or a slow file would.
    struct Trickle<'a>(&'a [u8]);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.0.len()).min(7);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn an_image_holds_exactly_the_bytes_its_inspector_saw() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut seen = Vec::new();
        let image = BinaryImage::read(Trickle(&data), 1000, Path::new("x.bin"), |c| {
            seen.extend_from_slice(c)
        })
        .unwrap();
        assert_eq!(seen, data);
        assert_eq!(image.bytes(), &data[..]);
    }

    #[test]
    fn a_reader_shorter_or_longer_than_declared_is_refused() {
        let data = [1u8; 100];
        let short = BinaryImage::read(&data[..], 101, Path::new("x.bin"), |_| {}).unwrap_err();
        assert!(
            short.to_string().contains("ended after 100 of 101 bytes"),
            "{short}"
        );
        let long = BinaryImage::read(&data[..], 99, Path::new("x.bin"), |_| {}).unwrap_err();
        assert!(
            long.to_string().contains("longer than its 99 bytes"),
            "{long}"
        );
        let empty = BinaryImage::read(&data[..0], 0, Path::new("x.bin"), |_| {}).unwrap_err();
        assert!(empty.to_string().contains("x.bin: empty file"), "{empty}");
    }
}
