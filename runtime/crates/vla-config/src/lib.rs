//! The `vlad` configuration: one JSON file, parsed without heap allocation into
//! [`Config`] and checked field by field before anything starts.
//!
//! The file is read by `serde-json-core` into bounded `heapless` values, then a
//! validation pass checks ranges, formats and cross-field rules. Unknown fields, missing
//! fields, wrong types and out-of-range values are all errors, and every
//! [`ConfigError`] displays as one line naming where the configuration came from, the
//! field as a dotted path (`control.publish_hz`), what was expected and what was found:
//!
//! ```text
//! config file /etc/vla/vlad.json: `control.publish_hz`: expected a number in (0, 1000], found 0
//! ```
//!
//! The field reference, with ranges and defaults, is `config/README.md`.
//!
//! ```
//! let json = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../config/vlad.json"))?;
//! let mut config = vla_config::Config::from_json(&json)?;
//! // At start-up, after loading: environment overrides (the daemon passes its lookup).
//! config.apply_overrides(|name| std::env::var_os(name))?;
//! assert_eq!(config.control.publish_hz, 20.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// `ConfigError` is heap-free by design, so it is large (under 1 KiB); it is built at most
// once, at start-up, where that size costs nothing.
#![allow(clippy::result_large_err)]
#![forbid(unsafe_code)]

mod error;
mod probe;
mod raw;
mod read;
mod validate;

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::Path;
use std::time::Duration;

pub use error::{ConfigError, Expected, FieldPath, FileName, Found, Origin, Segment, Snippet};

/// Largest accepted configuration, in bytes.
pub const MAX_CONFIG_BYTES: usize = 16 * 1024;
/// Longest accepted path value, in bytes.
pub const MAX_PATH_BYTES: usize = 256;
/// Longest accepted library file name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Most entries in `realtime.inference_cpus`.
pub const MAX_INFERENCE_CPUS: usize = 16;
/// Most entries in `ota.trusted_keys`.
pub const MAX_TRUSTED_KEYS: usize = 8;
/// Highest CPU index accepted (the kernel's `CPU_SETSIZE` is 1024).
pub const MAX_CPU_INDEX: u16 = 1023;
/// Most sessions an explicit `npu.groups` may list.
pub const MAX_NPU_GROUPS: usize = 16;
/// Most contexts one `npu.groups` entry may list.
pub const MAX_NPU_GROUP_CONTEXTS: usize = 16;
/// Highest NSP id a group may name (the platform's own count is checked at start).
pub const MAX_NSP_ID: u8 = 7;
/// Environment variable that replaces `qnn.lib_dir` (see [`Config::apply_overrides`]).
pub const QNN_LIB_DIR_ENV: &str = "VLA_QNN_LIB_DIR";

/// Scratch space for strings with escape sequences; longer than any accepted string so an
/// over-long escaped string is still reported by its field's own length bound.
pub(crate) const UNESCAPE_BYTES: usize = 512;

/// An accepted path value.
pub type PathText = heapless::String<MAX_PATH_BYTES>;
/// An accepted library file name.
pub type NameText = heapless::String<MAX_NAME_BYTES>;

/// A log verbosity, from quietest to noisiest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors and warnings.
    Warn,
    /// Also informational messages (QNN's INFO).
    Info,
    /// Also debug messages (QNN's VERBOSE).
    Debug,
    /// Everything (QNN's DEBUG).
    Trace,
}

impl LogLevel {
    /// The accepted spellings, in order.
    pub const NAMES: [&'static str; 5] = ["error", "warn", "info", "debug", "trace"];

    /// The level spelled as in the config (`"error"` .. `"trace"`); `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "error" => Some(LogLevel::Error),
            "warn" => Some(LogLevel::Warn),
            "info" => Some(LogLevel::Info),
            "debug" => Some(LogLevel::Debug),
            "trace" => Some(LogLevel::Trace),
            _ => None,
        }
    }

    /// The level's spelling in the config, one of [`Self::NAMES`].
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The QNN `QnnLog_Level_t` value (1 error .. 5 debug): our `debug` is QNN's
    /// VERBOSE (4) and our `trace` is QNN's DEBUG (5).
    pub fn qnn_level(self) -> u32 {
        self as u32 + 1
    }
}

