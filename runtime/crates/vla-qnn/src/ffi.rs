//! Hand-written declarations of the parts of the QNN C ABI this crate uses.
//!
//! Layouts come from the QAIRT 2.51 libraries (checked) and the public 2.32-era headers;
//! see `docs/qnn-abi.md` in this repository. Only the fields we read or write are
//! named; where a newer library may have grown a struct we never rely on its total size,
//! except `Qnn_Tensor_t`, which we allocate ourselves as version 1 (the library accepts
//! v1 and v2 alike) at its full v2 size so a library that peeks at v2 fields reads zeros.

// FFI: calls into the QNN libraries, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use core::ffi::{c_char, c_void};

/// `Qnn_ErrorHandle_t`: what every QNN function returns; 0 is success, the low 16 bits
/// are the error code ([`error_code`]).
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
    /// `Qnn_MemHandle_t`: a registration of shared memory with a context, made by
    /// `memRegister`; a tensor of memType MEMHANDLE carries it instead of a client buffer.
    MemHandle;
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

/// The return value of a call that succeeded.
pub const QNN_SUCCESS: u64 = 0;

/// `QnnInterface_t`: backendId @0, providerName @8, core API version @16, backend API
/// version @28, function table from @40.
pub const IFACE_PROVIDER_NAME: usize = 8;
/// `QnnInterface_t`'s core API version (3 x u32).
pub const IFACE_CORE_API: usize = 16;
/// `QnnInterface_t`'s backend API version (3 x u32).
pub const IFACE_BACKEND_API: usize = 28;
/// Where `QnnInterface_t`'s function table starts (one pointer per [`slot`]).
pub const IFACE_TABLE: usize = 40;

/// `QnnSystemInterface_t`: backendId @0, providerName @8, system API version @16,
/// function table from @32.
pub const SYS_IFACE_API: usize = 16;
/// Where `QnnSystemInterface_t`'s function table starts (one pointer per [`sys_slot`]).
pub const SYS_IFACE_TABLE: usize = 32;

/// Slots of the QNN core function table.
pub mod slot {
    /// `backendCreate`.
    pub const BACKEND_CREATE: usize = 1;
    /// `backendGetBuildId`.
    pub const BACKEND_GET_BUILD_ID: usize = 4;
    /// `backendFree`.
    pub const BACKEND_FREE: usize = 8;
    /// `contextCreateFromBinary`.
    pub const CONTEXT_CREATE_FROM_BINARY: usize = 13;
    /// `contextFree`.
    pub const CONTEXT_FREE: usize = 14;
    /// `graphRetrieve`.
    pub const GRAPH_RETRIEVE: usize = 20;
    /// `graphExecute`.
    pub const GRAPH_EXECUTE: usize = 21;
    /// `logCreate`.
    pub const LOG_CREATE: usize = 25;
    /// `logFree`.
    pub const LOG_FREE: usize = 27;
    /// `memRegister`.
    pub const MEM_REGISTER: usize = 35;
    /// `memDeRegister`.
    pub const MEM_DEREGISTER: usize = 36;
    /// `deviceGetPlatformInfo`.
    pub const DEVICE_GET_PLATFORM_INFO: usize = 37;
    /// `deviceFreePlatformInfo`.
    pub const DEVICE_FREE_PLATFORM_INFO: usize = 38;
    /// `deviceGetInfrastructure`.
    pub const DEVICE_GET_INFRASTRUCTURE: usize = 39;
    /// `deviceCreate`.
    pub const DEVICE_CREATE: usize = 40;
    /// `deviceFree`.
    pub const DEVICE_FREE: usize = 43;
    /// `errorGetMessage`.
    pub const ERROR_GET_MESSAGE: usize = 48;
    /// The highest slot we call: the provider's table must be at least this long, which
    /// the minimum core API version guarantees.
    pub const HIGHEST_USED: usize = ERROR_GET_MESSAGE;
}

