//! Where a set of contexts goes in the DSP's address space: which contexts share a cDSP
//! session and on which NSP, computed before anything is created on the NPU.
//!
//! A cDSP session is one 32-bit address space (4 GiB, about 3.75 GiB usable); every
//! resident context of the session lives in it: its weights (about the size of its
//! binary), its spill-fill buffer (shared by the session's contexts as one HTP group) and
//! the DSP-side copies of its graph inputs and outputs. This module adds those up per
//! session and refuses a placement over the budget; it knows nothing of policies or of
//! how a placement was configured. Its sums are estimates from the binaries' own
//! metadata: the runtime's own heap in the session is the budget's reserve.

use crate::binary::ContextBinary;
use core::fmt;

/// Bytes in a MiB.
pub const MIB: u64 = 1 << 20;

/// The address space of one cDSP session as usable by a client: 3.75 GiB of the 32-bit
/// space (Qualcomm's HTP backend guidance, recorded in docs/qnn-abi.md).
pub const SESSION_USABLE_BYTES: u64 = 3840 * MIB;

/// What the plan keeps free in every session for what the binaries do not state: the
/// QNN runtime's own DSP heap, runlists and FastRPC mappings. A stated guess until the
/// bring-up probe measures it on a board.
pub const DEFAULT_RESERVE_BYTES: u64 = 256 * MIB;

/// The per-session budget `auto` packs under by default.
pub const DEFAULT_SESSION_BUDGET: u64 = SESSION_USABLE_BYTES - DEFAULT_RESERVE_BYTES;

/// What one context needs in a session's address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// The context's name (the caller's: a component, a file name).
    pub name: String,
    /// Weights and graph data: the binary's size.
    pub weights: u64,
    /// The largest spill-fill buffer a graph of the binary reports (0 when none does).
    pub spill_fill: u64,
    /// Bytes of every graph input and output (0 when not known).
    pub io: u64,
}

impl Footprint {
    /// The footprint a binary states about itself: its size, its spill-fill size from
    /// the binary info, the bytes of its graphs' inputs and outputs.
    pub fn of(name: impl Into<String>, binary: &ContextBinary) -> Self {
        let info = binary.info();
        let io = info
            .graphs
            .iter()
            .flat_map(|g| g.inputs.iter().chain(g.outputs.iter()))
            .map(|t| t.byte_len().unwrap_or(0) as u64)
            .sum();
        Footprint {
            name: name.into(),
            weights: binary.size() as u64,
            spill_fill: info.spill_fill_bytes(),
            io,
        }
    }

    /// Everything the context needs on its own (its spill-fill buffer included).
    pub fn total(&self) -> u64 {
        self.weights
            .saturating_add(self.spill_fill)
            .saturating_add(self.io)
    }
}

/// How the contexts are to be placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Pack the contexts in their given (pipeline) order: a context joins the current
    /// session while the session stays within the budget, else opens the next one; each
    /// new session goes to the NSP holding the fewest bytes so far (the lowest id on a tie).
    Auto,
    /// Explicit sessions: each group's contexts (by name) on the NSP given. Every context
    /// must be in exactly one group.
    Groups(Vec<Group>),
}

/// One explicit session of [`Placement::Groups`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The NSP (HTP device id) the session is on.
    pub nsp: u32,
    /// The contexts of the session, by name.
    pub contexts: Vec<String>,
}

/// One planned session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedSession {
    /// The NSP it is on.
    pub nsp: u32,
    /// Indices into [`MemoryPlan::footprints`], in pipeline order.
    pub contexts: Vec<usize>,
    /// Weights + I/O of its contexts, plus the largest spill-fill buffer among them
    /// (the session's contexts share one).
    pub bytes: u64,
}

/// Which contexts share a session and where, with each session's sum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Every context's footprint, in the order given.
    pub footprints: Vec<Footprint>,
    /// The sessions, in the order of their first context.
    pub sessions: Vec<PlannedSession>,
    /// The per-session budget the plan was checked against.
    pub budget: u64,
    /// How many NSPs the plan could use.
    pub nsps: u32,
}