/// Where the QNN (QAIRT) libraries are and how loud they may be.
#[derive(Clone, Debug, PartialEq)]
pub struct QnnConfig {
    /// Directory holding the backend and system libraries (absolute).
    pub lib_dir: PathText,
    /// File name of the backend library inside `lib_dir`, e.g. `libQnnHtp.so`.
    pub backend_lib: NameText,
    /// File name of the system library inside `lib_dir`, e.g. `libQnnSystem.so`.
    pub system_lib: NameText,
    /// QNN's own log level (`qnn.log_level`), mapped by [`LogLevel::qnn_level`].
    pub log_level: LogLevel,
    /// HTP performance vote while inferences run (`qnn.performance`, default burst).
    pub performance: QnnPerformance,
    /// Idle time after the last inference before the vote drops to relaxed.
    pub performance_idle_release_ms: u32,
}

impl QnnConfig {
    /// ONNX Runtime's QNN EP waits 300 ms after a run before relaxing its vote.
    pub const DEFAULT_IDLE_RELEASE_MS: u32 = 300;

    /// [`Self::performance_idle_release_ms`] as a duration.
    pub fn performance_idle_release(&self) -> core::time::Duration {
        core::time::Duration::from_millis(self.performance_idle_release_ms.into())
    }
}

/// The HTP performance mode to vote for (`qnn.performance`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QnnPerformance {
    /// DCVS off, every voltage corner MAX, 40 us sleep latency (the default).
    Burst,
    /// DCVS off, corners TURBO, 100 us sleep latency.
    HighPerformance,
    /// DCVS on, NOM_PLUS, 1000 us sleep latency.
    Balanced,
    /// DCVS on, SVS, 1000 us sleep latency.
    PowerSaver,
    /// No vote: the platform's DCVS decides.
    Off,
}

impl QnnPerformance {
    /// The mode used when `qnn.performance` is absent or `null`: burst.
    pub const DEFAULT: QnnPerformance = QnnPerformance::Burst;
    /// The accepted spellings, in order.
    pub const NAMES: [&'static str; 5] = [
        "burst",
        "high_performance",
        "balanced",
        "power_saver",
        "off",
    ];
    const ALL: [QnnPerformance; 5] = [
        QnnPerformance::Burst,
        QnnPerformance::HighPerformance,
        QnnPerformance::Balanced,
        QnnPerformance::PowerSaver,
        QnnPerformance::Off,
    ];

    /// The mode spelled as in the config; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| Self::ALL[i])
    }

    /// The mode's spelling in the config, one of [`Self::NAMES`].
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// The policy bundle to load.
#[derive(Clone, Debug, PartialEq)]
pub struct BundleConfig {
    /// Bundle directory. May be relative (development); then it is resolved against the
    /// working directory of the process.
    pub path: PathText,
}

/// The shared-memory rings to the robot side.
#[derive(Clone, Debug, PartialEq)]
pub struct RingsConfig {
    /// Observation ring file (robot -> vlad), absolute; device: `/dev/shm/vla-obs`.
    pub observation_path: PathText,
    /// Action ring file (vlad -> robot), absolute and not `observation_path`; device:
    /// `/dev/shm/vla-act`.
    pub action_path: PathText,
    /// Slots in the action ring: a power of two.
    pub action_slots: u32,
    /// Instruction segment file (robot -> vlad: instructions as text), absolute and
    /// neither ring's path; device: `/dev/shm/vla-txt`. Absent: the robot names only the
    /// bundle's fixed instructions.
    pub instruction_path: Option<PathText>,
}

/// How a landing chunk takes over from the one in play (`control.merge`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Merge {
    /// The landing chunk replaces the one in play, minus the steps its latency consumed.
    #[default]
    Skip,
    /// Steps present in both chunks are blended, the new chunk's weight ramping up over the
    /// shared steps.
    Crossfade,
    /// The next inference is conditioned on the old chunk's remaining steps inside the flow
    /// loop, then lands like `Skip`; needs `d < H`.
    Prefix,
    /// Like `Prefix`, but by inpainting the overlap rows after every flow update; needs `d < H`.
    Inpaint,
}

