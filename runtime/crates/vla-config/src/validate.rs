//! The rules a parsed configuration must follow (ranges, formats, cross-field limits).
//!
//! The checks run in document order, so the first error reported is the first wrong
//! field in the file.

use crate::error::{ConfigError, FieldPath, Found};
use crate::raw::{
    Number, RawConfig, RawControl, RawMetrics, RawNpu, RawOta, RawQnn, RawRealtime, RawRecorder,
    RawRings, Text,
};
use crate::{
    BundleConfig, Config, ControlConfig, LogConfig, LogLevel, Merge, MetricsConfig, NameText,
    NpuConfig, NpuGroup, NpuPlacement, OtaConfig, PathText, QnnConfig, QnnPerformance,
    RealtimeConfig, RecorderConfig, RecorderFrames, RingsConfig, SharedBuffers, SystemdConfig,
    TriggerMode, TrustedKey, MAX_CPU_INDEX, MAX_NSP_ID,
};

/// Longest accepted staleness or timeout: a minute is far beyond any sane control loop,
/// and a bound keeps millisecond arithmetic clear of overflow.
const MAX_MS: u32 = 60_000;

/// The age limits' ceiling with `control.emulator_age_limits`: a TCG VM on a loaded
/// 2-core machine inferred for 160-190 s (docs/testing.md), and the slowest runs' hang
/// guards are half an hour; an hour is past both and still far from overflow in ns.
const EMULATOR_MAX_AGE_MS: u32 = 3_600_000;

/// QAIRT ships the HTP emulator only as an x86_64 library: on any other CPU (the
/// IQ-9075's aarch64) the HTP backend is the NPU, and a robot's limits stay a minute.
const EMULATOR_BUILD: bool = cfg!(target_arch = "x86_64");

type Checked<T> = Result<T, ConfigError>;

fn path(keys: &[&str]) -> FieldPath {
    FieldPath::of(keys)
}

pub(crate) fn validate(raw: &RawConfig) -> Checked<Config> {
    let qnn = qnn(&raw.qnn)?;
    let bundle = BundleConfig {
        path: any_path(path(&["bundle", "path"]), &raw.bundle.path)?,
    };
    let rings = rings(&raw.rings)?;
    let control = control(&raw.control)?;
    let realtime = realtime(&raw.realtime)?;
    if raw.systemd.watchdog.0 && !raw.systemd.notify.0 {
        return Err(ConfigError::invalid(
            path(&["systemd", "watchdog"]),
            format_args!(
                "false while systemd.notify is false (watchdog pings use the notify socket)"
            ),
            Found::Bool(true),
        ));
    }
    let systemd = SystemdConfig {
        notify: raw.systemd.notify.0,
        watchdog: raw.systemd.watchdog.0,
        inference_deadline_ms: whole(
            path(&["systemd", "inference_deadline_ms"]),
            raw.systemd
                .inference_deadline_ms
                .map(|v| v.0)
                .unwrap_or(30_000.0),
            100,
            3_600_000,
        )?,
    };
    let ota = ota(&raw.ota)?;
    let log = LogConfig {
        level: log_level(path(&["log", "level"]), &raw.log.level)?,
    };
    let recorder = raw.recorder.as_deref().map(recorder).transpose()?;
    let metrics = raw.metrics.as_deref().map(metrics).transpose()?;
    let npu = match &raw.npu {
        None => NpuConfig::default(),
        Some(n) => npu(n)?,
    };
    Ok(Config {
        qnn,
        bundle,
        rings,
        control,
        realtime,
        systemd,
        ota,
        log,
        recorder,
        metrics,
        npu,
    })
}

