//! HTP performance votes: a power-config id per voter, the modes Qualcomm's own tools use,
//! and an idle release that drops the vote when no inference has run for a while.
//!
//! A power-config id belongs to one HTP device (NSP) and core (`createPowerConfigId`'s
//! arguments), so a governor holds one voter per device it is started on: contexts placed
//! on NSP 1 run at the voted clock only if NSP 1 has a voter of its own.
//!
//! The id is created from the backend's performance infrastructure and destroyed in
//! `Drop`; [`PerformanceVote`] holds the backend alive (an `Arc`), so the id always goes
//! before the device, the backend and the library. [`PerfGovernor`] is what a runtime
//! uses: `inference()` on the inference thread votes (only when the vote is not already
//! up) with preallocated config lists, never blocking or allocating; a releaser thread
//! relaxes the vote after the idle time. The two never call `setPowerConfig` at once: the
//! releaser calls it under a mutex the inference thread only `try_lock`s; when that fails
//! (the releaser is mid-call), the releaser sees the inference and restores the vote.

// FFI: calls into the QNN libraries, each block with its `SAFETY:` invariant.
#![allow(unsafe_code)]

use crate::backend::{Backend, BackendInner};
use crate::error::QnnError;
use crate::ffi::{self, htp_perf as hp, qnn, read_at, PowerConfig};
use core::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How hard the HTP should run while inferences happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerformanceMode {
    /// DCVS off, performance power mode, every corner at MAX, 40 us sleep latency, RPC
    /// polling 9999 us and control latency 100 us (qnn-net-run's / ORT's "burst").
    Burst,
    /// DCVS off, every corner TURBO, 100 us sleep latency, RPC polling 9999 us.
    HighPerformance,
    /// DCVS on, power-saver mode, NOM_PLUS corners, 1000 us sleep latency.
    Balanced,
    /// DCVS on, power-saver mode, SVS corners, 1000 us sleep latency.
    PowerSaver,
    /// No vote at all: the platform's default DCVS decides.
    Off,
}

impl PerformanceMode {
    /// Every mode, fastest first.
    pub const ALL: [PerformanceMode; 5] = [
        PerformanceMode::Burst,
        PerformanceMode::HighPerformance,
        PerformanceMode::Balanced,
        PerformanceMode::PowerSaver,
        PerformanceMode::Off,
    ];

    /// The mode's name in configuration (`high_performance`).
    pub fn as_str(self) -> &'static str {
        match self {
            PerformanceMode::Burst => "burst",
            PerformanceMode::HighPerformance => "high_performance",
            PerformanceMode::Balanced => "balanced",
            PerformanceMode::PowerSaver => "power_saver",
            PerformanceMode::Off => "off",
        }
    }

    /// The mode named `s` (as [`PerformanceMode::as_str`] writes it).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

impl core::fmt::Display for PerformanceMode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The DCVS_V3 payload for one vote.
struct Dcvs {
    dcvs_enable: bool,
    power_mode: u32,
    sleep_latency_us: u32,
    corners: [u32; 3],
}

fn dcvs(id: u32, d: &Dcvs) -> PowerConfig {
    let [min, target, max] = d.corners;
    PowerConfig {
        option: hp::OPTION_DCVS_V3,
        payload: [
            id,
            1,
            d.dcvs_enable as u32,
            d.power_mode,
            1,
            d.sleep_latency_us,
            0,
            0,
            1,
            min,
            target,
            max,
            1,
            min,
            target,
            max,
        ],
    }
}

fn single(option: u32, value: u32) -> PowerConfig {
    let mut payload = [0; 16];
    payload[0] = value;
    PowerConfig { option, payload }
}

/// A NULL-terminated `const PowerConfig**` list, built once so a vote allocates nothing.
pub struct PowerConfigList {
    configs: Box<[PowerConfig]>,
    pointers: Box<[*const PowerConfig]>,
}

// SAFETY: the pointers refer into `configs`, owned by the same struct and never mutated.
unsafe impl Send for PowerConfigList {}
// SAFETY: as above; the list is read-only after construction.
unsafe impl Sync for PowerConfigList {}

