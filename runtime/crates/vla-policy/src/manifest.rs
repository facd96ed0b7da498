//! `bundle.json`: the policy bundle manifest (format 1, see `docs/bundle-format.md`).
//!
//! Parsed strictly (unknown fields are errors) and validated for internal consistency
//! before any context is loaded, so a broken manifest is reported by field name and never
//! half-loads a policy.

use serde::Deserialize;
use std::collections::BTreeMap;

mod validate;

/// `bundle.json` as parsed, unknown fields refused, before the cross-field rules are
/// checked: [`RawManifest::validate`] checks them and makes the [`Manifest`]. Its form is
/// the file's (`policy` names the policy, its settings sit under a key of that name),
/// kept so that serde can refuse unknown fields, which it cannot do for an enum tagged by
/// a field of the same object.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawManifest {
    /// Bundle format version; only 1 is accepted.
    pub format: u32,
    /// The bundle's name (for logs, metrics and the OTA manifest).
    pub name: String,
    /// The bundle's version (`MAJOR.MINOR.PATCH`).
    pub version: String,
    /// Which policy's host glue runs the contexts.
    pub policy: PolicyKind,
    /// Informational (`original`, `lp_vtp_sd`, `drift_keystone`, `operator_fused`, `fastwam`).
    #[serde(default)]
    pub variant: Option<String>,
    /// QNN SoC model the context binaries were built for (QCS9075: 77).
    pub soc_model: u32,
    /// Hexagon HTP architecture the context binaries were built for (v73: 73).
    pub htp_arch: u32,
    /// Oldest runtime version that can run this bundle.
    pub min_runtime_version: String,
    /// The contexts by component name (`vision`, `llm_split0`, ..., `action_step`).
    pub components: BTreeMap<String, Component>,
    /// MolmoAct2 settings; must be present exactly when `policy` is `molmoact2`.
    #[serde(default)]
    pub molmoact2: Option<MolmoAct2Settings>,
    /// Fast-WAM settings; must be present exactly when `policy` is `fastwam`.
    #[serde(default)]
    pub fastwam: Option<FastWamSettings>,
    /// Cosine thresholds of the parity gates.
    pub parity: ParityGate,
    /// Bundle-relative path of the end-to-end golden (observation in, actions out).
    pub end_to_end: String,
}

/// The validated `bundle.json`: what a bundle holds and how its policy runs, with the
/// settings of exactly the policy it names.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// Bundle format version (1).
    pub format: u32,
    /// The bundle's name (for logs, metrics and the OTA manifest).
    pub name: String,
    /// The bundle's version (`MAJOR.MINOR.PATCH`).
    pub version: String,
    /// Which policy's host glue runs the contexts, with its settings.
    pub policy: PolicySettings,
    /// Informational (`original`, `lp_vtp_sd`, `drift_keystone`, `operator_fused`, `fastwam`).
    pub variant: Option<String>,
    /// QNN SoC model the context binaries were built for (QCS9075: 77).
    pub soc_model: u32,
    /// Hexagon HTP architecture the context binaries were built for (v73: 73).
    pub htp_arch: u32,
    /// Oldest runtime version that can run this bundle.
    pub min_runtime_version: String,
    /// The contexts by component name (`vision`, `llm_split0`, ..., `action_step`).
    pub components: BTreeMap<String, Component>,
    /// Cosine thresholds of the parity gates.
    pub parity: ParityGate,
    /// Bundle-relative path of the end-to-end golden (observation in, actions out).
    pub end_to_end: String,
}

/// The policy a bundle runs and its settings (`bundle.json` `policy` and the block named
/// after it).
#[derive(Clone, Debug, PartialEq)]
pub enum PolicySettings {
    /// `policy: molmoact2` with its `molmoact2` block.
    Molmoact2(Box<MolmoAct2Settings>),
    /// `policy: fastwam` with its `fastwam` block.
    Fastwam(Box<FastWamSettings>),
}

impl PolicySettings {
    /// Which policy these settings are for.
    pub fn kind(&self) -> PolicyKind {
        match self {
            PolicySettings::Molmoact2(_) => PolicyKind::Molmoact2,
            PolicySettings::Fastwam(_) => PolicyKind::Fastwam,
        }
    }
}

/// The policy a bundle runs (`bundle.json` `policy`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// MolmoAct2: vision, LLM splits, action context and flow-matching action step.
    Molmoact2,
    /// Fast-WAM: an action step on a constant world model or on the world-model chain.
    Fastwam,
}

impl PolicyKind {
    /// The name `bundle.json` spells it with.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Molmoact2 => "molmoact2",
            PolicyKind::Fastwam => "fastwam",
        }
    }
}

