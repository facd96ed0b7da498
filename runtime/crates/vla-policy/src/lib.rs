//! Resident VLA policies: bundle loading, contract checks, and all host glue between the
//! QNN contexts (MolmoAct2 and Fast-WAM).
//!
//! This crate knows policies and contexts; it knows nothing of shared memory, control
//! rates or systemd. The daemon hands it an [`Observation`] and a preallocated action
//! buffer; [`Policy::infer`] fills the buffer without allocating.
//!
//! The bundle layout and every step of the glue are specified in `docs/bundle-format.md`;
//! `tools/vla_host/vla_host/reference.py` implements the same contract independently in numpy.

#![forbid(unsafe_code)]

mod bundle;
mod error;
mod exec;
mod fastwam;
mod guard;
pub use guard::HelperSetup;
mod keystone;
pub mod manifest;
mod molmoact2;
mod noise;
mod norm;
mod pack;
mod parity;
mod prefix;
mod preprocess;
mod prompt;
mod text;

pub use bundle::{
    Bundle, CheckedRead, LoadedGraph, OpenBinary, OpenFile, DEVICE_HTP_ARCH, DEVICE_SOC_MODEL,
};
pub use error::PolicyError;
pub use exec::{count_non_finite, Timings};
pub use fastwam::image::{center_crop_geometry, FastWamImage, PassOrder, PillowBilinear};
pub use fastwam::norm::FastWamNormalizer;
pub use fastwam::state::quat2axisangle;
pub use fastwam::{map_gripper, proprio_row, wan_actions, wan_sigmas, wan_update, FastWam};
pub use keystone::KeyStoneSelector;
pub use manifest::{
    Manifest, OutputGate, ParityGate, PolicyKind, PolicySettings, RawManifest, Threshold,
    ANY_OUTPUT, GATE_FLOOR,
};
pub use molmoact2::{
    initial_trajectory, integrate_step, state_token_ids, MolmoAct2, TextSlot, TEXT_SLOTS,
};
pub use noise::{fill_gaussian, SplitMix64};
pub use norm::{state_token_id, Normalizer};
pub use pack::{
    normalize_pack_text, AttachedPacks, InstructionPacks, PackAttacher, PACK_FILE,
    PACK_INSTRUCTION_FLAG,
};
pub use parity::{BundleParity, EndToEndParity, ObservationFile, StageParity};
pub use prefix::{prefix_mask, ActionPrefix, PrefixMethod};
pub use preprocess::Preprocessor;
pub use prompt::{attention_bias, Instruction};
pub use text::{RenderedText, TextRenderer};

use vla_qnn::Backend;

/// One observation as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct Observation<'a> {
    /// Camera frames in `frames`.
    pub cameras: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// `cameras x height x width x 3` RGB8, camera-major.
    pub frames: &'a [u8],
    /// The robot state (`state_dims` values); must be finite.
    pub state: &'a [f32],
    /// A fixed instruction's index (below the bundle's count), a rendered text's id
    /// ([`TEXT_INSTRUCTION_FLAG`] set) as [`Policy::instruction_from_text`] gave it, or a
    /// Fast-WAM pack instruction's id ([`PACK_INSTRUCTION_FLAG`] set).
    pub instruction_id: u32,
    /// Seed of the flow-matching noise (KeyStone candidate k uses `seed + k`).
    pub seed: u64,
}

impl Observation<'_> {
    /// The checks every policy makes on the robot side of an observation: the state's
    /// length and finiteness (a non-finite state is refused: fail closed) and the
    /// instruction id against the bundle's fixed list (`instructions`) or, flagged, its
    /// `text_slots` rendered texts or the attached `packs`' instructions: a plain id never
    /// selects a text or a pack's rows.
    pub(crate) fn check_state_and_instruction(
        &self,
        state_dims: usize,
        instructions: usize,
        text_slots: usize,
        packs: Option<&InstructionPacks>,
    ) -> Result<(), PolicyError> {
        if self.state.len() != state_dims {
            return Err(PolicyError::Observation {
                field: "state",
                expected: format!("{state_dims} values"),
                found: format!("{} values", self.state.len()),
            });
        }
        if let Some(i) = self.state.iter().position(|x| !x.is_finite()) {
            return Err(PolicyError::Observation {
                field: "state",
                expected: "finite values".into(),
                found: format!("{} at index {i}", self.state[i]),
            });
        }
        let id = self.instruction_id;
        let known = if id & TEXT_INSTRUCTION_FLAG != 0 {
            ((id & !TEXT_INSTRUCTION_FLAG) as usize) < text_slots
        } else if id & PACK_INSTRUCTION_FLAG != 0 {
            packs.is_some_and(|p| p.contains(id))
        } else {
            (id as usize) < instructions
        };
        if !known {
            let packed = packs.map_or(0, InstructionPacks::instructions);
            return Err(PolicyError::Observation {
                field: "instruction_id",
                expected: format!(
                    "0..{instructions} (the bundle's instructions), one of {text_slots} \
                     rendered texts' ids or one of {packed} pack instructions' ids"
                ),
                found: self.instruction_id.to_string(),
            });
        }
        Ok(())
    }
}