impl PowerConfigList {
    /// Any list of configs, e.g. an option this crate does not name (for diagnostics).
    pub fn new(configs: Vec<PowerConfig>) -> Self {
        let configs = configs.into_boxed_slice();
        let pointers = configs
            .iter()
            .map(|c| c as *const PowerConfig)
            .chain(core::iter::once(core::ptr::null()))
            .collect();
        Self { configs, pointers }
    }

    /// The vote for `mode` by voter `id` (`None` for [`PerformanceMode::Off`]).
    pub fn for_mode(mode: PerformanceMode, id: u32) -> Option<Self> {
        let (d, polling, latency) = match mode {
            PerformanceMode::Burst => (
                Dcvs {
                    dcvs_enable: false,
                    power_mode: hp::POWER_MODE_PERFORMANCE,
                    sleep_latency_us: 40,
                    corners: [hp::CORNER_MAX; 3],
                },
                Some(9999),
                Some(100),
            ),
            PerformanceMode::HighPerformance => (
                Dcvs {
                    dcvs_enable: false,
                    power_mode: hp::POWER_MODE_PERFORMANCE,
                    sleep_latency_us: 100,
                    corners: [hp::CORNER_TURBO; 3],
                },
                Some(9999),
                None,
            ),
            PerformanceMode::Balanced => (
                Dcvs {
                    dcvs_enable: true,
                    power_mode: hp::POWER_MODE_POWER_SAVER,
                    sleep_latency_us: 1000,
                    corners: [hp::CORNER_NOM_PLUS; 3],
                },
                None,
                None,
            ),
            PerformanceMode::PowerSaver => (
                Dcvs {
                    dcvs_enable: true,
                    power_mode: hp::POWER_MODE_POWER_SAVER,
                    sleep_latency_us: 1000,
                    corners: [hp::CORNER_SVS; 3],
                },
                None,
                None,
            ),
            PerformanceMode::Off => return None,
        };
        let mut configs = vec![dcvs(id, &d)];
        configs.extend(polling.map(|us| single(hp::OPTION_RPC_POLLING_TIME, us)));
        configs.extend(latency.map(|us| single(hp::OPTION_RPC_CONTROL_LATENCY, us)));
        Some(Self::new(configs))
    }

    /// The idle vote (ONNX Runtime's "relaxed"): DCVS on, power saver, 2000 us sleep
    /// latency, corners SVS2 up to SVS, RPC polling off.
    pub fn relaxed(id: u32) -> Self {
        Self::new(vec![
            dcvs(
                id,
                &Dcvs {
                    dcvs_enable: true,
                    power_mode: hp::POWER_MODE_POWER_SAVER,
                    sleep_latency_us: 2000,
                    corners: [hp::CORNER_SVS2, hp::CORNER_SVS, hp::CORNER_SVS],
                },
            ),
            single(hp::OPTION_RPC_POLLING_TIME, 0),
        ])
    }

    /// The configs, in the order they are passed.
    pub fn configs(&self) -> &[PowerConfig] {
        &self.configs
    }
}

/// One voter: a power-config id of the HTP performance infrastructure, destroyed on drop.
pub struct PerformanceVote {
    backend: Arc<BackendInner>,
    destroy: ffi::DestroyPowerConfigIdFn,
    set: ffi::SetPowerConfigFn,
    id: u32,
    device_id: u32,
}

impl PerformanceVote {
    /// Creates a voter on device 0, core 0 (see [`PerformanceVote::create_on`]).
    pub fn create(backend: &Backend) -> Result<Self, QnnError> {
        Self::create_on(backend, 0, 0)
    }

