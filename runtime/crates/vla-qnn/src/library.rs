//! Loading libQnnHtp.so / libQnnSystem.so with `libloading` and picking their providers.
//!
//! The provider structs live inside the loaded libraries, so [`QnnLibrary`] copies the
//! function pointers it needs out of them and keeps both libraries loaded for as long as
//! any handle made from them exists (handles hold an `Arc<QnnLibrary>`).

// FFI: calls into the QNN libraries, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use crate::error::QnnError;
use crate::ffi::{self, qnn, read_at, slot, sys_slot, GetProvidersFn};
use core::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};

/// A `major.minor.patch` API version as reported by a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiVersion {
    /// Incompatible changes.
    pub major: u32,
    /// Additions (new table slots, grown unions).
    pub minor: u32,
    /// Fixes.
    pub patch: u32,
}

impl core::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl ApiVersion {
    /// `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Same major, at least the required minor.
    pub fn satisfies(self, needed: ApiVersion) -> bool {
        self.major == needed.major && (self.minor, self.patch) >= (needed.minor, needed.patch)
    }

    /// In the window `oldest ..= newest.major.newest.minor.*`: the versions whose struct
    /// layouts a build knows. A newer minor may have grown a union (`Qnn_Tensor_t`, the
    /// binary info's graph array: their sizes are the strides this crate walks), so it is
    /// refused until its layouts are checked and `newest` moved.
    pub fn within(self, oldest: ApiVersion, newest: ApiVersion) -> bool {
        self.satisfies(oldest) && self.major == newest.major && self.minor <= newest.minor
    }
}

/// Newest QNN core API whose layouts (interface table prefix, `Qnn_Tensor_t` = 144 bytes,
/// v1/v2) were checked against a real library: QNN 2.51 (onnxruntime-qnn 2.7.0), core API
/// 2.40.0; see `docs/qnn-abi.md`.
pub const NEWEST_KNOWN_CORE_API: ApiVersion = ApiVersion::new(2, 40, 0);
/// Newest QNN system API whose binary-info layouts (v1-v3, graph info stride 88 bytes)
/// were checked: system API 1.15.0 of QNN 2.51.
pub const NEWEST_KNOWN_SYSTEM_API: ApiVersion = ApiVersion::new(1, 15, 0);

/// Where and what to load.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// The directory holding both libraries (loaded by absolute path from it).
    pub lib_dir: PathBuf,
    /// The backend library's file name (`libQnnHtp.so`).
    pub backend_lib: String,
    /// The system library's file name (`libQnnSystem.so`).
    pub system_lib: String,
    /// Oldest QNN core API whose function table has every slot we call.
    pub min_core_api: ApiVersion,
    /// Oldest system API with `systemContextGetBinaryInfo`.
    pub min_system_api: ApiVersion,
    /// Newest core API (major.minor; any patch) whose struct layouts this build knows.
    pub newest_core_api: ApiVersion,
    /// Newest system API (major.minor; any patch) whose binary-info layouts it knows.
    pub newest_system_api: ApiVersion,
}

/// "core API 2.14.0 ..= 2.40.x (...)": the accepted window, for errors.
fn window(what: &str, oldest: ApiVersion, newest: ApiVersion) -> String {
    format!(
        "{what} API {oldest} ..= {}.{}.x (the versions whose layouts this build knows)",
        newest.major, newest.minor
    )
}

impl LoadOptions {
    /// The HTP backend from `lib_dir` with the default file names and minimum versions.
    pub fn htp(lib_dir: impl Into<PathBuf>) -> Self {
        Self {
            lib_dir: lib_dir.into(),
            backend_lib: "libQnnHtp.so".into(),
            system_lib: "libQnnSystem.so".into(),
            // QAIRT 2.20+ (core API 2.14) has every slot up to errorGetMessage.
            min_core_api: ApiVersion::new(2, 14, 0),
            min_system_api: ApiVersion::new(1, 3, 0),
            newest_core_api: NEWEST_KNOWN_CORE_API,
            newest_system_api: NEWEST_KNOWN_SYSTEM_API,
        }
    }
}

