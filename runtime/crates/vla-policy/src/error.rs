//! Errors of bundle loading and inference, each naming the bundle part involved.

use crate::manifest::Invalid;
use std::path::PathBuf;

/// Why a bundle could not be loaded or an inference not made. Display is one line naming
/// the bundle, file, component or field involved.
#[derive(Debug)]
#[non_exhaustive]
pub enum PolicyError {
    /// A file the bundle needs is absent or unreadable.
    MissingFile {
        /// The bundle directory.
        bundle: PathBuf,
        /// What the file is for (e.g. `"manifest"`, ``"context `vision`"``, `"prompt tables"`).
        what: String,
        /// The file's path.
        path: PathBuf,
        /// Why it cannot be used (the operating system's error, or `"not a regular file"`).
        reason: String,
    },
    /// `bundle.json` does not parse.
    ManifestSyntax {
        /// The `bundle.json` file.
        path: PathBuf,
        /// The JSON parser's complaint.
        reason: String,
    },
    /// `bundle.json` parses but breaks a rule.
    ManifestInvalid {
        /// The `bundle.json` file.
        path: PathBuf,
        /// The field and the rule it breaks.
        invalid: Invalid,
    },
    /// The bundle was built for another SoC or HTP architecture.
    Target {
        /// The bundle directory.
        bundle: PathBuf,
        /// `"soc_model"` or `"htp_arch"`.
        field: &'static str,
        /// This device's value.
        expected: u32,
        /// The bundle's value.
        found: u32,
    },
    /// A context does not have the tensor the manifest promises.
    Contract {
        /// The manifest component whose context is checked.
        component: String,
        /// The tensor name.
        tensor: String,
        /// The shape or element type the manifest implies.
        expected: String,
        /// What the context has.
        found: String,
    },
    /// The prompt tables are malformed or inconsistent with the manifest; also a context's
    /// golden that fails to feed its graph in [`crate::Bundle::parity`].
    Prompt {
        /// The npz file at fault.
        file: String,
        /// What is wrong, as one line.
        reason: String,
    },
    /// An instruction given as text that vlad will not run (refused before anything
    /// computed from it is published).
    Instruction {
        /// The text, as given (shortened in the message).
        text: String,
        /// Why, as one line.
        reason: String,
    },
    /// A Fast-WAM instruction pack that cannot be attached to the running bundle.
    Pack {
        /// The pack directory.
        pack: String,
        /// Why, as one line.
        reason: String,
    },
    /// Reading an npz of the bundle (golden, tables, world model, observation) failed.
    Npz(vla_npz::NpzError),
    /// A context binary's bytes are not the ones its bundle's checker expects (e.g. a
    /// signed manifest's digest): nothing of them reached QNN.
    Unverified {
        /// The manifest component whose binary was refused.
        component: String,
        /// The binary file.
        path: PathBuf,
        /// The checker's error.
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A file of the bundle other than a context binary (golden, tables, tokenizer,
    /// embedding table) is not the one its bundle's checker expects: its bytes, read once,
    /// were not used.
    UnverifiedFile {
        /// What the file is for (e.g. ``"golden of `vision`"``, `"prompt tables"`).
        what: String,
        /// The file.
        path: PathBuf,
        /// The checker's error.
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// Loading or executing a context failed.
    Qnn {
        /// The manifest component whose context failed.
        component: String,
        /// The QNN binding's error.
        error: vla_qnn::QnnError,
    },
    /// An observation that does not fit the bundle.
    Observation {
        /// What does not fit (`"state"`, `"instruction_id"`, `"frames"`, ...).
        field: &'static str,
        /// What the bundle needs.
        expected: String,
        /// What the observation holds.
        found: String,
    },
    /// A context produced NaN or Inf.
    NonFinite {
        /// The context that produced them.
        component: String,
        /// The output tensor holding them.
        tensor: String,
        /// How many values are NaN or infinite.
        count: usize,
    },
    /// A helper thread the pipeline needs could not be started.
    Thread {
        /// The thread's name.
        name: &'static str,
        /// The operating system's error, as one line.
        reason: String,
    },
    /// A host step's half on a helper thread did not complete (`step` names it).
    Helper {
        /// The host step (e.g. the preprocess or the prompt rows).
        step: &'static str,
        /// What went wrong on the helper thread.
        error: vla_fork::HelperFailed,
    },
}

/// Text taken from a bundle file (a field name, a path, a parser message quoting them),
/// with control characters escaped so that it cannot break the one-line message.
struct FromFile<'a>(&'a str);

impl core::fmt::Display for FromFile<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Write::write_str(&mut vla_oneline::OneLine(f), self.0)
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
            PolicyError::Instruction { text, reason } => {
                let short: String = text.chars().take(60).collect();
                let more = if short.len() < text.len() { "..." } else { "" };
                write!(f, "instruction {:?}: {reason}", format!("{short}{more}"))
            }
            PolicyError::Pack { pack, reason } => write!(f, "instruction pack {pack}: {reason}"),
            PolicyError::Npz(e) => e.fmt(f),
            PolicyError::Qnn { component, error } => write!(f, "component `{component}`: {error}"),
            PolicyError::Unverified { component, path, source } => write!(
                f,
                "component `{component}`: context binary {} refused before QNN saw it: {source}",
                path.display()
            ),
            PolicyError::UnverifiedFile { what, path, source } => write!(
                f,
                "{what} {} refused, its bytes unused: {source}",
                FromFile(&path.to_string_lossy())
            ),
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

impl PolicyError {
    /// The QNN binding's `error` for `component`: bytes refused before QNN saw them are
    /// [`PolicyError::Unverified`] (the checker's verdict), anything else
    /// [`PolicyError::Qnn`].
    pub fn of_qnn(component: String, error: vla_qnn::QnnError) -> Self {
        match error {
            vla_qnn::QnnError::Refused { path, source } => PolicyError::Unverified {
                component,
                path,
                source,
            },
            error => PolicyError::Qnn { component, error },
        }
    }

    /// The QNN binding's error under this one, if loading or executing a context failed
    /// (what a caller classifies NPU faults by).
    pub fn qnn_error(&self) -> Option<&vla_qnn::QnnError> {
        match self {
            PolicyError::Qnn { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl std::error::Error for PolicyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // The npz error is this error's whole message: its causes are this error's.
            PolicyError::Npz(e) => e.source(),
            // Named in the message (`qnn_error` hands it out typed): only the causes the
            // QNN error leaves out of its own message come next.
            PolicyError::Qnn { error, .. } => error.source(),
            _ => None,
        }
    }
}
