//! Typed errors of the QNN binding, each shown to the user as one readable line.
//!
//! A failed QNN call keeps the operation, the raw code and a meaning from the codes the
//! QAIRT libraries are known to return, plus the backend's own message when it has one.

use std::path::PathBuf;

/// Meaning of a QNN error code (`Qnn_ErrorHandle_t & 0xFFFF`).
pub fn error_meaning(code: u64) -> &'static str {
    match code {
        0 => "success",
        1000 => "not supported",
        1002 => "memory allocation failed",
        1003 => "system error",
        1004 => "invalid argument",
        1005 => "operation not permitted",
        1006 => "platform not supported",
        1007 => "system communication error (DSP/FastRPC)",
        1008 => "incompatible binaries",
        1009 => "loading binaries failed",
        1010 => "resource unavailable",
        5000 => "context: invalid argument (empty or NULL buffer)",
        5001 => "context: does not exist",
        5002 => "context: invalid handle",
        5004 => "context: binary version not supported",
        5005 => "context: binary configuration mismatch",
        5007 => "context: corrupted or incompatible binary",
        5010 => "context: invalid config",
        6000 => "graph: invalid argument",
        6001 => "graph: invalid handle",
        6003 => "graph: no graph of that name in the context",
        6004 => "graph: invalid tensor (id, data pointer or dimensions)",
        8000 => "memory: invalid argument or descriptor",
        8001 => "memory: invalid handle",
        8002 => "memory: already registered",
        8003 => "memory: mapping the file descriptor failed",
        8004 => "memory: shape not supported",
        8005 => "memory: memory type not supported",
        13001 => "device: invalid power config id or config list",
        13002 => "device: unknown power config option",
        13004 => "device: power config option not supported by this HTP",
        13006 => "device: NULL out-pointer for a power config id",
        14001 => "device: invalid config",
        30001 => "system: not a QNN context binary",
        30010 => "system: malformed or truncated context binary",
        c if (1000..2000).contains(&c) => "common error",
        c if (4000..5000).contains(&c) => "backend error",
        c if (5000..6000).contains(&c) => "context error",
        c if (6000..7000).contains(&c) => "graph error",
        c if (7000..8000).contains(&c) => "tensor error",
        c if (8000..9000).contains(&c) => "memory registration error",
        c if (11000..12000).contains(&c) => "log error",
        c if (13000..14000).contains(&c) => "performance infrastructure error",
        c if (14000..15000).contains(&c) => "device error",
        c if (30000..31000).contains(&c) => "system library error",
        _ => "unknown error",
    }
}

/// Why the HTP backend did not start, with what to check (see [`QnnError::HtpUnavailable`]).
#[derive(Debug)]
pub struct HtpRefusal {
    /// The backend library that refused (libQnnHtp.so's path).
    pub library: PathBuf,
    /// The QNN call that failed (`backendCreate`).
    pub operation: &'static str,
    /// Its error code (the handle's low 16 bits).
    pub code: u64,
    /// What `errorGetMessage` said of the error, when it said anything.
    pub backend_message: Option<String>,
    /// The library's own first error lines while it tried (deduplicated).
    pub library_says: Vec<String>,
    /// The user the process runs as ("vla (uid 990)").
    pub user: String,
    /// What the machine has of `/dev/fastrpc-*`, in a few words.
    pub fastrpc: String,
}