pub(crate) struct CoreFns {
    pub backend_create: ffi::BackendCreateFn,
    pub backend_get_build_id: ffi::BackendGetBuildIdFn,
    pub backend_free: ffi::BackendFreeFn,
    pub context_create_from_binary: ffi::ContextCreateFromBinaryFn,
    pub context_free: ffi::ContextFreeFn,
    pub graph_retrieve: ffi::GraphRetrieveFn,
    pub graph_execute: ffi::GraphExecuteFn,
    pub log_create: ffi::LogCreateFn,
    pub log_free: ffi::LogFreeFn,
    pub device_create: Option<ffi::DeviceCreateFn>,
    pub device_free: Option<ffi::DeviceFreeFn>,
    pub device_get_infrastructure: Option<ffi::DeviceGetInfrastructureFn>,
    pub device_get_platform_info: Option<ffi::DeviceGetPlatformInfoFn>,
    pub device_free_platform_info: Option<ffi::DeviceFreePlatformInfoFn>,
    pub mem_register: Option<ffi::MemRegisterFn>,
    pub mem_deregister: Option<ffi::MemDeRegisterFn>,
    pub error_get_message: Option<ffi::ErrorGetMessageFn>,
}

pub(crate) struct SystemFns {
    pub context_create: ffi::SysContextCreateFn,
    pub context_get_binary_info: ffi::SysContextGetBinaryInfoFn,
    pub context_free: ffi::SysContextFreeFn,
}

/// Both QNN libraries, loaded, with the chosen providers' function tables.
pub struct QnnLibrary {
    pub(crate) core: CoreFns,
    pub(crate) system: SystemFns,
    backend_path: PathBuf,
    provider_name: String,
    core_api: ApiVersion,
    backend_api: ApiVersion,
    system_api: ApiVersion,
    // Dropped last: every function pointer above points into these.
    _system_lib: libloading::Library,
    _backend_lib: libloading::Library,
}

// SAFETY: the struct holds plain function pointers into libraries that stay loaded for
// its whole life; QNN's entry points may be called from any thread.
unsafe impl Send for QnnLibrary {}
// SAFETY: as above; nothing in the struct is mutated after construction.
unsafe impl Sync for QnnLibrary {}

impl core::fmt::Debug for QnnLibrary {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("QnnLibrary")
            .field("backend", &self.backend_path)
            .field("provider", &self.provider_name)
            .field("core_api", &self.core_api)
            .finish_non_exhaustive()
    }
}

fn open_library(path: &Path) -> Result<libloading::Library, QnnError> {
    if !path.is_file() {
        return Err(QnnError::LibraryLoad {
            path: path.to_owned(),
            reason: "no such file".into(),
            source: None,
        });
    }
    // SAFETY: loading a shared library runs its initializers; the QNN libraries are
    // trusted vendor code selected by configuration, loaded by absolute path so that
    // their $ORIGIN-relative dependencies resolve.
    unsafe { libloading::Library::new(path) }.map_err(|e| QnnError::LibraryLoad {
        path: path.to_owned(),
        reason: "dlopen failed".into(),
        source: Some(e),
    })
}