/// Slots of the QNN system function table.
pub mod sys_slot {
    /// `systemContextCreate`.
    pub const CONTEXT_CREATE: usize = 0;
    /// `systemContextGetBinaryInfo`.
    pub const CONTEXT_GET_BINARY_INFO: usize = 1;
    /// `systemContextFree`.
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
///
/// Its three handles have three types, so passing the device where the backend goes
/// does not compile:
///
/// ```compile_fail
/// use vla_qnn::ffi::{BackendHandle, ContextCreateFromBinaryFn, ContextHandle};
/// use vla_qnn::ffi::{DeviceHandle, ProfileHandle};
/// unsafe fn create(
///     f: ContextCreateFromBinaryFn,
///     backend: BackendHandle,
///     device: DeviceHandle,
///     out: &mut ContextHandle,
/// ) -> u64 {
///     let (configs, buffer) = (core::ptr::null(), core::ptr::null());
///     unsafe { f(device, backend, configs, buffer, 0, out, ProfileHandle::NULL) }
/// }
/// ```
///
/// while the declared order does:
///
/// ```
/// use vla_qnn::ffi::{BackendHandle, ContextCreateFromBinaryFn, ContextHandle};
/// use vla_qnn::ffi::{DeviceHandle, ProfileHandle};
/// unsafe fn create(
///     f: ContextCreateFromBinaryFn,
///     backend: BackendHandle,
///     device: DeviceHandle,
///     out: &mut ContextHandle,
/// ) -> u64 {
///     let (configs, buffer) = (core::ptr::null(), core::ptr::null());
///     unsafe { f(backend, device, configs, buffer, 0, out, ProfileHandle::NULL) }
/// }
/// ```
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
/// `deviceGetPlatformInfo(log, const QnnDevice_PlatformInfo_t** info)`: the devices
/// (NSPs) and cores the backend sees; the memory is the backend's until
/// [`DeviceFreePlatformInfoFn`].
pub type DeviceGetPlatformInfoFn =
    unsafe extern "C" fn(LogHandle, *mut *const c_void) -> ErrorHandle;
/// `deviceFreePlatformInfo(log, const QnnDevice_PlatformInfo_t* info)`.
pub type DeviceFreePlatformInfoFn = unsafe extern "C" fn(LogHandle, *const c_void) -> ErrorHandle;

/// `QnnDevice_PlatformInfo_t` (QnnDevice.h): u32 version @0, union @8; v1 = { u32
/// numHwDevices @0, QnnDevice_HardwareDeviceInfo_t* hwDevices @8 }. Offsets absolute.
pub mod platform_info {
    /// `u32 version` (1).
    pub const VERSION: usize = 0;
    /// v1: `u32 numHwDevices`.
    pub const NUM_DEVICES: usize = 8;
    /// v1: `QnnDevice_HardwareDeviceInfo_t* hwDevices`.
    pub const DEVICES: usize = 16;
    /// Bytes we read.
    pub const MIN_SIZE: usize = DEVICES + 8;
}

/// `QnnDevice_HardwareDeviceInfo_t`: u32 version @0, union @8; v1 = { u32 deviceId @0,
/// u32 deviceType @4, u32 numCores @8, QnnDevice_CoreInfo_t* cores @16,
/// deviceInfoExtension @24 }. Offsets absolute; the array stride is the struct's size
/// (40: the union holds v1 only in every header seen, 2.32 to 2.51).
pub mod hw_device_info {
    /// Bytes from one device to the next.
    pub const STRIDE: usize = 40;
    /// `u32 version` (1).
    pub const VERSION: usize = 0;
    /// v1: `u32 deviceId`.
    pub const DEVICE_ID: usize = 8;
    /// v1: `u32 deviceType` (HTP: 0 on-chip).
    pub const DEVICE_TYPE: usize = 12;
    /// v1: `u32 numCores`.
    pub const NUM_CORES: usize = 16;
    /// v1: `QnnDevice_CoreInfo_t* cores`.
    pub const CORES: usize = 24;
    /// v1: `QnnDevice_DeviceInfoExtension_t` (HTP: `QnnHtpDevice_DeviceInfoExtension_t*`).
    pub const EXTENSION: usize = 32;
}

/// `QnnDevice_CoreInfo_t`: u32 version @0, union @8; v1 = { u32 coreId @0, u32 coreType
/// @4, coreInfoExtension @8 }. Offsets absolute; stride 24.
pub mod core_info {
    /// Bytes from one core to the next.
    pub const STRIDE: usize = 24;
    /// `u32 version` (1).
    pub const VERSION: usize = 0;
    /// v1: `u32 coreId`.
    pub const CORE_ID: usize = 8;
    /// v1: `u32 coreType` (HTP: 0 NSP, 1 HPASS).
    pub const CORE_TYPE: usize = 12;
}

/// `QnnHtpDevice_DeviceInfoExtension_t` (QnnHtpDevice.h): u32 devType @0 (0 on-chip),
/// union @8: on-chip = { size_t vtcmSize (MB) @0, u32 socModel @8, bool signedPdSupport
/// @12, bool dlbcSupport @13, u32 arch @16 }. Offsets absolute.
pub mod htp_device_extension {
    /// `devType`: 0 = on-chip.
    pub const DEV_TYPE: usize = 0;
    /// On-chip: `size_t vtcmSize`, in MB.
    pub const VTCM_MB: usize = 8;
    /// On-chip: `u32 socModel`.
    pub const SOC_MODEL: usize = 16;
    /// On-chip: `bool signedPdSupport`.
    pub const SIGNED_PD: usize = 20;
    /// On-chip: `bool dlbcSupport`.
    pub const DLBC: usize = 21;
    /// On-chip: `u32 arch` (73 = v73).
    pub const ARCH: usize = 24;
    /// Bytes we read.
    pub const MIN_SIZE: usize = ARCH + 4;
}

/// `QnnHtpDevice_DeviceInfoExtension_t` with its on-chip member, as the caller builds it
/// for a device config (offsets in [`htp_device_extension`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HtpOnChipExtension {
    /// `devType`: 0 on-chip.
    pub dev_type: u32,
    /// Padding to the union.
    pub _pad: u32,
    /// `size_t vtcmSize`, MB.
    pub vtcm_mb: u64,
    /// `socModel`.
    pub soc_model: u32,
    /// `signedPdSupport`.
    pub signed_pd: bool,
    /// `dlbcSupport`.
    pub dlbc: bool,
    /// `arch`.
    pub arch: u32,
    /// Zeros to the end of the union.
    pub _rest: u32,
}

