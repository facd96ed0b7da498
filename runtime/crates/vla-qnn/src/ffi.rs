//! Hand-written declarations of the parts of the QNN C ABI this crate uses.
//!
//! Layouts come from the QAIRT 2.51 libraries (checked) and the public 2.32-era headers;
//! see `shared/qnn-abi.md` in the project notes. Only the fields we read or write are
//! named; where a newer library may have grown a struct we never rely on its total size,
//! except `Qnn_Tensor_t`, which we allocate ourselves as version 1 (the library accepts
//! v1 and v2 alike) at its full v2 size so a library that peeks at v2 fields reads zeros.

// FFI: calls into the QNN libraries, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use core::ffi::{c_char, c_void};

pub type ErrorHandle = u64;

/// The error code of a QNN error handle: its low 16 bits (`QNN_GET_ERROR_CODE`). The
/// handle itself is what `errorGetMessage` takes.
pub const fn error_code(handle: ErrorHandle) -> u64 {
    handle & 0xFFFF
}

/// Declares one type per kind of QNN handle: each is the opaque pointer QNN hands out,
/// passed by value across the C ABI exactly like the `void*` it wraps
/// (`#[repr(transparent)]`), but a distinct Rust type, so a call that takes a backend, a
/// device and a context cannot be given them in the wrong order.
macro_rules! handles {
    ($($(#[$doc:meta])* $name:ident;)+) => {$(
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name(*mut c_void);

        impl $name {
            /// No handle: what QNN takes for "none" and what an out-parameter holds
            /// before QNN writes it.
            pub const NULL: Self = Self(core::ptr::null_mut());

            /// Whether this is [`Self::NULL`].
            pub fn is_null(self) -> bool {
                self.0.is_null()
            }
        }

        // Passed where C has a pointer: same size and alignment as one.
        const _: () = {
            assert!(core::mem::size_of::<$name>() == core::mem::size_of::<*mut c_void>());
            assert!(core::mem::align_of::<$name>() == core::mem::align_of::<*mut c_void>());
        };
    )+};
}

handles! {
    /// `Qnn_LogHandle_t`: a logger made by `logCreate`.
    LogHandle;
    /// `Qnn_BackendHandle_t`: a backend made by `backendCreate`.
    BackendHandle;
    /// `Qnn_DeviceHandle_t`: a device made by `deviceCreate` (NULL where the platform
    /// runs without one, as the emulator does).
    DeviceHandle;
    /// `Qnn_ContextHandle_t`: a resident context made by `contextCreateFromBinary`.
    ContextHandle;
    /// `Qnn_GraphHandle_t`: a graph of a context, from `graphRetrieve`.
    GraphHandle;
    /// `Qnn_ProfileHandle_t`: a profiler; this crate always passes NULL (no profiling).
    ProfileHandle;
    /// `Qnn_SignalHandle_t`: a signal to abort or time out a call; always NULL here.
    SignalHandle;
    /// `QnnSystemContext_Handle_t`: a libQnnSystem context, used to read binary info.
    SystemContextHandle;
}

/// Calls one C function of QNN and returns what it returns: a slot of a function table
/// (`qnn!(unsafe lib.core.graph_retrieve(context, name, &mut graph))`) or a function
/// pointer held elsewhere (`qnn!(unsafe set(id, list))`).
///
/// Every call into the QNN libraries goes through here, so the `unsafe` block it makes
/// holds that one call and nothing else (the workspace denies
/// `clippy::multiple_unsafe_ops_per_block`, so an argument cannot hide a second unsafe
/// operation in it). The `// SAFETY:` comment above the macro states the call's contract.
/// Arguments are evaluated in the call expression itself, so temporaries in them live
/// until the call returns, as in a plain call. Use it as an expression (`let rc =
/// qnn!(...)`, `let _ = ...` for a return ignored): clippy finds the SAFETY comment of a
/// macro-made block above a `let`, not above a bare macro statement.
macro_rules! qnn {
    (unsafe $($f:ident).+ ($($arg:expr),* $(,)?)) => {
        unsafe { ($($f).+)($($arg),*) }
    };
}
pub(crate) use qnn;

/// `QnnInterface_getProviders` / `QnnSystemInterface_getProviders`.
pub type GetProvidersFn = unsafe extern "C" fn(*mut *const *const c_void, *mut u32) -> ErrorHandle;

/// QNN log callback: `void(const char* fmt, QnnLog_Level_t, uint64_t timestamp, va_list)`.
/// On LP64 targets a `va_list` argument reaches the callee as one pointer (x86_64: the
/// array decays; aarch64: the 32-byte struct is passed by reference), which `vsnprintf`
/// accepts back in the same form.
pub type LogCallback = unsafe extern "C" fn(*const c_char, u32, u64, *mut c_void);

pub const QNN_SUCCESS: u64 = 0;

/// `QnnInterface_t`: backendId @0, providerName @8, core API version @16, backend API
/// version @28, function table from @40.
pub const IFACE_PROVIDER_NAME: usize = 8;
pub const IFACE_CORE_API: usize = 16;
pub const IFACE_BACKEND_API: usize = 28;
pub const IFACE_TABLE: usize = 40;

/// `QnnSystemInterface_t`: backendId @0, providerName @8, system API version @16,
/// function table from @32.
pub const SYS_IFACE_API: usize = 16;
pub const SYS_IFACE_TABLE: usize = 32;

/// Slots of the QNN core function table.
pub mod slot {
    pub const BACKEND_CREATE: usize = 1;
    pub const BACKEND_GET_BUILD_ID: usize = 4;
    pub const BACKEND_FREE: usize = 8;
    pub const CONTEXT_CREATE_FROM_BINARY: usize = 13;
    pub const CONTEXT_FREE: usize = 14;
    pub const GRAPH_RETRIEVE: usize = 20;
    pub const GRAPH_EXECUTE: usize = 21;
    pub const LOG_CREATE: usize = 25;
    pub const LOG_FREE: usize = 27;
    pub const DEVICE_GET_INFRASTRUCTURE: usize = 39;
    pub const DEVICE_CREATE: usize = 40;
    pub const DEVICE_FREE: usize = 43;
    pub const ERROR_GET_MESSAGE: usize = 48;
    /// The highest slot we call: the provider's table must be at least this long, which
    /// the minimum core API version guarantees.
    pub const HIGHEST_USED: usize = ERROR_GET_MESSAGE;
}

/// Slots of the QNN system function table.
pub mod sys_slot {
    pub const CONTEXT_CREATE: usize = 0;
    pub const CONTEXT_GET_BINARY_INFO: usize = 1;
    pub const CONTEXT_FREE: usize = 3;
}

/// `logCreate(callback, maxLogLevel, *log)`.
pub type LogCreateFn =
    unsafe extern "C" fn(Option<LogCallback>, u32, *mut LogHandle) -> ErrorHandle;
/// `logFree(log)`.
pub type LogFreeFn = unsafe extern "C" fn(LogHandle) -> ErrorHandle;
/// `backendCreate(log, const QnnBackend_Config_t** /* NULL: defaults */, *backend)`.
pub type BackendCreateFn =
    unsafe extern "C" fn(LogHandle, *const *const c_void, *mut BackendHandle) -> ErrorHandle;
/// `backendGetBuildId(const char** id)`.
pub type BackendGetBuildIdFn = unsafe extern "C" fn(*mut *const c_char) -> ErrorHandle;
/// `backendFree(backend)`.
pub type BackendFreeFn = unsafe extern "C" fn(BackendHandle) -> ErrorHandle;
/// `deviceCreate(log, const QnnDevice_Config_t** /* NULL: defaults */, *device)`.
pub type DeviceCreateFn =
    unsafe extern "C" fn(LogHandle, *const *const c_void, *mut DeviceHandle) -> ErrorHandle;
/// `deviceFree(device)`.
pub type DeviceFreeFn = unsafe extern "C" fn(DeviceHandle) -> ErrorHandle;
/// `contextCreateFromBinary(backend, device, const QnnContext_Config_t**, const void*
/// buffer, u64 size, *context, profile)`.
pub type ContextCreateFromBinaryFn = unsafe extern "C" fn(
    BackendHandle,
    DeviceHandle,
    *const *const c_void,
    *const c_void,
    u64,
    *mut ContextHandle,
    ProfileHandle,
) -> ErrorHandle;
/// `contextFree(context, profile)`.
pub type ContextFreeFn = unsafe extern "C" fn(ContextHandle, ProfileHandle) -> ErrorHandle;
/// `graphRetrieve(context, const char* name, *graph)`.
pub type GraphRetrieveFn =
    unsafe extern "C" fn(ContextHandle, *const c_char, *mut GraphHandle) -> ErrorHandle;
/// `graphExecute(graph, const Qnn_Tensor_t* inputs, u32 n, Qnn_Tensor_t* outputs, u32 n,
/// profile, signal)`.
pub type GraphExecuteFn = unsafe extern "C" fn(
    GraphHandle,
    *const QnnTensor,
    u32,
    *mut QnnTensor,
    u32,
    ProfileHandle,
    SignalHandle,
) -> ErrorHandle;
/// `deviceGetInfrastructure(QnnDevice_Infrastructure_t* out)`: the out value is a pointer
/// to the backend's infrastructure struct (HTP: [`htp_perf`]).
pub type DeviceGetInfrastructureFn = unsafe extern "C" fn(*mut *const c_void) -> ErrorHandle;
/// `errorGetMessage(error, const char** message)`: the message of an error handle.
pub type ErrorGetMessageFn = unsafe extern "C" fn(ErrorHandle, *mut *const c_char) -> ErrorHandle;

/// `systemContextCreate(*systemContext)`.
pub type SysContextCreateFn = unsafe extern "C" fn(*mut SystemContextHandle) -> ErrorHandle;
/// `systemContextGetBinaryInfo(systemContext, void* buffer, u64 size, const
/// QnnSystemContext_BinaryInfo_t** info, u64* infoSize)`.
pub type SysContextGetBinaryInfoFn = unsafe extern "C" fn(
    SystemContextHandle,
    *mut c_void,
    u64,
    *mut *const c_void,
    *mut u64,
) -> ErrorHandle;
/// `systemContextFree(systemContext)`.
pub type SysContextFreeFn = unsafe extern "C" fn(SystemContextHandle) -> ErrorHandle;

/// HTP performance infrastructure (`QnnHtpDevice_Infrastructure_t` with infraType PERF):
/// u32 infraType @0, then the function pointers below.
pub mod htp_perf {
    pub const INFRA_TYPE_PERF: u32 = 0;
    pub const CREATE_POWER_CONFIG_ID: usize = 8;
    pub const DESTROY_POWER_CONFIG_ID: usize = 16;
    pub const SET_POWER_CONFIG: usize = 24;
    /// Bytes of the struct we read.
    pub const MIN_SIZE: usize = SET_POWER_CONFIG + 8;

    /// `QnnHtpPerfInfrastructure_PowerConfigOption_t`.
    pub const OPTION_DCVS_V3: u32 = 1;
    pub const OPTION_RPC_CONTROL_LATENCY: u32 = 2;
    pub const OPTION_RPC_POLLING_TIME: u32 = 3;
    pub const OPTION_HMX_V2: u32 = 5;

    /// `QnnHtpPerfInfrastructure_PowerMode_t` (bit values).
    pub const POWER_MODE_POWER_SAVER: u32 = 0x4;
    pub const POWER_MODE_PERFORMANCE: u32 = 0x10;

    /// `QnnHtpPerfInfrastructure_VoltageCorner_t`.
    pub const CORNER_SVS2: u32 = 0x30;
    pub const CORNER_SVS: u32 = 0x40;
    pub const CORNER_NOM_PLUS: u32 = 0x70;
    pub const CORNER_TURBO: u32 = 0x80;
    pub const CORNER_MAX: u32 = 0xA0;
}

pub type CreatePowerConfigIdFn = unsafe extern "C" fn(u32, u32, *mut u32) -> ErrorHandle;
pub type DestroyPowerConfigIdFn = unsafe extern "C" fn(u32) -> ErrorHandle;
pub type SetPowerConfigFn = unsafe extern "C" fn(u32, *const *const PowerConfig) -> ErrorHandle;

/// `QnnHtpPerfInfrastructure_PowerConfig_t`: 68 bytes, align 4; u32 option @0, payload
/// union @4. DCVS_V3's payload is 16 u32 in order: contextId, setDcvsEnable, dcvsEnable,
/// powerMode, setSleepLatency, sleepLatency, setSleepDisable, sleepDisable, setBusParams,
/// busMin, busTarget, busMax, setCoreParams, coreMin, coreTarget, coreMax; the RPC options
/// use the first u32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerConfig {
    pub option: u32,
    pub payload: [u32; 16],
}

