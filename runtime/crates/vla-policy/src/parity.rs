//! The bundle parity gate: every context against its golden, then the whole pipeline
//! against the end-to-end golden (observation in, actions out).
//!
//! Used by `vlad parity --bundle`, by the daemon before it resumes on a new bundle, and by
//! the OTA trial. Per-context checks run on the resident graphs themselves, so what is
//! gated is exactly what will drive the arm.

use crate::bundle::Bundle;
use crate::error::PolicyError;
use crate::{Observation, Policy};
use std::path::Path;
use vla_npz::{DType, Npz};
use vla_parity::{check_context_with, ContextParity, GateOptions};
use vla_tensor::{compare, Comparison};

/// An observation stored as npz (`frames`, `state`, `instruction_id`, `seed`), the format
/// of `golden/end_to_end.npz` and of `vlad run-once --obs`.
#[derive(Clone, Debug, Default)]
pub struct ObservationFile {
    /// Camera frames in `frames` (0 when the file has none).
    pub cameras: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// `cameras x height x width x 3` RGB8, camera-major.
    pub frames: Vec<u8>,
    /// The robot state (empty when the file has none).
    pub state: Vec<f32>,
    /// Index into the bundle's instructions (0 when absent).
    pub instruction_id: u32,
    /// Seed of the flow-matching noise (required).
    pub seed: u64,
}

/// Integer values of any integer array (ids and seeds may be saved as i32, i64 or u64).
fn integers(a: &vla_npz::Array) -> Result<Vec<i128>, PolicyError> {
    let npz = PolicyError::Npz;
    Ok(match a.dtype() {
        DType::I32 => a
            .to_i32()
            .map_err(npz)?
            .into_iter()
            .map(i128::from)
            .collect(),
        DType::I64 => a
            .to_i64()
            .map_err(npz)?
            .into_iter()
            .map(i128::from)
            .collect(),
        DType::U64 => a
            .to_u64()
            .map_err(npz)?
            .into_iter()
            .map(i128::from)
            .collect(),
        DType::U8 => a
            .to_u8()
            .map_err(npz)?
            .into_iter()
            .map(i128::from)
            .collect(),
        other => {
            return Err(PolicyError::Observation {
                field: "integer array",
                expected: "int32, int64, uint64 or uint8".into(),
                found: format!("{other} array `{}`", a.name()),
            })
        }
    })
}

impl ObservationFile {
    /// Reads an observation; `frames`, `state` and `instruction_id` may be absent (Fast-WAM).
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        Self::from_npz(&Npz::open(path).map_err(PolicyError::Npz)?)
    }

    /// [`ObservationFile::load`] from an npz already read.
    pub fn from_npz(npz: &Npz) -> Result<Self, PolicyError> {
        let mut o = ObservationFile::default();
        if npz.contains("frames") {
            let a = npz.array("frames").map_err(PolicyError::Npz)?;
            let s = a.shape();
            if a.dtype() != DType::U8 || s.len() != 4 || s[3] != 3 {
                return Err(PolicyError::Observation {
                    field: "frames",
                    expected: "uint8 [cameras, height, width, 3]".into(),
                    found: format!("{} {:?} in {}", a.dtype(), s, npz.label()),
                });
            }
            (o.cameras, o.height, o.width) = (s[0], s[1], s[2]);
            o.frames = a.to_u8().map_err(PolicyError::Npz)?;
        }
        if npz.contains("state") {
            o.state = npz
                .array("state")
                .map_err(PolicyError::Npz)?
                .to_f32()
                .map_err(PolicyError::Npz)?;
        }
        if npz.contains("instruction_id") {
            let v = integers(&npz.array("instruction_id").map_err(PolicyError::Npz)?)?;
            o.instruction_id = match v.as_slice() {
                [id] if *id >= 0 && *id <= u32::MAX as i128 => *id as u32,
                _ => {
                    return Err(PolicyError::Observation {
                        field: "instruction_id",
                        expected: "one non-negative integer".into(),
                        found: format!("{v:?}"),
                    })
                }
            };
        }
        let v = integers(&npz.array("seed").map_err(PolicyError::Npz)?)?;
        o.seed = match v.as_slice() {
            [s] if *s >= 0 && *s <= u64::MAX as i128 => *s as u64,
            _ => {
                return Err(PolicyError::Observation {
                    field: "seed",
                    expected: "one non-negative integer".into(),
                    found: format!("{v:?}"),
                })
            }
        };
        Ok(o)
    }

    /// The observation as the policy takes it, borrowing this file's buffers.
    pub fn observation(&self) -> Observation<'_> {
        Observation {
            cameras: self.cameras,
            height: self.height,
            width: self.width,
            frames: &self.frames,
            state: &self.state,
            instruction_id: self.instruction_id,
            seed: self.seed,
        }
    }
}