/// `QnnDevice_Config_t`: u32 option @0, union @8 { customConfig; hardwareInfo }. Option
/// PLATFORM_INFO's member is a `QnnDevice_PlatformInfo_t*` naming the one device (and its
/// cores) the created device is to use, which is how QNN's NSP-selection tutorial picks
/// an NSP.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeviceConfig {
    /// `QnnDevice_ConfigOption_t` ([`DEVICE_CONFIG_OPTION_PLATFORM_INFO`]).
    pub option: u32,
    /// The option's pointer.
    pub pointer: *const c_void,
}
/// `QNN_DEVICE_CONFIG_OPTION_CUSTOM`.
pub const DEVICE_CONFIG_OPTION_CUSTOM: u32 = 0;
/// `QNN_DEVICE_CONFIG_OPTION_PLATFORM_INFO`.
pub const DEVICE_CONFIG_OPTION_PLATFORM_INFO: u32 = 1;

/// `QnnDevice_PlatformInfo_t` version 1, as the caller builds it for a device config.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PlatformInfoV1 {
    /// 1.
    pub version: u32,
    /// Padding to the union, which is pointer-aligned.
    pub _pad: u32,
    /// `numHwDevices`.
    pub num_devices: u32,
    /// `hwDevices`.
    pub devices: *const HwDeviceInfoV1,
}

/// `QnnDevice_HardwareDeviceInfo_t` version 1, as the caller builds it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HwDeviceInfoV1 {
    /// 1.
    pub version: u32,
    /// Padding to the union, which is pointer-aligned.
    pub _pad: u32,
    /// `deviceId`.
    pub device_id: u32,
    /// `deviceType`.
    pub device_type: u32,
    /// `numCores`.
    pub num_cores: u32,
    /// `cores`.
    pub cores: *const CoreInfoV1,
    /// `deviceInfoExtension` (HTP: an [`HtpOnChipExtension`], or NULL).
    pub extension: *const c_void,
}

/// `QnnDevice_CoreInfo_t` version 1, as the caller builds it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CoreInfoV1 {
    /// 1.
    pub version: u32,
    /// Padding to the union, which is pointer-aligned.
    pub _pad: u32,
    /// `coreId`.
    pub core_id: u32,
    /// `coreType`.
    pub core_type: u32,
    /// `coreInfoExtension` (NULL).
    pub extension: *const c_void,
}

/// `memRegister(context, const Qnn_MemDescriptor_t* descriptors, u32 n, Qnn_MemHandle_t*
/// handles)`: one handle per descriptor; on failure nothing is registered.
pub type MemRegisterFn =
    unsafe extern "C" fn(ContextHandle, *const MemDescriptor, u32, *mut MemHandle) -> ErrorHandle;