/// `QnnContext_Config_t`: u32 option @0, union @8. Only the CUSTOM option is used, whose
/// member is a pointer to a backend-specific config. The union is padded beyond the
/// pointer so a library that reads a larger member of it reads zeros, not our stack.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ContextConfig {
    pub option: u32,
    pub custom: *const c_void,
    pub _rest_of_union: [u64; 3],
}
pub const CONTEXT_CONFIG_OPTION_CUSTOM: u32 = 0;

/// `QnnHtpContext_CustomConfig_t`: u32 option @0, union @8 (24 bytes). Option
/// REGISTER_MULTI_CONTEXTS's member is `QnnHtpContext_GroupRegistration_t
/// { Qnn_ContextHandle_t firstGroupHandle; u64 maxSpillFillBuffer }`: the first context
/// of a group passes a NULL handle, each later one the first context's handle.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HtpContextGroupConfig {
    pub option: u32,
    pub first_group_handle: ContextHandle,
    pub max_spill_fill_buffer: u64,
}
pub const HTP_CONTEXT_CONFIG_REGISTER_MULTI_CONTEXTS: u32 = 2;

/// `QnnSystemContext_BinaryInfo_t`: u32 version @0, union @8. Offsets below are absolute.
pub mod binary_info {
    pub const VERSION: usize = 0;
    const U: usize = 8;
    pub const BUILD_ID: usize = U + 8;
    pub const CORE_API: usize = U + 16;
    pub const BACKEND_API: usize = U + 28;
    pub const V1_NUM_GRAPHS: usize = U + 112;
    pub const V1_GRAPHS: usize = U + 120;
    pub const V3_BLOB_VERSION: usize = U + 48;
    pub const V3_BLOB_SIZE: usize = U + 64;
    pub const V3_NUM_GRAPHS: usize = U + 88;
    pub const V3_GRAPHS: usize = U + 96;
    pub const V3_SOC_MODEL: usize = U + 128;
    /// Bytes the library must return for us to read every v3 field above.
    pub const V3_MIN_SIZE: usize = V3_SOC_MODEL + 4;
}