/// One context of the bundle.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Component {
    /// Bundle-relative path of the QNN HTP context binary (mapped read-only).
    pub binary: String,
    /// Bundle-relative path of the context's golden I/O npz (its parity gate).
    pub golden: String,
    /// QNN graph name inside the binary; `None`: the binary's only graph.
    #[serde(default)]
    pub graph: Option<String>,
}

/// The parity gates' thresholds.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ParityGate {
    /// Every context's outputs must reach this cosine against their goldens, unless
    /// `contexts` holds an entry for the output.
    pub context_cosine: f64,
    /// The end-to-end actions must reach this cosine against the end-to-end golden. No
    /// per-context entry changes it.
    pub end_to_end_cosine: f64,
    /// Lets an entry of `contexts` go below [`GATE_FLOOR`] (still above 0). Set only when the
    /// importer was told `--allow-low-gate`.
    #[serde(default)]
    pub allow_low_gate: bool,
    /// Per-context, per-output thresholds: context name -> output name (or [`ANY_OUTPUT`])
    /// -> threshold and the reason for it.
    #[serde(default)]
    pub contexts: BTreeMap<String, BTreeMap<String, OutputGate>>,
    /// Per-stage thresholds of the end-to-end run's intermediates the golden stores
    /// (`hidden_states`, `k_ctx`, ...): stage name -> threshold and the reason for it. A
    /// context output with its own gate moves the stages built from it (vision's image
    /// embeddings are rows of `hidden_states`); the end-to-end actions keep their gate.
    #[serde(default)]
    pub stages: BTreeMap<String, OutputGate>,
}

/// The lowest per-output threshold a bundle may set without `allow_low_gate`: below it, a
/// context could be the wrong binary and still pass.
pub const GATE_FLOOR: f64 = 0.99;

/// The output key of a per-context entry that holds every output of the context that has
/// no entry of its own.
pub const ANY_OUTPUT: &str = "*";

/// One output's own threshold (`parity.contexts.<context>.<output>`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutputGate {
    /// The threshold; kept as JSON so that a non-number is refused naming its field.
    pub cosine: serde_json::Value,
    /// Why this output has its own threshold (a card's figure, a calibration report's hash).
    pub reason: String,
}

/// The threshold one output is held to, and where it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    /// Minimum cosine against the golden.
    pub cosine: f64,
    /// `None`: the bundle's `parity.context_cosine`; otherwise the entry's key path and reason.
    pub entry: Option<(String, String)>,
}

impl ParityGate {
    /// Refuses an entry of `context` that names none of its `outputs` (the graph's).
    pub fn check_outputs(&self, context: &str, outputs: &[&str]) -> Result<(), Invalid> {
        let Some(entries) = self.contexts.get(context) else {
            return Ok(());
        };
        match entries
            .keys()
            .find(|k| k.as_str() != ANY_OUTPUT && !outputs.contains(&k.as_str()))
        {
            Some(unknown) => Err(invalid(
                format!("parity.contexts.{context}.{unknown}"),
                format!(
                    "names no output of context `{context}` (its outputs: {})",
                    outputs.join(", ")
                ),
            )),
            None => Ok(()),
        }
    }

    /// Refuses a stage entry that names none of `stages`: the stages of the policy's
    /// end-to-end run that its golden stores (only those are compared).
    pub fn check_stages(&self, stages: &[&str]) -> Result<(), Invalid> {
        match self.stages.keys().find(|k| !stages.contains(&k.as_str())) {
            Some(unknown) => Err(invalid(
                format!("parity.stages.{unknown}"),
                format!(
                    "names no stage of the end-to-end run that its golden stores (those: {})",
                    stages.join(", ")
                ),
            )),
            None => Ok(()),
        }
    }

    /// The threshold stage `stage` of the end-to-end run is held to.
    pub fn stage_threshold(&self, stage: &str) -> Threshold {
        match self.stages.get(stage) {
            Some(g) => Threshold {
                cosine: g.cosine.as_f64().unwrap_or(f64::NAN),
                entry: Some((format!("parity.stages.{stage}"), g.reason.clone())),
            },
            None => Threshold {
                cosine: self.context_cosine,
                entry: None,
            },
        }
    }

    /// The threshold output `output` of context `context` is held to.
    pub fn threshold(&self, context: &str, output: &str) -> Threshold {
        let entry = self.contexts.get(context).and_then(|outs| {
            outs.get(output)
                .map(|g| (output, g))
                .or_else(|| outs.get(ANY_OUTPUT).map(|g| (ANY_OUTPUT, g)))
        });
        match entry {
            Some((key, g)) => Threshold {
                cosine: g.cosine.as_f64().unwrap_or(f64::NAN),
                entry: Some((format!("parity.contexts.{context}.{key}"), g.reason.clone())),
            },
            None => Threshold {
                cosine: self.context_cosine,
                entry: None,
            },
        }
    }
}

