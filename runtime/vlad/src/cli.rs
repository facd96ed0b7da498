//! Command-line plumbing shared by the subcommands: the options common to all and `--help`
//! parsed in one place ([`Parser`]), the value readers, logging set-up.

use crate::Failure;
use lexopt::Arg;
use std::ffi::OsString;
use std::path::PathBuf;

/// Options every QNN-using subcommand accepts (`--lib-dir`, `--log-level`).
#[derive(Default)]
pub struct Common {
    pub lib_dir: Option<PathBuf>,
    pub log_level: Option<String>,
}

impl Common {
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

/// A subcommand's command line: lexopt's parser with what every command shares handled
/// here (`--lib-dir` and `--log-level` into [`Common`], and `-h`/`--help`, which prints the
/// command's help), so each command matches only its own arguments:
///
/// ```ignore
/// let mut p = cli::Parser::new(args, HELP);
/// while let Some(arg) = p.next()? {
///     match arg {
///         Long("bundle") => bundle = Some(p.path()?),
///         other => return Err(cli::unexpected(other)),
///     }
/// }
/// let Some(common) = p.finish() else { return Ok(()) }; // --help was printed
/// ```
pub struct Parser {
    inner: lexopt::Parser,
    help: &'static str,
    /// None: the command takes no common options (they are then unexpected).
    common: Option<Common>,
    /// The last long option's name, owned so that the parser is free to read its value.
    long: String,
    helped: bool,
}

/// An argument read from lexopt before it is handed on (a long option's name kept in
/// [`Parser::long`]).
enum Read {
    Long,
    Short(char),
    Value(OsString),
}

impl Parser {
    /// A command that takes the common options.
    pub fn new(args: Vec<OsString>, help: &'static str) -> Self {
        Self {
            inner: lexopt::Parser::from_args(args),
            help,
            common: Some(Common::default()),
            long: String::new(),
            helped: false,
        }
    }

    /// A command that takes no QNN library and sets up no logging: only `--help` is shared.
    pub fn without_common(args: Vec<OsString>, help: &'static str) -> Self {
        Self {
            common: None,
            ..Self::new(args, help)
        }
    }

    /// The next argument that is the command's own; None at the end, or once `--help`
    /// was printed (then [`Parser::finish`] says so).
    pub fn next(&mut self) -> Result<Option<Arg<'_>>, Failure> {
        loop {
            let read = match self.inner.next().map_err(usage)? {
                None => return Ok(None),
                Some(Arg::Long(name)) => {
                    self.long.clear();
                    self.long.push_str(name);
                    Read::Long
                }
                Some(Arg::Short(c)) => Read::Short(c),
                Some(Arg::Value(v)) => Read::Value(v),
            };
            match (read, self.common.as_mut()) {
                (Read::Long, Some(common)) if self.long == "lib-dir" => {
                    common.lib_dir = Some(value(&mut self.inner)?.into())
                }
                (Read::Long, Some(common)) if self.long == "log-level" => {
                    common.log_level = Some(string(&mut self.inner)?)
                }
                (Read::Short('h'), _) => return Ok(self.print_help()),
                (Read::Long, _) if self.long == "help" => return Ok(self.print_help()),
                (Read::Long, _) => return Ok(Some(Arg::Long(&self.long))),
                (Read::Short(c), _) => return Ok(Some(Arg::Short(c))),
                (Read::Value(v), _) => return Ok(Some(Arg::Value(v))),
            }
        }
    }

    fn print_help<T>(&mut self) -> Option<T> {
        println!("{}", self.help);
        self.helped = true;
        None
    }

    /// The common options once the arguments are read; None when `--help` was printed
    /// (the command then ends, successfully).
    pub fn finish(self) -> Option<Common> {
        (!self.helped).then(|| self.common.unwrap_or_default())
    }

    /// The current option's value.
    pub fn value(&mut self) -> Result<OsString, Failure> {
        value(&mut self.inner)
    }

    /// The current option's value as a path.
    pub fn path(&mut self) -> Result<PathBuf, Failure> {
        value(&mut self.inner).map(PathBuf::from)
    }

    /// The current option's value as UTF-8 text.
    pub fn string(&mut self) -> Result<String, Failure> {
        string(&mut self.inner)
    }

    /// The current option's value as a number; `what` names the option in the error.
    pub fn number<T: std::str::FromStr>(&mut self, what: &str) -> Result<T, Failure> {
        number(&mut self.inner, what)
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

#[cfg(test)]
mod tests {
    use super::Parser;
    use lexopt::prelude::*;
    use std::ffi::OsString;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn common_options_are_taken_and_the_rest_handed_on_with_their_values() {
        let mut p = Parser::new(
            args(&[
                "--lib-dir",
                "/q",
                "--bundle",
                "b",
                "x",
                "--log-level",
                "info",
            ]),
            "help",
        );
        let (mut bundle, mut values) = (None, Vec::new());
        while let Some(arg) = p.next().unwrap() {
            match arg {
                Long("bundle") => bundle = Some(p.path().unwrap()),
                Value(v) => values.push(v),
                other => panic!("{other:?} handed on"),
            }
        }
        assert_eq!(bundle, Some("b".into()));
        assert_eq!(values, args(&["x"]));
        let common = p.finish().expect("no --help");
        assert_eq!(common.lib_dir, Some("/q".into()));
        assert_eq!(common.log_level.as_deref(), Some("info"));
    }

    #[test]
    fn help_ends_the_arguments_and_finish_says_so() {
        for help in ["-h", "--help"] {
            let mut p = Parser::new(args(&[help, "--bogus"]), "help");
            assert!(p.next().unwrap().is_none());
            assert!(p.finish().is_none());
        }
    }

    #[test]
    fn without_common_the_common_options_are_the_commands_to_refuse() {
        let mut p = Parser::without_common(args(&["--lib-dir", "/q"]), "help");
        assert!(matches!(p.next().unwrap(), Some(Long("lib-dir"))));
    }
}