/// A placement that cannot be planned. Each names the session (its index, from 0) it is
/// about where there is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// A group names a context that is not among those to place.
    UnknownContext {
        /// The group's index.
        session: usize,
        /// The name it gave.
        name: String,
        /// The contexts there are.
        known: Vec<String>,
    },
    /// A group is on an NSP the platform does not have.
    NoSuchNsp {
        /// The group's index.
        session: usize,
        /// The NSP it asked for.
        nsp: u32,
        /// How many the platform has (ids 0..nsps).
        nsps: u32,
    },
    /// A context is in two groups, or twice in one.
    Twice {
        /// The group where it appears again.
        session: usize,
        /// The context.
        name: String,
    },
    /// A context is in no group.
    Unplaced {
        /// The context.
        name: String,
    },
    /// A group has no contexts.
    EmptyGroup {
        /// The group's index.
        session: usize,
    },
    /// A session's sum is over the budget.
    OverBudget {
        /// The session's index.
        session: usize,
        /// Its NSP.
        nsp: u32,
        /// Its contexts, by name.
        contexts: Vec<String>,
        /// Its sum.
        bytes: u64,
        /// The budget.
        budget: u64,
    },
    /// No NSP to place on.
    NoNsp,
}

/// Bytes as MiB with one decimal, for plans and refusals.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::UnknownContext {
                session,
                name,
                known,
            } => write!(
                f,
                "session {session} names context `{name}`, which is not one of {}",
                known.join(", ")
            ),
            PlanError::NoSuchNsp { session, nsp, nsps } => write!(
                f,
                "session {session} is on NSP {nsp}, but the platform has {nsps} (ids 0..{})",
                nsps.saturating_sub(1)
            ),
            PlanError::Twice { session, name } => {
                write!(f, "session {session} names context `{name}` a second time")
            }
            PlanError::Unplaced { name } => {
                write!(f, "context `{name}` is in no session of the placement")
            }
            PlanError::EmptyGroup { session } => write!(f, "session {session} has no contexts"),
            PlanError::OverBudget {
                session,
                nsp,
                contexts,
                bytes,
                budget,
            } => write!(
                f,
                "session {session} (NSP {nsp}: {}) needs {}, over the per-session budget of {}",
                contexts.join(" + "),
                mib(*bytes),
                mib(*budget)
            ),
            PlanError::NoNsp => write!(f, "the platform reports no NSP to place contexts on"),
        }
    }
}

impl std::error::Error for PlanError {}

fn session_bytes(footprints: &[Footprint], members: &[usize]) -> u64 {
    let mut sum = 0u64;
    let mut spill = 0u64;
    for &i in members {
        let f = &footprints[i];
        sum = sum.saturating_add(f.weights).saturating_add(f.io);
        spill = spill.max(f.spill_fill);
    }
    sum.saturating_add(spill)
}

impl MemoryPlan {
    /// Plans `footprints` (in pipeline order) on `nsps` NSPs under `budget` bytes per
    /// session. Nothing is created: this is arithmetic on what the binaries state.
    pub fn compute(
        footprints: Vec<Footprint>,
        placement: &Placement,
        nsps: u32,
        budget: u64,
    ) -> Result<MemoryPlan, PlanError> {
        if nsps == 0 {
            return Err(PlanError::NoNsp);
        }
        let sessions = match placement {
            Placement::Auto => pack(&footprints, nsps, budget)?,
            Placement::Groups(groups) => explicit(&footprints, groups, nsps)?,
        };
        for (i, s) in sessions.iter().enumerate() {
            if s.bytes > budget {
                return Err(PlanError::OverBudget {
                    session: i,
                    nsp: s.nsp,
                    contexts: s
                        .contexts
                        .iter()
                        .map(|&c| footprints[c].name.clone())
                        .collect(),
                    bytes: s.bytes,
                    budget,
                });
            }
        }
        Ok(MemoryPlan {
            footprints,
            sessions,
            budget,
            nsps,
        })
    }