/// Actions against the end-to-end golden.
#[derive(Clone, Debug)]
pub struct EndToEndParity {
    /// The chunk the policy made, `chunk_len x action_dims`.
    pub actions: Vec<f32>,
    /// The golden chunk.
    pub expected: Vec<f32>,
    /// Cosine and differences of `actions` against `expected`.
    pub comparison: Comparison,
    /// (golden choice, our choice) for KeyStone bundles.
    pub keystone: Option<(usize, usize)>,
    /// True when the cosine reaches the end-to-end gate, no value is NaN or infinite and, for
    /// KeyStone, the same candidate was chosen.
    pub passed: bool,
}

/// One host-glue intermediate of the end-to-end run against the golden's copy.
#[derive(Clone, Debug)]
pub struct StageParity {
    /// The stage's name in the golden (e.g. `pixel_values`, `k_ctx`, `latents`).
    pub name: String,
    /// Cosine and differences against the golden's copy.
    pub comparison: Comparison,
    /// The cosine this stage was held to (its `parity.stages` entry, else the default).
    pub min_cosine: f64,
    /// True when the cosine reaches `min_cosine` and no value is NaN or infinite.
    pub passed: bool,
}

/// The whole bundle gate: every context, every stored stage and the end-to-end actions.
#[derive(Clone, Debug)]
pub struct BundleParity {
    /// Every context against its own golden.
    pub contexts: Vec<ContextParity>,
    /// The stages the end-to-end golden stores, in pipeline order.
    pub stages: Vec<StageParity>,
    /// The end-to-end actions against the golden.
    pub end_to_end: EndToEndParity,
    /// The default per-context threshold and the per-stage one (`parity.context_cosine`);
    /// each context output's own is in its [`vla_parity::OutputParity::min_cosine`].
    pub context_gate: f64,
    /// The end-to-end cosine threshold (`parity.end_to_end_cosine`).
    pub end_to_end_gate: f64,
    /// The bundle's actions do not depend on the observation (constant world model).
    pub open_loop: bool,
}

impl BundleParity {
    /// True when every context, every stage and the end-to-end check passed.
    pub fn passed(&self) -> bool {
        self.contexts.iter().all(|c| c.passed())
            && self.stages.iter().all(|s| s.passed)
            && self.end_to_end.passed
    }

    /// The first stage (in pipeline order) below the gate: where a host-glue mistake
    /// happens, rather than the thin end-to-end miss it causes downstream.
    pub fn first_diverging_stage(&self) -> Option<&StageParity> {
        self.stages.iter().find(|s| !s.passed)
    }

