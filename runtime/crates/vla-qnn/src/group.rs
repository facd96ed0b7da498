//! Creating several contexts (a bundle's) as one HTP spill-fill group.
//!
//! Each HTP context otherwise gets its own spill-fill buffer, sized by its binary. The
//! HTP custom context config REGISTER_MULTI_CONTEXTS makes the contexts of a group share
//! one buffer: the first context is created with a NULL group handle and the largest
//! spill-fill size any of the binaries reports, each later one with the first context's
//! handle and the same size. Only the creation differs; execution does not.
//!
//! The decision rests on the binaries' own metadata ([`ContextBinary::info`]): no group
//! when none reports a buffer, or when there is only one context (nothing to share). A
//! backend that refuses the config is not fatal: the refused binary and the ones after it
//! are created as [`Context::create`] does, with one log line. An error that persists
//! without the config is the binary's own and is returned.

use crate::backend::Backend;
use crate::binary::ContextBinary;
use crate::context::Context;
use crate::error::QnnError;
use crate::ffi;

/// The spill-fill size a group of contexts with these per-binary sizes should share:
/// the largest, or `None` (no group) when every size is 0 or there are fewer than two.
pub fn shared_spill_fill(sizes: impl IntoIterator<Item = u64>) -> Option<u64> {
    let (mut n, mut largest) = (0usize, 0u64);
    for s in sizes {
        n += 1;
        largest = largest.max(s);
    }
    (n >= 2 && largest > 0).then_some(largest)
}

/// How the contexts of [`create_contexts`] came to hold their spill-fill buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpillFillSharing {
    /// No group was asked for (see [`shared_spill_fill`]): each context has its own.
    NotNeeded,
    /// Every context joined one group sharing a buffer of `bytes`.
    Shared {
        /// The shared buffer's size.
        bytes: u64,
        /// How many contexts share it.
        contexts: usize,
    },
    /// The backend refused the group config for the context at index `grouped` (its
    /// message in `error`): the first `grouped` contexts share `bytes`, the rest were
    /// created without a group.
    Refused {
        /// The buffer size the group asked for.
        bytes: u64,
        /// The index of the refused context, and so the number in the group.
        grouped: usize,
        /// The backend's error for the refused config.
        error: String,
    },
}

impl core::fmt::Display for SpillFillSharing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SpillFillSharing::NotNeeded => {
                write!(f, "no shared spill-fill buffer (no binary reports one)")
            }
            SpillFillSharing::Shared { bytes, contexts } => {
                write!(
                    f,
                    "{contexts} contexts share one spill-fill buffer of {bytes} bytes"
                )
            }
            SpillFillSharing::Refused {
                bytes,
                grouped,
                error,
            } => write!(
                f,
                "spill-fill sharing ({bytes} bytes) refused after {grouped} contexts: {error}"
            ),
        }
    }
}

/// Contexts created together, in the order of their binaries.
pub struct ContextGroup {
    /// The contexts, in the order of the binaries.
    pub contexts: Vec<Context>,
    /// How they came to hold their spill-fill buffers.
    pub sharing: SpillFillSharing,
}

/// A session's id, its backend, and its binaries with their indices among all of them.
type SessionBinaries = (usize, Backend, Vec<(usize, ContextBinary)>);

/// A context of the set that could not be created: its index among the binaries.
pub type GroupError = (usize, QnnError);

/// Creates one context per binary, as one spill-fill group when the binaries report a
/// spill-fill size ([`shared_spill_fill`] of their [`crate::BinaryInfo::spill_fill_bytes`]).
///
/// With a backend made by [`Backend::with_placement`], each session of the placement is
/// its own group, created on the session's device, in the order of the sessions' first
/// binaries; the contexts come back in the order of the binaries.
pub fn create_contexts(
    backend: &Backend,
    binaries: Vec<ContextBinary>,
) -> Result<ContextGroup, GroupError> {
    let Some(placement) = backend.placement.clone() else {
        let size = shared_spill_fill(binaries.iter().map(|b| b.info().spill_fill_bytes()));
        return create_contexts_sharing(backend, binaries, size);
    };
    let n = binaries.len();
    // Sessions in order of first appearance.
    let mut sessions: Vec<SessionBinaries> = Vec::new();
    for (i, binary) in binaries.into_iter().enumerate() {
        let (session, on) = match placement.of(binary.path()) {
            Some((s, b)) => (s, b.clone()),
            None => (
                usize::MAX,
                Backend {
                    placement: None,
                    ..backend.clone()
                },
            ),
        };
        match sessions.iter_mut().find(|(s, _, _)| *s == session) {
            Some((_, _, members)) => members.push((i, binary)),
            None => sessions.push((session, on, vec![(i, binary)])),
        }
    }
    let mut slots: Vec<Option<Context>> = (0..n).map(|_| None).collect();
    let mut sharing = SpillFillSharing::NotNeeded;
    for (_, on, members) in sessions {
        let (indices, group): (Vec<usize>, Vec<ContextBinary>) = members.into_iter().unzip();
        let size = shared_spill_fill(group.iter().map(|b| b.info().spill_fill_bytes()));
        let made = create_contexts_sharing(&on, group, size).map_err(|(k, e)| (indices[k], e))?;
        // A refusal is what the caller most needs to hear of; else any group shared.
        sharing = match (&sharing, made.sharing) {
            (SpillFillSharing::Refused { .. }, _) => sharing,
            (_, refused @ SpillFillSharing::Refused { .. }) => refused,
            (_, shared @ SpillFillSharing::Shared { .. }) => shared,
            (_, SpillFillSharing::NotNeeded) => sharing,
        };
        for (i, c) in indices.into_iter().zip(made.contexts) {
            slots[i] = Some(c);
        }
    }
    Ok(ContextGroup {
        contexts: slots.into_iter().flatten().collect(),
        sharing,
    })
}