fn npu(raw: &RawNpu) -> Checked<NpuConfig> {
    let at = |k: &str| path(&["npu", k]);
    let mut groups = heapless::Vec::new();
    let placement = match raw.placement.as_ref().map(|w| w.0.as_str()) {
        None | Some("auto") => {
            if let Some(groups) = &raw.groups {
                return Err(ConfigError::invalid(
                    at("groups"),
                    format_args!("absent unless npu.placement is \"groups\""),
                    Found::Other(crate::error::bounded(format_args!(
                        "{} groups",
                        groups.0.len()
                    ))),
                ));
            }
            NpuPlacement::Auto
        }
        Some("groups") => {
            let Some(list) = &raw.groups else {
                return Err(ConfigError::invalid(
                    at("groups"),
                    format_args!(
                        "a list of {{\"nsp\", \"contexts\"}} with npu.placement \"groups\""
                    ),
                    Found::Absent,
                ));
            };
            if list.0.is_empty() {
                return Err(ConfigError::invalid(
                    at("groups"),
                    format_args!("at least one group"),
                    Found::Other(crate::error::bounded(format_args!("an empty list"))),
                ));
            }
            for (i, g) in list.0.iter().enumerate() {
                let gp = at("groups").index(i);
                let nsp = whole(gp.clone().key("nsp"), g.nsp.0, 0, MAX_NSP_ID.into())? as u8;
                let mut contexts = heapless::Vec::new();
                for (j, name) in g.contexts.0.iter().enumerate() {
                    let cp = gp.clone().key("contexts").index(j);
                    if name.0.is_empty() {
                        return Err(ConfigError::invalid(
                            cp,
                            format_args!("a component name"),
                            Found::text(""),
                        ));
                    }
                    // Capacity equals the raw list's bound, so this cannot fail.
                    let _ = contexts.push(copy_text(cp, &name.0)?);
                }
                if contexts.is_empty() {
                    return Err(ConfigError::invalid(
                        gp.key("contexts"),
                        format_args!("at least one component"),
                        Found::Other(crate::error::bounded(format_args!("an empty list"))),
                    ));
                }
                let _ = groups.push(NpuGroup { nsp, contexts });
            }
            NpuPlacement::Groups
        }
        Some(other) => {
            return Err(ConfigError::invalid(
                at("placement"),
                format_args!("one of auto, groups"),
                Found::text(other),
            ))
        }
    };
    let session_mb = match raw.session_mb.map(|v| v.0) {
        None => NpuConfig::DEFAULT_SESSION_MB,
        Some(mb) => whole(at("session_mb"), mb, 1, 4096)?,
    };
    let reserve_mb = match raw.reserve_mb.map(|v| v.0) {
        None => NpuConfig::DEFAULT_RESERVE_MB.min(session_mb - 1),
        Some(mb) => whole(at("reserve_mb"), mb, 0, session_mb - 1)?,
    };
    Ok(NpuConfig {
        placement,
        groups,
        session_mb,
        reserve_mb,
        shared_buffers: match &raw.shared_buffers {
            None => SharedBuffers::DEFAULT,
            Some(word) => SharedBuffers::parse(&word.0).ok_or_else(|| {
                ConfigError::invalid(
                    at("shared_buffers"),
                    format_args!("one of {}", SharedBuffers::NAMES.join(", ")),
                    Found::text(&word.0),
                )
            })?,
        },
    })
}

fn qnn(raw: &RawQnn) -> Checked<QnnConfig> {
    Ok(QnnConfig {
        lib_dir: absolute_path(path(&["qnn", "lib_dir"]), &raw.lib_dir.0)?,
        backend_lib: file_name(path(&["qnn", "backend_lib"]), &raw.backend_lib)?,
        system_lib: file_name(path(&["qnn", "system_lib"]), &raw.system_lib)?,
        log_level: log_level(path(&["qnn", "log_level"]), &raw.log_level)?,
        performance: match &raw.performance {
            None => QnnPerformance::DEFAULT,
            Some(word) => QnnPerformance::parse(&word.0).ok_or_else(|| {
                ConfigError::invalid(
                    path(&["qnn", "performance"]),
                    format_args!("one of {}", QnnPerformance::NAMES.join(", ")),
                    Found::text(&word.0),
                )
            })?,
        },
        performance_idle_release_ms: match raw.performance_idle_release_ms.map(|v| v.0) {
            None => QnnConfig::DEFAULT_IDLE_RELEASE_MS,
            Some(ms) => whole(path(&["qnn", "performance_idle_release_ms"]), ms, 1, 60_000)?,
        },
    })
}

