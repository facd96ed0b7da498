//! What the backend reports of the platform's HTP devices (NSPs) and their cores
//! (`deviceGetPlatformInfo`), and the device config that selects one of them.
//!
//! The report is copied out and the backend's memory handed back
//! (`deviceFreePlatformInfo`) before [`PlatformInfo::read`] returns. A device is selected
//! as QNN's "Multicore Device Creation and NSP Selection" tutorial does: a device config
//! of option PLATFORM_INFO naming that one device and its cores.

// FFI: reads backend-owned structs and calls into QNN, each block with its `SAFETY:`.
#![allow(unsafe_code)]

use crate::error::QnnError;
use crate::ffi::{self, qnn, read_at, LogHandle};
use crate::library::QnnLibrary;
use core::ffi::c_void;

/// Most devices and cores read from a report: far past any SoC (QCS9075 has 2 NSPs), a
/// bound so a corrupt count cannot make us walk off the backend's memory for long.
const MAX_DEVICES: u32 = 16;
const MAX_CORES: u32 = 64;

/// One core of an HTP device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreReport {
    /// `coreId`.
    pub id: u32,
    /// `coreType` (HTP: 0 NSP, 1 HPASS).
    pub core_type: u32,
}

/// One HTP device (an NSP) as the backend reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceReport {
    /// `deviceId`: what a device config selects.
    pub id: u32,
    /// `deviceType` (HTP: 0 on-chip).
    pub device_type: u32,
    /// Its cores.
    pub cores: Vec<CoreReport>,
    /// VTCM in MB (HTP on-chip extension), when reported.
    pub vtcm_mb: Option<u64>,
    /// SoC model (HTP on-chip extension), when reported.
    pub soc_model: Option<u32>,
    /// HTP architecture (73 = v73), when reported.
    pub arch: Option<u32>,
    /// Signed-PD and DLBC support (HTP on-chip extension), when reported.
    pub signed_pd_dlbc: Option<(bool, bool)>,
}

/// The backend's platform report, copied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlatformInfo {
    /// The report's version (1).
    pub version: u32,
    /// Its devices, in the backend's order.
    pub devices: Vec<DeviceReport>,
}

impl PlatformInfo {
    /// Asks the backend (`deviceGetPlatformInfo`) and copies the report. `Ok(None)` when
    /// the provider has no such entry.
    pub fn read(lib: &QnnLibrary, log: LogHandle) -> Result<Option<PlatformInfo>, QnnError> {
        let (Some(get), Some(free)) = (
            lib.core.device_get_platform_info,
            lib.core.device_free_platform_info,
        ) else {
            return Ok(None);
        };
        let mut raw: *const c_void = core::ptr::null();
        // SAFETY: `get` is the provider's deviceGetPlatformInfo (a non-NULL slot of the
        // checked table, the library loaded while `lib` is borrowed); `log` is a live
        // logger or NULL; `raw` is a local the backend writes once.
        let rc = qnn!(unsafe get(log, &mut raw));
        lib.check(rc, "deviceGetPlatformInfo", String::new)?;
        if raw.is_null() {
            return Ok(Some(PlatformInfo {
                version: 0,
                devices: Vec::new(),
            }));
        }
        // SAFETY: the backend returned a QnnDevice_PlatformInfo_t it owns until freed
        // below; `copy` reads only its documented v1 fields within the bounded counts.
        let info = unsafe { copy(raw as *const u8) };
        // SAFETY: `free` is the provider's deviceFreePlatformInfo; `raw` is the report
        // the same backend returned, freed once, after the copy.
        let rc = qnn!(unsafe free(log, raw));
        if rc != ffi::QNN_SUCCESS {
            log::warn!(
                "QNN deviceFreePlatformInfo returned {}",
                ffi::error_code(rc)
            );
        }
        Ok(Some(info))
    }

    /// The device of id `id`.
    pub fn device(&self, id: u32) -> Option<&DeviceReport> {
        self.devices.iter().find(|d| d.id == id)
    }