/// Set in the instruction id of a text rendered at run time (the slot below it); ids
/// without it are the bundle's fixed instructions only, so no plain id reaches a text.
/// The same bit the observation ring uses for its text ids.
pub const TEXT_INSTRUCTION_FLAG: u32 = 1 << 31;

/// What the robot side must provide and will receive (ring geometry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Camera frames per observation (0 for an open-loop Fast-WAM bundle).
    pub cameras: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// State values per observation on the ring.
    pub state_dims: usize,
    /// Values per action step.
    pub action_dims: usize,
    /// Steps per chunk (the action horizon H).
    pub chunk_len: usize,
    /// Number of instructions; an observation's `instruction_id` must be below it.
    pub instructions: usize,
}

fn molmoact2_geometry(m: &manifest::MolmoAct2Settings) -> Geometry {
    Geometry {
        cameras: m.cameras,
        height: m.frame_height,
        width: m.frame_width,
        state_dims: m.state_dims,
        action_dims: m.action_dims,
        chunk_len: m.action_horizon,
        instructions: m.instructions.len(),
    }
}

fn fastwam_geometry(f: &manifest::FastWamSettings) -> Geometry {
    match &f.chain {
        Some(c) => Geometry {
            cameras: c.cameras,
            height: c.frame_height,
            width: c.frame_width,
            state_dims: c.ring_state_dims(),
            action_dims: f.action_dims,
            chunk_len: f.action_horizon,
            instructions: c.instructions.len(),
        },
        // Open loop: the observation is not read.
        None => Geometry {
            cameras: 0,
            height: 0,
            width: 0,
            state_dims: 0,
            action_dims: f.action_dims,
            chunk_len: f.action_horizon,
            instructions: 1,
        },
    }
}

impl Manifest {
    /// The geometry a validated manifest's policy needs, without loading any context
    /// (what `Policy::geometry` reports once loaded).
    pub fn geometry(&self) -> Geometry {
        match &self.policy {
            PolicySettings::Molmoact2(m) => molmoact2_geometry(m),
            PolicySettings::Fastwam(f) => fastwam_geometry(f),
        }
    }
}

/// How [`Policy::load_with`] sets up what it starts.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Run first on each helper thread (the non-finite scans' `vla-guard`, MolmoAct2's
    /// `vla-fork` for half of the preprocess and prompt rows), which the inference
    /// thread waits on: give it the inference thread's pinning and priority.
    pub helper_setup: Option<guard::HelperSetup>,
}

/// A loaded, resident policy of either kind; [`Policy::load`] picks by the manifest.
pub enum Policy {
    /// A MolmoAct2 bundle.
    MolmoAct2(Box<MolmoAct2>),
    /// A Fast-WAM bundle.
    FastWam(Box<FastWam>),
}

impl Policy {
    /// Opens the bundle and makes every context resident.
    pub fn load(bundle: &Bundle, backend: &Backend) -> Result<Self, PolicyError> {
        Self::load_with(bundle, backend, &LoadOptions::default())
    }

    /// [`Policy::load`] with options (the helper threads' set-up).
    pub fn load_with(
        bundle: &Bundle,
        backend: &Backend,
        options: &LoadOptions,
    ) -> Result<Self, PolicyError> {
        Ok(match &bundle.manifest.policy {
            PolicySettings::Molmoact2(m) => {
                Policy::MolmoAct2(Box::new(MolmoAct2::load(bundle, m, backend, options)?))
            }
            PolicySettings::Fastwam(f) => {
                Policy::FastWam(Box::new(FastWam::load(bundle, f, backend)?))
            }
        })
    }

    /// The instruction id of an instruction given as text (see
    /// [`MolmoAct2::instruction_from_text`]); a Fast-WAM chain bundle looks it up in its
    /// fixed list and its attached instruction packs ([`FastWam::instruction_from_text`]).
    pub fn instruction_from_text(&mut self, text: &[u8]) -> Result<u32, PolicyError> {
        match self {
            Policy::MolmoAct2(p) => p.instruction_from_text(text),
            Policy::FastWam(p) => p.instruction_from_text(text),
        }
    }