/// `memDeRegister(const Qnn_MemHandle_t* handles, u32 n)`: on failure every valid handle
/// of the array is still deregistered.
pub type MemDeRegisterFn = unsafe extern "C" fn(*const MemHandle, u32) -> ErrorHandle;
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
    /// `infraType` of the performance infrastructure.
    pub const INFRA_TYPE_PERF: u32 = 0;
    /// Offset of `createPowerConfigId`.
    pub const CREATE_POWER_CONFIG_ID: usize = 8;
    /// Offset of `destroyPowerConfigId`.
    pub const DESTROY_POWER_CONFIG_ID: usize = 16;
    /// Offset of `setPowerConfig`.
    pub const SET_POWER_CONFIG: usize = 24;
    /// Bytes of the struct we read.
    pub const MIN_SIZE: usize = SET_POWER_CONFIG + 8;

    /// `QnnHtpPerfInfrastructure_PowerConfigOption_t`.
    pub const OPTION_DCVS_V3: u32 = 1;
    /// RPC control latency, in us.
    pub const OPTION_RPC_CONTROL_LATENCY: u32 = 2;
    /// RPC polling time, in us (at most 9999).
    pub const OPTION_RPC_POLLING_TIME: u32 = 3;
    /// HMX voting, v2 (v75 and newer only: the emulator refuses it with 13004).
    pub const OPTION_HMX_V2: u32 = 5;

    /// `QnnHtpPerfInfrastructure_PowerMode_t` (bit values).
    pub const POWER_MODE_POWER_SAVER: u32 = 0x4;
    /// `POWER_MODE_PERFORMANCE_MODE`.
    pub const POWER_MODE_PERFORMANCE: u32 = 0x10;

    /// `QnnHtpPerfInfrastructure_VoltageCorner_t`.
    pub const CORNER_SVS2: u32 = 0x30;
    /// SVS corner.
    pub const CORNER_SVS: u32 = 0x40;
    /// NOM_PLUS corner.
    pub const CORNER_NOM_PLUS: u32 = 0x70;
    /// TURBO corner.
    pub const CORNER_TURBO: u32 = 0x80;
    /// MAX corner.
    pub const CORNER_MAX: u32 = 0xA0;
}

/// `createPowerConfigId(u32 deviceId, u32 coreId, u32* powerConfigId)`.
pub type CreatePowerConfigIdFn = unsafe extern "C" fn(u32, u32, *mut u32) -> ErrorHandle;
/// `destroyPowerConfigId(u32 powerConfigId)`.
pub type DestroyPowerConfigIdFn = unsafe extern "C" fn(u32) -> ErrorHandle;
/// `setPowerConfig(u32 powerConfigId, const PowerConfig** /* NULL-terminated */)`.
pub type SetPowerConfigFn = unsafe extern "C" fn(u32, *const *const PowerConfig) -> ErrorHandle;

/// `QnnHtpPerfInfrastructure_PowerConfig_t`: 68 bytes, align 4; u32 option @0, payload
/// union @4. DCVS_V3's payload is 16 u32 in order: contextId, setDcvsEnable, dcvsEnable,
/// powerMode, setSleepLatency, sleepLatency, setSleepDisable, sleepDisable, setBusParams,
/// busMin, busTarget, busMax, setCoreParams, coreMin, coreTarget, coreMax; the RPC options
/// use the first u32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerConfig {
    /// `QnnHtpPerfInfrastructure_PowerConfigOption_t` (`htp_perf::OPTION_*`).
    pub option: u32,
    /// The option's payload, as described above.
    pub payload: [u32; 16],
}

/// `QnnContext_Config_t`: u32 option @0, union @8. Only the CUSTOM option is used, whose
/// member is a pointer to a backend-specific config. The union is padded beyond the
/// pointer so a library that reads a larger member of it reads zeros, not our stack.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ContextConfig {
    /// `QnnContext_ConfigOption_t` ([`CONTEXT_CONFIG_OPTION_CUSTOM`]).
    pub option: u32,
    /// The CUSTOM option's backend config ([`HtpContextGroupConfig`] for HTP).
    pub custom: *const c_void,
    /// Zeros to the end of the union.
    pub _rest_of_union: [u64; 3],
}
/// `QNN_CONTEXT_CONFIG_OPTION_CUSTOM`: a backend-specific config.
pub const CONTEXT_CONFIG_OPTION_CUSTOM: u32 = 0;

