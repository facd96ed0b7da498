//! Contexts created from binaries, their graphs, and checked execution.
//!
//! `graphExecute` matches tensors by id and trusts every `dataSize`: a short output buffer
//! is overrun and a short input is over-read. So each buffer is checked against the
//! tensor metadata here, before the call, and the tensor structs handed to QNN are built
//! once per graph so execution itself allocates nothing.

// FFI: calls into the QNN libraries, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use crate::backend::{Backend, BackendInner, SelectedDevice};
use crate::binary::{ContextBinary, GraphInfo, TensorInfo};
use crate::error::QnnError;
use crate::ffi::{self, qnn, ContextHandle, GraphHandle, ProfileHandle, QnnTensor, SignalHandle};
use crate::mem::{self, Region, Registration, SharedBuffer};
use core::ffi::c_void;
use core::ops::Range;
use std::ffi::CString;
use std::sync::{Arc, Mutex};
use vla_tensor::AlignedBuf;

struct ContextInner {
    backend: Arc<BackendInner>,
    /// The device the context was created on when not the backend's own: freed after
    /// the context (fields drop after `drop` frees the context).
    _device: Option<Arc<SelectedDevice>>,
    handle: ContextHandle,
    binary: ContextBinary,
    /// Names of the graphs that have a live [`Graph`]. QNN does not document concurrent
    /// `graphExecute` on one graph handle as safe (the emulator happens to serialize it),
    /// so each graph has at most one executable handle: [`Graph`] is `Send`, not `Sync`,
    /// and executes through `&mut self`. The lock also serializes `graphRetrieve`.
    retrieved: Mutex<Vec<String>>,
}

// SAFETY: a QNN context handle may be used and freed from any thread.
unsafe impl Send for ContextInner {}
// SAFETY: shared (through `Arc`) by the `Context` clones and the graphs made from it,
// possibly on several threads. What they do with it: `graphRetrieve`, under the
// `retrieved` lock; `graphExecute` of a graph, only by the one `Graph` of that graph
// (enforced by `retrieved`) through `&mut Graph`; `contextFree`, once, in `drop`.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: created by contextCreateFromBinary and freed exactly once, before the
        // backend (which this struct keeps alive through its Arc).
        let rc = qnn!(unsafe self.backend.lib.core.context_free(self.handle, ProfileHandle::NULL));
        if rc != ffi::QNN_SUCCESS {
            log::warn!(
                "QNN contextFree({}) returned {}",
                self.binary.path().display(),
                ffi::error_code(rc)
            );
        }
    }
}

