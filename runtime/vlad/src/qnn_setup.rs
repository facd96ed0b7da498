//! Finding and loading the QNN libraries for a subcommand, and starting its HTP votes.
//!
//! The directory is resolved here, once per command, and handed to `vla-qnn`, which reads
//! no environment: `--lib-dir`, else `VLA_QNN_LIB_DIR`, else the configuration's
//! `qnn.lib_dir` (`vlad run`), else `/usr/lib` (where the device image installs QAIRT).
//! The variable is read by [`environment`] only, and checked by `vla-config` the same way
//! for every command: an absolute UTF-8 path; set but empty is an error, not "unset".

use crate::cli::Common;
use crate::Failure;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use vla_qnn::{Backend, LoadOptions, PerfGovernor, PerformanceMode, QnnLibrary};

pub const DEVICE_LIB_DIR: &str = "/usr/lib";

/// The process environment as the configuration's override lookup
/// (`Config::apply_overrides`): the one place vlad reads `VLA_QNN_LIB_DIR`.
pub fn environment(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// The QNN library directory: `--lib-dir` (which `vlad run` fills from its configuration,
/// the environment's override applied), else `VLA_QNN_LIB_DIR`, else [`DEVICE_LIB_DIR`].
pub fn lib_dir(common: &Common) -> Result<PathBuf, Failure> {
    if let Some(dir) = &common.lib_dir {
        return Ok(dir.clone());
    }
    match environment(vla_config::QNN_LIB_DIR_ENV) {
        Some(value) => Ok(PathBuf::from(
            vla_config::qnn_lib_dir_override(&value)?.as_str(),
        )),
        None => Ok(PathBuf::from(DEVICE_LIB_DIR)),
    }
}

pub fn load_library(common: &Common) -> Result<Arc<QnnLibrary>, Failure> {
    let opts = LoadOptions::htp(lib_dir(common)?);
    Ok(Arc::new(QnnLibrary::load(&opts)?))
}

pub fn load_backend(common: &Common) -> Result<(Arc<QnnLibrary>, Backend), Failure> {
    let lib = load_library(common)?;
    let backend = Backend::new(lib.clone())?;
    Ok((lib, backend))
}

/// The binding's mode for the config's `qnn.performance`.
pub fn configured_mode(p: vla_config::QnnPerformance) -> PerformanceMode {
    use vla_config::QnnPerformance as C;
    match p {
        C::Burst => PerformanceMode::Burst,
        C::HighPerformance => PerformanceMode::HighPerformance,
        C::Balanced => PerformanceMode::Balanced,
        C::PowerSaver => PerformanceMode::PowerSaver,
        C::Off => PerformanceMode::Off,
    }
}

/// Parses a `--performance MODE` value.
pub fn performance_mode(value: &str) -> Result<PerformanceMode, crate::Failure> {
    PerformanceMode::parse(value).ok_or_else(|| {
        let names: Vec<&str> = PerformanceMode::ALL.iter().map(|m| m.as_str()).collect();
        crate::Failure::Usage(format!(
            "--performance: `{value}` is not one of {}",
            names.join(", ")
        ))
    })
}

/// Starts the HTP performance votes for `mode` on each HTP device in `devices` (the
/// NSPs contexts may be placed on), logging the outcome in one line. A backend that
/// refuses is not fatal: vlad runs without votes (`None`).
pub fn start_votes(
    backend: &Backend,
    devices: &[u32],
    mode: PerformanceMode,
    idle: Duration,
) -> Option<PerfGovernor> {
    match PerfGovernor::start_on(backend, devices, mode, idle) {
        Ok(Some(g)) => {
            let ids: Vec<String> = g
                .power_config_ids()
                .iter()
                .map(|(device, id)| format!("NSP {device}: power config id {id}"))
                .collect();
            log::info!(
                "HTP performance vote: {mode} accepted ({}), released to relaxed after {} ms idle",
                ids.join(", "),
                idle.as_millis()
            );
            Some(g)
        }
        Ok(None) => {
            log::info!("HTP performance vote: off (the platform's DCVS decides)");
            None
        }
        Err(e) => {
            log::warn!("HTP performance vote {mode} refused, running without votes: {e}");
            None
        }
    }
}