/// `QnnHtpContext_CustomConfig_t`: u32 option @0, union @8 (24 bytes). Option
/// REGISTER_MULTI_CONTEXTS's member is `QnnHtpContext_GroupRegistration_t
/// { Qnn_ContextHandle_t firstGroupHandle; u64 maxSpillFillBuffer }`: the first context
/// of a group passes a NULL handle, each later one the first context's handle.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HtpContextGroupConfig {
    /// `QnnHtpContext_CustomConfigOption_t` ([`HTP_CONTEXT_CONFIG_REGISTER_MULTI_CONTEXTS`]).
    pub option: u32,
    /// NULL for the group's first context, the first context's handle for later ones.
    pub first_group_handle: ContextHandle,
    /// The largest spill-fill buffer any context of the group needs, in bytes.
    pub max_spill_fill_buffer: u64,
}
/// `QNN_HTP_CONTEXT_CONFIG_OPTION_REGISTER_MULTI_CONTEXTS`.
pub const HTP_CONTEXT_CONFIG_REGISTER_MULTI_CONTEXTS: u32 = 2;

/// `QnnSystemContext_BinaryInfo_t`: u32 version @0, union @8. Offsets below are absolute.
pub mod binary_info {
    /// `u32 version`, common to every version.
    pub const VERSION: usize = 0;
    const U: usize = 8;
    /// `const char* buildId`.
    pub const BUILD_ID: usize = U + 8;
    /// `coreApiVersion` (3 x u32).
    pub const CORE_API: usize = U + 16;
    /// `backendApiVersion` (3 x u32).
    pub const BACKEND_API: usize = U + 28;
    /// v1/v2: `u32 numGraphs`.
    pub const V1_NUM_GRAPHS: usize = U + 112;
    /// v1/v2: `QnnSystemContext_GraphInfo_t* graphs`.
    pub const V1_GRAPHS: usize = U + 120;
    /// v3: `contextBlobVersion` (3 x u32).
    pub const V3_BLOB_VERSION: usize = U + 48;
    /// v3: `u64 contextBlobSize`.
    pub const V3_BLOB_SIZE: usize = U + 64;
    /// v3: `u32 numGraphs`.
    pub const V3_NUM_GRAPHS: usize = U + 88;
    /// v3: `QnnSystemContext_GraphInfo_t* graphs`.
    pub const V3_GRAPHS: usize = U + 96;
    /// v3: `u32 socModel` (77: QCS9075/QCS9100).
    pub const V3_SOC_MODEL: usize = U + 128;
    /// Bytes the library must return for us to read every v3 field above.
    pub const V3_MIN_SIZE: usize = V3_SOC_MODEL + 4;
}

/// `QnnSystemContext_GraphInfo_t`: 88-byte stride; u32 version @0, union @8. The stride
/// is the size of the union of every graph-info version the library was built with, so a
/// newer system API may change it: libraries are accepted only up to
/// [`crate::NEWEST_KNOWN_SYSTEM_API`], the newest whose layout was checked.
pub mod graph_info {
    /// Bytes from one graph info to the next.
    pub const STRIDE: usize = 88;
    /// `const char* graphName`.
    pub const NAME: usize = 8;
    /// `u32 numGraphInputs`.
    pub const NUM_INPUTS: usize = 16;
    /// `Qnn_Tensor_t* graphInputs`.
    pub const INPUTS: usize = 24;
    /// `u32 numGraphOutputs`.
    pub const NUM_OUTPUTS: usize = 32;
    /// `Qnn_Tensor_t* graphOutputs`.
    pub const OUTPUTS: usize = 40;
    /// v3 (seen in QAIRT 2.51 on the emulator): u32 @48 and a NULL pointer @56 (updateable
    /// tensors), `u32 graphBlobInfoSize` @64, `void* graphBlobInfo` @72 (HTP:
    /// `QnnHtpSystemContext_GraphBlobInfo_t`, u32 version @0, `u64 spillFillBufferSize` @8).
    pub const BLOB_INFO_SIZE: usize = 64;
    /// v3: `void* graphBlobInfo`.
    pub const BLOB_INFO: usize = 72;
    /// `u64 spillFillBufferSize` in the blob info.
    pub const BLOB_INFO_SPILL_FILL: usize = 8;
}

/// `QNN_TENSOR_TYPE_APP_WRITE`: an input the application writes.
pub const TENSOR_TYPE_APP_WRITE: u32 = 0;
/// `QNN_TENSOR_TYPE_APP_READ`: an output the application reads.
pub const TENSOR_TYPE_APP_READ: u32 = 1;
/// `QNN_TENSOR_DATA_FORMAT_DENSE` (flat, row-major).
pub const DATA_FORMAT_DENSE: u32 = 0;
/// `QNN_TENSORMEMTYPE_RAW`: the data is in a client buffer.
pub const MEM_TYPE_RAW: u32 = 0;
/// `QNN_TENSORMEMTYPE_MEMHANDLE`: the data is registered memory; the tensor's union holds
/// the [`MemHandle`] where a client buffer would be.
pub const MEM_TYPE_MEMHANDLE: u32 = 1;