    /// The NSPs the plan uses, ascending.
    pub fn nsps_used(&self) -> Vec<u32> {
        let mut used: Vec<u32> = self.sessions.iter().map(|s| s.nsp).collect();
        used.sort_unstable();
        used.dedup();
        used
    }

    /// The session index and NSP of the context at `index`.
    pub fn session_of(&self, index: usize) -> Option<(usize, u32)> {
        self.sessions
            .iter()
            .enumerate()
            .find(|(_, s)| s.contexts.contains(&index))
            .map(|(i, s)| (i, s.nsp))
    }

    /// One line: `s0 nsp0 [vision+llm_split0] 2751.0 MiB; s1 ...; budget 3584.0 MiB`.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .sessions
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let names: Vec<&str> = s
                    .contexts
                    .iter()
                    .map(|&c| self.footprints[c].name.as_str())
                    .collect();
                format!("s{i} nsp{} [{}] {}", s.nsp, names.join("+"), mib(s.bytes))
            })
            .collect();
        parts.push(format!("budget {}", mib(self.budget)));
        parts.join("; ")
    }

    /// The plan as a table: one line per context, then one per session.
    pub fn render(&self) -> String {
        use fmt::Write;
        let mut out = String::new();
        let width = self
            .footprints
            .iter()
            .map(|f| f.name.len())
            .max()
            .unwrap_or(7)
            .max(7);
        let _ = writeln!(
            out,
            "{:<width$}  {:>12}  {:>12}  {:>12}  session  nsp",
            "context", "weights", "spill-fill", "I/O"
        );
        for (i, f) in self.footprints.iter().enumerate() {
            let (s, nsp) = self.session_of(i).unwrap_or((usize::MAX, u32::MAX));
            let _ = writeln!(
                out,
                "{:<width$}  {:>12}  {:>12}  {:>12}  {:>7}  {:>3}",
                f.name,
                mib(f.weights),
                mib(f.spill_fill),
                mib(f.io),
                s,
                nsp
            );
        }
        for (i, s) in self.sessions.iter().enumerate() {
            let names: Vec<&str> = s
                .contexts
                .iter()
                .map(|&c| self.footprints[c].name.as_str())
                .collect();
            let _ = writeln!(
                out,
                "session {i} on NSP {}: {} = {} of {} ({:.0}%)",
                s.nsp,
                names.join(" + "),
                mib(s.bytes),
                mib(self.budget),
                100.0 * s.bytes as f64 / self.budget.max(1) as f64
            );
        }
        out
    }
}

fn pack(
    footprints: &[Footprint],
    nsps: u32,
    budget: u64,
) -> Result<Vec<PlannedSession>, PlanError> {
    let mut sessions: Vec<PlannedSession> = Vec::new();
    let mut per_nsp = vec![0u64; nsps as usize];
    for i in 0..footprints.len() {
        if let Some(last) = sessions.last_mut() {
            let mut with = last.contexts.clone();
            with.push(i);
            let bytes = session_bytes(footprints, &with);
            if bytes <= budget {
                per_nsp[last.nsp as usize] += bytes - last.bytes;
                last.contexts = with;
                last.bytes = bytes;
                continue;
            }
        }
        // A context alone over the budget still gets its session: the check after
        // packing refuses it with its sum.
        let nsp = (0..nsps)
            .min_by_key(|&n| (per_nsp[n as usize], n))
            .unwrap_or(0);
        let bytes = session_bytes(footprints, &[i]);
        per_nsp[nsp as usize] += bytes;
        sessions.push(PlannedSession {
            nsp,
            contexts: vec![i],
            bytes,
        });
    }
    Ok(sessions)
}

