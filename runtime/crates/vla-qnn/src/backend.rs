//! The QNN log, backend and device handles, freed in the one safe order.
//!
//! QNN requires contexts to go before the device, the device before the backend and the
//! backend before the log. Contexts hold an `Arc` of [`BackendInner`], so the handles here
//! are freed only after the last context, whatever order the owner drops things in.

// FFI: calls into the QNN libraries, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use crate::error::{HtpRefusal, QnnError};
use crate::ffi::{self, qnn, BackendHandle, DeviceHandle, LogHandle};
use crate::library::QnnLibrary;
use crate::platform::{DeviceReport, DeviceSelection, PlatformInfo};
use core::ffi::{c_char, c_int, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

extern "C" {
    fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: *mut c_void) -> c_int;
}

/// Backends being created right now: while any is, QNN's errors and warnings are held
/// back instead of logged, so that a backend that cannot start is reported in one line
/// (with what the library said) and one that starts has them logged afterwards.
static CREATING: AtomicUsize = AtomicUsize::new(0);
static HELD: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());
const HELD_MAX: usize = 64;

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
    let hold = level <= log::Level::Warn && CREATING.load(Ordering::Acquire) > 0;
    if !hold && !log::log_enabled!(target: "qnn", level) {
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
    let text = text.trim();
    if hold {
        if let Ok(mut held) = HELD.lock() {
            if held.len() < HELD_MAX {
                held.push((level, text.to_owned()));
            }
            return;
        }
    }
    log::log!(target: "qnn", level, "{text}");
}

/// Marks a backend creation in progress for [`qnn_log_callback`]; on drop, hands back
/// the held messages once no other creation is running.
struct HoldQnnLog;

impl HoldQnnLog {
    fn start() -> Self {
        CREATING.fetch_add(1, Ordering::AcqRel);
        HoldQnnLog
    }

    /// Ends the hold: the messages held so far (all of them when this was the last
    /// creation running; none otherwise, the last one takes them).
    fn finish(self) -> Vec<(log::Level, String)> {
        let last = CREATING.fetch_sub(1, Ordering::AcqRel) == 1;
        core::mem::forget(self);
        match HELD.lock() {
            Ok(mut held) if last => core::mem::take(&mut *held),
            _ => Vec::new(),
        }
    }
}

impl Drop for HoldQnnLog {
    fn drop(&mut self) {
        CREATING.fetch_sub(1, Ordering::AcqRel);
    }
}

fn replay(held: Vec<(log::Level, String)>) {
    for (level, text) in held {
        log::log!(target: "qnn", level, "{text}");
    }
}