/// `Qnn_MemShape_t` (QnnMem.h; 24 bytes): the registered tensor's shape.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemShape {
    /// `numDim`.
    pub num_dim: u32,
    /// `numDim` dimensions (QNN only reads them during `memRegister`).
    pub dim_size: *mut u32,
    /// Backend-specific configuration string; NULL.
    pub shape_config: *const c_char,
}

/// `Qnn_MemDescriptor_t` (QnnMem.h; 40 bytes, align 8): shape @0, u32 dataType @24, u32
/// memType @28, union @32 whose members are `Qnn_MemIonInfo_t { i32 fd }` for
/// [`MEM_DESC_TYPE_ION`] and `void* customInfo` for [`MEM_DESC_TYPE_CUSTOM`]. The union
/// is kept as one pointer-sized word: the ION member is its low 32 bits (LP64, little
/// endian on both targets).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemDescriptor {
    /// The tensor's shape.
    pub mem_shape: MemShape,
    /// `Qnn_DataType_t` of the tensor ([`data_type`]).
    pub data_type: u32,
    /// `Qnn_MemType_t` ([`MEM_DESC_TYPE_ION`] or [`MEM_DESC_TYPE_CUSTOM`]).
    pub mem_type: u32,
    /// The union: an [`HtpMemDescriptor`] pointer for CUSTOM.
    pub custom_info: *const c_void,
}
/// `QNN_MEM_TYPE_ION`: one fd per tensor (a whole rpcmem allocation per handle).
pub const MEM_DESC_TYPE_ION: u32 = 1;
/// `QNN_MEM_TYPE_CUSTOM`: a backend-specific descriptor ([`HtpMemDescriptor`] for HTP).
pub const MEM_DESC_TYPE_CUSTOM: u32 = 2;
/// `QNN_MEM_INVALID_FD`.
pub const MEM_INVALID_FD: i32 = -1;

/// `QnnMemHtp_Descriptor_t` (HTP/QnnHtpMem.h; 32 bytes, align 8): u32 type @0, u64 size
/// @8 (for SHARED_BUFFER the whole buffer's size), union @16 whose SHARED_BUFFER member
/// is `QnnHtpMem_SharedBufferConfig_t { i32 fd @16; u64 offset @24 }`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HtpMemDescriptor {
    /// `QnnHtpMem_Type_t` ([`HTP_MEM_SHARED_BUFFER`]).
    pub mem_type: u32,
    /// Size of the whole buffer the fd names, in bytes.
    pub size: u64,
    /// The buffer's file descriptor (rpcmem_to_fd).
    pub fd: i32,
    /// Where the tensor starts in it, in bytes.
    pub offset: u64,
}
/// `QNN_HTP_MEM_QURT`: an address on the DSP side only.
pub const HTP_MEM_QURT: u32 = 0;
/// `QNN_HTP_MEM_SHARED_BUFFER`: one fd, many tensors at offsets, one handle each.
pub const HTP_MEM_SHARED_BUFFER: u32 = 1;
/// `QNN_DEFINITION_DEFINED`: the quantization parameters are set.
pub const QUANT_DEFINITION_DEFINED: u32 = 1;
/// `QNN_DEFINITION_UNDEFINED` / `QNN_QUANTIZATION_ENCODING_UNDEFINED` (float tensors).
pub const QUANT_UNDEFINED: u32 = 0x7FFF_FFFF;
/// `QNN_QUANTIZATION_ENCODING_SCALE_OFFSET`: one scale and offset per tensor.
pub const QUANT_ENCODING_SCALE_OFFSET: u32 = 0;