fn explicit(
    footprints: &[Footprint],
    groups: &[Group],
    nsps: u32,
) -> Result<Vec<PlannedSession>, PlanError> {
    let mut placed = vec![false; footprints.len()];
    let mut sessions = Vec::with_capacity(groups.len());
    for (g, group) in groups.iter().enumerate() {
        if group.nsp >= nsps {
            return Err(PlanError::NoSuchNsp {
                session: g,
                nsp: group.nsp,
                nsps,
            });
        }
        if group.contexts.is_empty() {
            return Err(PlanError::EmptyGroup { session: g });
        }
        let mut members = Vec::with_capacity(group.contexts.len());
        for name in &group.contexts {
            let Some(i) = footprints.iter().position(|f| &f.name == name) else {
                return Err(PlanError::UnknownContext {
                    session: g,
                    name: name.clone(),
                    known: footprints.iter().map(|f| f.name.clone()).collect(),
                });
            };
            if placed[i] {
                return Err(PlanError::Twice {
                    session: g,
                    name: name.clone(),
                });
            }
            placed[i] = true;
            members.push(i);
        }
        members.sort_unstable();
        sessions.push(PlannedSession {
            nsp: group.nsp,
            bytes: session_bytes(footprints, &members),
            contexts: members,
        });
    }
    if let Some(i) = placed.iter().position(|p| !p) {
        return Err(PlanError::Unplaced {
            name: footprints[i].name.clone(),
        });
    }
    Ok(sessions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(name: &str, mb: u64) -> Footprint {
        Footprint {
            name: name.into(),
            weights: mb * MIB,
            spill_fill: 0,
            io: 0,
        }
    }

    /// The original MolmoAct2 release's published context sizes.
    fn original() -> Vec<Footprint> {
        vec![
            fp("vision", 926),
            fp("llm_split0", 1825),
            fp("llm_split1", 1825),
            fp("llm_split2", 1825),
            fp("llm_split3", 1825),
            fp("action_context", 4),
            fp("action_step", 1164),
        ]
    }

    fn names(plan: &MemoryPlan) -> Vec<Vec<&str>> {
        plan.sessions
            .iter()
            .map(|s| {
                s.contexts
                    .iter()
                    .map(|&c| plan.footprints[c].name.as_str())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn auto_packs_in_pipeline_order_under_the_budget_and_balances_nsps() {
        let plan =
            MemoryPlan::compute(original(), &Placement::Auto, 2, DEFAULT_SESSION_BUDGET).unwrap();
        assert_eq!(
            names(&plan),
            vec![
                vec!["vision", "llm_split0"],
                vec!["llm_split1"],
                vec!["llm_split2"],
                vec!["llm_split3", "action_context", "action_step"],
            ]
        );
        let nsps: Vec<u32> = plan.sessions.iter().map(|s| s.nsp).collect();
        assert_eq!(nsps, vec![0, 1, 1, 0]);
        assert_eq!(plan.sessions[0].bytes, (926 + 1825) * MIB);
        assert!(plan.sessions.iter().all(|s| s.bytes <= plan.budget));
        assert_eq!(plan.nsps_used(), vec![0, 1]);
        // Everything in one session is what vlad did before: 9.4 GiB, refused.
        let one = Placement::Groups(vec![Group {
            nsp: 0,
            contexts: original().into_iter().map(|f| f.name).collect(),
        }]);
        let e = MemoryPlan::compute(original(), &one, 2, DEFAULT_SESSION_BUDGET).unwrap_err();
        assert!(matches!(e, PlanError::OverBudget { session: 0, .. }), "{e}");
        assert!(e.to_string().contains("9394.0 MiB"), "{e}");
        assert!(e.to_string().contains("3584.0 MiB"), "{e}");
    }

    #[test]
    fn spill_fill_is_shared_within_a_session_and_io_added() {
        let mut f = original();
        f[0].spill_fill = 100 * MIB;
        f[1].spill_fill = 300 * MIB;
        f[1].io = 10 * MIB;
        let plan = MemoryPlan::compute(f, &Placement::Auto, 1, DEFAULT_SESSION_BUDGET).unwrap();
        assert_eq!(plan.sessions[0].bytes, (926 + 1825 + 300 + 10) * MIB);
    }

    #[test]
    fn a_session_exactly_at_the_budget_fits_and_one_byte_more_does_not() {
        let f = || vec![fp("a", 60), fp("b", 40)];
        let plan = MemoryPlan::compute(f(), &Placement::Auto, 1, 100 * MIB).unwrap();
        assert_eq!(names(&plan), vec![vec!["a", "b"]]);
        let plan = MemoryPlan::compute(f(), &Placement::Auto, 1, 100 * MIB - 1).unwrap();
        assert_eq!(names(&plan), vec![vec!["a"], vec!["b"]]);
        let both = Placement::Groups(vec![Group {
            nsp: 0,
            contexts: vec!["a".into(), "b".into()],
        }]);
        assert!(MemoryPlan::compute(f(), &both, 1, 100 * MIB).is_ok());
        let e = MemoryPlan::compute(f(), &both, 1, 100 * MIB - 1).unwrap_err();
        assert!(matches!(e, PlanError::OverBudget { session: 0, .. }), "{e}");
    }

    #[test]
    fn a_context_alone_over_the_budget_is_refused_naming_it() {
        let f = vec![fp("action_step", 4000)];
        let e = MemoryPlan::compute(f, &Placement::Auto, 1, DEFAULT_SESSION_BUDGET).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("session 0 (NSP 0: action_step) needs 4000.0 MiB"),
            "{text}"
        );
    }

    #[test]
    fn explicit_groups_are_checked_for_names_nsps_and_coverage() {
        let g = |nsp, c: &[&str]| Group {
            nsp,
            contexts: c.iter().map(|s| s.to_string()).collect(),
        };
        let all = |groups| {
            MemoryPlan::compute(
                original(),
                &Placement::Groups(groups),
                2,
                DEFAULT_SESSION_BUDGET,
            )
        };
        let ok = all(vec![
            g(0, &["vision", "llm_split0"]),
            g(1, &["llm_split1"]),
            g(0, &["llm_split2"]),
            g(1, &["llm_split3", "action_context"]),
            g(1, &["action_step"]),
        ])
        .unwrap();
        assert_eq!(ok.sessions.len(), 5);
        assert_eq!(ok.session_of(5), Some((3, 1)));
        let e = all(vec![g(0, &["vision", "llm_spilt0"])]).unwrap_err();
        assert!(
            matches!(&e, PlanError::UnknownContext { session: 0, name, .. } if name == "llm_spilt0")
        );
        let e = all(vec![g(2, &["vision"])]).unwrap_err();
        assert_eq!(
            e,
            PlanError::NoSuchNsp {
                session: 0,
                nsp: 2,
                nsps: 2
            }
        );
        assert!(e.to_string().contains("NSP 2"), "{e}");
        let e = all(vec![g(0, &["vision"]), g(1, &["vision"])]).unwrap_err();
        assert_eq!(
            e,
            PlanError::Twice {
                session: 1,
                name: "vision".into()
            }
        );
        let e = all(vec![g(0, &["vision"])]).unwrap_err();
        assert_eq!(
            e,
            PlanError::Unplaced {
                name: "llm_split0".into()
            }
        );
        let e = all(vec![g(0, &[])]).unwrap_err();
        assert_eq!(e, PlanError::EmptyGroup { session: 0 });
        let e = all(vec![
            g(0, &["vision", "llm_split0", "llm_split1"]),
            g(
                1,
                &["llm_split2", "llm_split3", "action_context", "action_step"],
            ),
        ])
        .unwrap_err();
        assert!(
            e.to_string().starts_with(
                "session 0 (NSP 0: vision + llm_split0 + llm_split1) needs 4576.0 MiB"
            ),
            "{e}"
        );
        assert_eq!(
            MemoryPlan::compute(original(), &Placement::Auto, 0, 1),
            Err(PlanError::NoNsp)
        );
    }
}