/// Everything the binding can fail with.
#[derive(Debug)]
#[non_exhaustive]
pub enum QnnError {
    /// The configured library directory does not exist or is not a directory.
    LibraryDirMissing {
        /// The directory configured.
        dir: PathBuf,
    },
    /// `dlopen` or a symbol lookup failed (`source`: the loader's own error, when it
    /// has one, named in the message; [`QnnError::loader_error`] hands it out), or the
    /// library is not a usable QNN library.
    LibraryLoad {
        /// The library file.
        path: PathBuf,
        /// What went wrong, in a few words.
        reason: String,
        /// The loader's error, kept typed ([`QnnError::loader_error`]).
        source: Option<libloading::Error>,
    },
    /// No provider with a usable API version.
    ApiVersion {
        /// The library whose providers were examined.
        library: PathBuf,
        /// Each provider found, with its API version.
        found: String,
        /// The window of versions this build accepts.
        needed: String,
    },
    /// A QNN call returned an error.
    Call {
        /// The QNN function (`graphExecute`).
        operation: &'static str,
        /// What it was called on (a file, a graph).
        subject: String,
        /// The error code (the handle's low 16 bits; [`error_meaning`] names its range).
        code: u64,
        /// What `errorGetMessage` said of the error, when it said anything.
        backend_message: Option<String>,
    },
    /// The context binary file could not be opened or is unusable before QNN sees it.
    Binary {
        /// The binary file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Whoever gave a binary's bytes at its context's creation refused them (e.g. not
    /// the digest a signed manifest lists), or they are not what the load was planned
    /// with: nothing of them reached `contextCreateFromBinary`.
    Refused {
        /// The binary file.
        path: PathBuf,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The library returned metadata we cannot represent safely.
    Metadata {
        /// The binary the metadata describes.
        path: PathBuf,
        /// What in it cannot be represented.
        reason: String,
    },
    /// The graph already has a live [`crate::Graph`] (one executable handle per graph:
    /// QNN does not document concurrent `graphExecute` on one graph handle as safe).
    GraphInUse {
        /// The context's binary.
        path: PathBuf,
        /// The graph's name.
        graph: String,
    },
    /// No graph of the requested name, or no unique graph when none was named.
    GraphName {
        /// The context's binary.
        path: PathBuf,
        /// The name asked for (`None`: the binary's only graph).
        requested: Option<String>,
        /// The graphs the binary has.
        available: Vec<String>,
    },
    /// A graph input or output has a type this runtime does not execute.
    UnsupportedTensor {
        /// The graph's label.
        graph: String,
        /// The tensor's name.
        tensor: String,
        /// What about its type is not supported.
        reason: String,
    },
    /// The buffers passed to an execution do not match the graph's tensors.
    Buffer {
        /// The graph's label.
        graph: String,
        /// The tensor the buffer was for.
        tensor: String,
        /// The tensor's size in bytes.
        expected_bytes: usize,
        /// The buffer's.
        found_bytes: usize,
    },
    /// An execution was given more or fewer buffers than the graph has inputs or
    /// outputs.
    BufferCount {
        /// The graph's label.
        graph: String,
        /// `"input"` or `"output"`.
        direction: &'static str,
        /// How many the graph has.
        expected: usize,
        /// How many were passed.
        found: usize,
    },
    /// A graph's tensor cannot be given the shared-buffer region asked for.
    SharedRegion {
        /// The graph's label.
        graph: String,
        /// The tensor's name (empty when the whole graph is meant).
        tensor: String,
        /// What is wrong with the region.
        reason: String,
    },
    /// The backend lacks something this call needs (e.g. performance infrastructure).
    NotAvailable {
        /// The missing capability.
        what: &'static str,
        /// Why it is missing.
        reason: String,
    },
    /// The HTP backend refused to start: no Snapdragon SoC / FastRPC session here (off
    /// the board, or the FastRPC devices or libcdsprpc.so unreachable). Nothing was
    /// loaded onto the NPU.
    HtpUnavailable(Box<HtpRefusal>),
}

impl core::fmt::Display for QnnError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            QnnError::LibraryDirMissing { dir } => write!(
                f,
                "QNN library directory {} does not exist (set qnn.lib_dir or VLA_QNN_LIB_DIR)",
                dir.display()
            ),
            QnnError::LibraryLoad { path, reason, source } => {
                write!(f, "cannot load QNN library {}: {reason}", path.display())?;
                match source {
                    Some(cause) => write!(f, ": {cause}"),
                    None => Ok(()),
                }
            }
            QnnError::ApiVersion { library, found, needed } => write!(
                f,
                "{}: no usable QNN provider: found {found}, need {needed}",
                library.display()
            ),
            QnnError::Call { operation, subject, code, backend_message } => {
                write!(f, "{operation} failed for {subject}: QNN error {code} ({})", error_meaning(*code))?;
                if let Some(m) = backend_message {
                    write!(f, ": {m}")?;
                }
                Ok(())
            }
            QnnError::Binary { path, reason } => {
                write!(f, "context binary {}: {reason}", path.display())
            }
            QnnError::Metadata { path, reason } => {
                write!(f, "context binary {}: unusable metadata: {reason}", path.display())
            }
            QnnError::Refused { path, source } => write!(
                f,
                "context binary {}: bytes refused before QNN saw them: {source}",
                path.display()
            ),
            QnnError::GraphInUse { path, graph } => write!(
                f,
                "context binary {}: graph `{graph}` is already retrieved (one executable handle per graph; drop the other first)",
                path.display()
            ),
            QnnError::GraphName { path, requested, available } => match requested {
                Some(name) => write!(
                    f,
                    "context binary {}: no graph named `{name}` (has: {})",
                    path.display(),
                    available.join(", ")
                ),
                None => write!(
                    f,
                    "context binary {}: holds {} graphs ({}); name the one to use",
                    path.display(),
                    available.len(),
                    available.join(", ")
                ),
            },
            QnnError::UnsupportedTensor { graph, tensor, reason } => {
                write!(f, "graph {graph}: tensor `{tensor}`: {reason}")
            }
            QnnError::Buffer { graph, tensor, expected_bytes, found_bytes } => write!(
                f,
                "graph {graph}: buffer for tensor `{tensor}` is {found_bytes} bytes, the tensor needs {expected_bytes}"
            ),
            QnnError::BufferCount { graph, direction, expected, found } => write!(
                f,
                "graph {graph}: {found} {direction} buffers given, the graph has {expected}"
            ),
            QnnError::SharedRegion { graph, tensor, reason } if tensor.is_empty() => {
                write!(f, "graph {graph}: shared buffer: {reason}")
            }
            QnnError::SharedRegion { graph, tensor, reason } => {
                write!(f, "graph {graph}: tensor `{tensor}`: shared buffer: {reason}")
            }
            QnnError::NotAvailable { what, reason } => write!(f, "{what} is not available: {reason}"),
            QnnError::HtpUnavailable(r) => {
                let HtpRefusal {
                    library,
                    operation,
                    code,
                    backend_message,
                    library_says,
                    user,
                    fastrpc,
                } = &**r;
                // One line: what is missing, what the library said, what to check.
                write!(
                    f,
                    "HTP backend unavailable, nothing loaded: no Snapdragon SoC / FastRPC session \
                     ({operation} in {} failed with QNN error {code}",
                    library.display()
                )?;
                if let Some(m) = backend_message {
                    write!(f, ", {m}")?;
                }
                if !library_says.is_empty() {
                    write!(f, "; the library says: {}", library_says.join("; "))?;
                }
                write!(
                    f,
                    "). Not running on an IQ-9075, or the FastRPC devices or libcdsprpc.so \
                     are not reachable for user {user} ({fastrpc}): check the board, \
                     /dev/fastrpc-cdsp* and its group, and that libcdsprpc.so.1 is installed"
                )
            }
        }
    }
}