    /// A renderer of instructions given as text, to run off the inference thread (see
    /// [`MolmoAct2::text_renderer`], [`FastWam::text_renderer`]); `None` for MolmoAct2
    /// bundles without a `text` block and open-loop Fast-WAM.
    pub fn text_renderer(&self) -> Option<TextRenderer> {
        match self {
            Policy::MolmoAct2(p) => p.text_renderer(),
            Policy::FastWam(p) => p.text_renderer(),
        }
    }

    /// Installs a text rendered by this policy's [`TextRenderer`] (see
    /// [`MolmoAct2::install_text`]): its instruction id and the text slot it replaced.
    /// What Fast-WAM's renderer gives is an id the policy already holds: nothing to
    /// install (pass `text` empty: it is not kept). `None` for a rendering of the other
    /// policy kind. No allocation.
    pub fn install_text(
        &mut self,
        text: Vec<u8>,
        rendered: RenderedText,
    ) -> Option<(u32, Option<TextSlot>)> {
        match (self, rendered) {
            (Policy::MolmoAct2(p), RenderedText::Prompt(instruction)) => {
                Some(p.install_text(text, instruction))
            }
            // Nothing is kept: the text is dropped here, so the inference thread passes
            // it empty (freeing nothing), as the daemon does.
            (Policy::FastWam(_), RenderedText::Existing(id)) => {
                drop(text);
                Some((id, None))
            }
            _ => None,
        }
    }

    /// Whether `id`, flagged [`PACK_INSTRUCTION_FLAG`], names an attached pack instruction
    /// (no allocation: for the inference thread's readiness check).
    pub fn has_pack_instruction(&self, id: u32) -> bool {
        match self {
            Policy::FastWam(p) => p.packs().is_some_and(|packs| packs.contains(id)),
            Policy::MolmoAct2(_) => false,
        }
    }

    /// Attaches the Fast-WAM instruction pack in `dir` (verified by the caller, e.g. the
    /// OTA store) to this policy: its instructions become selectable by id and by text.
    /// Before any [`TextRenderer`] is handed out (renderers share the packs). Returns the
    /// pack's label and instruction count; refused in one line for MolmoAct2, open-loop
    /// Fast-WAM, another bundle or a pack that does not fit. With `files` (a checker of
    /// the pack's bytes, as [`Bundle::with_files`] takes), each file is read once through
    /// it, the rows into private memory; without, `pack.json` is read and the rows mapped
    /// by path.
    pub fn attach_pack(
        &mut self,
        dir: &std::path::Path,
        files: Option<&dyn OpenFile>,
    ) -> Result<(String, usize), PolicyError> {
        match self {
            Policy::FastWam(p) => p.attach_pack(dir, files),
            Policy::MolmoAct2(_) => Err(PolicyError::Pack {
                pack: dir.display().to_string(),
                reason: "instruction packs are for Fast-WAM bundles (MolmoAct2 renders text)"
                    .into(),
            }),
        }
    }

    /// An attacher of instruction packs to this policy while it runs, for a non-real-time
    /// thread (see the `pack` module); `None` but for a Fast-WAM chain bundle.
    pub fn pack_attacher(&self) -> Option<PackAttacher> {
        match self {
            Policy::FastWam(p) => p.pack_attacher(),
            Policy::MolmoAct2(_) => None,
        }
    }

    /// Installs packs a [`PackAttacher`] of this policy attached, between inferences: `Ok`
    /// with the set it replaced, `Err` with `set` when the policy's packs are not the ones
    /// it was built on (another policy, or another install came first). Either way the
    /// returned set is to be dropped off the inference thread. No allocation, no file I/O.
    pub fn install_packs(&mut self, set: AttachedPacks) -> Result<AttachedPacks, AttachedPacks> {
        match self {
            Policy::FastWam(p) => p.install_packs(set),
            Policy::MolmoAct2(_) => Err(set),
        }
    }

    /// What the robot side must provide and will receive.
    pub fn geometry(&self) -> Geometry {
        match self {
            Policy::MolmoAct2(p) => molmoact2_geometry(&p.settings),
            Policy::FastWam(p) => fastwam_geometry(&p.settings),
        }
    }

    /// Which action dims are discrete commands, never to be interpolated or blended: a
    /// binarized gripper (Fast-WAM's `gripper_binarize`: -1 or 1, nothing between).
    /// MolmoAct2's gripper is continuous.
    pub fn discrete_dims(&self) -> Vec<bool> {
        match self {
            Policy::MolmoAct2(p) => vec![false; p.settings.action_dims],
            Policy::FastWam(p) => {
                let dims = p.settings.action_dims;
                (0..dims)
                    .map(|d| p.settings.gripper_binarize && d + 1 == dims)
                    .collect()
            }
        }
    }