    /// One line: `2 devices: 0 (v73, soc 77, 8 MB VTCM, cores 0), 1 (...)`.
    pub fn describe(&self) -> String {
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|d| {
                let mut facts = Vec::new();
                if let Some(a) = d.arch {
                    facts.push(format!("v{a}"));
                }
                if let Some(s) = d.soc_model {
                    facts.push(format!("soc {s}"));
                }
                if let Some(v) = d.vtcm_mb {
                    facts.push(format!("{v} MB VTCM"));
                }
                let cores: Vec<String> = d
                    .cores
                    .iter()
                    .map(|c| format!("{} (type {})", c.id, c.core_type))
                    .collect();
                facts.push(format!("cores {}", cores.join(", ")));
                format!("device {} ({})", d.id, facts.join(", "))
            })
            .collect();
        format!(
            "platform info v{}: {} device(s): {}",
            self.version,
            self.devices.len(),
            devices.join("; ")
        )
    }
}

/// Copies a backend-owned platform report.
///
/// # Safety
/// `p` points at a live `QnnDevice_PlatformInfo_t` whose v1 arrays hold the counts they
/// state (at most [`MAX_DEVICES`] devices and [`MAX_CORES`] cores each are read).
unsafe fn copy(p: *const u8) -> PlatformInfo {
    // SAFETY: the struct's version (the caller's guarantee).
    let version: u32 = unsafe { read_at(p, ffi::platform_info::VERSION) };
    // The union's layout is known for version 1 only: read no field of another.
    if version != 1 {
        log::warn!("QNN platform info version {version} (known: 1): no device read");
        return PlatformInfo {
            version,
            devices: Vec::new(),
        };
    }
    // SAFETY: as above.
    let n: u32 = unsafe { read_at(p, ffi::platform_info::NUM_DEVICES) };
    // SAFETY: as above.
    let devices: *const u8 = unsafe { read_at(p, ffi::platform_info::DEVICES) };
    let mut out = Vec::new();
    if !devices.is_null() {
        for i in 0..n.min(MAX_DEVICES) as usize {
            let at = i * ffi::hw_device_info::STRIDE;
            // SAFETY: device `i`'s version, of the array the report states.
            let device_version: u32 =
                unsafe { read_at(devices, at + ffi::hw_device_info::VERSION) };
            if device_version != 1 {
                log::warn!(
                    "QNN hardware device info {i}: version {device_version} (known: 1), skipped"
                );
                continue;
            }
            // SAFETY: device `i` of the array the report states (caller's guarantee).
            let id: u32 = unsafe { read_at(devices, at + ffi::hw_device_info::DEVICE_ID) };
            // SAFETY: as above.
            let device_type: u32 =
                unsafe { read_at(devices, at + ffi::hw_device_info::DEVICE_TYPE) };
            // SAFETY: as above.
            let num_cores: u32 = unsafe { read_at(devices, at + ffi::hw_device_info::NUM_CORES) };
            // SAFETY: as above.
            let cores_p: *const u8 = unsafe { read_at(devices, at + ffi::hw_device_info::CORES) };
            // SAFETY: as above.
            let ext: *const u8 = unsafe { read_at(devices, at + ffi::hw_device_info::EXTENSION) };
            let mut cores = Vec::new();
            if !cores_p.is_null() {
                for c in 0..num_cores.min(MAX_CORES) as usize {
                    let ca = c * ffi::core_info::STRIDE;
                    // SAFETY: core `c`'s version, of the device's array.
                    let core_version: u32 =
                        unsafe { read_at(cores_p, ca + ffi::core_info::VERSION) };
                    if core_version != 1 {
                        continue;
                    }
                    // SAFETY: core `c` of the device's array (caller's guarantee).
                    let cid: u32 = unsafe { read_at(cores_p, ca + ffi::core_info::CORE_ID) };
                    // SAFETY: as above.
                    let ctype: u32 = unsafe { read_at(cores_p, ca + ffi::core_info::CORE_TYPE) };
                    cores.push(CoreReport {
                        id: cid,
                        core_type: ctype,
                    });
                }
            }
            let (mut vtcm_mb, mut soc_model, mut arch, mut flags) = (None, None, None, None);
            if !ext.is_null() {
                // SAFETY: the HTP backend's device extension (QnnHtpDevice.h), on-chip.
                let dev_type: u32 = unsafe { read_at(ext, ffi::htp_device_extension::DEV_TYPE) };
                if dev_type == 0 {
                    // SAFETY: the on-chip member's fields.
                    vtcm_mb =
                        Some(unsafe { read_at::<u64>(ext, ffi::htp_device_extension::VTCM_MB) });
                    // SAFETY: as above.
                    soc_model =
                        Some(unsafe { read_at::<u32>(ext, ffi::htp_device_extension::SOC_MODEL) });
                    // SAFETY: as above.
                    arch = Some(unsafe { read_at::<u32>(ext, ffi::htp_device_extension::ARCH) });
                    // SAFETY: as above; read as bytes (any value is a valid u8).
                    let signed: u8 = unsafe { read_at(ext, ffi::htp_device_extension::SIGNED_PD) };
                    // SAFETY: as above.
                    let dlbc: u8 = unsafe { read_at(ext, ffi::htp_device_extension::DLBC) };
                    flags = Some((signed != 0, dlbc != 0));
                }
            }
            out.push(DeviceReport {
                id,
                device_type,
                cores,
                vtcm_mb,
                soc_model,
                arch,
                signed_pd_dlbc: flags,
            });
        }
    }
    PlatformInfo {
        version,
        devices: out,
    }
}

