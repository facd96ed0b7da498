//! `vlad`: the on-device VLA policy runtime daemon and its tools.
//!
//! One binary, several subcommands: the daemon itself and the tools an integrator needs
//! next to it (inspect a context binary, prove parity against golden tensors, measure a
//! context). This module only parses the command line and maps errors to exit codes;
//! each subcommand lives in its own module under `cmd/`.

#![forbid(unsafe_code)]

mod cli;
mod cmd;
mod daemon;
mod dsp_plan;
mod gate;
mod memory;
mod notify;
mod npu_io;
mod observe;
mod packs;
mod qnn_setup;
mod verified;

use std::process::ExitCode;

const USAGE: &str = "\
usage: vlad <command> [options]

commands:
  run --config FILE                 the daemon: control loop over the rings (SIGHUP reloads)
  simulate --config FILE            robot stand-in: writes observations, reads actions, reports
  inspect <ctx.bin>                 SoC model, blob version, QNN build, graphs and tensors
  parity <ctx.bin> <io.npz>         run one context on the npz inputs, compare its outputs
  parity --bundle DIR               every context and the end-to-end golden of a bundle
  replay FILE.mcap [--bundle DIR]   re-run a flight recording's observations, compare chunks (exit 3)
  plan --config FILE --horizon H --latency-ms L
                                    the operating point the config gives at a latency: hold, limits
  plan --bundle DIR | --sizes FILE  the DSP memory plan: contexts per cDSP session and NSP
  dsp-probe --bundle DIR            load contexts one by one, then as planned: where loading fails
  run-once --bundle DIR --obs FILE  one inference: the action chunk and per-component latency
  prompt --tokenizer F ...          render instructions as upstream does (the importer's tables)
  bench-context <ctx.bin>           load time, first executes, steady p50/p99
  bench-bundle --bundle DIR         end-to-end latency, execute sum, host overhead, load, memory
  ota status|install|activate|commit|rollback|gc
                                    over-the-air bundle store (signed, atomic, rollback)
  bundle calibrate|pack|sign|verify|keygen
                                    calibrate parity gates, make and check signed bundles

common options:
  --lib-dir DIR     QNN library directory (default: $VLA_QNN_LIB_DIR, else /usr/lib)
  --log-level LVL   error|warn|info|debug|trace (default: warn; RUST_LOG also works)
  -h, --help        this text
";

/// How a command ended, beyond plain success.
#[derive(Debug)]
pub enum Failure {
    /// Bad command line: exit 2.
    Usage(String),
    /// The command ran and an error stopped it: exit 1.
    Error(String),
    /// The command ran to the end and a gate failed (parity below threshold): exit 3.
    Gate(String),
    /// A wait for an outcome owned by another process ran out: exit 4.
    Pending(String),
}

impl<E: std::error::Error + 'static> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Error(error_line(&e))
    }
}

/// `error` and its causes as the one line vlad prints: the error's own message, then each
/// cause down its `source()` chain. Every error names its cause either in its message
/// (`bundle X: component `vision`: ...`; this workspace's errors do, and hand out from
/// `source()` only what that cause leaves out of its own message) or through `source()`
/// (an error of another crate may), never both: each cause is printed once.
pub fn error_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(command) = args.next() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest: Vec<std::ffi::OsString> = args.collect();
    let result = match command.to_str().unwrap_or("") {
        "inspect" => cmd::inspect::run(rest),
        "parity" => cmd::parity::run(rest),
        "bench-context" => cmd::bench_context::run(rest),
        "bench-bundle" => cmd::bench_bundle::run(rest),
        "run-once" => cmd::run_once::run(rest),
        "run" => cmd::run::run(rest),
        "simulate" => cmd::simulate::run(rest),
        "replay" => cmd::replay::run(rest),
        "plan" => cmd::plan::run(rest),
        "dsp-probe" => cmd::dsp_probe::run(rest),
        "prompt" => cmd::prompt::run(rest),
        "ota" => cmd::ota::run(rest),
        "bundle" => cmd::bundle::run(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        "--version" | "version" => {
            println!("vlad {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        other => Err(Failure::Usage(format!("unknown command `{other}`"))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("vlad: {m}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Error(m)) => {
            eprintln!("vlad: error: {m}");
            ExitCode::from(1)
        }
        Err(Failure::Gate(m)) => {
            eprintln!("vlad: gate failed: {m}");
            ExitCode::from(3)
        }
        Err(Failure::Pending(m)) => {
            eprintln!("vlad: still pending: {m}");
            ExitCode::from(4)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::error_line;

    #[derive(Debug)]
    struct Outer {
        names_its_cause: bool,
        cause: std::io::Error,
    }

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            if self.names_its_cause {
                write!(f, "reading /x: {}", self.cause)
            } else {
                write!(f, "reading /x")
            }
        }
    }

    // Names its cause or hands it out, not both.
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            if self.names_its_cause {
                self.cause.source()
            } else {
                Some(&self.cause)
            }
        }
    }

    #[test]
    fn the_line_names_every_cause_once() {
        let cause = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let silent = Outer {
            names_its_cause: false,
            cause: cause(),
        };
        assert_eq!(error_line(&silent), "reading /x: no such file");
        let naming = Outer {
            names_its_cause: true,
            cause: cause(),
        };
        assert_eq!(error_line(&naming), "reading /x: no such file");
    }
}