/// Calls a `*_getProviders` entry point and returns the provider pointers.
fn providers(
    lib: &libloading::Library,
    symbol: &[u8],
    path: &Path,
) -> Result<Vec<*const u8>, QnnError> {
    // SAFETY: the symbol has the documented `getProviders` signature in both libraries.
    let get: libloading::Symbol<GetProvidersFn> =
        unsafe { lib.get(symbol) }.map_err(|e| QnnError::LibraryLoad {
            path: path.to_owned(),
            reason: format!(
                "no symbol {}",
                String::from_utf8_lossy(&symbol[..symbol.len() - 1])
            ),
            source: Some(e),
        })?;
    let mut list: *const *const c_void = core::ptr::null();
    let mut count: u32 = 0;
    // SAFETY: `get` was resolved from `lib`, which the caller keeps loaded, with the
    // signature QNN documents for `*_getProviders`; `list` and `count` are locals it
    // writes. The array it returns is owned by the library, not by us.
    let rc = qnn!(unsafe get(&mut list, &mut count));
    if rc != ffi::QNN_SUCCESS || list.is_null() || count == 0 {
        return Err(QnnError::LibraryLoad {
            path: path.to_owned(),
            reason: format!(
                "{} returned code {} and {count} providers",
                String::from_utf8_lossy(&symbol[..symbol.len() - 1]),
                ffi::error_code(rc)
            ),
            source: None,
        });
    }
    // SAFETY: the library reported `count` valid provider pointers at `list` (non-NULL,
    // checked above), an array it owns and keeps while loaded; copied at once.
    let list = unsafe { core::slice::from_raw_parts(list, count as usize) };
    Ok(list.iter().map(|&p| p as *const u8).collect())
}

/// A copy of the C string at `ptr` (empty for NULL).
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that stays valid for the call
/// (QNN's strings live as long as the library that returned them).
unsafe fn c_string(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL, and NUL-terminated and alive for the call by the caller's contract.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// Turns a QNN return value into a typed error for `operation` on `subject`: the code
/// (the handle's low 16 bits) and, through `get_message` (the provider's errorGetMessage),
/// the backend's message for the whole handle.
fn call_error(
    rc: u64,
    operation: &'static str,
    subject: String,
    get_message: Option<ffi::ErrorGetMessageFn>,
) -> QnnError {
    let backend_message = get_message.and_then(|f| {
        let mut p: *const c_char = core::ptr::null();
        // SAFETY: `f` is the provider's errorGetMessage (a non-NULL slot of the checked
        // table, or a test's stand-in with its signature); `rc` is an error handle the
        // same library returned, `p` a local it writes.
        let ok = qnn!(unsafe f(rc, &mut p)) == ffi::QNN_SUCCESS;
        if !ok {
            // QNN promises nothing about `p` when the call failed.
            return None;
        }
        // SAFETY: on success `p` is NULL or the library's NUL-terminated message, copied
        // at once.
        let m = unsafe { c_string(p) };
        (!m.is_empty()).then_some(m)
    });
    QnnError::Call {
        operation,
        subject,
        code: ffi::error_code(rc),
        backend_message,
    }
}

/// A provider's function table: `base` is the provider struct, the table starts
/// `offset` bytes into it; `path` is the library's, for errors.
struct Table<'a> {
    base: *const u8,
    offset: usize,
    path: &'a Path,
}

impl Table<'_> {
    /// Slot `index`, `None` when the provider leaves it NULL.
    ///
    /// # Safety
    /// The table has at least `index + 1` slots and slot `index` holds a function of
    /// type `F` (an `extern "C" fn` pointer type).
    unsafe fn optional<F: Copy>(&self, index: usize) -> Option<F> {
        // Checked in release builds too: the transmute below is only sound for a
        // pointer-sized `F`.
        assert_eq!(
            core::mem::size_of::<F>(),
            core::mem::size_of::<*const c_void>(),
            "a QNN function table slot read as a type that is not a function pointer"
        );
        // SAFETY: per the caller's guarantee the slot is inside the provider struct.
        let raw: *const c_void = unsafe { read_at(self.base, self.offset + 8 * index) };
        if raw.is_null() {
            None
        } else {
            // SAFETY: F is an `extern "C" fn` type of pointer size; the slot holds that
            // function (the caller's guarantee).
            Some(unsafe { core::mem::transmute_copy::<*const c_void, F>(&raw) })
        }
    }

    /// Slot `index`, refused with an error naming `what` when the provider leaves it NULL.
    ///
    /// # Safety
    /// As [`Table::optional`].
    unsafe fn required<F: Copy>(&self, index: usize, what: &str) -> Result<F, QnnError> {
        // SAFETY: the caller's contract is `optional`'s.
        unsafe { self.optional(index) }.ok_or_else(|| QnnError::LibraryLoad {
            path: self.path.to_owned(),
            reason: format!("provider has no {what} entry"),
            source: None,
        })
    }
}