fn rings(raw: &RawRings) -> Checked<RingsConfig> {
    let observation_path = absolute_path(
        path(&["rings", "observation_path"]),
        &raw.observation_path.0,
    )?;
    let action_path = absolute_path(path(&["rings", "action_path"]), &raw.action_path.0)?;
    if action_path == observation_path {
        return Err(ConfigError::invalid(
            path(&["rings", "action_path"]),
            format_args!("a path different from rings.observation_path"),
            Found::text(&action_path),
        ));
    }
    let slots_path = path(&["rings", "action_slots"]);
    let action_slots = whole(slots_path.clone(), raw.action_slots.0, 2, 4096)?;
    if !action_slots.is_power_of_two() {
        return Err(ConfigError::invalid(
            slots_path,
            format_args!("a power of two in 2..=4096"),
            Found::Number(raw.action_slots.0),
        ));
    }
    let instruction_path = match &raw.instruction_path {
        None => None,
        Some(p) => {
            let at = path(&["rings", "instruction_path"]);
            let text = absolute_path(at.clone(), &p.0)?;
            if text == observation_path || text == action_path {
                return Err(ConfigError::invalid(
                    at,
                    format_args!("a path different from both rings' paths"),
                    Found::text(&text),
                ));
            }
            Some(text)
        }
    };
    Ok(RingsConfig {
        observation_path,
        action_path,
        action_slots,
        instruction_path,
    })
}

fn control(raw: &RawControl) -> Checked<ControlConfig> {
    let hz = raw.publish_hz.0;
    if !(hz > 0.0 && hz <= 1000.0) {
        return Err(ConfigError::invalid(
            path(&["control", "publish_hz"]),
            format_args!("a number in (0, 1000]"),
            Found::number(hz),
        ));
    }
    let ms = |key: &str, value: f64, min: u32| whole(path(&["control", key]), value, min, MAX_MS);
    let emulator_age_limits =
        emulator_age_limits(raw.emulator_age_limits.map(|v| v.0), EMULATOR_BUILD)?;
    let age_max = if emulator_age_limits {
        EMULATOR_MAX_AGE_MS
    } else {
        MAX_MS
    };
    let age = |key: &str, value: f64| whole(path(&["control", key]), value, 1, age_max);
    let config = ControlConfig {
        publish_hz: hz,
        max_observation_age_ms: age("max_observation_age_ms", raw.max_observation_age_ms.0)?,
        max_chunk_age_ms: age("max_chunk_age_ms", raw.max_chunk_age_ms.0)?,
        hold_after_chunk_end_ms: ms("hold_after_chunk_end_ms", raw.hold_after_chunk_end_ms.0, 0)?,
        action_valid_ms: ms("action_valid_ms", raw.action_valid_ms.0, 1)?,
        writer_heartbeat_timeout_ms: ms(
            "writer_heartbeat_timeout_ms",
            raw.writer_heartbeat_timeout_ms.0,
            1,
        )?,
        merge: match &raw.merge {
            None => Merge::default(),
            Some(word) => Merge::parse(&word.0).ok_or_else(|| {
                ConfigError::invalid(
                    path(&["control", "merge"]),
                    format_args!("one of skip, crossfade, prefix, inpaint"),
                    Found::text(&word.0),
                )
            })?,
        },
        trigger: match raw.trigger.as_ref().map(|w| w.0.as_str()) {
            None | Some("back_to_back") => TriggerMode::BackToBack,
            Some("remaining") => TriggerMode::Remaining,
            Some("synchronous") => TriggerMode::Synchronous,
            Some(other) => {
                return Err(ConfigError::invalid(
                    path(&["control", "trigger"]),
                    format_args!("one of back_to_back, remaining, synchronous"),
                    Found::text(other),
                ))
            }
        },
        trigger_margin_steps: match raw.trigger_margin_steps.map(|v| v.0) {
            None => 2,
            Some(v) => whole(path(&["control", "trigger_margin_steps"]), v, 0, 1000)?,
        },
        execute_steps: match raw.execute_steps.map(|v| v.0) {
            None => None,
            Some(v) => Some(whole(path(&["control", "execute_steps"]), v, 1, 4096)?),
        },
        chunk_rate_hz: match raw.chunk_rate_hz.map(|v| v.0) {
            None => None,
            // Below 0.1 Hz a chunk step would last minutes and step times overflow.
            Some(r) if (0.1..=hz).contains(&r) => Some(r),
            Some(r) => {
                return Err(ConfigError::invalid(
                    path(&["control", "chunk_rate_hz"]),
                    format_args!("a number in [0.1, control.publish_hz = {hz}], or null (off)"),
                    Found::number(r),
                ))
            }
        },
        extra_latency_ms: match raw.extra_latency_ms.map(|v| v.0) {
            None => 0,
            Some(v) => ms("extra_latency_ms", v, 0)?,
        },
        emulator_age_limits,
    };
    // Synchronous execution starts every chunk at its first row: there is no overlap for
    // another mode to merge, and rows to execute only mean something there.
    if config.trigger == TriggerMode::Synchronous && config.merge != Merge::Skip {
        return Err(ConfigError::invalid(
            path(&["control", "merge"]),
            format_args!(
                "skip with control.trigger synchronous (each chunk starts at its first row)"
            ),
            Found::text(config.merge.as_str()),
        ));
    }
    if config.execute_steps.is_some() && config.trigger != TriggerMode::Synchronous {
        return Err(ConfigError::invalid(
            path(&["control", "execute_steps"]),
            format_args!("null unless control.trigger is synchronous"),
            Found::Number(raw.execute_steps.map(|v| v.0).unwrap_or_default()),
        ));
    }
    // An action must stay valid until the next one is published, or the reader would
    // see a gap of stale data on every tick.
    let period_ms = (1000.0 / hz).ceil() as u32;
    if config.action_valid_ms < period_ms {
        return Err(ConfigError::invalid(
            path(&["control", "action_valid_ms"]),
            format_args!("at least one publish period ({period_ms} ms at {hz} Hz)"),
            Found::Number(raw.action_valid_ms.0),
        ));
    }
    // One late tick must not look like a dead writer.
    let two_periods_ms = (2000.0 / hz).ceil() as u32;
    if config.writer_heartbeat_timeout_ms < two_periods_ms {
        return Err(ConfigError::invalid(
            path(&["control", "writer_heartbeat_timeout_ms"]),
            format_args!("at least two publish periods ({two_periods_ms} ms at {hz} Hz)"),
            Found::Number(raw.writer_heartbeat_timeout_ms.0),
        ));
    }
    Ok(config)
}

