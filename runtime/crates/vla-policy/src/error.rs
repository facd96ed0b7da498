//! Errors of bundle loading and inference, each naming the bundle part involved.

use crate::manifest::Invalid;
use std::path::PathBuf;

#[derive(Debug)]
#[non_exhaustive]
pub enum PolicyError {
    /// A file the bundle needs is absent or unreadable.
    MissingFile {
        bundle: PathBuf,
        what: String,
        path: PathBuf,
        reason: String,
    },
    /// `bundle.json` does not parse.
    ManifestSyntax {
        path: PathBuf,
        reason: String,
    },
    /// `bundle.json` parses but breaks a rule.
    ManifestInvalid {
        path: PathBuf,
        invalid: Invalid,
    },
    /// The bundle was built for another SoC or HTP architecture.
    Target {
        bundle: PathBuf,
        field: &'static str,
        expected: u32,
        found: u32,
    },
    /// A context does not have the tensor the manifest promises.
    Contract {
        component: String,
        tensor: String,
        expected: String,
        found: String,
    },
    Prompt {
        file: String,
        reason: String,
    },
    Npz(vla_npz::NpzError),
    Qnn {
        component: String,
        error: vla_qnn::QnnError,
    },
    /// An observation that does not fit the bundle.
    Observation {
        field: &'static str,
        expected: String,
        found: String,
    },
    /// A context produced NaN or Inf.
    NonFinite {
        component: String,
        tensor: String,
        count: usize,
    },
    /// A helper thread the pipeline needs could not be started.
    Thread {
        name: &'static str,
        reason: String,
    },
    /// A host step's half on a helper thread did not complete (`step` names it).
    Helper {
        step: &'static str,
        error: vla_fork::HelperFailed,
    },
}

/// Text taken from a bundle file (a field name, a path, a parser message quoting them),
/// with control characters escaped so that it cannot break the one-line message.
struct FromFile<'a>(&'a str);

impl core::fmt::Display for FromFile<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                core::fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

impl core::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PolicyError::MissingFile { bundle, what, path, reason } => write!(
                f,
                "bundle {}: {what} {}: {reason}",
                bundle.display(),
                FromFile(&path.to_string_lossy())
            ),
            PolicyError::ManifestSyntax { path, reason } => {
                write!(f, "{}: {}", path.display(), FromFile(reason))
            }
            PolicyError::ManifestInvalid { path, invalid } => write!(
                f,
                "{}: `{}` {}",
                path.display(),
                FromFile(&invalid.field),
                FromFile(&invalid.reason)
            ),
            PolicyError::Target { bundle, field, expected, found } => write!(
                f,
                "bundle {}: built for {field} {found}, this device needs {expected}",
                bundle.display()
            ),
            PolicyError::Contract { component, tensor, expected, found } => write!(
                f,
                "component `{component}` tensor `{tensor}`: expected {expected}, found {found}"
            ),
            PolicyError::Prompt { file, reason } => write!(f, "prompt tables {file}: {reason}"),
            PolicyError::Npz(e) => e.fmt(f),
            PolicyError::Qnn { component, error } => write!(f, "component `{component}`: {error}"),
            PolicyError::Observation { field, expected, found } => {
                write!(f, "observation {field}: expected {expected}, found {found}")
            }
            PolicyError::NonFinite { component, tensor, count } => write!(
                f,
                "component `{component}` output `{tensor}` holds {count} NaN/Inf values; no action published"
            ),
            PolicyError::Thread { name, reason } => write!(f, "cannot start thread {name}: {reason}"),
            PolicyError::Helper { step, error } => write!(f, "{step}: {error}; no action published"),
        }
    }
}

impl std::error::Error for PolicyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PolicyError::Npz(e) => Some(e),
            PolicyError::Qnn { error, .. } => Some(error),
            PolicyError::Helper { error, .. } => Some(error),
            _ => None,
        }
    }
}