/// What MolmoAct2's `action_step` graph returns (`step_output`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StepOutput {
    /// The graph returns the velocity v; the host integrates `x + dt * v`.
    Velocity,
    /// The graph returns `x + dt * v` itself.
    NextTrajectory,
}

/// How KeyStone picks one of its candidate trajectories (`keystone.selector`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    /// Upstream `medoid`.
    Medoid,
    /// Upstream `cluster_medoid_guarded` (its default).
    GuardedMedoid,
    /// Upstream `cluster_medoid`: the largest cluster's medoid, no unimodality guard.
    ClusterMedoid,
}

/// Distance between KeyStone candidates (`keystone.distance`), computed in f32 as
/// `torch.cdist`'s direct CPU kernel: bit for bit with upstream up to K = 25 candidates.
/// Above 25, torch switches l2 to a matrix-product form whose rounding vlad does not
/// reproduce (measured gaps up to 1.1e-4 off the diagonal, 0.025 on it; vla-policy's
/// `tests/upstream.rs` caps them and checks the picks).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Distance {
    /// Euclidean distance.
    L2,
    /// Sum of absolute differences.
    L1,
    /// `1 - cos` of the two flattened candidates (each divided by its norm + 1e-8).
    Cosine,
}

/// KeyStone: run `k` candidate inferences (seeds `seed + i`) and select one.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeyStone {
    /// Number of candidates, 1..=64.
    pub k: usize,
    /// How the candidate is picked.
    pub selector: Selector,
    /// Distance between candidates (default `l2`).
    #[serde(default = "default_distance")]
    pub distance: Distance,
    /// Rows of each candidate the distances use; `None`: the whole horizon.
    #[serde(default)]
    pub executed_steps: Option<usize>,
    /// `guarded_medoid` only: above this spread (`|mean - medoid|` over the median pairwise
    /// distance) k-means picks the largest cluster's medoid (default 0.3).
    #[serde(default = "default_spread")]
    pub spread_threshold: f64,
    /// Upstream `cluster_medoid_num_clusters` (C of the k-means; clustering uses min(C, K)).
    #[serde(default = "default_clusters")]
    pub num_clusters: usize,
}

fn default_clusters() -> usize {
    2
}

fn default_distance() -> Distance {
    Distance::L2
}
fn default_spread() -> f64 {
    0.3
}

/// How a normalization block maps raw values to the policy's space.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NormMode {
    /// Between the quantile bounds `low`/`high` (q01/q99 or q10/q90), to [-1, 1].
    Quantile,
    /// `(x - mean) / std`.
    MeanStd,
    /// Between the dataset's `low` (min) and `high` (max), to [-1, 1].
    MinMax,
    /// Values pass unchanged.
    Identity,
}

/// Whose normalizer a MolmoAct2 checkpoint is run with: they differ in their floors, their
/// zero mask, what they clip and what they refuse (`norm.rs` has the rules).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NormFollows {
    /// The Hugging Face model's `_FeatureNormalizer` (`predict_action`): an HF checkpoint.
    #[default]
    HfFeatureNormalizer,
    /// LeRobot's policy pipeline (`select_action`): a LeRobot checkpoint.
    LerobotPipeline,
}

impl NormFollows {
    /// The name the bundle spells it with.
    pub fn as_str(self) -> &'static str {
        match self {
            NormFollows::HfFeatureNormalizer => "hf_feature_normalizer",
            NormFollows::LerobotPipeline => "lerobot_pipeline",
        }
    }
}

/// A normalization block (`state_norm`, `action_norm`); the statistics are per dim, and
/// only those the mode uses need be present.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Normalization {
    /// How values are mapped.
    pub mode: NormMode,
    /// Absent in bundles made before the field existed: those followed the HF normalizer.
    #[serde(default)]
    pub follows: NormFollows,
    /// LeRobot's normalizer `eps` (its step config's; 1e-8 when absent). Only with
    /// `lerobot_pipeline`: the HF normalizer's floor is fixed.
    #[serde(default)]
    pub eps: Option<f32>,
    /// Lower bounds per dim (`quantile`, `min_max`).
    #[serde(default)]
    pub low: Option<Vec<f32>>,
    /// Upper bounds per dim (`quantile`, `min_max`); may equal `low` (the divisor is floored).
    #[serde(default)]
    pub high: Option<Vec<f32>>,
    /// Means per dim (`mean_std`).
    #[serde(default)]
    pub mean: Option<Vec<f32>>,
    /// Standard deviations per dim (`mean_std`); may be 0 (the divisor is floored).
    #[serde(default)]
    pub std: Option<Vec<f32>>,
    /// Dims left unnormalized (e.g. the gripper); `None`: none.
    #[serde(default)]
    pub passthrough: Option<Vec<bool>>,
    /// Dims whose dataset min equals its max: normalized to 0 (upstream's `zero_mask`;
    /// in min_max mode also every dim with `low == high`).
    #[serde(default)]
    pub constant: Option<Vec<bool>>,
}