fn realtime(raw: &RawRealtime) -> Checked<RealtimeConfig> {
    let publisher_priority = whole(
        path(&["realtime", "publisher_priority"]),
        raw.publisher_priority.0,
        0,
        99,
    )? as u8;
    let inference_priority = whole(
        path(&["realtime", "inference_priority"]),
        raw.inference_priority.0,
        0,
        99,
    )? as u8;
    // A real-time inference thread at or above the publisher would starve it.
    if inference_priority > 0 && inference_priority >= publisher_priority {
        return Err(ConfigError::invalid(
            path(&["realtime", "inference_priority"]),
            format_args!(
                "0 (SCHED_OTHER) or a priority below realtime.publisher_priority ({publisher_priority})"
            ),
            Found::Number(raw.inference_priority.0),
        ));
    }
    let publisher_cpu = match raw.publisher_cpu.map(|v| v.0) {
        Some(cpu) => Some(cpu_index(path(&["realtime", "publisher_cpu"]), cpu)?),
        None => None,
    };
    let mut inference_cpus = heapless::Vec::new();
    if let Some(list) = &raw.inference_cpus {
        for (i, &Number(value)) in list.0.iter().enumerate() {
            let item_path = path(&["realtime", "inference_cpus"]).index(i);
            let cpu = cpu_index(item_path.clone(), value)?;
            if inference_cpus.contains(&cpu) {
                return Err(ConfigError::invalid(
                    item_path,
                    format_args!("each CPU listed once"),
                    Found::Number(value),
                ));
            }
            if publisher_cpu == Some(cpu) {
                return Err(ConfigError::invalid(
                    item_path,
                    format_args!("a CPU other than realtime.publisher_cpu ({cpu}), which the publisher keeps to itself"),
                    Found::Number(value),
                ));
            }
            // Capacity equals the raw list's bound, so this cannot fail.
            let _ = inference_cpus.push(cpu);
        }
    }
    Ok(RealtimeConfig {
        publisher_priority,
        inference_priority,
        publisher_cpu,
        inference_cpus,
        mlockall: raw.mlockall.0,
    })
}