/// `Qnn_DataType_t` codes: the high byte is the kind, the low byte the width.
pub mod data_type {
    /// `QNN_DATATYPE_INT_8`.
    pub const INT_8: u32 = 0x0008;
    /// `QNN_DATATYPE_INT_16`.
    pub const INT_16: u32 = 0x0016;
    /// `QNN_DATATYPE_INT_32`.
    pub const INT_32: u32 = 0x0032;
    /// `QNN_DATATYPE_INT_64`.
    pub const INT_64: u32 = 0x0064;
    /// `QNN_DATATYPE_UINT_8`.
    pub const UINT_8: u32 = 0x0108;
    /// `QNN_DATATYPE_UINT_16`.
    pub const UINT_16: u32 = 0x0116;
    /// `QNN_DATATYPE_UINT_32`.
    pub const UINT_32: u32 = 0x0132;
    /// `QNN_DATATYPE_UINT_64`.
    pub const UINT_64: u32 = 0x0164;
    /// `QNN_DATATYPE_FLOAT_16`.
    pub const FLOAT_16: u32 = 0x0216;
    /// `QNN_DATATYPE_FLOAT_32`.
    pub const FLOAT_32: u32 = 0x0232;
    /// `QNN_DATATYPE_FLOAT_64`.
    pub const FLOAT_64: u32 = 0x0264;
    /// `QNN_DATATYPE_BFLOAT_16`.
    pub const BFLOAT_16: u32 = 0x0226;
    /// `QNN_DATATYPE_SFIXED_POINT_8`.
    pub const SFIXED_POINT_8: u32 = 0x0308;
    /// `QNN_DATATYPE_SFIXED_POINT_16`.
    pub const SFIXED_POINT_16: u32 = 0x0316;
    /// `QNN_DATATYPE_SFIXED_POINT_32`.
    pub const SFIXED_POINT_32: u32 = 0x0332;
    /// `QNN_DATATYPE_UFIXED_POINT_8`.
    pub const UFIXED_POINT_8: u32 = 0x0408;
    /// `QNN_DATATYPE_UFIXED_POINT_16`.
    pub const UFIXED_POINT_16: u32 = 0x0416;
    /// `QNN_DATATYPE_UFIXED_POINT_32`.
    pub const UFIXED_POINT_32: u32 = 0x0432;
    /// `QNN_DATATYPE_BOOL_8`.
    pub const BOOL_8: u32 = 0x0508;
    /// `QNN_DATATYPE_STRING`.
    pub const STRING: u32 = 0x0608;
}

/// `Qnn_QuantizeParams_t` (40 bytes): definition, encoding, then a union whose
/// scale-offset member is `{ f32 scale, i32 offset }`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantizeParams {
    /// `Qnn_Definition_t` ([`QUANT_DEFINITION_DEFINED`] or [`QUANT_UNDEFINED`]).
    pub encoding_definition: u32,
    /// `Qnn_QuantizationEncoding_t` ([`QUANT_ENCODING_SCALE_OFFSET`] or [`QUANT_UNDEFINED`]).
    pub quantization_encoding: u32,
    /// Scale of the scale-offset encoding: real = (q + offset) * scale.
    pub scale: f32,
    /// Offset of the scale-offset encoding.
    pub offset: i32,
    /// Zeros to the end of the union.
    pub _rest_of_union: [u64; 3],
}

#[repr(C)]
#[derive(Clone, Copy)]
/// `Qnn_ClientBuffer_t`: where a tensor's data is.
pub struct ClientBuffer {
    /// The buffer.
    pub data: *mut c_void,
    /// Its size in bytes (QNN does not check it: [`crate::Graph`] does).
    pub data_size: u32,
}

/// `Qnn_TensorV1_t` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TensorV1 {
    /// The id `graphExecute` matches tensors by.
    pub id: u32,
    /// NUL-terminated name.
    pub name: *const c_char,
    /// `Qnn_TensorType_t` ([`TENSOR_TYPE_APP_WRITE`], [`TENSOR_TYPE_APP_READ`], ...).
    pub tensor_type: u32,
    /// `Qnn_TensorDataFormat_t` ([`DATA_FORMAT_DENSE`]).
    pub data_format: u32,
    /// `Qnn_DataType_t` ([`data_type`]).
    pub data_type: u32,
    /// Quantization of the elements.
    pub quantize_params: QuantizeParams,
    /// Number of dimensions.
    pub rank: u32,
    /// `rank` dimensions, outermost first.
    pub dimensions: *mut u32,
    /// `Qnn_TensorMemType_t` ([`MEM_TYPE_RAW`] or [`MEM_TYPE_MEMHANDLE`]).
    pub mem_type: u32,
    /// The data, for [`MEM_TYPE_RAW`]; for [`MEM_TYPE_MEMHANDLE`] the union's first word
    /// is the [`MemHandle`] instead ([`TensorV1::set_mem_handle`]).
    pub client_buf: ClientBuffer,
}

impl TensorV1 {
    /// Points the tensor at registered memory: memType MEMHANDLE, the handle in the
    /// union's first word (where `clientBuf.data` is) and the rest of the union zero.
    pub fn set_mem_handle(&mut self, handle: MemHandle) {
        self.mem_type = MEM_TYPE_MEMHANDLE;
        self.client_buf = ClientBuffer {
            data: handle.0,
            data_size: 0,
        };
    }