impl Merge {
    /// The accepted spellings, in declaration order.
    pub const NAMES: [&'static str; 4] = ["skip", "crossfade", "prefix", "inpaint"];

    /// The mode spelled as in the config; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "skip" => Some(Merge::Skip),
            "crossfade" => Some(Merge::Crossfade),
            "prefix" => Some(Merge::Prefix),
            "inpaint" => Some(Merge::Inpaint),
            _ => None,
        }
    }

    /// The mode's spelling in the config, one of [`Self::NAMES`].
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// When the next inference starts (`control.trigger`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TriggerMode {
    /// As soon as the previous inference finished (the default).
    #[default]
    BackToBack,
    /// When the chunk in play has `d + control.trigger_margin_steps` steps left.
    Remaining,
    /// Upstream's evaluation protocol: execute `control.execute_steps` rows of a chunk
    /// from its first, hold while the next inference runs on an observation taken after
    /// them, start the next chunk at its first row.
    Synchronous,
}

/// Timing of the action publisher and the staleness limits that make it fail closed.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlConfig {
    /// Rate at which actions are published on absolute deadlines, in Hz, (0, 1000].
    pub publish_hz: f64,
    /// An observation older than this (ms, 1..=60000) is not used for inference.
    pub max_observation_age_ms: u32,
    /// A chunk older than this (ms since its observation, 1..=60000) is not published from.
    pub max_chunk_age_ms: u32,
    /// After a chunk's last step its last action stays `ok` this long (ms, 0..=60000), then
    /// the loop publishes `hold` (fail closed); 0: `hold` at once.
    pub hold_after_chunk_end_ms: u32,
    /// Each action's `valid_until` is its publish time plus this (ms); validation keeps it at
    /// least one publish period.
    pub action_valid_ms: u32,
    /// A reader considers the writer dead after this long without a heartbeat (ms); validation
    /// keeps it at least two publish periods.
    pub writer_heartbeat_timeout_ms: u32,
    /// How a landing chunk takes over from the one in play.
    pub merge: Merge,
    /// When the next inference starts.
    pub trigger: TriggerMode,
    /// Extra steps of slack for [`TriggerMode::Remaining`] (0..=1000, default 2).
    pub trigger_margin_steps: u32,
    /// Rows executed per chunk with `trigger: synchronous`; `None`: the whole chunk.
    pub execute_steps: Option<u32>,
    /// Chunk steps advance at this rate (the slower time base); `None`: at `publish_hz`.
    pub chunk_rate_hz: Option<f64>,
    /// Added to every inference (tests and benchmarks only: reproduces a board's
    /// latency on the emulator).
    pub extra_latency_ms: u32,
    /// HTP emulator only: `max_observation_age_ms` and `max_chunk_age_ms` may exceed the
    /// device ceiling of a minute (up to an hour), because a loaded emulator infers for
    /// minutes. Refused by a build for any CPU but x86_64, the only one the emulator
    /// exists for (the board's aarch64 build refuses it).
    pub emulator_age_limits: bool,
}

impl ControlConfig {
    /// Time between two published actions (saturating, for hand-built values outside the
    /// validated range; a validated rate gives at most 60 s).
    pub fn publish_period(&self) -> Duration {
        Duration::try_from_secs_f64(1.0 / self.publish_hz).unwrap_or(Duration::MAX)
    }

    /// [`Self::max_observation_age_ms`] as a duration.
    pub fn max_observation_age(&self) -> Duration {
        Duration::from_millis(self.max_observation_age_ms.into())
    }

    /// [`Self::max_chunk_age_ms`] as a duration.
    pub fn max_chunk_age(&self) -> Duration {
        Duration::from_millis(self.max_chunk_age_ms.into())
    }

    /// [`Self::hold_after_chunk_end_ms`] as a duration.
    pub fn hold_after_chunk_end(&self) -> Duration {
        Duration::from_millis(self.hold_after_chunk_end_ms.into())
    }

    /// [`Self::action_valid_ms`] as a duration.
    pub fn action_valid(&self) -> Duration {
        Duration::from_millis(self.action_valid_ms.into())
    }

    /// [`Self::writer_heartbeat_timeout_ms`] as a duration.
    pub fn writer_heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.writer_heartbeat_timeout_ms.into())
    }

    /// Time between chunk steps: the publish period, or `1 / chunk_rate_hz`.
    pub fn chunk_period(&self) -> Duration {
        match self.chunk_rate_hz {
            Some(hz) => Duration::try_from_secs_f64(1.0 / hz).unwrap_or(Duration::MAX),
            None => self.publish_period(),
        }
    }

    /// [`Self::extra_latency_ms`] as a duration (zero on a device).
    pub fn extra_latency(&self) -> Duration {
        Duration::from_millis(self.extra_latency_ms.into())
    }
}

