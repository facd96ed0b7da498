//! The QNN log, backend and device handles, freed in the one safe order.
//!
//! QNN requires contexts to go before the device, the device before the backend and the
//! backend before the log. Contexts hold an `Arc` of [`BackendInner`], so the handles here
//! are freed only after the last context, whatever order the owner drops things in.

use crate::error::QnnError;
use crate::ffi::{self, Handle};
use crate::library::QnnLibrary;
use core::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

extern "C" {
    fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: *mut c_void) -> c_int;
}

/// Routes QNN's printf-style log lines to the `log` crate (target `qnn`).
///
/// Called by QNN from any of its threads; must never unwind.
unsafe extern "C" fn qnn_log_callback(fmt: *const c_char, level: u32, _ts: u64, args: *mut c_void) {
    if fmt.is_null() {
        return;
    }
    let level = match level {
        1 => log::Level::Error,
        2 => log::Level::Warn,
        3 => log::Level::Info,
        4 => log::Level::Debug,
        _ => log::Level::Trace,
    };
    if !log::log_enabled!(target: "qnn", level) {
        return;
    }
    let mut buf = [0u8; 1024];
    // SAFETY: `fmt` and `args` come from QNN as a matching printf pair; vsnprintf writes
    // at most `buf.len()` bytes including the terminating NUL.
    let n = unsafe { vsnprintf(buf.as_mut_ptr() as *mut c_char, buf.len(), fmt, args) };
    if n < 0 {
        return;
    }
    let end = (n as usize).min(buf.len() - 1);
    let text = String::from_utf8_lossy(&buf[..end]);
    log::log!(target: "qnn", level, "{}", text.trim_end());
}

fn qnn_log_level() -> u32 {
    match log::max_level() {
        log::LevelFilter::Off | log::LevelFilter::Error => 1,
        log::LevelFilter::Warn => 2,
        log::LevelFilter::Info => 3,
        log::LevelFilter::Debug => 4,
        log::LevelFilter::Trace => 5,
    }
}

pub(crate) struct BackendInner {
    pub lib: Arc<QnnLibrary>,
    pub log: Handle,
    pub backend: Handle,
    pub device: Handle,
}

// SAFETY: QNN handles are opaque pointers usable from any thread; the backend serializes
// what must be serialized (execution on one graph).
unsafe impl Send for BackendInner {}
// SAFETY: as above; the handles themselves are never mutated after creation.
unsafe impl Sync for BackendInner {}

impl Drop for BackendInner {
    fn drop(&mut self) {
        let core = &self.lib.core;
        // SAFETY: each handle was created by this library, is freed once, and every
        // context made from it is already gone (contexts hold an Arc of this struct).
        unsafe {
            if !self.device.is_null() {
                if let Some(free) = core.device_free {
                    let rc = free(self.device);
                    if rc != ffi::QNN_SUCCESS {
                        log::warn!("QNN deviceFree returned {}", rc & 0xFFFF);
                    }
                }
            }
            let rc = (core.backend_free)(self.backend);
            if rc != ffi::QNN_SUCCESS {
                log::warn!("QNN backendFree returned {}", rc & 0xFFFF);
            }
            if !self.log.is_null() {
                (core.log_free)(self.log);
            }
        }
    }
}

/// An initialized QNN backend (log + backend + device), ready to create contexts.
#[derive(Clone)]
pub struct Backend {
    pub(crate) inner: Arc<BackendInner>,
}

impl Backend {
    /// Creates the log (routed to `log`), the backend and, where the platform has one,
    /// the device.
    pub fn new(lib: Arc<QnnLibrary>) -> Result<Self, QnnError> {
        let core = &lib.core;
        let mut log_handle: Handle = core::ptr::null_mut();
        // SAFETY: the callback matches QnnLog_Callback_t and never unwinds.
        let rc =
            unsafe { (core.log_create)(Some(qnn_log_callback), qnn_log_level(), &mut log_handle) };
        if rc != ffi::QNN_SUCCESS {
            // Not fatal: without a logger QNN prints to stdout.
            log::warn!(
                "QNN logCreate failed with {}; QNN messages go to stdout",
                rc & 0xFFFF
            );
            log_handle = core::ptr::null_mut();
        }
        let mut backend: Handle = core::ptr::null_mut();
        // SAFETY: NULL config is allowed; out-pointer valid.
        let rc = unsafe { (core.backend_create)(log_handle, core::ptr::null(), &mut backend) };
        if let Err(e) = lib.check(rc, "backendCreate", || {
            lib.backend_path().display().to_string()
        }) {
            if !log_handle.is_null() {
                // SAFETY: created above, freed once.
                unsafe { (core.log_free)(log_handle) };
            }
            return Err(e);
        }
        let mut device: Handle = core::ptr::null_mut();
        if let Some(create) = core.device_create {
            // SAFETY: NULL config is allowed; out-pointer valid.
            let rc = unsafe { create(log_handle, core::ptr::null(), &mut device) };
            if rc != ffi::QNN_SUCCESS {
                // The HTP emulator and some platforms run without a device handle.
                log::debug!(
                    "QNN deviceCreate returned {}; continuing without a device",
                    rc & 0xFFFF
                );
                device = core::ptr::null_mut();
            }
        }
        Ok(Self {
            inner: Arc::new(BackendInner {
                lib,
                log: log_handle,
                backend,
                device,
            }),
        })
    }

    pub fn library(&self) -> &Arc<QnnLibrary> {
        &self.inner.lib
    }
}
