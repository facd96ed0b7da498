//! Finding and loading the QNN libraries for a subcommand, and starting its HTP votes.
//!
//! The directory comes from `--lib-dir`, else `VLA_QNN_LIB_DIR`, else `/usr/lib` (where
//! the device image installs QAIRT).

use crate::cli::Common;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use vla_qnn::{Backend, LoadOptions, PerfGovernor, PerformanceMode, QnnError, QnnLibrary};

pub const DEVICE_LIB_DIR: &str = "/usr/lib";

pub fn lib_dir(common: &Common) -> PathBuf {
    match &common.lib_dir {
        Some(d) => d.clone(),
        None => vla_qnn::lib_dir_from_env(std::path::Path::new(DEVICE_LIB_DIR)),
    }
}

pub fn load_library(common: &Common) -> Result<Arc<QnnLibrary>, QnnError> {
    let opts = LoadOptions::htp(lib_dir(common));
    Ok(Arc::new(QnnLibrary::load(&opts)?))
}

pub fn load_backend(common: &Common) -> Result<(Arc<QnnLibrary>, Backend), QnnError> {
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

/// Starts the HTP performance votes for `mode`, logging the outcome in one line. A
/// backend that refuses is not fatal: vlad runs without votes (`None`).
pub fn start_votes(
    backend: &Backend,
    mode: PerformanceMode,
    idle: Duration,
) -> Option<PerfGovernor> {
    match PerfGovernor::start(backend, mode, idle) {
        Ok(Some(g)) => {
            log::info!(
                "HTP performance vote: {mode} accepted (power config id {}), released to relaxed after {} ms idle",
                g.power_config_id(),
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