/// The `molmoact2` block: shapes of the contexts and the host glue's parameters.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MolmoAct2Settings {
    /// Camera frames per observation (2: `image`, `wrist_image`).
    pub cameras: usize,
    /// Raw RGB8 frame height the bundle expects, in pixels.
    pub frame_height: usize,
    /// Raw RGB8 frame width the bundle expects, in pixels.
    pub frame_width: usize,
    /// Side of the square the frames are resized to for the vision context, in pixels.
    pub crop_size: usize,
    /// ViT patch side in pixels (14).
    pub patch_size: usize,
    /// Rows of `image_embeds`, all cameras together.
    pub image_tokens: usize,
    /// Prompt length S in tokens.
    pub seq_len: usize,
    /// Rows of left padding the exported LLM contexts' baked RoPE positions assume
    /// (row r has position `max(r - rope_left_pad, 0)`, upstream's
    /// `clamp(cumsum(mask) - 1, 0)` for that padding). When set, every instruction must
    /// be padded by exactly this many rows; `null` leaves the padding unchecked.
    #[serde(default)]
    pub rope_left_pad: Option<usize>,
    /// LLM width D.
    pub hidden: usize,
    /// Number of LLM split contexts (at most 64).
    pub llm_splits: usize,
    /// Decoder layers per split.
    pub layers_per_split: usize,
    /// Last dim of the KV cache `[splits * layers, 1, S, kv_width]`.
    pub kv_width: usize,
    /// Last dim of action_context's `k_ctx` / `v_ctx`.
    pub action_context_width: usize,
    /// Steps per chunk H: the trajectory is `[1, H, action_width]`.
    pub action_horizon: usize,
    /// Width of the trajectory rows; the first `action_dims` are real, the rest padding.
    pub action_width: usize,
    /// Real action values per step.
    pub action_dims: usize,
    /// Euler steps of the flow loop (10 original, 2 SD, 1 Drift).
    pub flow_steps: usize,
    /// What the action_step graph returns.
    pub step_output: StepOutput,
    /// KeyStone candidate selection; `None`: one inference per chunk.
    #[serde(default)]
    pub keystone: Option<KeyStone>,
    /// Robot state length.
    pub state_dims: usize,
    /// Normalization of the robot state.
    pub state_norm: Normalization,
    /// De-normalization of the `action_dims` outputs.
    pub action_norm: Normalization,
    /// Value written into the attention bias for a blocked (query, key) pair (upstream:
    /// `finfo(f32).min`).
    pub attention_blocked_value: f32,
    /// Bundle-relative path of the prompt tables npz.
    pub prompt: String,
    /// The instruction texts; an observation's `instruction_id` indexes them.
    pub instructions: Vec<String>,
    /// What vlad needs to render an instruction given as text at run time; absent: only
    /// the fixed `instructions` (see docs/prompt-text.md).
    #[serde(default)]
    pub text: Option<TextSettings>,
}

/// The `molmoact2.text` block: the checkpoint's tokenizer and text embedding table and the
/// prompt template's settings, as the importer resolved them from the checkpoint.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TextSettings {
    /// Bundle-relative path of the checkpoint's `tokenizer.json`.
    pub tokenizer: String,
    /// Bundle-relative path of its `tokenizer_config.json` (BOS, EOS, PAD), when it has one.
    #[serde(default)]
    pub tokenizer_config: Option<String>,
    /// Bundle-relative path of the embedding table `.npy` `[V, D]`, in the checkpoint's dtype
    /// (f32 or f16; bf16 as its u16 bit patterns, with `embedding_dtype` "bf16").
    pub embedding: String,
    /// "bf16" when the table holds bf16 bit patterns; absent: the `.npy` dtype says it.
    #[serde(default)]
    pub embedding_dtype: Option<String>,
    /// Pooled image tokens per camera `[rows, cols]`.
    pub grid: [usize; 2],
    /// `<im_col>` after each row of patches.
    pub col_tokens: bool,
    /// The setup text (`setup_type`).
    pub setup: String,
    /// The control mode text (`control_mode`).
    pub control: String,
    /// Wrap the setup text in its markers.
    pub add_setup_tokens: bool,
    /// Wrap the control text in its markers.
    pub add_control_tokens: bool,
    /// Normalize the task text as upstream does.
    pub normalize_language: bool,
    /// The upstream version whose prompt layout is followed.
    pub upstream: String,
    /// The pack step's cap, when the checkpoint states one.
    #[serde(default)]
    pub max_sequence_length: Option<usize>,
    /// The checkpoint's action mode: "continuous" or "both".
    pub action_mode: String,
}