impl QnnError {
    /// The loader's own error under a [`QnnError::LibraryLoad`], when it has one.
    pub fn loader_error(&self) -> Option<&libloading::Error> {
        match self {
            QnnError::LibraryLoad { source, .. } => source.as_ref(),
            _ => None,
        }
    }
}

// Each message names its cause (the loader's error, the checker's refusal), so `source()`
// hands out only the causes that cause leaves out of its own message.
impl std::error::Error for QnnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            QnnError::LibraryLoad {
                source: Some(cause),
                ..
            } => cause.source(),
            QnnError::Refused { source, .. } => source.source(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn htp_refusal_is_one_line_naming_what_is_missing_and_what_to_check() {
        let e = QnnError::HtpUnavailable(Box::new(HtpRefusal {
            library: PathBuf::from("/usr/lib/libQnnHtp.so"),
            operation: "backendCreate",
            code: 4000,
            backend_message: Some(
                "QNN_BACKEND_ERROR_CANNOT_INITIALIZE: Backend failed to initialize".into(),
            ),
            library_says: vec![
                "No Snapdragon SOC detected".into(),
                "Failed to init router".into(),
            ],
            user: "vla (uid 990)".into(),
            fastrpc: "this machine has no /dev/fastrpc-* device".into(),
        }));
        let line = e.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.starts_with("HTP backend unavailable, nothing loaded: no Snapdragon SoC / FastRPC session (backendCreate in /usr/lib/libQnnHtp.so failed with QNN error 4000, QNN_BACKEND_ERROR_CANNOT_INITIALIZE"), "{line}");
        assert!(
            line.contains("the library says: No Snapdragon SOC detected; Failed to init router)"),
            "{line}"
        );
        assert!(line.contains("Not running on an IQ-9075, or the FastRPC devices or libcdsprpc.so are not reachable for user vla (uid 990) (this machine has no /dev/fastrpc-* device)"), "{line}");
    }
}