    /// Creates a voter for HTP device `device_id` (an NSP, as `deviceGetPlatformInfo`
    /// reports it), core `core_id`. The id is never 0: QNN treats id 0 as a client that
    /// overrides every other vote.
    pub fn create_on(backend: &Backend, device_id: u32, core_id: u32) -> Result<Self, QnnError> {
        let b = &backend.inner;
        let unavailable = |reason: String| QnnError::NotAvailable {
            what: "HTP performance infrastructure",
            reason,
        };
        let get = b
            .lib
            .core
            .device_get_infrastructure
            .ok_or_else(|| unavailable("the provider has no deviceGetInfrastructure".into()))?;
        let mut infra: *const c_void = core::ptr::null();
        // SAFETY: `get` is the provider's deviceGetInfrastructure, a non-NULL slot of the
        // checked table, and `infra` a local it writes; the struct it points to is owned
        // by the library, which `b.lib` (kept by the governor's backend) keeps loaded.
        let rc = qnn!(unsafe get(&mut infra));
        b.lib.check(rc, "deviceGetInfrastructure", || {
            b.lib.backend_path().display().to_string()
        })?;
        if infra.is_null() {
            return Err(unavailable("deviceGetInfrastructure returned NULL".into()));
        }
        let base = infra as *const u8;
        // The HTP infrastructure struct holds infraType and, for PERF, the three function
        // pointers at the offsets in `htp_perf` (checked against QAIRT 2.51).
        // SAFETY: infraType (u32) @0 of the library's struct.
        let infra_type: u32 = unsafe { read_at(base, 0) };
        // SAFETY: createPowerConfigId (a function pointer or NULL) of the struct.
        let create: Option<ffi::CreatePowerConfigIdFn> =
            unsafe { read_at(base, hp::CREATE_POWER_CONFIG_ID) };
        // SAFETY: destroyPowerConfigId (a function pointer or NULL) of the struct.
        let destroy: Option<ffi::DestroyPowerConfigIdFn> =
            unsafe { read_at(base, hp::DESTROY_POWER_CONFIG_ID) };
        // SAFETY: setPowerConfig (a function pointer or NULL) of the struct.
        let set: Option<ffi::SetPowerConfigFn> = unsafe { read_at(base, hp::SET_POWER_CONFIG) };
        if infra_type != hp::INFRA_TYPE_PERF {
            return Err(unavailable(format!("infrastructure type {infra_type}")));
        }
        let (Some(create), Some(destroy), Some(set)) = (create, destroy, set) else {
            return Err(unavailable("NULL power config functions".into()));
        };
        let mut id = 0u32;
        // SAFETY: `create` was read from the PERF infrastructure struct and checked
        // non-NULL above; it takes the ids by value (an id the backend lacks is its
        // error, checked below), and `id` is a local it writes.
        let rc = qnn!(unsafe create(device_id, core_id, &mut id));
        b.lib.check(rc, "createPowerConfigId", || {
            format!("device {device_id}, core {core_id}")
        })?;
        if id == 0 {
            return Err(unavailable("createPowerConfigId returned id 0".into()));
        }
        Ok(Self {
            backend: b.clone(),
            destroy,
            set,
            id,
            device_id,
        })
    }

    /// The HTP device (NSP) the voter votes for.
    pub fn device_id(&self) -> u32 {
        self.device_id
    }

    /// The power-config id (never 0).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Applies `list`; on refusal QNN's error handle as returned (its low 16 bits are
    /// the code, [`ffi::error_code`]; the whole handle is what `errorGetMessage` takes).
    /// Allocates nothing.
    pub fn apply_raw(&self, list: &PowerConfigList) -> Result<(), u64> {
        // SAFETY: the id is live (destroyed only in Drop); `pointers` is a NULL-terminated
        // array of configs owned by `list`, alive for the call.
        let rc = qnn!(unsafe self.set(self.id, list.pointers.as_ptr()));
        if rc == ffi::QNN_SUCCESS {
            Ok(())
        } else {
            Err(rc)
        }
    }

    /// As [`PerformanceVote::apply_raw`], with a typed error.
    pub fn apply(&self, list: &PowerConfigList) -> Result<(), QnnError> {
        match self.apply_raw(list) {
            Ok(()) => Ok(()),
            Err(handle) => self.backend.lib.check(handle, "setPowerConfig", || {
                format!("power config id {}", self.id)
            }),
        }
    }
}

impl Drop for PerformanceVote {
    fn drop(&mut self) {
        // SAFETY: the id was created by this infrastructure and is destroyed once, while
        // `self.backend` (and so the device, backend and library) is still alive.
        let rc = qnn!(unsafe self.destroy(self.id));
        if rc != ffi::QNN_SUCCESS {
            log::warn!(
                "QNN destroyPowerConfigId({}) returned {}",
                self.id,
                ffi::error_code(rc)
            );
        }
    }
}