/// The user this process runs as, for messages about device permissions.
fn effective_user() -> String {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let name = std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|line| {
                let mut f = line.split(':');
                let name = f.next()?;
                (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_owned())
            })
        });
    match name {
        Some(n) => format!("{n} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// What this machine has of FastRPC's device nodes, in a few words.
fn fastrpc_devices() -> String {
    let mut found: Vec<String> = std::fs::read_dir("/dev")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("fastrpc-"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    if found.is_empty() {
        return "this machine has no /dev/fastrpc-* device".into();
    }
    let usable: Vec<&String> = found
        .iter()
        .filter(|n| {
            let path = std::ffi::CString::new(format!("/dev/{n}")).unwrap_or_default();
            // SAFETY: a valid NUL-terminated path; access only checks permissions.
            unsafe { libc::access(path.as_ptr(), libc::R_OK | libc::W_OK) == 0 }
        })
        .collect();
    if usable.is_empty() {
        format!("it cannot open /dev/{}", found.join(", /dev/"))
    } else {
        format!(
            "it can open /dev/{}",
            usable
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", /dev/")
        )
    }
}

/// The error for a backend that refused to start (off the board, or FastRPC unreachable).
fn unavailable(
    library: &Path,
    operation: &'static str,
    code: u64,
    backend_message: Option<String>,
    held: &[(log::Level, String)],
) -> QnnError {
    let mut library_says: Vec<String> = Vec::new();
    for (level, text) in held {
        log::debug!(target: "qnn", "({level}) {text}");
        let text = text
            .trim_start_matches("<E>")
            .trim_start_matches("<W>")
            .trim();
        if *level == log::Level::Error
            && library_says.len() < 2
            && !text.is_empty()
            && !library_says.iter().any(|t| t == text)
        {
            library_says.push(text.replace(['\n', '\r'], " "));
        }
    }
    QnnError::HtpUnavailable(Box::new(HtpRefusal {
        library: library.to_owned(),
        operation,
        code,
        backend_message,
        library_says,
        user: effective_user(),
        fastrpc: fastrpc_devices(),
    }))
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
    pub log: LogHandle,
    pub backend: BackendHandle,
    pub device: DeviceHandle,
}

// SAFETY: QNN handles are opaque pointers usable from any thread; the backend serializes
// what must be serialized (execution on one graph).
unsafe impl Send for BackendInner {}
// SAFETY: as above; the handles themselves are never mutated after creation.
unsafe impl Sync for BackendInner {}

impl Drop for BackendInner {
    fn drop(&mut self) {
        let core = &self.lib.core;
        // Each handle was created by this library and is freed once, here, after every
        // context made from it (contexts hold an Arc of this struct), in QNN's order:
        // device, backend, log.
        if !self.device.is_null() {
            if let Some(free) = core.device_free {
                // SAFETY: `free` is the provider's deviceFree (a non-NULL slot of the
                // checked table, the library kept loaded by `self.lib`); the device is
                // live, its contexts are gone, and it is freed once.
                let rc = qnn!(unsafe free(self.device));
                if rc != ffi::QNN_SUCCESS {
                    log::warn!("QNN deviceFree returned {}", ffi::error_code(rc));
                }
            }
        }
        // SAFETY: a slot of the checked table; the backend is live, its contexts and
        // device are gone, and it is freed once.
        let rc = qnn!(unsafe core.backend_free(self.backend));
        if rc != ffi::QNN_SUCCESS {
            log::warn!("QNN backendFree returned {}", ffi::error_code(rc));
        }
        if !self.log.is_null() {
            // SAFETY: a slot of the checked table; the logger outlived the backend that
            // used it and is freed once.
            let _ = qnn!(unsafe core.log_free(self.log));
        }
    }
}

/// An initialized QNN backend (log + backend + device), ready to create contexts.
///
/// A clone made by [`Backend::on_device`] creates its contexts on a device of its own
/// (one NSP); every clone shares the one backend.
#[derive(Clone)]
pub struct Backend {
    pub(crate) inner: Arc<BackendInner>,
    /// The device contexts are created on when not the backend's default one.
    pub(crate) selected: Option<Arc<SelectedDevice>>,
    /// Where [`crate::create_contexts`] puts each binary, when a plan says.
    pub(crate) placement: Option<Arc<ContextPlacement>>,
}

/// Which session (a spill-fill group) and which device each context binary goes to, by
/// the binary's path: what [`crate::create_contexts`] follows for a backend made by
/// [`Backend::with_placement`]. A binary it does not name goes to the backend's own
/// device, in a group of its own kind (session `usize::MAX`).
#[derive(Clone, Default)]
pub struct ContextPlacement {
    pub(crate) entries: Vec<(std::path::PathBuf, usize, Backend)>,
}

impl ContextPlacement {
    /// Puts the binary at `path` in session `session`, created through `on` (a backend
    /// from [`Backend::on_device`], or the plain one).
    pub fn place(&mut self, path: impl Into<std::path::PathBuf>, session: usize, on: &Backend) {
        let on = Backend {
            placement: None,
            ..on.clone()
        };
        self.entries.push((path.into(), session, on));
    }

    /// The session and backend of the binary at `path`.
    pub(crate) fn of(&self, path: &Path) -> Option<(usize, &Backend)> {
        self.entries
            .iter()
            .find(|(p, _, _)| p == path)
            .map(|(_, s, b)| (*s, b))
    }
}

/// A device created on one reported HTP device (an NSP), freed after the last context
/// created on it and before the backend (it holds the backend's `Arc`).
pub(crate) struct SelectedDevice {
    pub backend: Arc<BackendInner>,
    pub handle: DeviceHandle,
    pub id: u32,
}

// SAFETY: as for BackendInner: an opaque handle usable from any thread, never mutated.
unsafe impl Send for SelectedDevice {}
// SAFETY: as above.
unsafe impl Sync for SelectedDevice {}

impl Drop for SelectedDevice {
    fn drop(&mut self) {
        if let Some(free) = self.backend.lib.core.device_free {
            // SAFETY: `free` is the provider's deviceFree; the handle was created by
            // deviceCreate of the same library (kept loaded by `self.backend`), its
            // contexts are gone (each holds this struct's Arc), and it is freed once.
            let rc = qnn!(unsafe free(self.handle));
            if rc != ffi::QNN_SUCCESS {
                log::warn!(
                    "QNN deviceFree (device {}) returned {}",
                    self.id,
                    ffi::error_code(rc)
                );
            }
        }
    }
}

impl Backend {
    /// Creates the log (routed to `log`), the backend and, where the platform has one,
    /// the device.
    pub fn new(lib: Arc<QnnLibrary>) -> Result<Self, QnnError> {
        let core = &lib.core;
        let hold = HoldQnnLog::start();
        let mut log_handle = LogHandle::NULL;
        // SAFETY: `log_create` is a slot of the provider table that `QnnLibrary::load`
        // checked against the core API version, and `lib` (held for this call) keeps the
        // library mapped. The callback has QnnLog_Callback_t's signature and, being
        // `extern "C"`, aborts rather than unwinds into QNN on a panic; `log_handle` is a
        // local QNN writes once.
        let log_rc = qnn!(unsafe core.log_create(
            Some(qnn_log_callback),
            qnn_log_level(),
            &mut log_handle
        ));
        if log_rc != ffi::QNN_SUCCESS {
            log_handle = LogHandle::NULL;
        }
        let mut backend = BackendHandle::NULL;
        // SAFETY: a slot of the checked provider table, as above. `log_handle` is the
        // logger just created or NULL (both accepted), a NULL config list means QNN's
        // defaults, and `backend` is a local QNN writes once.
        let rc = qnn!(unsafe core.backend_create(log_handle, core::ptr::null(), &mut backend));
        if let Err(e) = lib.check(rc, "backendCreate", || {
            lib.backend_path().display().to_string()
        }) {
            if !log_handle.is_null() {
                // SAFETY: `log_handle` was created by `log_create` above and nothing else
                // holds it (the backend that would have was not created); freed once here.
                let _ = qnn!(unsafe core.log_free(log_handle));
            }
            let held = hold.finish();
            return Err(match e {
                // The HTP backend starts only where it finds the SoC's cDSP through
                // FastRPC: anything else is "not here", reported in one line.
                QnnError::Call {
                    code,
                    backend_message,
                    ..
                } => unavailable(
                    lib.backend_path(),
                    "backendCreate",
                    code,
                    backend_message,
                    &held,
                ),
                other => {
                    replay(held);
                    other
                }
            });
        }
        replay(hold.finish());
        if log_rc != ffi::QNN_SUCCESS {
            // Not fatal: without a logger QNN prints to stdout.
            log::warn!(
                "QNN logCreate failed with {}; QNN messages go to stdout",
                ffi::error_code(log_rc)
            );
        }
        let mut device = DeviceHandle::NULL;
        if let Some(create) = core.device_create {
            // SAFETY: `create` is the provider's deviceCreate, a non-NULL slot of the checked
            // table; `log_handle` is our logger or NULL, a NULL config list means the
            // defaults, and `device` is a local QNN writes once.
            let rc = qnn!(unsafe create(log_handle, core::ptr::null(), &mut device));
            if rc != ffi::QNN_SUCCESS {
                // The HTP emulator and some platforms run without a device handle.
                log::debug!(
                    "QNN deviceCreate returned {}; continuing without a device",
                    ffi::error_code(rc)
                );
                device = DeviceHandle::NULL;
            }
        }
        Ok(Self {
            inner: Arc::new(BackendInner {
                lib,
                log: log_handle,
                backend,
                device,
            }),
            selected: None,
            placement: None,
        })
    }

    /// This backend, creating the contexts [`crate::create_contexts`] is given where
    /// `placement` says.
    pub fn with_placement(&self, placement: ContextPlacement) -> Backend {
        Backend {
            placement: Some(Arc::new(placement)),
            ..self.clone()
        }
    }

    /// The platform's HTP devices (NSPs) and cores as the backend reports them;
    /// `Ok(None)` when the provider has no `deviceGetPlatformInfo`.
    pub fn platform_info(&self) -> Result<Option<PlatformInfo>, QnnError> {
        PlatformInfo::read(&self.inner.lib, self.inner.log)
    }

    /// This backend with a device of its own on `device` (a config of option
    /// PLATFORM_INFO naming it and its cores): contexts created through the returned
    /// backend live on that NSP. The device is freed after its last context.
    pub fn on_device(&self, device: &DeviceReport) -> Result<Backend, QnnError> {
        let lib = &self.inner.lib;
        let Some(create) = lib.core.device_create else {
            return Err(QnnError::Call {
                operation: "deviceCreate",
                subject: format!(
                    "HTP device {} (the provider has no deviceCreate)",
                    device.id
                ),
                code: 1000,
                backend_message: None,
            });
        };
        let selection = DeviceSelection::new(device);
        let list: [*const c_void; 2] = [selection.config() as *const c_void, core::ptr::null()];
        let mut handle = DeviceHandle::NULL;
        // SAFETY: `create` is the provider's deviceCreate (a non-NULL slot of the checked
        // table, the library kept loaded by `self.inner`); the log is ours or NULL; the
        // config list is NULL-terminated and `selection` (which everything it points to
        // lives in) outlives the call; `handle` is a local QNN writes once.
        let rc = qnn!(unsafe create(self.inner.log, list.as_ptr(), &mut handle));
        lib.check(rc, "deviceCreate", || format!("HTP device {}", device.id))?;
        Ok(Backend {
            inner: self.inner.clone(),
            selected: Some(Arc::new(SelectedDevice {
                backend: self.inner.clone(),
                handle,
                id: device.id,
            })),
            placement: None,
        })
    }

    /// The HTP device id contexts made through this backend go to (`None`: the default).
    pub fn device_id(&self) -> Option<u32> {
        self.selected.as_ref().map(|d| d.id)
    }

    /// Where [`crate::create_contexts`] through this backend puts the binary at `path`:
    /// its session and HTP device id (`None`: the default device). `None` when this
    /// backend has no placement or the placement does not name the binary.
    pub fn placed(&self, path: &Path) -> Option<(usize, Option<u32>)> {
        let (session, on) = self.placement.as_ref()?.of(path)?;
        Some((session, on.device_id()))
    }

    /// The device handle contexts are created on, and what keeps it alive.
    pub(crate) fn context_device(&self) -> (DeviceHandle, Option<Arc<SelectedDevice>>) {
        match &self.selected {
            Some(d) => (d.handle, Some(d.clone())),
            None => (self.inner.device, None),
        }
    }

    /// The library the backend was created from.
    pub fn library(&self) -> &Arc<QnnLibrary> {
        &self.inner.lib
    }
}