/// `QnnSystemContext_GraphInfo_t`: 88-byte stride; u32 version @0, union @8. The stride
/// is the size of the union of every graph-info version the library was built with, so a
/// newer system API may change it: libraries are accepted only up to
/// [`crate::NEWEST_KNOWN_SYSTEM_API`], the newest whose layout was checked.
pub mod graph_info {
    pub const STRIDE: usize = 88;
    pub const NAME: usize = 8;
    pub const NUM_INPUTS: usize = 16;
    pub const INPUTS: usize = 24;
    pub const NUM_OUTPUTS: usize = 32;
    pub const OUTPUTS: usize = 40;
    /// v3 (seen in QAIRT 2.51 on the emulator): u32 @48 and a NULL pointer @56 (updateable
    /// tensors), `u32 graphBlobInfoSize` @64, `void* graphBlobInfo` @72 (HTP:
    /// `QnnHtpSystemContext_GraphBlobInfo_t`, u32 version @0, `u64 spillFillBufferSize` @8).
    pub const BLOB_INFO_SIZE: usize = 64;
    pub const BLOB_INFO: usize = 72;
    pub const BLOB_INFO_SPILL_FILL: usize = 8;
}

pub const TENSOR_TYPE_APP_WRITE: u32 = 0;
pub const TENSOR_TYPE_APP_READ: u32 = 1;
pub const DATA_FORMAT_DENSE: u32 = 0;
pub const MEM_TYPE_RAW: u32 = 0;
pub const QUANT_DEFINITION_DEFINED: u32 = 1;
pub const QUANT_UNDEFINED: u32 = 0x7FFF_FFFF;
pub const QUANT_ENCODING_SCALE_OFFSET: u32 = 0;