    /// Points the tensor back at no client buffer (memType RAW, NULL, 0).
    pub fn clear_data(&mut self) {
        self.mem_type = MEM_TYPE_RAW;
        self.client_buf = ClientBuffer {
            data: core::ptr::null_mut(),
            data_size: 0,
        };
    }
}

/// `Qnn_Tensor_t`: 144 bytes, align 8; version 1 plus zeroed v2 tail. 144 is the size of
/// the union of the tensor versions known up to [`crate::NEWEST_KNOWN_CORE_API`] (and
/// the stride of the tensor arrays in binary info): newer libraries are refused.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnTensor {
    /// 1: `v1` is what the library reads.
    pub version: u32,
    /// The version-1 struct.
    pub v1: TensorV1,
    /// Zeros where version 2 has more fields.
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
    assert!(core::mem::size_of::<DeviceConfig>() == 16);
    assert!(core::mem::offset_of!(HtpOnChipExtension, vtcm_mb) == htp_device_extension::VTCM_MB);
    assert!(
        core::mem::offset_of!(HtpOnChipExtension, soc_model) == htp_device_extension::SOC_MODEL
    );
    assert!(
        core::mem::offset_of!(HtpOnChipExtension, signed_pd) == htp_device_extension::SIGNED_PD
    );
    assert!(core::mem::offset_of!(HtpOnChipExtension, dlbc) == htp_device_extension::DLBC);
    assert!(core::mem::offset_of!(HtpOnChipExtension, arch) == htp_device_extension::ARCH);
    assert!(core::mem::offset_of!(DeviceConfig, pointer) == 8);
    assert!(core::mem::offset_of!(PlatformInfoV1, num_devices) == platform_info::NUM_DEVICES);
    assert!(core::mem::offset_of!(PlatformInfoV1, devices) == platform_info::DEVICES);
    assert!(core::mem::size_of::<HwDeviceInfoV1>() == hw_device_info::STRIDE);
    assert!(core::mem::offset_of!(HwDeviceInfoV1, device_id) == hw_device_info::DEVICE_ID);
    assert!(core::mem::offset_of!(HwDeviceInfoV1, device_type) == hw_device_info::DEVICE_TYPE);
    assert!(core::mem::offset_of!(HwDeviceInfoV1, num_cores) == hw_device_info::NUM_CORES);
    assert!(core::mem::offset_of!(HwDeviceInfoV1, cores) == hw_device_info::CORES);
    assert!(core::mem::offset_of!(HwDeviceInfoV1, extension) == hw_device_info::EXTENSION);
    assert!(core::mem::size_of::<CoreInfoV1>() == core_info::STRIDE);
    assert!(core::mem::offset_of!(CoreInfoV1, core_id) == core_info::CORE_ID);
    assert!(core::mem::offset_of!(CoreInfoV1, core_type) == core_info::CORE_TYPE);
    // QnnMem.h / QnnHtpMem.h, checked with a C program against the headers' layouts.
    assert!(core::mem::size_of::<MemShape>() == 24);
    assert!(core::mem::size_of::<MemDescriptor>() == 40);
    assert!(core::mem::align_of::<MemDescriptor>() == 8);
    assert!(core::mem::offset_of!(MemDescriptor, data_type) == 24);
    assert!(core::mem::offset_of!(MemDescriptor, mem_type) == 28);
    assert!(core::mem::offset_of!(MemDescriptor, custom_info) == 32);
    assert!(core::mem::size_of::<HtpMemDescriptor>() == 32);
    assert!(core::mem::offset_of!(HtpMemDescriptor, size) == 8);
    assert!(core::mem::offset_of!(HtpMemDescriptor, fd) == 16);
    assert!(core::mem::offset_of!(HtpMemDescriptor, offset) == 24);
    assert!(core::mem::size_of::<MemHandle>() == 8);
};

/// Reads a `T` at `base + offset` from library-owned memory.
///
/// # Safety
/// `base` and `base + offset` must lie in one allocated object (as `pointer::add`
/// requires), and `base + offset .. + size_of::<T>()` must be readable memory holding a
/// valid `T`.
pub unsafe fn read_at<T: Copy>(base: *const u8, offset: usize) -> T {
    // SAFETY: the caller guarantees `base + offset` lies in one readable object.
    let at = unsafe { base.add(offset) } as *const T;
    // SAFETY: the caller guarantees the range is readable and holds a valid `T`;
    // unaligned reads are used because the library only promises the C layout, which we
    // address by offset.
    unsafe { core::ptr::read_unaligned(at) }
}