    /// One line naming what failed, for logs and exit messages.
    pub fn failure_summary(&self) -> Option<String> {
        let mut parts: Vec<String> = self
            .contexts
            .iter()
            .filter(|c| !c.passed())
            .flat_map(|c| {
                c.outputs.iter().filter(|o| !o.passed).map(|o| {
                    format!(
                        "{} {} cosine {:.6} < {}",
                        c.label, o.name, o.comparison.cosine, o.min_cosine
                    )
                })
            })
            .collect();
        if let Some(st) = self.first_diverging_stage() {
            parts.push(format!(
                "first diverging stage `{}` cosine {:.6} < {}",
                st.name, st.comparison.cosine, st.min_cosine
            ));
        }
        let e = &self.end_to_end;
        if !e.passed {
            match e.keystone {
                Some((want, got)) if want != got => {
                    parts.push(format!("KeyStone chose {got}, golden {want}"))
                }
                _ => parts.push(format!(
                    "end-to-end actions cosine {:.6} < {}",
                    e.comparison.cosine, self.end_to_end_gate
                )),
            }
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

impl Bundle {
    /// Runs the parity gate of this bundle on `policy` (loaded from it).
    pub fn parity(&self, policy: &mut Policy) -> Result<BundleParity, PolicyError> {
        let gate = GateOptions {
            min_cosine: self.manifest.parity.context_cosine,
            ..GateOptions::default()
        };
        let mut contexts = Vec::new();
        let gates = &self.manifest.parity;
        // Every entry must name a real output before anything runs: a misspelt output
        // would otherwise leave the real one at the default without a word.
        for g in policy.graphs_mut() {
            let names: Vec<&str> = g.graph.outputs().iter().map(|t| t.name.as_str()).collect();
            gates
                .check_outputs(&g.component, &names)
                .map_err(|invalid| PolicyError::ManifestInvalid {
                    path: self.dir.join("bundle.json"),
                    invalid,
                })?;
        }
        for g in policy.graphs_mut() {
            let rel = &self.manifest.components[&g.component].golden;
            let npz = self.npz(&format!("golden of `{}`", g.component), rel)?;
            let component = g.component.clone();
            let r = check_context_with(&mut g.graph, &npz, &gate, |output| {
                gates.threshold(&component, output).cosine
            })
            .map_err(|e| PolicyError::Prompt {
                file: g.golden.display().to_string(),
                reason: e.to_string(),
            })?;
            contexts.push(r);
        }
        let path = self.path(&self.manifest.end_to_end);
        // One read: the observation and the expected actions come from the same bytes.
        let npz = self.npz("end-to-end golden", &self.manifest.end_to_end)?;
        let obs = ObservationFile::from_npz(&npz)?;
        let expected = npz
            .array("actions")
            .map_err(PolicyError::Npz)?
            .to_f32()
            .map_err(PolicyError::Npz)?;
        let g = policy.geometry();
        if expected.len() != g.chunk_len * g.action_dims {
            return Err(PolicyError::Observation {
                field: "golden actions",
                expected: format!("{} values", g.chunk_len * g.action_dims),
                found: format!("{} values in {}", expected.len(), path.display()),
            });
        }
        let mut actions = vec![0f32; expected.len()];
        policy.infer(&obs.observation(), &mut actions)?;
        let comparison = compare(&actions, &expected, 1e-3, 1e-2);
        let mut stages = Vec::new();
        let produced = policy.stages(&obs.observation());
        // An entry for a stage the golden does not store would gate nothing without a word.
        let names: Vec<&str> = produced
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| npz.contains(n))
            .collect();
        gates
            .check_stages(&names)
            .map_err(|invalid| PolicyError::ManifestInvalid {
                path: self.dir.join("bundle.json"),
                invalid,
            })?;
        for (name, ours) in produced {
            if !npz.contains(&name) {
                continue;
            }
            let want = npz
                .array(&name)
                .map_err(PolicyError::Npz)?
                .to_f32()
                .map_err(PolicyError::Npz)?;
            if want.len() != ours.len() {
                return Err(PolicyError::Observation {
                    field: "golden stage",
                    expected: format!("{} values", ours.len()),
                    found: format!("{} values of `{name}` in {}", want.len(), path.display()),
                });
            }
            let c = compare(&ours, &want, 1e-3, 1e-2);
            let min_cosine = gates.stage_threshold(&name).cosine;
            let passed = c.non_finite == 0 && c.cosine >= min_cosine;
            stages.push(StageParity {
                name,
                comparison: c,
                min_cosine,
                passed,
            });
        }
        let keystone = match (policy.keystone_choice(), npz.contains("keystone_choice")) {
            (Some(ours), true) => {
                let want = integers(&npz.array("keystone_choice").map_err(PolicyError::Npz)?)?;
                Some((want.first().copied().unwrap_or(-1) as usize, ours))
            }
            _ => None,
        };
        let e2e_gate = self.manifest.parity.end_to_end_cosine;
        let passed = comparison.non_finite == 0
            && comparison.cosine >= e2e_gate
            && keystone.is_none_or(|(want, got)| want == got);
        Ok(BundleParity {
            contexts,
            stages,
            open_loop: policy.open_loop(),
            end_to_end: EndToEndParity {
                actions,
                expected,
                comparison,
                keystone,
                passed,
            },
            context_gate: gate.min_cosine,
            end_to_end_gate: e2e_gate,
        })
    }
}