/// Counts of what a governor did, for logs and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VoteStats {
    /// Votes for the mode that the backend accepted (the first one at start included).
    pub votes: u64,
    /// Idle releases to the relaxed vote that the backend accepted.
    pub releases: u64,
    /// Calls the backend refused.
    pub refused: u64,
    /// The error code of the last refusal (0 before any).
    pub last_refused_code: u64,
}

/// One device's voter with its two preallocated lists (each names the voter's id).
struct DeviceVote {
    vote: PerformanceVote,
    high: PowerConfigList,
    relaxed: PowerConfigList,
}

/// Which of a [`DeviceVote`]'s lists to apply.
#[derive(Clone, Copy)]
enum Level {
    High,
    Relaxed,
}

struct Shared {
    /// One voter per device, in the order the governor was started with.
    votes_by_device: Box<[DeviceVote]>,
    idle: Duration,
    base: Instant,
    /// Whether the mode's vote is in force; the lock serializes setPowerConfig calls.
    voted: Mutex<bool>,
    busy: AtomicBool,
    last_end_ns: AtomicU64,
    stop: AtomicBool,
    votes: AtomicU64,
    releases: AtomicU64,
    refused: AtomicU64,
    last_refused_code: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// Applies `level` on every device and counts the outcome once; true when every
    /// device accepted (a device that refused is voted again on the next try).
    fn apply(&self, level: Level, counter: &AtomicU64) -> bool {
        let mut all = true;
        for d in self.votes_by_device.iter() {
            let list = match level {
                Level::High => &d.high,
                Level::Relaxed => &d.relaxed,
            };
            if let Err(handle) = d.vote.apply_raw(list) {
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.last_refused_code
                    .store(ffi::error_code(handle), Ordering::Relaxed);
                all = false;
            }
        }
        if all {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        all
    }
}

/// Votes for a mode around inferences and releases the vote after an idle time.
pub struct PerfGovernor {
    shared: Arc<Shared>,
    mode: PerformanceMode,
    releaser: Option<std::thread::JoinHandle<()>>,
}

/// Marks one inference; the releaser may relax the vote only after it is dropped.
pub struct InferenceVote<'a> {
    governor: &'a PerfGovernor,
}

impl Drop for InferenceVote<'_> {
    fn drop(&mut self) {
        let s = &self.governor.shared;
        s.last_end_ns.store(s.now_ns(), Ordering::SeqCst);
        s.busy.store(false, Ordering::SeqCst);
        if let Some(r) = &self.governor.releaser {
            r.thread().unpark();
        }
    }
}

impl PerfGovernor {
    /// [`PerfGovernor::start_on`] device 0 alone.
    pub fn start(
        backend: &Backend,
        mode: PerformanceMode,
        idle: Duration,
    ) -> Result<Option<Self>, QnnError> {
        Self::start_on(backend, &[0], mode, idle)
    }