/// Scheduling of the publisher and inference threads.
#[derive(Clone, Debug, PartialEq)]
pub struct RealtimeConfig {
    /// `SCHED_FIFO` priority 1..=99, or 0 for `SCHED_OTHER`.
    pub publisher_priority: u8,
    /// `SCHED_FIFO` priority 1..=99, or 0 for `SCHED_OTHER`; below the publisher's.
    pub inference_priority: u8,
    /// CPU the publisher is pinned to; `None`: not pinned.
    pub publisher_cpu: Option<u16>,
    /// CPUs the inference thread may run on; empty: not pinned.
    pub inference_cpus: heapless::Vec<u16, MAX_INFERENCE_CPUS>,
    /// Lock all current and future pages in memory (`mlockall`).
    pub mlockall: bool,
}

/// Integration with systemd (`Type=notify`).
#[derive(Clone, Debug, PartialEq)]
pub struct SystemdConfig {
    /// Send `READY=1`, `STATUS=` and `STOPPING=1` to `$NOTIFY_SOCKET`.
    pub notify: bool,
    /// Send `WATCHDOG=1` when `$WATCHDOG_USEC` asks for it (requires `notify`).
    pub watchdog: bool,
    /// The watchdog is withheld (systemd restarts vlad) once the inference thread has
    /// not come back for this long: a QNN call that blocks (`systemd.inference_deadline_ms`,
    /// default 30000; longer than any inference, a session re-creation included).
    pub inference_deadline_ms: u32,
}

/// An Ed25519 public key trusted to sign bundles (the 32 raw bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrustedKey(pub [u8; 32]);

/// Over-the-air bundle updates.
#[derive(Clone, Debug, PartialEq)]
pub struct OtaConfig {
    /// Directory holding the bundle versions and the `current` link.
    pub root: PathText,
    /// Keys a bundle signature may verify against; empty: every update is refused.
    pub trusted_keys: heapless::Vec<TrustedKey, MAX_TRUSTED_KEYS>,
    /// Distinct trusted keys that must have signed a bundle (k of n; default 1).
    pub signature_threshold: u32,
    /// The fleet's offline root keys, which sign key lists (rotation, revocation); empty
    /// (the default): key lists are not read.
    pub root_keys: heapless::Vec<TrustedKey, MAX_TRUSTED_KEYS>,
    /// Inferences a new bundle must complete before it is marked good.
    pub trial_inferences: u32,
    /// Starts a new bundle gets before it is rolled back.
    pub max_trial_starts: u32,
}

/// The daemon's own logging.
#[derive(Clone, Debug, PartialEq)]
pub struct LogConfig {
    /// Verbosity of vlad's own log.
    pub level: LogLevel,
}

/// The whole, validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The QNN libraries and their performance vote.
    pub qnn: QnnConfig,
    /// The policy bundle to load.
    pub bundle: BundleConfig,
    /// The two shared-memory rings to the robot.
    pub rings: RingsConfig,
    /// Publish rate, staleness limits, merge and trigger.
    pub control: ControlConfig,
    /// Thread priorities, CPU pinning and memory locking.
    pub realtime: RealtimeConfig,
    /// systemd notify and watchdog.
    pub systemd: SystemdConfig,
    /// Over-the-air bundle updates.
    pub ota: OtaConfig,
    /// vlad's own logging.
    pub log: LogConfig,
    /// `None`: no flight recorder (the default).
    pub recorder: Option<RecorderConfig>,
    /// `None`: no metrics textfile (the default).
    pub metrics: Option<MetricsConfig>,
    /// The NPU: where the bundle's contexts go and how their inputs and outputs are
    /// handed over (`npu`; absent: the defaults).
    pub npu: NpuConfig,
}

/// `npu.shared_buffers`: rpcmem memory registered with QNN (read and written in place by
/// the HTP) or client buffers (copied by QNN before and after every execute).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedBuffers {
    /// Shared buffers where libcdsprpc.so and registration work, else client buffers.
    Auto,
    /// Shared buffers, or refuse to start.
    On,
    /// Client buffers.
    Off,
}