/// The `fastwam` block: the action step's shape, its flow schedule and one of the two
/// world-model forms.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FastWamSettings {
    /// Steps per chunk H: `latents_action` is `[1, H, action_dims]`.
    pub action_horizon: usize,
    /// Action values per step.
    pub action_dims: usize,
    /// Steps N of the Wan flow schedule (upstream LIBERO eval: 10).
    pub flow_steps: usize,
    /// Shift of the Wan flow schedule (upstream LIBERO eval: 5.0).
    pub shift: f64,
    /// The constant-world-model form (open loop): fixed `video_keys`, `video_values`,
    /// `context`, `context_mask` for action_step. Exactly one of this and `chain`.
    #[serde(default)]
    pub world_model: Option<String>,
    /// The closed-loop form: the world-model chain computes them per observation.
    #[serde(default)]
    pub chain: Option<FastWamChain>,
    /// Fast-WAM's own normalizer for the actions (`identity` allowed).
    pub action_norm: Normalization,
    /// Binarize the gripper (last dim) after de-normalizing and [`Self::gripper_map`].
    #[serde(default)]
    pub gripper_binarize: bool,
    /// What is done to the gripper dim after de-normalizing.
    #[serde(default)]
    pub gripper_map: GripperMap,
}

/// Upstream Fast-WAM's LIBERO evaluation (github yuantianyuan01/FastWAM 45d8e14):
/// `configs/train.yaml` `eval_num_inference_steps: 10`, `configs/model/fastwam.yaml`
/// `infer_shift: 5.0` (`sim_libero.yaml` leaves `sigma_shift` null), `sim_libero.yaml`
/// `binarize_gripper: true`, and the eval's `g*2 - 1`, `invert_gripper_action` gripper map.
pub const UPSTREAM_LIBERO_FLOW_STEPS: usize = 10;
/// Upstream's LIBERO eval flow steps (`eval_num_inference_steps`).
pub const UPSTREAM_LIBERO_SHIFT: f64 = 5.0;
/// Upstream's LIBERO eval schedule shift (`infer_shift`).
pub const UPSTREAM_LIBERO_GRIPPER_MAP: GripperMap = GripperMap::Libero;
/// Upstream's LIBERO eval gripper map (`g*2 - 1`, inverted).
pub const UPSTREAM_LIBERO_GRIPPER_BINARIZE: bool = true;

impl FastWamSettings {
    /// True when the actions do not depend on the observation (constant world model).
    pub fn open_loop(&self) -> bool {
        self.chain.is_none()
    }

    /// The settings that differ from upstream's LIBERO eval, each as `name value (upstream
    /// value)`, joined by ", " (None when the bundle runs upstream's settings).
    pub fn upstream_eval_deviations(&self) -> Option<String> {
        let mut d = Vec::new();
        if self.flow_steps != UPSTREAM_LIBERO_FLOW_STEPS {
            d.push(format!(
                "flow_steps {} (upstream {UPSTREAM_LIBERO_FLOW_STEPS})",
                self.flow_steps
            ));
        }
        if self.shift != UPSTREAM_LIBERO_SHIFT {
            d.push(format!(
                "shift {} (upstream {UPSTREAM_LIBERO_SHIFT})",
                self.shift
            ));
        }
        if self.gripper_map != UPSTREAM_LIBERO_GRIPPER_MAP {
            d.push(format!(
                "gripper_map {} (upstream {})",
                self.gripper_map.name(),
                UPSTREAM_LIBERO_GRIPPER_MAP.name()
            ));
        }
        if self.gripper_binarize != UPSTREAM_LIBERO_GRIPPER_BINARIZE {
            d.push(format!(
                "gripper_binarize {} (upstream {UPSTREAM_LIBERO_GRIPPER_BINARIZE})",
                self.gripper_binarize
            ));
        }
        (!d.is_empty()).then(|| d.join(", "))
    }
}

/// What happens to the last action dim after de-normalizing.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GripperMap {
    /// Left as it is (binarized on `g >= 0` with `gripper_binarize`): the format-1 rule.
    #[default]
    None,
    /// Upstream LIBERO eval: `g = -(g * 2 - 1)`, then `sign(g)` with `gripper_binarize`.
    Libero,
}

impl GripperMap {
    /// The setting's name in `bundle.json`.
    pub fn name(self) -> &'static str {
        match self {
            GripperMap::None => "none",
            GripperMap::Libero => "libero",
        }
    }
}