fn ota(raw: &RawOta) -> Checked<OtaConfig> {
    let root = absolute_path(path(&["ota", "root"]), &raw.root.0)?;
    // An empty list is allowed: every update is then refused (fail closed), which is the
    // right default for an image that has not been given its fleet key yet.
    let keys_path = path(&["ota", "trusted_keys"]);
    let mut trusted_keys = heapless::Vec::new();
    for (i, text) in raw.trusted_keys.0.iter().enumerate() {
        let key_path = keys_path.clone().index(i);
        let key = trusted_key(key_path.clone(), &text.0)?;
        if trusted_keys.contains(&key) {
            return Err(ConfigError::invalid(
                key_path,
                format_args!("each key listed once"),
                Found::text(&text.0),
            ));
        }
        // Capacity equals the raw list's bound, so this cannot fail.
        let _ = trusted_keys.push(key);
    }
    // At most the number of keys (at least 1): a threshold no set of keys can meet would
    // refuse every update without saying why.
    let signature_threshold = whole(
        path(&["ota", "signature_threshold"]),
        raw.signature_threshold.map(|v| v.0).unwrap_or(1.0),
        1,
        (trusted_keys.len() as u32).max(1),
    )?;
    let roots_path = path(&["ota", "root_keys"]);
    let mut root_keys = heapless::Vec::new();
    for (i, text) in raw.root_keys.iter().flat_map(|l| l.0.iter()).enumerate() {
        let key_path = roots_path.clone().index(i);
        let key = trusted_key(key_path.clone(), &text.0)?;
        if root_keys.contains(&key) {
            return Err(ConfigError::invalid(
                key_path,
                format_args!("each key listed once"),
                Found::text(&text.0),
            ));
        }
        // Capacity equals the raw list's bound, so this cannot fail.
        let _ = root_keys.push(key);
    }
    Ok(OtaConfig {
        root,
        trusted_keys,
        signature_threshold,
        root_keys,
        trial_inferences: whole(
            path(&["ota", "trial_inferences"]),
            raw.trial_inferences.0,
            1,
            1_000_000,
        )?,
        max_trial_starts: whole(
            path(&["ota", "max_trial_starts"]),
            raw.max_trial_starts.0,
            1,
            100,
        )?,
    })
}

fn recorder(raw: &RawRecorder) -> Checked<RecorderConfig> {
    let at = |k: &str| path(&["recorder", k]);
    let history_s = raw.history_s.map(|v| v.0).unwrap_or(10.0);
    if !(history_s > 0.0 && history_s <= 600.0) {
        return Err(ConfigError::invalid(
            at("history_s"),
            format_args!("a number in (0, 600]"),
            Found::number(history_s),
        ));
    }
    let frames = match &raw.frames {
        None => RecorderFrames::Full,
        Some(word) => match word.0.as_str() {
            "off" => RecorderFrames::Off,
            "downscaled" => RecorderFrames::Downscaled,
            "full" => RecorderFrames::Full,
            _ => {
                return Err(ConfigError::invalid(
                    at("frames"),
                    format_args!("one of {}", RecorderFrames::NAMES.join(", ")),
                    Found::text(&word.0),
                ))
            }
        },
    };
    Ok(RecorderConfig {
        directory: absolute_path(at("directory"), &raw.directory.0)?,
        history_s,
        max_chunks: whole(
            at("max_chunks"),
            raw.max_chunks.map(|v| v.0).unwrap_or(64.0),
            1,
            10_000,
        )?,
        frames,
        downscale: whole(
            at("downscale"),
            raw.downscale.map(|v| v.0).unwrap_or(4.0),
            2,
            16,
        )?,
        max_mb: whole(
            at("max_mb"),
            raw.max_mb.map(|v| v.0).unwrap_or(256.0),
            1,
            1_000_000,
        )?,
        on_fault: raw.on_fault.map(|v| v.0).unwrap_or(true),
        hold_limit_ms: whole(
            at("hold_limit_ms"),
            raw.hold_limit_ms.map(|v| v.0).unwrap_or(2000.0),
            0,
            600_000,
        )?,
    })
}

fn metrics(raw: &RawMetrics) -> Checked<MetricsConfig> {
    let at = |k: &str| path(&["metrics", k]);
    let textfile = absolute_path(at("textfile"), &raw.textfile.0)?;
    if !textfile.ends_with(".prom") {
        return Err(ConfigError::invalid(
            at("textfile"),
            format_args!(
                "a file name ending in .prom (node_exporter's textfile collector reads only those)"
            ),
            Found::text(&textfile),
        ));
    }
    Ok(MetricsConfig {
        textfile,
        interval_ms: whole(
            at("interval_ms"),
            raw.interval_ms.map(|v| v.0).unwrap_or(5000.0),
            100,
            60_000,
        )?,
    })
}

/// `control.emulator_age_limits`, refused where no emulator can run (`emulator_build`
/// false), so that a board's configuration keeps the device ceiling.
fn emulator_age_limits(raw: Option<bool>, emulator_build: bool) -> Checked<bool> {
    match raw {
        Some(true) if !emulator_build => Err(ConfigError::invalid(
            path(&["control", "emulator_age_limits"]),
            format_args!(
                "false or absent in a build for {} (the HTP emulator runs on x86_64 only)",
                std::env::consts::ARCH
            ),
            Found::Bool(true),
        )),
        other => Ok(other.unwrap_or(false)),
    }
}

