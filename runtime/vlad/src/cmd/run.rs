//! `vlad run --config FILE`: the daemon's command line. The daemon itself (start-up,
//! reloads, the loop's supervision) is `crate::daemon`.

use crate::cli::{self, Common};
use crate::Failure;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;

const HELP: &str = "usage: vlad run --config FILE [--bundle DIR] [--duration SECONDS] [--lib-dir DIR] [--log-level LVL]
Runs the control loop until SIGTERM (or for --duration). SIGHUP reloads the bundle.";

/// `vlad run`'s command line.
pub struct RunArgs {
    pub common: Common,
    config: PathBuf,
    pub bundle: Option<PathBuf>,
    pub duration: Option<f64>,
}

impl RunArgs {
    /// The arguments, or None when `--help` was asked for (and printed).
    fn parse(args: Vec<OsString>) -> Result<Option<Self>, Failure> {
        let (mut config, mut bundle, mut duration) = (None, None, None);
        let mut p = cli::Parser::new(args, HELP);
        while let Some(arg) = p.next()? {
            match arg {
                Long("config") => config = Some(p.path()?),
                Long("bundle") => bundle = Some(p.path()?),
                Long("duration") => duration = Some(p.number("--duration")?),
                other => return Err(cli::unexpected(other)),
            }
        }
        let Some(common) = p.finish() else {
            return Ok(None);
        };
        let config = config.ok_or_else(|| Failure::Usage("run needs --config FILE".into()))?;
        Ok(Some(Self {
            common,
            config,
            bundle,
            duration,
        }))
    }

    /// The config with the environment's overrides; logging started at its level unless
    /// `--log-level` set one, and the QNN library directory defaulted from it.
    pub fn load_config(&mut self) -> Result<vla_config::Config, Failure> {
        let mut config = vla_config::Config::load(&self.config)?;
        config.apply_overrides(crate::qnn_setup::environment)?;
        let common = &mut self.common;
        if common.log_level.is_none() {
            common.log_level = Some(format!(
                "{},qnn={}",
                config.log.level.as_str(),
                config.qnn.log_level.as_str()
            ));
        }
        common.init_logging();
        if common.lib_dir.is_none() {
            common.lib_dir = Some(PathBuf::from(config.qnn.lib_dir.as_str()));
        }
        Ok(config)
    }
}

/// Parses the command line and runs the daemon.
pub fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let Some(args) = RunArgs::parse(args)? else {
        return Ok(());
    };
    crate::daemon::run(args)
}