/// The Fast-WAM world-model chain: wm_vae_enc -> wm_embed -> wm_prefill_split0..K-1.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FastWamChain {
    /// Camera frames per observation.
    pub cameras: usize,
    /// Raw RGB8 frame height, in pixels.
    pub frame_height: usize,
    /// Raw RGB8 frame width, in pixels.
    pub frame_width: usize,
    /// Each camera's size after the centre-crop resize; the image is
    /// `[1, 3, camera_height, cameras * camera_width]`.
    pub camera_height: usize,
    /// See [`Self::camera_height`].
    pub camera_width: usize,
    /// Per camera: turn the frame by 180 degrees first (LIBERO's cameras).
    pub rotate_180: Vec<bool>,
    /// Channels Z of wm_vae_enc's `latents [1, Z, lh, lw]`.
    pub latent_channels: usize,
    /// Height lh of the latents.
    pub latent_height: usize,
    /// Width lw of the latents.
    pub latent_width: usize,
    /// Video tokens T out of wm_embed.
    pub video_tokens: usize,
    /// Width W of the video tokens.
    pub video_width: usize,
    /// Layers of each prefill split, in order; they must add up to action_step's.
    pub prefill_layers: Vec<usize>,
    /// Text rows M of the context (128 in Fast-WAM); row M is the proprio row.
    pub text_tokens: usize,
    /// Width E of the context rows (4096 in Fast-WAM).
    pub context_width: usize,
    /// Values of the state the policy normalizes (8 for LIBERO: eef position 3, axis-angle
    /// 3, gripper qpos 2).
    pub state_dims: usize,
    /// What the robot writes on the ring in place of that state (see [`StateInput`]).
    #[serde(default)]
    pub state_input: StateInput,
    /// Fast-WAM's normalizer for the state.
    pub state_norm: Normalization,
    /// npz: `text_rows [instructions, text_tokens, context_width]` (f16 or f32),
    /// `proprio_weight [context_width, state_dims]`, `proprio_bias [context_width]` (f32).
    pub tables: String,
    /// The task strings; instruction i uses `text_rows[i]`.
    pub instructions: Vec<String>,
}

/// The state the robot writes on the observation ring for a Fast-WAM chain.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StateInput {
    /// The policy's state itself, `state_dims` values, normalized as it comes.
    #[default]
    State,
    /// Upstream LIBERO's raw robot state, 9 values: eef position (3), eef quaternion (4,
    /// robosuite's x, y, z, w order), gripper qpos (2). The host turns it into the 8 values
    /// the policy normalizes as upstream's eval does (`eef_pos + quat2axisangle(eef_quat) +
    /// gripper_qpos`); needs `state_dims` 8.
    EefPosQuatGripper,
}

impl StateInput {
    /// The setting's name in `bundle.json`.
    pub fn name(self) -> &'static str {
        match self {
            StateInput::State => "state",
            StateInput::EefPosQuatGripper => "eef_pos_quat_gripper",
        }
    }
}

impl FastWamChain {
    /// Values per observation on the ring: `state_dims`, or 9 for `eef_pos_quat_gripper`.
    pub fn ring_state_dims(&self) -> usize {
        match self.state_input {
            StateInput::State => self.state_dims,
            StateInput::EefPosQuatGripper => EEF_POS_QUAT_GRIPPER_DIMS,
        }
    }
}

/// The raw LIBERO robot state: position 3, quaternion 4, gripper qpos 2.
pub const EEF_POS_QUAT_GRIPPER_DIMS: usize = 9;
/// The state upstream builds from it: position 3, axis-angle 3, gripper qpos 2.
pub const EEF_POS_AXISANGLE_GRIPPER_DIMS: usize = 8;

/// Most prefill splits a Fast-WAM chain may have.
pub const MAX_PREFILL_SPLITS: usize = 64;