    /// One inference into `actions` (`chunk_len x action_dims`, de-normalized).
    pub fn infer(&mut self, obs: &Observation<'_>, actions: &mut [f32]) -> Result<(), PolicyError> {
        match self {
            Policy::MolmoAct2(p) => p.infer(obs, actions),
            Policy::FastWam(p) => p.infer(obs, actions),
        }
    }

    /// One inference whose overlap continues `prefix` (see the `prefix` module).
    pub fn infer_with_prefix(
        &mut self,
        obs: &Observation<'_>,
        prefix: &ActionPrefix<'_>,
        actions: &mut [f32],
    ) -> Result<(), PolicyError> {
        match self {
            Policy::MolmoAct2(p) => p.infer_conditioned(obs, Some(prefix), actions),
            Policy::FastWam(p) => p.infer_conditioned(obs, Some(prefix), actions),
        }
    }

    /// Per-component wall time of the last inference.
    pub fn timings(&self) -> &Timings {
        match self {
            Policy::MolmoAct2(p) => &p.timings,
            Policy::FastWam(p) => &p.timings,
        }
    }

    /// The host-glue intermediates of the last inference of `obs`, by the end-to-end
    /// golden's names in pipeline order (parity by stage).
    pub fn stages(&self, obs: &Observation<'_>) -> Vec<(String, Vec<f32>)> {
        match self {
            Policy::MolmoAct2(p) => p.stages(obs),
            Policy::FastWam(p) => p.stages(obs.seed),
        }
    }

    /// True when the actions do not depend on the observation: a Fast-WAM bundle with a
    /// constant world model (no chain).
    pub fn open_loop(&self) -> bool {
        match self {
            Policy::MolmoAct2(_) => false,
            Policy::FastWam(p) => p.settings.open_loop(),
        }
    }

    /// Moves the policy's NPU I/O into HTP shared buffers from `rpc` (registered with the
    /// contexts: no copies by QNN around each execute; chained contexts share regions).
    /// Both policies can, in every form; a backend that refuses the registration returns
    /// the error and the policy stays on client buffers.
    pub fn use_shared_buffers(
        &mut self,
        rpc: &std::sync::Arc<vla_qnn::RpcMem>,
    ) -> Result<(), PolicyError> {
        match self {
            Policy::MolmoAct2(p) => p.use_shared_buffers(rpc),
            Policy::FastWam(p) => p.use_shared_buffers(rpc),
        }
    }

    /// Whether the policy's NPU I/O is in HTP shared buffers.
    pub fn on_shared_buffers(&self) -> bool {
        match self {
            Policy::MolmoAct2(p) => p.on_shared_buffers(),
            Policy::FastWam(p) => p.on_shared_buffers(),
        }
    }

    /// Bytes the host glue has copied from one buffer into another since load, in all (see
    /// [`MolmoAct2::host_copy_bytes`], [`FastWam::host_copy_bytes`]). With each graph's
    /// `client_buffer_bytes` (QNN's copies), what an inference copies.
    pub fn host_copy_bytes(&self) -> u64 {
        match self {
            Policy::MolmoAct2(p) => p.host_copy_bytes(),
            Policy::FastWam(p) => p.host_copy_bytes(),
        }
    }

    /// KeyStone's choice in the last inference (KeyStone bundles only).
    pub fn keystone_choice(&self) -> Option<usize> {
        match self {
            Policy::MolmoAct2(p) => p.last_choice(),
            Policy::FastWam(_) => None,
        }
    }

    /// Poisons the output of `component` with NaN after it runs, to exercise the guards.
    #[cfg(feature = "fault-injection")]
    pub fn inject_non_finite(&mut self, component: Option<&str>) {
        match self {
            Policy::MolmoAct2(p) => p.fault = component.map(str::to_owned),
            Policy::FastWam(p) => p.fault = component.map(str::to_owned),
        }
    }

    /// Every resident graph with its component name and golden, in pipeline order.
    pub fn graphs_mut(&mut self) -> Vec<&mut LoadedGraph> {
        match self {
            Policy::MolmoAct2(p) => {
                let p = &mut **p;
                let mut v = vec![&mut p.vision];
                v.extend(p.splits.iter_mut());
                v.push(&mut p.action_context);
                v.push(&mut p.action_step);
                v
            }
            Policy::FastWam(p) => p.graphs_mut(),
        }
    }
}