pub mod data_type {
    pub const INT_8: u32 = 0x0008;
    pub const INT_16: u32 = 0x0016;
    pub const INT_32: u32 = 0x0032;
    pub const INT_64: u32 = 0x0064;
    pub const UINT_8: u32 = 0x0108;
    pub const UINT_16: u32 = 0x0116;
    pub const UINT_32: u32 = 0x0132;
    pub const UINT_64: u32 = 0x0164;
    pub const FLOAT_16: u32 = 0x0216;
    pub const FLOAT_32: u32 = 0x0232;
    pub const FLOAT_64: u32 = 0x0264;
    pub const BFLOAT_16: u32 = 0x0226;
    pub const SFIXED_POINT_8: u32 = 0x0308;
    pub const SFIXED_POINT_16: u32 = 0x0316;
    pub const SFIXED_POINT_32: u32 = 0x0332;
    pub const UFIXED_POINT_8: u32 = 0x0408;
    pub const UFIXED_POINT_16: u32 = 0x0416;
    pub const UFIXED_POINT_32: u32 = 0x0432;
    pub const BOOL_8: u32 = 0x0508;
    pub const STRING: u32 = 0x0608;
}

/// `Qnn_QuantizeParams_t` (40 bytes): definition, encoding, then a union whose
/// scale-offset member is `{ f32 scale, i32 offset }`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantizeParams {
    pub encoding_definition: u32,
    pub quantization_encoding: u32,
    pub scale: f32,
    pub offset: i32,
    pub _rest_of_union: [u64; 3],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ClientBuffer {
    pub data: *mut c_void,
    pub data_size: u32,
}