impl SharedBuffers {
    /// The value when `npu.shared_buffers` is absent or `null`: auto.
    pub const DEFAULT: SharedBuffers = SharedBuffers::Auto;
    /// The accepted spellings, in declaration order.
    pub const NAMES: [&'static str; 3] = ["auto", "on", "off"];
    const ALL: [SharedBuffers; 3] = [SharedBuffers::Auto, SharedBuffers::On, SharedBuffers::Off];

    /// The value spelled as in the config; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| Self::ALL[i])
    }

    /// The spelling in the config, one of [`Self::NAMES`].
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// What the flight recorder keeps of the camera frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecorderFrames {
    /// No frames kept (observations and chunks still are).
    Off,
    /// Every `recorder.downscale`-th pixel and row.
    Downscaled,
    /// Full resolution: what `vlad replay` needs.
    Full,
}

impl RecorderFrames {
    /// The accepted spellings, in declaration order.
    pub const NAMES: [&'static str; 3] = ["off", "downscaled", "full"];
}

/// The flight recorder (`recorder`): the last seconds of the loop, written as MCAP on a
/// trigger.
#[derive(Clone, Debug, PartialEq)]
pub struct RecorderConfig {
    /// Where recordings land (absolute; created at start).
    pub directory: PathText,
    /// Seconds of ticks a recording covers, (0, 600], default 10.
    pub history_s: f64,
    /// Inferences kept, each with its observation and frames (1..=10000, default 64): bounds
    /// the memory at `max_chunks` times the frame bytes.
    pub max_chunks: u32,
    /// What is kept of the camera frames (default full).
    pub frames: RecorderFrames,
    /// Subsampling factor for [`RecorderFrames::Downscaled`], 2..=16, default 4.
    pub downscale: u32,
    /// The directory's recordings are kept under this many MB (10^6 bytes); the oldest are
    /// removed, the newest always kept. Default 256.
    pub max_mb: u32,
    /// Record when the loop starts publishing fault (default true).
    pub on_fault: bool,
    /// 0: a long hold does not trigger a recording.
    pub hold_limit_ms: u32,
}

/// The Prometheus textfile (`metrics`).
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsConfig {
    /// The `.prom` file node_exporter's textfile collector reads (absolute), replaced
    /// atomically.
    pub textfile: PathText,
    /// How often the textfile is rewritten, in ms (100..=60000, default 5000).
    pub interval_ms: u32,
}

/// The NPU (`npu`): where the bundle's contexts go (which share a cDSP session and on
/// which NSP; the names in `groups` are checked against the bundle at start) and how
/// their inputs and outputs are handed over.
#[derive(Clone, Debug, PartialEq)]
pub struct NpuConfig {
    /// `auto` or explicit groups.
    pub placement: NpuPlacement,
    /// With [`NpuPlacement::Groups`]: the sessions (empty with `auto`).
    pub groups: heapless::Vec<NpuGroup, MAX_NPU_GROUPS>,
    /// A session's usable address space, in MiB (1..=4096, default 3840: 3.75 GiB).
    pub session_mb: u32,
    /// What the plan keeps free in each session for the runtime's own heap, in MiB
    /// (below `session_mb`, default 256).
    pub reserve_mb: u32,
    /// Whether inputs and outputs live in HTP shared buffers (`npu.shared_buffers`).
    pub shared_buffers: SharedBuffers,
}

impl NpuConfig {
    /// The default `session_mb`: 3.75 GiB of a session's 4 GiB address space.
    pub const DEFAULT_SESSION_MB: u32 = 3840;
    /// The default `reserve_mb`.
    pub const DEFAULT_RESERVE_MB: u32 = 256;

    /// The budget each session's contexts must fit in, in MiB.
    pub fn budget_mb(&self) -> u32 {
        self.session_mb - self.reserve_mb
    }
}

impl Default for NpuConfig {
    fn default() -> Self {
        NpuConfig {
            placement: NpuPlacement::Auto,
            groups: heapless::Vec::new(),
            session_mb: Self::DEFAULT_SESSION_MB,
            reserve_mb: Self::DEFAULT_RESERVE_MB,
            shared_buffers: SharedBuffers::DEFAULT,
        }
    }
}

/// `npu.placement`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpuPlacement {
    /// Pack the contexts in pipeline order under the budget (`"auto"`, the default).
    Auto,
    /// One session per entry of `npu.groups` (`"groups"`).
    Groups,
}