/// A resident QNN context made from a context binary.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl Context {
    /// Creates the context from the mapped binary (no copy on our side), then unmaps the
    /// binary: the backend copied what it needs (no persistent-binary config is passed).
    pub fn create(backend: &Backend, binary: ContextBinary) -> Result<Self, QnnError> {
        Self::create_with(backend, binary, &[]).map_err(|failed| failed.0)
    }

    /// [`Context::create`] with context configs (the group module's spill-fill group).
    /// On failure the binary is handed back, still mapped, so the caller can retry.
    pub(crate) fn create_with(
        backend: &Backend,
        mut binary: ContextBinary,
        configs: &[&ffi::ContextConfig],
    ) -> Result<Self, Box<(QnnError, ContextBinary)>> {
        let b = &backend.inner;
        // Bytes given only now (one binary of a group at a time); a refusal hands the
        // binary back without bytes, and a caller's retry gets the "already used" error.
        if let Err(e) = binary.take_bytes(&b.lib) {
            return Err(Box::new((e, binary)));
        }
        let Some(bytes) = binary.bytes() else {
            let e = QnnError::Binary {
                path: binary.path().to_owned(),
                reason: "already used for a context (unmapped)".into(),
            };
            return Err(Box::new((e, binary)));
        };
        // NULL-terminated list of config pointers, NULL for none.
        let mut list: Vec<*const c_void> = configs
            .iter()
            .map(|c| *c as *const ffi::ContextConfig as *const c_void)
            .collect();
        let list_ptr = if list.is_empty() {
            core::ptr::null()
        } else {
            list.push(core::ptr::null());
            list.as_ptr()
        };
        // QAIRT version coupling, known before the load: the build the binary records
        // against the loaded libraries' (the parity gate settles what is only expected).
        let built = binary.info().build_id.clone();
        let libs = b.lib.build_id();
        let coupling = crate::Coupling::of(built.as_deref(), libs.as_deref());
        log::log!(
            if coupling.expected_to_load() {
                log::Level::Info
            } else {
                log::Level::Warn
            },
            "{}: compiled by QNN {}, libraries QNN {}: {}",
            binary.path().display(),
            built.as_deref().unwrap_or("unknown"),
            libs.as_deref().unwrap_or("unknown"),
            coupling.describe()
        );
        let (device, device_keep) = backend.context_device();
        let mut handle = ContextHandle::NULL;
        // SAFETY: a slot of the checked provider table, the library kept loaded by `b`;
        // the backend and device are live (held by `b`, and a selected device by
        // `device_keep`); the buffer is the whole mapped
        // file, its exact size; the config list is NULL or NULL-terminated and its configs
        // (and what they point to) outlive the call; a NULL profile is allowed; the
        // out-pointer is a local.
        let rc = qnn!(unsafe b.lib.core.context_create_from_binary(
            b.backend,
            device,
            list_ptr,
            bytes.as_ptr() as *const c_void,
            bytes.len() as u64,
            &mut handle,
            ProfileHandle::NULL,
        ));
        if let Err(e) = b.lib.check(rc, "contextCreateFromBinary", || {
            binary.path().display().to_string()
        }) {
            return Err(Box::new((e, binary)));
        }
        binary.release_bytes();
        Ok(Self {
            inner: Arc::new(ContextInner {
                backend: b.clone(),
                _device: device_keep,
                handle,
                binary,
                retrieved: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The QNN handle, for configs that name another context (a spill-fill group).
    pub(crate) fn raw_handle(&self) -> ContextHandle {
        self.inner.handle
    }

    /// The binary the context was made from (its bytes released).
    pub fn binary(&self) -> &ContextBinary {
        &self.inner.binary
    }

    /// Retrieves the graph called `name`, or the binary's only graph when `name` is `None`.
    pub fn graph(&self, name: Option<&str>) -> Result<Graph, QnnError> {
        let info = self.inner.binary.info();
        let available = || {
            info.graphs
                .iter()
                .map(|g| g.name.clone())
                .collect::<Vec<_>>()
        };
        let graph_info = match name {
            Some(n) => info.graphs.iter().find(|g| g.name == n),
            None if info.graphs.len() == 1 => info.graphs.first(),
            None => None,
        }
        .ok_or_else(|| QnnError::GraphName {
            path: self.inner.binary.path().to_owned(),
            requested: name.map(str::to_owned),
            available: available(),
        })?
        .clone();
        let label = self
            .inner
            .binary
            .path()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| graph_info.name.clone());
        for t in graph_info.inputs.iter().chain(&graph_info.outputs) {
            let unsupported = |reason: String| QnnError::UnsupportedTensor {
                graph: label.clone(),
                tensor: t.name.clone(),
                reason,
            };
            if let Some(why) = &t.unsupported {
                return Err(unsupported(why.clone()));
            }
            if t.byte_len().is_none_or(|n| n > u32::MAX as usize) {
                return Err(unsupported("larger than 4 GiB".into()));
            }
        }
        let cname = CString::new(graph_info.name.as_str()).map_err(|_| QnnError::Metadata {
            path: self.inner.binary.path().to_owned(),
            reason: "graph name contains NUL".into(),
        })?;
        let mut retrieved = self
            .inner
            .retrieved
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if retrieved.contains(&graph_info.name) {
            return Err(QnnError::GraphInUse {
                path: self.inner.binary.path().to_owned(),
                graph: graph_info.name,
            });
        }
        let lib = &self.inner.backend.lib;
        let mut handle = GraphHandle::NULL;
        // SAFETY: a slot of the checked provider table, the library kept loaded by
        // `self`; valid context handle, NUL-terminated name, valid out-pointer.
        let rc =
            qnn!(unsafe lib.core.graph_retrieve(self.inner.handle, cname.as_ptr(), &mut handle));
        lib.check(rc, "graphRetrieve", || {
            format!(
                "graph `{}` in {}",
                graph_info.name,
                self.inner.binary.path().display()
            )
        })?;
        retrieved.push(graph_info.name.clone());
        drop(retrieved);
        Graph::new(self.inner.clone(), handle, graph_info, label)
    }
}

/// Tensor structs handed to QNN, with the storage their pointers refer to.
struct BoundTensors {
    structs: Vec<QnnTensor>,
    byte_lens: Vec<usize>,
    _names: Vec<CString>,
    _dims: Vec<Vec<u32>>,
}

impl BoundTensors {
    fn new(infos: &[TensorInfo], tensor_type: u32) -> Self {
        let names: Vec<CString> = infos
            .iter()
            .map(|t| CString::new(t.name.replace('\0', "")).unwrap_or_default())
            .collect();
        let mut dims: Vec<Vec<u32>> = infos.iter().map(|t| t.dims.clone()).collect();
        let structs = infos
            .iter()
            .zip(&names)
            .zip(dims.iter_mut())
            .map(|((t, name), d)| QnnTensor {
                version: 1,
                v1: ffi::TensorV1 {
                    id: t.id,
                    name: name.as_ptr(),
                    tensor_type,
                    data_format: ffi::DATA_FORMAT_DENSE,
                    data_type: t.data_type,
                    quantize_params: t.quant_raw,
                    rank: d.len() as u32,
                    dimensions: d.as_mut_ptr(),
                    mem_type: ffi::MEM_TYPE_RAW,
                    client_buf: ffi::ClientBuffer {
                        data: core::ptr::null_mut(),
                        data_size: 0,
                    },
                },
                _v2_tail: [0; 3],
            })
            .collect();
        let byte_lens = infos.iter().map(|t| t.byte_len().unwrap_or(0)).collect();
        Self {
            structs,
            byte_lens,
            _names: names,
            _dims: dims,
        }
    }
}

/// One executable graph of a resident context.
pub struct Graph {
    context: Arc<ContextInner>,
    handle: GraphHandle,
    info: GraphInfo,
    label: String,
    inputs: BoundTensors,
    outputs: BoundTensors,
    /// The registrations of [`Graph::bind_shared`]: one per input, then one per output.
    shared: Option<SharedIo>,
    /// Bytes handed to successful executes in client buffers ([`Graph::client_buffer_bytes`]).
    client_bytes: u64,
}

/// A graph's inputs and outputs registered in one shared buffer.
struct SharedIo {
    inputs: Vec<Registration>,
    outputs: Vec<Registration>,
}

/// Where a graph's tensors go in a shared buffer: byte offsets, one per input and output
/// in graph order, each aligned to [`mem::REGION_ALIGN`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedLayout {
    /// One offset per input.
    pub inputs: Vec<usize>,
    /// One offset per output.
    pub outputs: Vec<usize>,
    /// The first aligned offset after the last region: where the next graph's may start.
    pub end: usize,
}

// SAFETY: the graph handle and the tensor structs (whose pointers refer to storage owned
// by this struct, or are memory handles of its registrations) may move between threads; a
// registration's handle may be deregistered from any thread (QNN handles are not tied to
// the thread that made them); `execute` takes `&mut self`, and no other `Graph` of the
// same QNN graph exists while this one lives (`ContextInner::retrieved`). Not `Sync`:
// nothing is shared by reference.
unsafe impl Send for Graph {}

impl Drop for Graph {
    /// The graph may be retrieved again.
    fn drop(&mut self) {
        let mut retrieved = self
            .context
            .retrieved
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(i) = retrieved.iter().position(|n| *n == self.info.name) {
            retrieved.swap_remove(i);
        }
    }
}

impl Graph {
    fn new(
        context: Arc<ContextInner>,
        handle: GraphHandle,
        info: GraphInfo,
        label: String,
    ) -> Result<Self, QnnError> {
        let inputs = BoundTensors::new(&info.inputs, ffi::TENSOR_TYPE_APP_WRITE);
        let outputs = BoundTensors::new(&info.outputs, ffi::TENSOR_TYPE_APP_READ);
        Ok(Self {
            context,
            handle,
            info,
            label,
            inputs,
            outputs,
            shared: None,
            client_bytes: 0,
        })
    }

    /// The QNN graph name.
    pub fn name(&self) -> &str {
        &self.info.name
    }
    /// A short label used in errors (the binary's file stem unless set).
    pub fn label(&self) -> &str {
        &self.label
    }
    /// Sets the label used in errors.
    pub fn set_label(&mut self, label: impl Into<String>) {
        self.label = label.into();
    }
    /// The graph's inputs, in execution order.
    pub fn inputs(&self) -> &[TensorInfo] {
        &self.info.inputs
    }
    /// The graph's outputs, in execution order.
    pub fn outputs(&self) -> &[TensorInfo] {
        &self.info.outputs
    }
    /// The position of the input called `name`.
    pub fn input_index(&self, name: &str) -> Option<usize> {
        self.info.inputs.iter().position(|t| t.name == name)
    }
    /// The position of the output called `name`.
    pub fn output_index(&self, name: &str) -> Option<usize> {
        self.info.outputs.iter().position(|t| t.name == name)
    }
    /// The binary of the graph's context.
    pub fn context_binary(&self) -> &ContextBinary {
        &self.context.binary
    }

    /// Buffers of exactly the right size for every input and output, 8-byte aligned.
    pub fn allocate_io(&self) -> IoBuffers {
        IoBuffers {
            inputs: self
                .inputs
                .byte_lens
                .iter()
                .map(|&n| AlignedBuf::zeroed(n))
                .collect(),
            outputs: self
                .outputs
                .byte_lens
                .iter()
                .map(|&n| AlignedBuf::zeroed(n))
                .collect(),
        }
    }

    fn bind(
        &mut self,
        output: bool,
        index: usize,
        ptr: *const u8,
        len: usize,
    ) -> Result<(), QnnError> {
        let (set, infos) = if output {
            (&mut self.outputs, &self.info.outputs)
        } else {
            (&mut self.inputs, &self.info.inputs)
        };
        let expected = set.byte_lens[index];
        if len != expected {
            return Err(QnnError::Buffer {
                graph: self.label.clone(),
                tensor: infos[index].name.clone(),
                expected_bytes: expected,
                found_bytes: len,
            });
        }
        let tensor = &mut set.structs[index].v1;
        tensor.mem_type = ffi::MEM_TYPE_RAW;
        tensor.client_buf = ffi::ClientBuffer {
            data: ptr as *mut c_void,
            data_size: len as u32,
        };
        Ok(())
    }

    fn check_counts(&self, n_in: usize, n_out: usize) -> Result<(), QnnError> {
        for (direction, expected, found) in [
            ("input", self.info.inputs.len(), n_in),
            ("output", self.info.outputs.len(), n_out),
        ] {
            if expected != found {
                return Err(QnnError::BufferCount {
                    graph: self.label.clone(),
                    direction,
                    expected,
                    found,
                });
            }
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(), QnnError> {
        let lib = &self.context.backend.lib;
        // SAFETY: every tensor struct was bound above to a live buffer of exactly the
        // tensor's byte size (inputs are only read by QNN); name and dims pointers refer
        // to storage owned by `self`; the graph handle belongs to the live context.
        let rc = qnn!(unsafe lib.core.graph_execute(
            self.handle,
            self.inputs.structs.as_ptr(),
            self.inputs.structs.len() as u32,
            self.outputs.structs.as_mut_ptr(),
            self.outputs.structs.len() as u32,
            ProfileHandle::NULL,
            SignalHandle::NULL,
        ));
        let result = lib.check(rc, "graphExecute", || format!("graph {}", self.label));
        if result.is_ok() {
            self.client_bytes += self
                .inputs
                .structs
                .iter()
                .chain(&self.outputs.structs)
                .filter(|t| t.v1.mem_type == ffi::MEM_TYPE_RAW)
                .map(|t| u64::from(t.v1.client_buf.data_size))
                .sum::<u64>();
        }
        // Do not keep pointers to buffers we do not own past this call; a graph bound to
        // a shared buffer goes back to its registered memory.
        for t in self
            .inputs
            .structs
            .iter_mut()
            .chain(self.outputs.structs.iter_mut())
        {
            t.v1.clear_data();
        }
        self.point_at_shared();
        result
    }

    /// Sets every tensor struct to its registration's handle (no-op when not bound).
    fn point_at_shared(&mut self) {
        let Some(shared) = &self.shared else { return };
        for (t, r) in self.inputs.structs.iter_mut().zip(&shared.inputs) {
            t.v1.set_mem_handle(r.handle());
        }
        for (t, r) in self.outputs.structs.iter_mut().zip(&shared.outputs) {
            t.v1.set_mem_handle(r.handle());
        }
    }

    /// Packs this graph's inputs, then its outputs, into a shared buffer from `start`
    /// (rounded up to [`mem::REGION_ALIGN`]), each region aligned.
    pub fn shared_layout(&self, start: usize) -> SharedLayout {
        let mut at = mem::align_region(start);
        let mut place = |lens: &[usize]| -> Vec<usize> {
            lens.iter()
                .map(|&n| {
                    let offset = at;
                    at += mem::align_region(n);
                    offset
                })
                .collect()
        };
        let inputs = place(&self.inputs.byte_lens);
        let outputs = place(&self.outputs.byte_lens);
        SharedLayout {
            inputs,
            outputs,
            end: at,
        }
    }

    /// Registers every input and output with the graph's context at `layout`'s offsets of
    /// `buffer` (one HTP SHARED_BUFFER registration each) and points the tensors at them
    /// (QNN_TENSORMEMTYPE_MEMHANDLE). Another graph's output and this graph's input may
    /// share a region: that is how contexts chain without host copies. Within the graph
    /// regions must not overlap, and each must lie inside the buffer (QNN checks
    /// neither). Replaces an earlier binding; on error the graph is left unbound.
    pub fn bind_shared(
        &mut self,
        buffer: &SharedBuffer,
        layout: &SharedLayout,
    ) -> Result<(), QnnError> {
        self.unbind_shared();
        self.check_counts(layout.inputs.len(), layout.outputs.len())?;
        let whole = 0..buffer.len();
        let within = |offsets: &[usize]| -> Vec<(usize, Range<usize>)> {
            offsets.iter().map(|&o| (o, whole.clone())).collect()
        };
        let what = format!("the {}-byte shared buffer", buffer.len());
        self.register_all(
            buffer.memory(),
            &within(&layout.inputs),
            &within(&layout.outputs),
            &what,
        )
    }

    /// [`Graph::bind_shared`] over the regions of a split arena: each input and output is
    /// registered at `(region, offset inside it)`, and must fit inside that region. A region
    /// may hold several tensors of different graphs (one graph's output, the next one's
    /// input: chaining without host copies); within the graph, regions of tensors must not
    /// overlap. Execute with [`Graph::execute_regions`].
    pub fn bind_regions(
        &mut self,
        inputs: &[(&Region, usize)],
        outputs: &[(&Region, usize)],
    ) -> Result<(), QnnError> {
        self.unbind_shared();
        self.check_counts(inputs.len(), outputs.len())?;
        let Some(memory) = inputs.iter().chain(outputs).map(|(r, _)| r.memory()).next() else {
            return Ok(());
        };
        if let Some((r, _)) = inputs
            .iter()
            .chain(outputs)
            .find(|(r, _)| !Arc::ptr_eq(r.memory(), memory))
        {
            return Err(QnnError::SharedRegion {
                graph: self.label.clone(),
                tensor: String::new(),
                reason: format!("region {r:?} is of another shared buffer than the first"),
            });
        }
        let places = |list: &[(&Region, usize)]| -> Vec<(usize, Range<usize>)> {
            list.iter()
                .map(|(r, o)| (r.range().start.saturating_add(*o), r.range()))
                .collect()
        };
        self.register_all(memory, &places(inputs), &places(outputs), "its region")
    }

    /// Registers every tensor at `(offset, inside)` (absolute offsets in `memory`, each
    /// tensor's bytes to lie inside `inside`, called `what` in errors) and points the
    /// tensors at the handles.
    fn register_all(
        &mut self,
        memory: &Arc<mem::Allocation>,
        inputs: &[(usize, Range<usize>)],
        outputs: &[(usize, Range<usize>)],
        what: &str,
    ) -> Result<(), QnnError> {
        let lib = &self.context.backend.lib;
        let (Some(register), Some(deregister)) = (lib.core.mem_register, lib.core.mem_deregister)
        else {
            return Err(QnnError::NotAvailable {
                what: "memRegister",
                reason: format!(
                    "the provider of {} has no memRegister/memDeRegister",
                    lib.backend_path().display()
                ),
            });
        };
        let fns = mem::MemFns {
            register,
            deregister,
        };
        // Every region is checked before any is registered (QNN checks none of this).
        let mut regions: Vec<(Range<usize>, &str)> = Vec::new();
        for (infos, places) in [(&self.info.inputs, inputs), (&self.info.outputs, outputs)] {
            for (t, (offset, inside)) in infos.iter().zip(places) {
                let region = |reason: String| QnnError::SharedRegion {
                    graph: self.label.clone(),
                    tensor: t.name.clone(),
                    reason,
                };
                let len = t.byte_len().unwrap_or(0);
                let range = *offset..offset.saturating_add(len);
                if range.start < inside.start
                    || range.end > inside.end
                    || range.end - range.start != len
                {
                    return Err(region(format!("bytes {range:?} are not inside {what}")));
                }
                if let Some((_, other)) = regions
                    .iter()
                    .find(|(r, _)| r.start < range.end && range.start < r.end)
                {
                    return Err(region(format!(
                        "bytes {range:?} overlap those of tensor `{other}` of the same graph"
                    )));
                }
                regions.push((range, &t.name));
            }
        }
        let owner: Arc<dyn Send + Sync> = self.context.clone();
        let mut made = (Vec::new(), Vec::new());
        for (output, infos, places) in [
            (false, &self.info.inputs, inputs),
            (true, &self.info.outputs, outputs),
        ] {
            for (t, (offset, _)) in infos.iter().zip(places) {
                let context = self.context.handle;
                let registered = mem::register(fns, context, owner.clone(), memory, *offset, t);
                let refused = |reason: &str| QnnError::SharedRegion {
                    graph: self.label.clone(),
                    tensor: t.name.clone(),
                    reason: reason.into(),
                };
                let r = match registered {
                    Ok(r) => r,
                    Err(mem::RegisterError::Qnn(rc)) => {
                        return Err(lib
                            .check(rc, "memRegister", || {
                                format!("tensor `{}` of graph {}", t.name, self.label)
                            })
                            .err()
                            .unwrap_or_else(|| refused("memRegister returned no handle")));
                    }
                    Err(mem::RegisterError::OutOfBounds) => {
                        return Err(refused("the region is not inside the shared buffer"));
                    }
                };
                if output {
                    made.1.push(r);
                } else {
                    made.0.push(r);
                }
            }
        }
        self.shared = Some(SharedIo {
            inputs: made.0,
            outputs: made.1,
        });
        self.point_at_shared();
        Ok(())
    }

    /// Deregisters the graph's shared buffer regions; it executes with client buffers again.
    pub fn unbind_shared(&mut self) {
        self.shared = None;
        for t in self
            .inputs
            .structs
            .iter_mut()
            .chain(self.outputs.structs.iter_mut())
        {
            t.v1.clear_data();
        }
    }

    /// Bytes of inputs and outputs this graph has handed to successful executes in client
    /// buffers, in all: what the HTP backend copies into and out of its own DSP-visible
    /// buffers (Qualcomm's "Qmem Graph" page). Registered memory adds nothing.
    pub fn client_buffer_bytes(&self) -> u64 {
        self.client_bytes
    }

    /// Whether the graph's tensors are registered in a shared buffer.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The bytes of input `index` in the bound shared buffer.
    pub fn shared_input(&self, index: usize) -> Option<Range<usize>> {
        Some(self.shared.as_ref()?.inputs.get(index)?.range())
    }

    /// The bytes of output `index` in the bound shared buffer.
    pub fn shared_output(&self, index: usize) -> Option<Range<usize>> {
        Some(self.shared.as_ref()?.outputs.get(index)?.range())
    }

    /// Executes on the registered memory of `buffer`: the inputs are read and the outputs
    /// written in place, with no host copy. `&mut` keeps every host slice of the buffer
    /// out of the way while the HTP writes.
    pub fn execute_shared(&mut self, buffer: &mut SharedBuffer) -> Result<(), QnnError> {
        let bound = self
            .shared
            .as_ref()
            .is_some_and(|s| s.inputs.iter().chain(&s.outputs).all(|r| r.is_in(buffer)));
        if !bound {
            return Err(QnnError::SharedRegion {
                graph: self.label.clone(),
                tensor: String::new(),
                reason: "the graph is not bound to this shared buffer (bind_shared first)".into(),
            });
        }
        self.run()
    }

    /// Executes on registered regions ([`Graph::bind_regions`]): `inputs` and `outputs` are
    /// the regions the graph's inputs and outputs lie in, one per tensor in graph order,
    /// each checked. Inputs are held shared (other threads may go on reading them), outputs
    /// exclusively: the HTP writes where nobody else can look, and no host copy is made.
    pub fn execute_regions(
        &mut self,
        inputs: &[&Region],
        outputs: &mut [&mut Region],
    ) -> Result<(), QnnError> {
        self.check_counts(inputs.len(), outputs.len())?;
        let misplaced = {
            let Some(shared) = &self.shared else {
                return Err(QnnError::SharedRegion {
                    graph: self.label.clone(),
                    tensor: String::new(),
                    reason: "the graph is not bound to regions (bind_regions first)".into(),
                });
            };
            let ins = shared.inputs.iter().zip(inputs.iter().map(|r| &**r));
            let outs = shared.outputs.iter().zip(outputs.iter().map(|r| &**r));
            ins.chain(outs)
                .position(|(reg, region)| !reg.is_within(region))
        };
        if let Some(k) = misplaced {
            let tensor = self
                .info
                .inputs
                .iter()
                .chain(&self.info.outputs)
                .nth(k)
                .map_or_else(String::new, |t| t.name.clone());
            return Err(QnnError::SharedRegion {
                graph: self.label.clone(),
                tensor,
                reason: "its registered bytes are not in the region given".into(),
            });
        }
        self.run()
    }

    /// Executes with caller-owned buffers, one per input and output in graph order.
    /// Each buffer's length must equal its tensor's byte size.
    pub fn execute(&mut self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<(), QnnError> {
        self.check_counts(inputs.len(), outputs.len())?;
        for (i, b) in inputs.iter().enumerate() {
            self.bind(false, i, b.as_ptr(), b.len())?;
        }
        for (i, b) in outputs.iter_mut().enumerate() {
            self.bind(true, i, b.as_mut_ptr(), b.len())?;
        }
        self.run()
    }

    /// Executes with buffers from [`Graph::allocate_io`] (no allocation).
    pub fn execute_io(&mut self, io: &mut IoBuffers) -> Result<(), QnnError> {
        self.check_counts(io.inputs.len(), io.outputs.len())?;
        for (i, b) in io.inputs.iter().enumerate() {
            let bytes = b.as_bytes();
            self.bind(false, i, bytes.as_ptr(), bytes.len())?;
        }
        for (i, b) in io.outputs.iter_mut().enumerate() {
            let bytes = b.as_bytes_mut();
            self.bind(true, i, bytes.as_mut_ptr(), bytes.len())?;
        }
        self.run()
    }
}

/// Owned, aligned input and output buffers of one graph.
pub struct IoBuffers {
    /// One buffer per input, in the graph's order.
    pub inputs: Vec<AlignedBuf>,
    /// One buffer per output, in the graph's order.
    pub outputs: Vec<AlignedBuf>,
}