/// A manifest rule that does not hold: `field` is a dotted path.
#[derive(Clone, Debug, PartialEq)]
pub struct Invalid {
    /// The field as a dotted path (e.g. `molmoact2.action_norm.low`).
    pub field: String,
    /// The rule it breaks, as one line.
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Invalid {
    Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Most LLM splits (one context binary each) a MolmoAct2 bundle may have.
pub const MAX_LLM_SPLITS: usize = 64;

impl RawManifest {
    /// Parses `bundle.json` bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

impl Manifest {
    /// MolmoAct2's settings, when the bundle runs MolmoAct2.
    pub fn molmoact2(&self) -> Option<&MolmoAct2Settings> {
        match &self.policy {
            PolicySettings::Molmoact2(m) => Some(m),
            PolicySettings::Fastwam(_) => None,
        }
    }

    /// Fast-WAM's settings, when the bundle runs Fast-WAM.
    pub fn fastwam(&self) -> Option<&FastWamSettings> {
        match &self.policy {
            PolicySettings::Fastwam(f) => Some(f),
            PolicySettings::Molmoact2(_) => None,
        }
    }

    /// The component names this policy needs, in pipeline order.
    pub fn required_components(&self) -> Vec<String> {
        match &self.policy {
            PolicySettings::Molmoact2(m) => {
                let mut v = vec!["vision".to_string()];
                v.extend((0..m.llm_splits).map(|i| format!("llm_split{i}")));
                v.push("action_context".into());
                v.push("action_step".into());
                v
            }
            PolicySettings::Fastwam(f) => match &f.chain {
                Some(c) => {
                    let mut v = vec!["wm_vae_enc".to_string(), "wm_embed".to_string()];
                    v.extend((0..c.prefill_layers.len()).map(|i| format!("wm_prefill_split{i}")));
                    v.push("action_step".into());
                    v
                }
                None => vec!["action_step".to_string()],
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The closed-loop fixture's manifest, edited by `edit`.
    fn closed_loop(edit: impl FnOnce(&mut serde_json::Value)) -> RawManifest {
        let path =
            vla_test_support::repo_root().join("golden/bundles/fastwam-closed-loop/bundle.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        edit(&mut v);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn state_input_defaults_to_the_state_and_sets_the_rings_state_length() {
        let m = closed_loop(|_| {});
        let c = m.fastwam.as_ref().unwrap().chain.as_ref().unwrap();
        assert_eq!(c.state_input, StateInput::State);
        assert_eq!(m.validate().unwrap().geometry().state_dims, 8);
        let m =
            closed_loop(|v| v["fastwam"]["chain"]["state_input"] = "eef_pos_quat_gripper".into());
        let m = m.validate().unwrap();
        assert_eq!(
            m.geometry().state_dims,
            9,
            "position 3 + quaternion 4 + gripper 2"
        );
        let m = closed_loop(|v| {
            v["fastwam"]["chain"]["state_input"] = "eef_pos_quat_gripper".into();
            v["fastwam"]["chain"]["state_dims"] = 7.into();
            v["fastwam"]["chain"]["state_norm"]["low"] = serde_json::json!(vec![0.0; 7]);
            v["fastwam"]["chain"]["state_norm"]["high"] = serde_json::json!(vec![1.0; 7]);
        });
        let e = m.validate().unwrap_err();
        assert_eq!(e.field, "fastwam.chain.state_input");
        assert!(e.reason.contains("state_dims is 7"), "{}", e.reason);
        let path =
            vla_test_support::repo_root().join("golden/bundles/fastwam-closed-loop/bundle.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        v["fastwam"]["chain"]["state_input"] = "eef_pos_quat".into();
        let e = serde_json::from_value::<RawManifest>(v)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("eef_pos_quat") && e.contains("eef_pos_quat_gripper"),
            "{e}"
        );
    }

    #[test]
    fn deviations_from_upstreams_libero_eval_are_named_with_upstreams_values() {
        let f = closed_loop(|_| {}).fastwam.unwrap();
        assert_eq!(
            f.upstream_eval_deviations(),
            None,
            "the fixture runs upstream's settings"
        );
        let f = closed_loop(|v| {
            v["fastwam"]["flow_steps"] = 4.into();
            v["fastwam"]["shift"] = 3.0.into();
            v["fastwam"]["gripper_map"] = "none".into();
            v["fastwam"]["gripper_binarize"] = false.into();
        })
        .fastwam
        .unwrap();
        assert_eq!(
            f.upstream_eval_deviations().unwrap(),
            "flow_steps 4 (upstream 10), shift 3 (upstream 5), gripper_map none (upstream libero), \
             gripper_binarize false (upstream true)"
        );
    }

    fn gated(entry: serde_json::Value, allow_low: bool) -> Result<(), Invalid> {
        closed_loop(|v| {
            v["parity"]["contexts"] = entry;
            v["parity"]["allow_low_gate"] = allow_low.into();
        })
        .validate()
        .map(drop)
    }

    #[test]
    fn per_output_gates_are_refused_naming_the_entry() {
        use serde_json::json;
        let ok = json!({"wm_embed": {"video_tokens": {"cosine": 0.998, "reason": "card"}}});
        gated(ok, false).unwrap();
        let any = json!({"wm_embed": {"*": {"cosine": 0.995, "reason": "card"}}});
        gated(any, false).unwrap();
        let cases = [
            (
                json!({"vison": {"image_embeds": {"cosine": 0.998, "reason": "r"}}}),
                "parity.contexts.vison",
                "names no component",
            ),
            (
                json!({"wm_embed": {"video_tokens": {"cosine": "0.998", "reason": "r"}}}),
                "parity.contexts.wm_embed.video_tokens.cosine",
                "is not a number",
            ),
            (
                json!({"wm_embed": {"video_tokens": {"cosine": 1.0001, "reason": "r"}}}),
                "parity.contexts.wm_embed.video_tokens.cosine",
                "1.0001 is not in (0.99, 1]",
            ),
            (
                json!({"wm_embed": {"video_tokens": {"cosine": 0.98, "reason": "r"}}}),
                "parity.contexts.wm_embed.video_tokens.cosine",
                "needs parity.allow_low_gate",
            ),
            (
                json!({"wm_embed": {"video_tokens": {"cosine": 0.999, "reason": " "}}}),
                "parity.contexts.wm_embed.video_tokens.reason",
                "is empty",
            ),
            (
                json!({"wm_embed": {}}),
                "parity.contexts.wm_embed",
                "holds no output",
            ),
            // The end-to-end gate is no context: no entry can reach it.
            (
                json!({"end_to_end": {"actions": {"cosine": 0.995, "reason": "r"}}}),
                "parity.contexts.end_to_end",
                "names no component",
            ),
        ];
        for (entry, field, reason) in cases {
            let e = gated(entry.clone(), false).unwrap_err();
            assert_eq!(e.field, field, "{entry}");
            assert!(e.reason.contains(reason), "{entry}: {}", e.reason);
        }
        let low = json!({"wm_embed": {"video_tokens": {"cosine": 0.98, "reason": "r"}}});
        gated(low, true).unwrap();
        // The defaults obey the floor too: lowering them would gate every output loosely.
        for field in ["context_cosine", "end_to_end_cosine"] {
            let m = closed_loop(|v| v["parity"][field] = 0.5.into());
            let e = m.validate().unwrap_err();
            assert_eq!(e.field, format!("parity.{field}"));
            assert!(
                e.reason.contains("needs parity.allow_low_gate"),
                "{}",
                e.reason
            );
            let m = closed_loop(|v| {
                v["parity"][field] = 0.5.into();
                v["parity"]["allow_low_gate"] = true.into();
            });
            m.validate().unwrap();
        }
        let zero = json!({"wm_embed": {"video_tokens": {"cosine": 0.0, "reason": "r"}}});
        assert!(gated(zero, true)
            .unwrap_err()
            .reason
            .contains("not in (0, 1]"));
    }

    #[test]
    fn an_output_is_held_to_its_entry_then_the_contexts_wildcard_then_the_default() {
        use serde_json::json;
        let m = closed_loop(|v| {
            v["parity"]["contexts"] = json!({"wm_embed": {
                "video_tokens": {"cosine": 0.998, "reason": "the card"},
                "*": {"cosine": 0.995, "reason": "fp16"},
            }})
        });
        let p = &m.parity;
        let own = p.threshold("wm_embed", "video_tokens");
        assert_eq!(own.cosine, 0.998);
        assert_eq!(
            own.entry,
            Some((
                "parity.contexts.wm_embed.video_tokens".into(),
                "the card".into()
            ))
        );
        assert_eq!(p.threshold("wm_embed", "context_embedding").cosine, 0.995);
        let default = p.threshold("action_step", "pred_noise");
        assert_eq!((default.cosine, default.entry), (p.context_cosine, None));
        assert!(p
            .check_outputs("wm_embed", &["video_tokens", "context_embedding"])
            .is_ok());
        let m = closed_loop(|v| {
            v["parity"]["stages"] = json!({"latents": {"cosine": 0.9995, "reason": "fp16"}})
        });
        let m = m.validate().unwrap();
        let t = m.parity.stage_threshold("latents");
        assert_eq!(t.cosine, 0.9995);
        assert_eq!(t.entry.unwrap().0, "parity.stages.latents");
        assert_eq!(
            m.parity.stage_threshold("image").cosine,
            m.parity.context_cosine
        );
        assert!(m.parity.check_stages(&["image", "latents"]).is_ok());
        let e = m.parity.check_stages(&["image"]).unwrap_err();
        assert_eq!(e.field, "parity.stages.latents");
        let bad = closed_loop(|v| {
            v["parity"]["stages"] = json!({"latents": {"cosine": 1.2, "reason": "x"}})
        });
        assert_eq!(
            bad.validate().unwrap_err().field,
            "parity.stages.latents.cosine"
        );
        let e = p
            .check_outputs("wm_embed", &["context_embedding"])
            .unwrap_err();
        assert_eq!(e.field, "parity.contexts.wm_embed.video_tokens");
        assert!(
            e.reason.contains("its outputs: context_embedding"),
            "{}",
            e.reason
        );
    }
}