/// `Qnn_TensorV1_t` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TensorV1 {
    pub id: u32,
    pub name: *const c_char,
    pub tensor_type: u32,
    pub data_format: u32,
    pub data_type: u32,
    pub quantize_params: QuantizeParams,
    pub rank: u32,
    pub dimensions: *mut u32,
    pub mem_type: u32,
    pub client_buf: ClientBuffer,
}

/// `Qnn_Tensor_t`: 144 bytes, align 8; version 1 plus zeroed v2 tail. 144 is the size of
/// the union of the tensor versions known up to [`crate::NEWEST_KNOWN_CORE_API`] (and
/// the stride of the tensor arrays in binary info): newer libraries are refused.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnTensor {
    pub version: u32,
    pub v1: TensorV1,
    pub _v2_tail: [u64; 3],
}

const _: () = {
    assert!(core::mem::size_of::<QuantizeParams>() == 40);
    assert!(core::mem::size_of::<TensorV1>() == 112);
    assert!(core::mem::size_of::<QnnTensor>() == 144);
    assert!(core::mem::align_of::<QnnTensor>() == 8);
    assert!(core::mem::offset_of!(QnnTensor, v1) == 8);
    assert!(core::mem::offset_of!(TensorV1, name) == 8);
    assert!(core::mem::offset_of!(TensorV1, tensor_type) == 16);
    assert!(core::mem::offset_of!(TensorV1, data_type) == 24);
    assert!(core::mem::offset_of!(TensorV1, quantize_params) == 32);
    assert!(core::mem::offset_of!(TensorV1, rank) == 72);
    assert!(core::mem::offset_of!(TensorV1, dimensions) == 80);
    assert!(core::mem::offset_of!(TensorV1, mem_type) == 88);
    assert!(core::mem::offset_of!(TensorV1, client_buf) == 96);
    assert!(core::mem::size_of::<PowerConfig>() == 68);
    assert!(core::mem::align_of::<PowerConfig>() == 4);
    assert!(core::mem::offset_of!(PowerConfig, payload) == 4);
    assert!(core::mem::offset_of!(ContextConfig, custom) == 8);
    assert!(core::mem::size_of::<HtpContextGroupConfig>() == 24);
    assert!(core::mem::offset_of!(HtpContextGroupConfig, first_group_handle) == 8);
    assert!(core::mem::offset_of!(HtpContextGroupConfig, max_spill_fill_buffer) == 16);
};

/// Reads a `T` at `base + offset` from library-owned memory.
///
/// # Safety
/// `base + offset .. + size_of::<T>()` must be readable memory holding a valid `T`.
pub unsafe fn read_at<T: Copy>(base: *const u8, offset: usize) -> T {
    // SAFETY: the caller guarantees `base + offset` lies in one readable object.
    let at = unsafe { base.add(offset) } as *const T;
    // SAFETY: the caller guarantees the range is readable and holds a valid `T`;
    // unaligned reads are used because the library only promises the C layout, which we
    // address by offset.
    unsafe { core::ptr::read_unaligned(at) }
}