/// A device config selecting one reported device with all its cores: the structs it
/// points into, kept together so the pointers stay valid while the config is used. Built
/// from the copied report (the backend's own report is freed by then): core extensions
/// NULL, the HTP on-chip extension rebuilt from what was reported.
pub struct DeviceSelection {
    cores: Vec<ffi::CoreInfoV1>,
    extension: Option<Box<ffi::HtpOnChipExtension>>,
    device: Box<ffi::HwDeviceInfoV1>,
    info: Box<ffi::PlatformInfoV1>,
    config: Box<ffi::DeviceConfig>,
}

impl DeviceSelection {
    /// The config for `device` (as reported: its id, type, cores and extensions).
    pub fn new(device: &DeviceReport) -> Self {
        let cores: Vec<ffi::CoreInfoV1> = device
            .cores
            .iter()
            .map(|c| ffi::CoreInfoV1 {
                version: 1,
                _pad: 0,
                core_id: c.id,
                core_type: c.core_type,
                extension: core::ptr::null(),
            })
            .collect();
        let extension = match (device.vtcm_mb, device.soc_model, device.arch) {
            (Some(vtcm_mb), Some(soc_model), Some(arch)) => {
                let (signed_pd, dlbc) = device.signed_pd_dlbc.unwrap_or((false, false));
                Some(Box::new(ffi::HtpOnChipExtension {
                    dev_type: 0,
                    _pad: 0,
                    vtcm_mb,
                    soc_model,
                    signed_pd,
                    dlbc,
                    arch,
                    _rest: 0,
                }))
            }
            _ => None,
        };
        let device_info = Box::new(ffi::HwDeviceInfoV1 {
            version: 1,
            _pad: 0,
            device_id: device.id,
            device_type: device.device_type,
            num_cores: cores.len() as u32,
            cores: cores.as_ptr(),
            extension: extension.as_deref().map_or(core::ptr::null(), |e| {
                e as *const ffi::HtpOnChipExtension as *const c_void
            }),
        });
        let info = Box::new(ffi::PlatformInfoV1 {
            version: 1,
            _pad: 0,
            num_devices: 1,
            devices: &*device_info,
        });
        let config = Box::new(ffi::DeviceConfig {
            option: ffi::DEVICE_CONFIG_OPTION_PLATFORM_INFO,
            pointer: &*info as *const ffi::PlatformInfoV1 as *const c_void,
        });
        DeviceSelection {
            cores,
            extension,
            device: device_info,
            info,
            config,
        }
    }

    /// The config, for a NULL-terminated `deviceCreate` config list.
    pub fn config(&self) -> *const ffi::DeviceConfig {
        let _ = (&self.cores, &self.extension, &self.device, &self.info);
        &*self.config
    }
}
