//! Why the simulator stopped. The ring errors are passed through as they are (their own
//! line and their own causes); the others name their cause in their message.

use std::fmt;
use std::path::PathBuf;

/// Why [`crate::run`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SimError {
    /// The geometry does not describe an observation (a frame size overflows).
    Geometry(vla_ring::ConfigError),
    /// The observation source does not have the geometry's frame bytes and state values.
    SourceSize {
        /// Frame bytes of the source.
        frames: usize,
        /// State values of the source.
        state: usize,
        /// Frame bytes the geometry needs.
        needed_frames: usize,
        /// State values the geometry needs.
        needed_state: usize,
    },
    /// The observation ring could not be created or taken over.
    ObservationRing(vla_ring::CreateError),
    /// An observation could not be published.
    Publish(vla_ring::PublishError),
    /// The JSON report or the timeline could not be written.
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said (in the message).
        source: std::io::Error,
    },
    /// The daemon's action ring never appeared while the simulator ran.
    NoActionRing {
        /// Where it was looked for.
        path: PathBuf,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Geometry(e) => write!(f, "{e}"),
            SimError::SourceSize {
                frames,
                state,
                needed_frames,
                needed_state,
            } => write!(
                f,
                "observation file has {frames} frame bytes and {state} state values; the bundle needs {needed_frames} and {needed_state}"
            ),
            SimError::ObservationRing(e) => write!(f, "{e}"),
            SimError::Publish(e) => write!(f, "{e}"),
            SimError::Write { path, source } => {
                write!(f, "cannot write {}: {source}", path.display())
            }
            SimError::NoActionRing { path } => write!(
                f,
                "no action ring appeared at {} (is `vlad run` up?)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for SimError {
    /// A ring error is this error's whole message, so its causes are this error's causes.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimError::Geometry(e) => e.source(),
            SimError::ObservationRing(e) => e.source(),
            SimError::Publish(e) => e.source(),
            SimError::SourceSize { .. }
            | SimError::Write { .. }
            | SimError::NoActionRing { .. } => None,
        }
    }
}