impl QnnLibrary {
    /// Loads the backend and system libraries from `opts.lib_dir` and picks providers.
    pub fn load(opts: &LoadOptions) -> Result<Self, QnnError> {
        if !opts.lib_dir.is_dir() {
            return Err(QnnError::LibraryDirMissing {
                dir: opts.lib_dir.clone(),
            });
        }
        let backend_path = opts.lib_dir.join(&opts.backend_lib);
        let system_path = opts.lib_dir.join(&opts.system_lib);
        // The emulator's libQnnHtp.so prints a banner on stdout when it loads.
        let (backend_lib, system_lib) = crate::load_output::capture(|| {
            Ok::<_, QnnError>((open_library(&backend_path)?, open_library(&system_path)?))
        })?;

        let mut found = Vec::new();
        let mut chosen = None;
        for p in providers(&backend_lib, b"QnnInterface_getProviders\0", &backend_path)? {
            // SAFETY: provider structs start with the documented header fields:
            // providerName (`const char*`) @8.
            let name: *const c_char = unsafe { read_at(p, ffi::IFACE_PROVIDER_NAME) };
            // SAFETY: NULL or the library's NUL-terminated name, alive while it is loaded.
            let name = unsafe { c_string(name) };
            // SAFETY: the header's core API version (3 x u32).
            let core: [u32; 3] = unsafe { read_at(p, ffi::IFACE_CORE_API) };
            // SAFETY: the header's backend API version (3 x u32).
            let backend: [u32; 3] = unsafe { read_at(p, ffi::IFACE_BACKEND_API) };
            let core = ApiVersion::new(core[0], core[1], core[2]);
            let backend = ApiVersion::new(backend[0], backend[1], backend[2]);
            found.push(format!("{name} core API {core}"));
            if chosen.is_none() && core.within(opts.min_core_api, opts.newest_core_api) {
                chosen = Some((p, name, core, backend));
            }
        }
        let Some((p, provider_name, core_api, backend_api)) = chosen else {
            return Err(QnnError::ApiVersion {
                library: backend_path,
                found: found.join(", "),
                needed: window("core", opts.min_core_api, opts.newest_core_api),
            });
        };

        let mut sys_found = Vec::new();
        let mut sys_chosen = None;
        for s in providers(
            &system_lib,
            b"QnnSystemInterface_getProviders\0",
            &system_path,
        )? {
            // SAFETY: system provider structs start with the documented header fields:
            // providerName (`const char*`) @8.
            let name: *const c_char = unsafe { read_at(s, ffi::IFACE_PROVIDER_NAME) };
            // SAFETY: NULL or the library's NUL-terminated name, alive while it is loaded.
            let name = unsafe { c_string(name) };
            // SAFETY: the header's system API version (3 x u32).
            let v: [u32; 3] = unsafe { read_at(s, ffi::SYS_IFACE_API) };
            let v = ApiVersion::new(v[0], v[1], v[2]);
            sys_found.push(format!("{name} system API {v}"));
            if sys_chosen.is_none() && v.within(opts.min_system_api, opts.newest_system_api) {
                sys_chosen = Some((s, v));
            }
        }
        let Some((s, system_api)) = sys_chosen else {
            return Err(QnnError::ApiVersion {
                library: system_path,
                found: sys_found.join(", "),
                needed: window("system", opts.min_system_api, opts.newest_system_api),
            });
        };

        let t = Table {
            base: p,
            offset: ffi::IFACE_TABLE,
            path: &backend_path,
        };
        // Each slot below is read from the chosen core provider's table, which its API
        // version guarantees to reach slot::HIGHEST_USED; the slot order and signatures
        // are the ones `ffi` declares (docs/qnn-abi.md).
        let core = CoreFns {
            // SAFETY: slot 1 is backendCreate, inside the table.
            backend_create: unsafe { t.required(slot::BACKEND_CREATE, "backendCreate") }?,
            // SAFETY: slot 4 is backendGetBuildId, inside the table.
            backend_get_build_id: unsafe {
                t.required(slot::BACKEND_GET_BUILD_ID, "backendGetBuildId")
            }?,
            // SAFETY: slot 8 is backendFree, inside the table.
            backend_free: unsafe { t.required(slot::BACKEND_FREE, "backendFree") }?,
            // SAFETY: slot 13 is contextCreateFromBinary, inside the table.
            context_create_from_binary: unsafe {
                t.required(slot::CONTEXT_CREATE_FROM_BINARY, "contextCreateFromBinary")
            }?,
            // SAFETY: slot 14 is contextFree, inside the table.
            context_free: unsafe { t.required(slot::CONTEXT_FREE, "contextFree") }?,
            // SAFETY: slot 20 is graphRetrieve, inside the table.
            graph_retrieve: unsafe { t.required(slot::GRAPH_RETRIEVE, "graphRetrieve") }?,
            // SAFETY: slot 21 is graphExecute, inside the table.
            graph_execute: unsafe { t.required(slot::GRAPH_EXECUTE, "graphExecute") }?,
            // SAFETY: slot 25 is logCreate, inside the table.
            log_create: unsafe { t.required(slot::LOG_CREATE, "logCreate") }?,
            // SAFETY: slot 27 is logFree, inside the table.
            log_free: unsafe { t.required(slot::LOG_FREE, "logFree") }?,
            // SAFETY: slot 40 is deviceCreate, inside the table.
            device_create: unsafe { t.optional(slot::DEVICE_CREATE) },
            // SAFETY: slot 43 is deviceFree, inside the table.
            device_free: unsafe { t.optional(slot::DEVICE_FREE) },
            // SAFETY: slot 37 is deviceGetPlatformInfo, inside the table.
            device_get_platform_info: unsafe { t.optional(slot::DEVICE_GET_PLATFORM_INFO) },
            // SAFETY: slot 38 is deviceFreePlatformInfo, inside the table.
            device_free_platform_info: unsafe { t.optional(slot::DEVICE_FREE_PLATFORM_INFO) },
            // SAFETY: slot 39 is deviceGetInfrastructure, inside the table.
            device_get_infrastructure: unsafe { t.optional(slot::DEVICE_GET_INFRASTRUCTURE) },
            // SAFETY: slot 35 is memRegister, inside the table.
            mem_register: unsafe { t.optional(slot::MEM_REGISTER) },
            // SAFETY: slot 36 is memDeRegister, inside the table.
            mem_deregister: unsafe { t.optional(slot::MEM_DEREGISTER) },
            // SAFETY: slot 48 is errorGetMessage, the highest slot read, inside the table.
            error_get_message: unsafe { t.optional(slot::ERROR_GET_MESSAGE) },
        };
        let st = Table {
            base: s,
            offset: ffi::SYS_IFACE_TABLE,
            path: &system_path,
        };
        // Every system API 1.x table has the first four slots, in `ffi::sys_slot`'s order.
        let system = SystemFns {
            // SAFETY: slot 0 is systemContextCreate.
            context_create: unsafe {
                st.required(sys_slot::CONTEXT_CREATE, "systemContextCreate")
            }?,
            // SAFETY: slot 1 is systemContextGetBinaryInfo.
            context_get_binary_info: unsafe {
                st.required(
                    sys_slot::CONTEXT_GET_BINARY_INFO,
                    "systemContextGetBinaryInfo",
                )
            }?,
            // SAFETY: slot 3 is systemContextFree.
            context_free: unsafe { st.required(sys_slot::CONTEXT_FREE, "systemContextFree") }?,
        };
        log::debug!(
            "loaded {} (provider {provider_name}, core API {core_api}, backend API {backend_api}, system API {system_api})",
            backend_path.display()
        );
        Ok(Self {
            core,
            system,
            backend_path,
            provider_name,
            core_api,
            backend_api,
            system_api,
            _system_lib: system_lib,
            _backend_lib: backend_lib,
        })
    }

