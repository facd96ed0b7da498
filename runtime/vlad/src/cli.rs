//! Command-line plumbing shared by the subcommands: options common to all, logging set-up.

use crate::Failure;
use lexopt::Arg;
use std::ffi::OsString;
use std::path::PathBuf;

/// Options every QNN-using subcommand accepts.
#[derive(Default)]
pub struct Common {
    pub lib_dir: Option<PathBuf>,
    pub log_level: Option<String>,
}

impl Common {
    /// Long options every subcommand accepts.
    pub const OPTIONS: [&'static str; 2] = ["lib-dir", "log-level"];

    /// Reads the value of common option `name` (one of [`Common::OPTIONS`]).
    pub fn take(&mut self, name: &str, parser: &mut lexopt::Parser) -> Result<(), Failure> {
        match name {
            "lib-dir" => self.lib_dir = Some(value(parser)?.into()),
            "log-level" => self.log_level = Some(string(parser)?),
            other => return Err(Failure::Usage(format!("unknown option --{other}"))),
        }
        Ok(())
    }

    /// Initializes logging to stderr: `--log-level`, else `RUST_LOG`, else warn.
    pub fn init_logging(&self) {
        let mut b = env_logger::Builder::new();
        match &self.log_level {
            Some(l) => {
                b.parse_filters(l);
            }
            None => match std::env::var("RUST_LOG") {
                Ok(v) if !v.is_empty() => {
                    b.parse_filters(&v);
                }
                _ => {
                    // The HTP backend reports routine start-up steps as warnings.
                    b.parse_filters("warn,qnn=error");
                }
            },
        }
        b.format_timestamp_millis()
            .target(env_logger::Target::Stderr);
        let _ = b.try_init();
    }
}

pub fn parser(args: Vec<OsString>) -> lexopt::Parser {
    lexopt::Parser::from_args(args)
}

pub fn value(parser: &mut lexopt::Parser) -> Result<OsString, Failure> {
    parser.value().map_err(|e| Failure::Usage(e.to_string()))
}

pub fn string(parser: &mut lexopt::Parser) -> Result<String, Failure> {
    value(parser)?
        .into_string()
        .map_err(|v| Failure::Usage(format!("not valid UTF-8: {}", v.to_string_lossy())))
}

pub fn number<T: std::str::FromStr>(parser: &mut lexopt::Parser, what: &str) -> Result<T, Failure> {
    let s = string(parser)?;
    s.parse()
        .map_err(|_| Failure::Usage(format!("{what}: `{s}` is not a valid number")))
}

pub fn unexpected(arg: Arg<'_>) -> Failure {
    Failure::Usage(arg.unexpected().to_string())
}

/// A command-line parse error.
pub fn usage(e: lexopt::Error) -> Failure {
    Failure::Usage(e.to_string())
}