    /// Creates a voter on core 0 of each HTP device in `device_ids` (the NSPs contexts
    /// may be placed on; duplicates count once) and votes for `mode` on each, checking
    /// the backend's answers; starts the releaser thread, which relaxes every device's
    /// vote together. `Ok(None)` for [`PerformanceMode::Off`]; an empty list means
    /// device 0.
    pub fn start_on(
        backend: &Backend,
        device_ids: &[u32],
        mode: PerformanceMode,
        idle: Duration,
    ) -> Result<Option<Self>, QnnError> {
        if mode == PerformanceMode::Off {
            return Ok(None);
        }
        let mut ids: Vec<u32> = device_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            ids.push(0);
        }
        let mut votes_by_device = Vec::with_capacity(ids.len());
        for device_id in ids {
            let vote = PerformanceVote::create_on(backend, device_id, 0)?;
            let high = PowerConfigList::for_mode(mode, vote.id()).expect("not Off");
            let relaxed = PowerConfigList::relaxed(vote.id());
            vote.apply(&high)?;
            votes_by_device.push(DeviceVote {
                vote,
                high,
                relaxed,
            });
        }
        let base = Instant::now();
        let shared = Arc::new(Shared {
            votes_by_device: votes_by_device.into_boxed_slice(),
            idle,
            base,
            voted: Mutex::new(true),
            busy: AtomicBool::new(false),
            last_end_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            votes: AtomicU64::new(1),
            releases: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            last_refused_code: AtomicU64::new(0),
        });
        let s = shared.clone();
        let releaser = std::thread::Builder::new()
            .name("vla-perf-release".into())
            .spawn(move || release_when_idle(&s))
            .map_err(|e| QnnError::NotAvailable {
                what: "HTP performance vote release thread",
                reason: e.to_string(),
            })?;
        Ok(Some(Self {
            shared,
            mode,
            releaser: Some(releaser),
        }))
    }

    /// The mode voted for around inferences.
    pub fn mode(&self) -> PerformanceMode {
        self.mode
    }
    /// How long after the last inference the vote is relaxed.
    pub fn idle_release(&self) -> Duration {
        self.shared.idle
    }
    /// The first device's power-config id.
    pub fn power_config_id(&self) -> u32 {
        self.shared.votes_by_device[0].vote.id()
    }

    /// Each voted device with its power-config id: `(device, id)`.
    pub fn power_config_ids(&self) -> Vec<(u32, u32)> {
        self.shared
            .votes_by_device
            .iter()
            .map(|d| (d.vote.device_id(), d.vote.id()))
            .collect()
    }

    /// Call on the inference thread right before an inference's first graph execution;
    /// keep the guard until its last. Votes only when the vote was released; never blocks,
    /// allocates or logs (a refusal is counted in [`VoteStats`]).
    pub fn inference(&self) -> InferenceVote<'_> {
        let s = &self.shared;
        s.busy.store(true, Ordering::SeqCst);
        match s.voted.try_lock() {
            Ok(mut voted) => {
                if !*voted {
                    *voted = s.apply(Level::High, &s.votes);
                }
            }
            // Held by the releaser mid-call (it re-checks `busy` before it lets go) or by
            // anyone else (`is_voted`): wake the releaser so that it votes for this
            // inference either way, instead of leaving it to run at the relaxed clock.
            Err(_) => {
                if let Some(r) = &self.releaser {
                    r.thread().unpark();
                }
            }
        }
        InferenceVote { governor: self }
    }

    /// What the governor did so far.
    pub fn stats(&self) -> VoteStats {
        let s = &self.shared;
        VoteStats {
            votes: s.votes.load(Ordering::Relaxed),
            releases: s.releases.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            last_refused_code: s.last_refused_code.load(Ordering::Relaxed),
        }
    }

    /// Whether the mode's vote is in force now (false after an idle release).
    pub fn is_voted(&self) -> bool {
        *self
            .shared
            .voted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for PerfGovernor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(r) = self.releaser.take() {
            r.thread().unpark();
            let _ = r.join();
        }
        // The id goes with the last `Shared`, before the backend it holds.
    }
}

/// The releaser thread: relaxes the vote once no inference has run for `idle`.
fn release_when_idle(s: &Shared) {
    while !s.stop.load(Ordering::SeqCst) {
        let wait = {
            let mut voted = s.voted.lock().unwrap_or_else(|p| p.into_inner());
            let mut wait = None;
            if *voted && !s.busy.load(Ordering::SeqCst) {
                let idle_for = Duration::from_nanos(
                    s.now_ns()
                        .saturating_sub(s.last_end_ns.load(Ordering::SeqCst)),
                );
                if idle_for >= s.idle {
                    if s.apply(Level::Relaxed, &s.releases) {
                        *voted = false;
                        log::debug!(
                            "HTP performance vote released (relaxed) after {} ms idle",
                            idle_for.as_millis()
                        );
                    }
                } else {
                    wait = Some(s.idle - idle_for);
                }
            }
            // An inference that began while this thread held the lock could not vote.
            if s.busy.load(Ordering::SeqCst) && !*voted {
                *voted = s.apply(Level::High, &s.votes);
            }
            wait
        };
        match wait {
            Some(d) => std::thread::park_timeout(d),
            None => std::thread::park(),
        }
    }
}