/// A whole number in `min..=max`.
fn whole(at: FieldPath, value: f64, min: u32, max: u32) -> Checked<u32> {
    if value.fract() == 0.0 && value >= f64::from(min) && value <= f64::from(max) {
        Ok(value as u32)
    } else {
        Err(ConfigError::invalid(
            at,
            format_args!("a whole number in {min}..={max}"),
            Found::number(value),
        ))
    }
}

fn cpu_index(at: FieldPath, value: f64) -> Checked<u16> {
    whole(at, value, 0, MAX_CPU_INDEX.into()).map(|cpu| cpu as u16)
}

fn path_text_problem(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        Some("a non-empty path")
    } else if value.contains('\0') {
        Some("a path without NUL characters")
    } else {
        None
    }
}

/// A non-empty absolute path without NUL characters.
pub(crate) fn absolute_path(at: FieldPath, value: &str) -> Checked<PathText> {
    let problem = path_text_problem(value)
        .or_else(|| (!value.starts_with('/')).then_some("an absolute path (starting with '/')"));
    if let Some(expected) = problem {
        return Err(ConfigError::invalid(
            at,
            format_args!("{expected}"),
            Found::text(value),
        ));
    }
    copy_text(at, value)
}

/// A non-empty path without NUL characters, absolute or relative to the working directory.
fn any_path(at: FieldPath, value: &Text<{ crate::MAX_PATH_BYTES }>) -> Checked<PathText> {
    if let Some(expected) = path_text_problem(&value.0) {
        return Err(ConfigError::invalid(
            at,
            format_args!("{expected}"),
            Found::text(&value.0),
        ));
    }
    Ok(value.0.clone())
}

fn copy_text<const N: usize>(at: FieldPath, value: &str) -> Checked<heapless::String<N>> {
    let mut text = heapless::String::new();
    if text.push_str(value).is_err() {
        return Err(ConfigError::invalid(
            at,
            format_args!("a path of at most {N} bytes"),
            Found::text(value),
        ));
    }
    Ok(text)
}

/// A bare file name (no directory part), looked up inside `qnn.lib_dir`.
fn file_name(at: FieldPath, value: &Text<{ crate::MAX_NAME_BYTES }>) -> Checked<NameText> {
    let name = value.0.as_str();
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(ConfigError::invalid(
            at,
            format_args!("a file name without '/' (it is looked up in qnn.lib_dir)"),
            Found::text(name),
        ));
    }
    Ok(value.0.clone())
}

fn log_level<const N: usize>(at: FieldPath, value: &Text<N>) -> Checked<LogLevel> {
    LogLevel::parse(&value.0).ok_or_else(|| {
        ConfigError::invalid(
            at,
            format_args!("one of error, warn, info, debug, trace"),
            Found::text(&value.0),
        )
    })
}

/// 64 lowercase hex characters: an Ed25519 public key.
fn trusted_key(at: FieldPath, value: &str) -> Checked<TrustedKey> {
    let bytes = value.as_bytes();
    let hex_value = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut key = [0u8; 32];
    let well_formed = bytes.len() == 64
        && key
            .iter_mut()
            .zip(bytes.chunks_exact(2))
            .all(
                |(out, pair)| match (hex_value(pair[0]), hex_value(pair[1])) {
                    (Some(high), Some(low)) => {
                        *out = high << 4 | low;
                        true
                    }
                    _ => false,
                },
            );
    if !well_formed {
        return Err(ConfigError::invalid(
            at,
            format_args!("64 lowercase hex characters (an Ed25519 public key)"),
            Found::text(value),
        ));
    }
    Ok(TrustedKey(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_emulator_setting_is_refused_where_no_emulator_runs() {
        let e = emulator_age_limits(Some(true), false).expect_err("a board build refuses it");
        let m = e.to_string();
        assert!(m.contains("control.emulator_age_limits"), "{m}");
        assert!(m.contains("x86_64"), "{m}");
        assert!(!m.contains('\n'), "{m}");
        for build in [false, true] {
            assert!(!emulator_age_limits(None, build).unwrap());
            assert!(!emulator_age_limits(Some(false), build).unwrap());
        }
        assert!(emulator_age_limits(Some(true), true).unwrap());
    }
}