    /// The backend library's path.
    pub fn backend_path(&self) -> &Path {
        &self.backend_path
    }
    /// The chosen backend provider's name (`HTP_QTI_AISW`).
    pub fn provider_name(&self) -> &str {
        &self.provider_name
    }
    /// The chosen provider's core API version.
    pub fn core_api(&self) -> ApiVersion {
        self.core_api
    }
    /// The chosen provider's backend API version.
    pub fn backend_api(&self) -> ApiVersion {
        self.backend_api
    }
    /// The chosen system provider's API version.
    pub fn system_api(&self) -> ApiVersion {
        self.system_api
    }

    /// The backend's build id string (e.g. `v2.51.0...`).
    pub fn build_id(&self) -> Option<String> {
        let mut p: *const c_char = core::ptr::null();
        // SAFETY: a slot of the provider table checked in `load`; `self` keeps the library
        // mapped. `p` is a local it writes; the string it points to is the library's and is
        // copied out by `c_string` before `self` can be dropped.
        let rc = qnn!(unsafe self.core.backend_get_build_id(&mut p));
        // SAFETY: `p` is the library's NUL-terminated build id when the call succeeded.
        (rc == ffi::QNN_SUCCESS && !p.is_null()).then(|| unsafe { c_string(p) })
    }

    /// Turns a QNN return value into a typed error for `operation` on `subject`.
    pub(crate) fn check(
        &self,
        rc: u64,
        operation: &'static str,
        subject: impl FnOnce() -> String,
    ) -> Result<(), QnnError> {
        if rc == ffi::QNN_SUCCESS {
            return Ok(());
        }
        Err(call_error(
            rc,
            operation,
            subject(),
            self.core.error_get_message,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The handle the stand-in errorGetMessage was asked about.
    static ASKED: AtomicU64 = AtomicU64::new(0);
    /// A handle with bits above the code, as a backend may return.
    const HANDLE: u64 = (0x2A << 32) | 13002;

    /// errorGetMessage as QNN declares it: knows a message for [`HANDLE`] only.
    unsafe extern "C" fn get_message(handle: u64, out: *mut *const c_char) -> u64 {
        ASKED.store(handle, Ordering::SeqCst);
        if handle != HANDLE {
            return 1000;
        }
        // SAFETY: `out` is the caller's local out-pointer (call_error passes `&mut p`).
        unsafe { *out = c"unknown power config option 99".as_ptr() };
        ffi::QNN_SUCCESS
    }

    #[test]
    fn a_failed_call_reports_the_code_and_asks_for_the_message_with_the_whole_handle() {
        let e = call_error(HANDLE, "setPowerConfig", "id 7".into(), Some(get_message));
        assert_eq!(ASKED.load(Ordering::SeqCst), HANDLE, "not the masked code");
        match e {
            QnnError::Call {
                code,
                backend_message,
                ..
            } => {
                assert_eq!(code, 13002);
                assert_eq!(
                    backend_message.as_deref(),
                    Some("unknown power config option 99")
                );
            }
            other => panic!("{other:?}"),
        }
        // The masked code (what perf.rs passed before) finds no message.
        let masked = call_error(13002, "setPowerConfig", "id 7".into(), Some(get_message));
        assert!(
            matches!(
                masked,
                QnnError::Call {
                    backend_message: None,
                    ..
                }
            ),
            "{masked:?}"
        );
    }
}