/// One entry of `npu.groups`: a session's contexts and its NSP.
#[derive(Clone, Debug, PartialEq)]
pub struct NpuGroup {
    /// The NSP (HTP device id, 0..=[`MAX_NSP_ID`]).
    pub nsp: u8,
    /// The bundle components of the session.
    pub contexts: heapless::Vec<NameText, MAX_NPU_GROUP_CONTEXTS>,
}

/// Which environment overrides [`Config::apply_overrides`] applied, for the start-up log.
pub type AppliedOverrides = heapless::Vec<&'static str, 1>;

impl Config {
    /// Parses and validates a configuration from JSON bytes. Never panics, whatever the
    /// bytes (a leading UTF-8 byte-order mark is ignored).
    pub fn from_json(json: &[u8]) -> Result<Config, ConfigError> {
        if json.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge {
                origin: Origin::Bytes,
                size: json.len() as u64,
                max: MAX_CONFIG_BYTES,
            });
        }
        let json = json.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(json);
        let raw = read::parse(json)?;
        validate::validate(&raw)
    }

    /// Reads, parses and validates the file at `path`; errors name the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let origin = Origin::File(error::bounded(format_args!("{}", path.display())));
        let read_error = |source| ConfigError::Read {
            origin: origin.clone(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let mut buffer = [0u8; MAX_CONFIG_BYTES + 1];
        let mut len = 0;
        // One byte more than allowed tells "too large" apart from "exactly at the limit";
        // reading instead of trusting metadata also covers pipes and /proc files.
        let mut limited = file.take(buffer.len() as u64);
        loop {
            match limited.read(&mut buffer[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(read_error(e)),
            }
        }
        if len > MAX_CONFIG_BYTES {
            let size = std::fs::metadata(path)
                .map(|m| m.len())
                .unwrap_or(len as u64);
            return Err(ConfigError::TooLarge {
                origin,
                size: size.max(len as u64),
                max: MAX_CONFIG_BYTES,
            });
        }
        Config::from_json(&buffer[..len]).map_err(|e| e.with_origin(origin))
    }

    /// Applies environment overrides, looking each variable up with `lookup` (the daemon
    /// passes the process environment, once, at start-up; tests pass their own table).
    /// This crate never reads the environment itself.
    ///
    /// - [`QNN_LIB_DIR_ENV`] (`VLA_QNN_LIB_DIR`) replaces `qnn.lib_dir`; the value must
    ///   pass the same check as the field (an absolute path, valid UTF-8). Set but empty
    ///   is an error, not "unset": an empty override is always a mistake.
    ///
    /// On error the configuration is left unchanged. Returns the variables applied.
    pub fn apply_overrides(
        &mut self,
        mut lookup: impl FnMut(&str) -> Option<OsString>,
    ) -> Result<AppliedOverrides, ConfigError> {
        let mut applied = AppliedOverrides::new();
        if let Some(value) = lookup(QNN_LIB_DIR_ENV) {
            self.qnn.lib_dir = qnn_lib_dir_override(&value)?;
            let _ = applied.push(QNN_LIB_DIR_ENV);
        }
        Ok(applied)
    }
}

/// Checks a value of [`QNN_LIB_DIR_ENV`] as it would replace `qnn.lib_dir`: an absolute
/// UTF-8 path. Set but empty is an error, not "unset": an empty override is always a
/// mistake. [`Config::apply_overrides`] uses it, and so do the commands that run without
/// a configuration, so the variable has one meaning everywhere.
pub fn qnn_lib_dir_override(value: &OsStr) -> Result<PathText, ConfigError> {
    let origin = Origin::Env(QNN_LIB_DIR_ENV);
    let path = FieldPath::of(&["qnn", "lib_dir"]);
    let Some(text) = value.to_str() else {
        return Err(ConfigError::invalid(
            path,
            format_args!("a UTF-8 absolute path"),
            Found::Other(error::bounded(format_args!(
                "non-UTF-8 bytes {:?}",
                value.to_string_lossy()
            ))),
        )
        .with_origin(origin));
    };
    validate::absolute_path(path, text).map_err(|e| e.with_origin(origin))
}