/// [`create_contexts`] with the group's spill-fill size given (`None`: no group), for
/// callers that decide it themselves, e.g. to try the group with binaries reporting none.
pub fn create_contexts_sharing(
    backend: &Backend,
    binaries: Vec<ContextBinary>,
    spill_fill: Option<u64>,
) -> Result<ContextGroup, GroupError> {
    let mut contexts = Vec::with_capacity(binaries.len());
    let Some(bytes) = spill_fill else {
        for (i, b) in binaries.into_iter().enumerate() {
            contexts.push(Context::create(backend, b).map_err(|e| (i, e))?);
        }
        return Ok(ContextGroup {
            contexts,
            sharing: SpillFillSharing::NotNeeded,
        });
    };
    // The index of the refused context and the backend's error.
    let mut refused: Option<(usize, String)> = None;
    for (i, binary) in binaries.into_iter().enumerate() {
        if refused.is_some() {
            contexts.push(Context::create(backend, binary).map_err(|e| (i, e))?);
            continue;
        }
        let first = contexts
            .first()
            .map_or(ffi::ContextHandle::NULL, Context::raw_handle);
        let group = ffi::HtpContextGroupConfig {
            option: ffi::HTP_CONTEXT_CONFIG_REGISTER_MULTI_CONTEXTS,
            first_group_handle: first,
            max_spill_fill_buffer: bytes,
        };
        let config = ffi::ContextConfig {
            option: ffi::CONTEXT_CONFIG_OPTION_CUSTOM,
            custom: &group as *const ffi::HtpContextGroupConfig as *const core::ffi::c_void,
            _rest_of_union: [0; 3],
        };
        match Context::create_with(backend, binary, &[&config]) {
            Ok(c) => contexts.push(c),
            Err(failed) => {
                let (grouped_error, binary) = *failed;
                // No bytes: they were refused before QNN saw them, not the group.
                if !binary.is_mapped() {
                    return Err((i, grouped_error));
                }
                // Without the config: success means the group was what was refused.
                let c = Context::create(backend, binary).map_err(|e| (i, e))?;
                log::warn!(
                    "HTP spill-fill sharing ({bytes} bytes) refused at context {} of the group \
                     ({grouped_error}); creating it and the rest without a group",
                    contexts.len()
                );
                refused = Some((contexts.len(), grouped_error.to_string()));
                contexts.push(c);
            }
        }
    }
    let sharing = match refused {
        None => SpillFillSharing::Shared {
            bytes,
            contexts: contexts.len(),
        },
        Some((grouped, error)) => SpillFillSharing::Refused {
            bytes,
            grouped,
            error,
        },
    };
    if let SpillFillSharing::Shared { .. } = sharing {
        log::info!("{sharing}");
    }
    Ok(ContextGroup { contexts, sharing })
}

#[cfg(test)]
mod tests {
    use super::shared_spill_fill;

    #[test]
    fn a_group_only_when_a_binary_reports_spill_fill_and_there_is_something_to_share() {
        assert_eq!(
            shared_spill_fill([0, 0, 0]),
            None,
            "no binary reports a buffer"
        );
        assert_eq!(shared_spill_fill([]), None);
        assert_eq!(
            shared_spill_fill([4096]),
            None,
            "one context shares with no one"
        );
        assert_eq!(shared_spill_fill([0, 4096]), Some(4096));
        assert_eq!(
            shared_spill_fill([1 << 20, 3 << 20, 0, 2 << 20]),
            Some(3 << 20),
            "the largest"
        );
        assert_eq!(shared_spill_fill([u64::MAX, 1]), Some(u64::MAX));
    }
}
