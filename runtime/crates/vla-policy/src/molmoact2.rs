//! The MolmoAct2 pipeline: vision -> prompt -> LLM chain -> action_context -> flow loop
//! (optionally KeyStone best-of-K) -> de-normalized action chunk.
//!
//! All buffers are allocated at load. Work that depends only on the instruction is done
//! once: the scaffold stays in the prompt buffer (split 0's input) until the instruction
//! changes, so per observation only the image and state rows are written. Chained
//! contexts write where the next one reads: the hidden state ping-pongs between two more
//! buffers, each split's keys and values land in place in the action_context inputs, and
//! k_ctx/v_ctx are the action_step inputs. One inference allocates nothing. The NaN/Inf
//! scans of the contexts' outputs run on a helper thread (`guard`) while the next context
//! executes: each split's hidden_out during the next split (the last one during
//! action_context), k_ctx/v_ctx during the flow loop. Each verdict is collected before the
//! buffer is written again and before the chunk is handed out, and a failed one names its
//! component. image_embeds is checked by the prompt-row pass that reads it anyway.
//!
//! The two host steps before split 0 (preprocess, prompt rows) each split into halves
//! writing disjoint parts of their buffer; a second helper (`vla-fork`) runs one half
//! while the inference thread runs the other. Both helpers get the loader's set-up
//! (pinning, priority): give the inference threads at least two CPUs, or the halves run
//! one after the other.
//!
//! The host steps between contexts are public functions so the benchmarks time the code
//! the pipeline runs.
//!
//! On HTP shared buffers ([`MolmoAct2::use_shared_buffers`]) every one of those buffers is
//! a region of one registered arena allocated at load, and each context's tensors are
//! registered where the buffers above already chain them: a split's hidden_out is the
//! region the next split reads, its keys and values are its part of action_context's
//! inputs, k_ctx/v_ctx are action_step's. The host glue writes its results into the next
//! context's input region (prompt rows, the trajectory, the timestep), and QNN copies
//! nothing. The guard's scans hold the region they read by `Arc` while the next context
//! runs; that context takes it by `&` (it only reads it), and every region a context
//! writes by `&mut`, so the binding's borrows are what keeps a scan and a write apart.

use crate::bundle::{Bundle, LoadedGraph};
use crate::error::PolicyError;
use crate::exec::{count_non_finite, execute, move_buf, permute, qnn, Buf, GraphIo, Src, Timings};
use crate::guard::{ScanGuard, Verdict};
use crate::keystone::KeyStoneSelector;
use crate::manifest::{MolmoAct2Settings, StepOutput};
use crate::noise::fill_gaussian;
use crate::norm::{state_token_id, Normalizer};
use crate::prefix::{ActionPrefix, PrefixBuffers, PrefixMethod};
use crate::preprocess::Preprocessor;
use crate::prompt::Instruction;
use crate::prompt::PromptTables;
use crate::text::TextPrompt;
use crate::text::TextRenderer;
use crate::TEXT_INSTRUCTION_FLAG;
use crate::{LoadOptions, Observation};
use std::sync::Arc;
use std::time::Instant;
use vla_fork::Fork;
use vla_qnn::{align_region, Backend, Region, RpcMem, SharedBuffer};
use vla_tensor::AlignedBuf;

/// A loaded MolmoAct2 policy: its resident contexts, the host glue's tables and every
/// buffer an inference needs.
pub struct MolmoAct2 {
    /// The bundle's `molmoact2` block.
    pub settings: MolmoAct2Settings,
    pre: Preprocessor,
    prompt: PromptTables,
    state_norm: Normalizer,
    action_norm: Normalizer,
    pub(crate) vision: LoadedGraph,
    vision_io: GraphIo<1, 1>,
    pub(crate) splits: Vec<LoadedGraph>,
    split_io: Vec<GraphIo<2, 3>>,
    pub(crate) action_context: LoadedGraph,
    context_io: GraphIo<2, 2>,
    pub(crate) action_step: LoadedGraph,
    step_io: GraphIo<6, 1>,
    pixel_values: Buf,
    image_embeds: Buf,
    /// Split 0's input: the scaffold of `prompt_instruction` plus the observation rows.
    prompt_hidden: Buf,
    prompt_instruction: Option<usize>,
    /// The buffers below in an `Arc` are shared with the guard's helper while it scans
    /// them, i.e. while the next context runs (`guard`).
    hidden: [Arc<Buf>; 2],
    keys: Buf,
    values: Buf,
    split_kv_bytes: usize,
    k_ctx: Arc<Buf>,
    v_ctx: Arc<Buf>,
    guard: ScanGuard,
    /// Runs half of the preprocess and of the prompt rows.
    fork: Fork,
    trajectory: Buf,
    step_out: Buf,
    timestep: Buf,
    dim_is_pad: Buf,
    /// On shared buffers: the instruction's attention bias (every split's input) and
    /// encoder mask (action_step's) in registered memory, written with the scaffold. On
    /// client buffers the contexts read them from the prompt tables.
    instruction_io: Option<(Buf, Buf)>,
    /// Bytes the host glue has copied from one buffer into another (not computed), in
    /// all: [`MolmoAct2::host_copy_bytes`].
    host_copied: u64,
    candidates: Vec<f32>,
    keystone: Option<KeyStoneSelector>,
    last_choice: Option<usize>,
    pub(crate) timings: Timings,
    state_ids: Vec<usize>,
    /// Component whose output is poisoned after it runs (tests only).
    pub(crate) fault: Option<String>,
    prefix: PrefixBuffers,
    /// Renders instructions given as text (bundles with a `text` block); shared with the
    /// [`TextRenderer`]s handed out, which render off the inference thread.
    text: Option<Arc<TextPrompt>>,
    /// The texts rendered into the slots after the fixed instructions.
    text_slots: Vec<Vec<u8>>,
    /// The slot the next new text replaces once all are used (the oldest rendered).
    text_next: usize,
}

/// Instructions given as text kept rendered at once (each holds an `[S, S]` bias and an
/// `[S, D]` scaffold): the oldest is replaced when a new one arrives.
pub const TEXT_SLOTS: usize = 4;

/// A text slot's text and rendered instruction, as [`MolmoAct2::install_text`] hands back
/// the one it replaced.
pub type TextSlot = (Vec<u8>, Instruction);

/// The state-token id of every state value: normalize, clip, quantize (step 2).
pub fn state_token_ids(norm: &Normalizer, state: &[f32], ids: &mut [usize]) {
    for (i, (&x, id)) in state.iter().zip(ids.iter_mut()).enumerate() {
        *id = state_token_id(norm.normalize(x, i));
    }
}

/// The flow's starting point `[H, width]`: seeded normals with the padded dims zeroed.
pub fn initial_trajectory(seed: u64, x: &mut [f32], width: usize, dims: usize) {
    fill_gaussian(seed, x);
    for (j, v) in x.iter_mut().enumerate() {
        if j % width >= dims {
            *v = 0.0;
        }
    }
}

/// The host side of one flow step: `x = mask(x + dt * out)` for a velocity output,
/// `x = mask(out)` for a next-trajectory output.
pub fn integrate_step(
    x: &mut [f32],
    out: &[f32],
    step_output: StepOutput,
    dt: f32,
    width: usize,
    dims: usize,
) {
    for (j, (xv, ov)) in x.iter_mut().zip(out).enumerate() {
        let keep = if j % width >= dims { 0.0 } else { 1.0 };
        *xv = match step_output {
            StepOutput::Velocity => (*xv + dt * ov) * keep,
            StepOutput::NextTrajectory => ov * keep,
        };
    }
}

/// The helper that runs half of the preprocess and of the prompt rows, set up like the
/// guard's (it too is waited on by the inference thread).
fn start_fork(options: &LoadOptions) -> Result<Fork, PolicyError> {
    let setup = options.helper_setup.clone();
    Fork::start("vla-fork", move || {
        if let Some(setup) = setup {
            setup("vla-fork");
        }
    })
    .map_err(|e| PolicyError::Thread {
        name: "vla-fork",
        reason: e.to_string(),
    })
}

/// The pipeline's own hold of a buffer it shares with the guard's helper while a scan runs.
/// Every scan of it was collected before the pipeline writes it again (the guard hands its
/// clones back with its verdict), so this never fails; a failure is a bug in that order.
fn unique(buf: &mut Arc<Buf>) -> &mut Buf {
    Arc::get_mut(buf).expect("the scan of this buffer was collected before it is written")
}

/// Writes NaN into `buf` when `fault` names `component` (fault-injection builds only).
fn poison(fault: &Option<String>, component: &str, buf: &mut Buf) {
    if cfg!(feature = "fault-injection") && fault.as_deref() == Some(component) {
        if let Some(v) = buf.as_f32_mut().first_mut() {
            *v = f32::NAN;
        }
    }
}

impl MolmoAct2 {
    /// Makes every MolmoAct2 context resident, checks their tensors against the manifest,
    /// reads the prompt tables and allocates every buffer; `settings` is the bundle's
    /// `molmoact2` block (what [`crate::Policy::load`] passes), `options` sets up the helper
    /// threads.
    pub fn load(
        bundle: &Bundle,
        settings: &MolmoAct2Settings,
        backend: &Backend,
        options: &LoadOptions,
    ) -> Result<Self, PolicyError> {
        let m = settings.clone();
        let (s, d) = (m.seq_len, m.hidden);
        let grid = m.crop_size / m.patch_size;
        let layers = m.llm_splits * m.layers_per_split;

        // Every context at once: they share one spill-fill buffer when they need one.
        let split_names: Vec<String> = (0..m.llm_splits).map(|i| format!("llm_split{i}")).collect();
        let mut order: Vec<&str> = vec!["vision"];
        order.extend(split_names.iter().map(String::as_str));
        order.extend(["action_context", "action_step"]);
        let mut loaded = bundle.load_components(backend, &order)?.into_iter();
        let mut next = || loaded.next().expect("one graph per component asked for");
        let vision = next();
        vision.expect_counts(1, 1)?;
        let (pv, _) = vision.input(
            "pixel_values",
            Some(&[1, m.cameras, grid * grid, m.patch_size * m.patch_size * 3]),
        )?;
        let (ie, _) = vision.output("image_embeds", Some(&[m.image_tokens, d]))?;

        let mut splits = Vec::with_capacity(m.llm_splits);
        let mut split_io = Vec::with_capacity(m.llm_splits);
        let kv_split = [m.layers_per_split, 1, s, m.kv_width];
        for _ in 0..m.llm_splits {
            let g = next();
            g.expect_counts(2, 3)?;
            let (hs, _) = g.input("hidden_states", Some(&[1, s, d]))?;
            let (ab, _) = g.input("attention_bias", Some(&[1, 1, s, s]))?;
            let (ho, _) = g.output("hidden_out", Some(&[1, s, d]))?;
            let (k, _) = g.output("keys", Some(&kv_split))?;
            let (v, _) = g.output("values", Some(&kv_split))?;
            split_io.push(GraphIo {
                inputs: [hs, ab],
                outputs: [ho, k, v],
            });
            splits.push(g);
        }

        let action_context = next();
        action_context.expect_counts(2, 2)?;
        let kv_all = [layers, 1, s, m.kv_width];
        let (ck, _) = action_context.input("keys", Some(&kv_all))?;
        let (cv, _) = action_context.input("values", Some(&kv_all))?;
        let (kc, k_ctx_shape) = action_context.output("k_ctx", None)?;
        let (vc, v_ctx_shape) = action_context.output("v_ctx", None)?;
        for (name, shape) in [("k_ctx", &k_ctx_shape), ("v_ctx", &v_ctx_shape)] {
            if shape.last() != Some(&m.action_context_width) {
                return Err(PolicyError::Contract {
                    component: "action_context".into(),
                    tensor: name.into(),
                    expected: format!("last dim {} (action_context_width)", m.action_context_width),
                    found: format!("shape {shape:?}"),
                });
            }
        }

        let action_step = next();
        action_step.expect_counts(6, 1)?;
        let traj = [1, m.action_horizon, m.action_width];
        let (st, _) = action_step.input("trajectory", Some(&traj))?;
        let (ts, _) = action_step.input("timestep", Some(&[1]))?;
        let (sk, _) = action_step.input("k_ctx", Some(&k_ctx_shape))?;
        let (sv, _) = action_step.input("v_ctx", Some(&v_ctx_shape))?;
        let (em, _) = action_step.input("encoder_attention_mask", Some(&[1, s]))?;
        let (ip, _) = action_step.input("action_dim_is_pad", Some(&[1, m.action_width]))?;
        let (nt, _) = action_step.output("next_trajectory", Some(&traj))?;

        let prompt = PromptTables::load(&bundle.npz("prompt tables", &m.prompt)?, &m)?;
        let mut prompt = prompt;
        let text = match &m.text {
            Some(t) => {
                // The text slots' room, so installing a rendered text never allocates.
                prompt.instructions.reserve_exact(TEXT_SLOTS);
                Some(Arc::new(TextPrompt::load(bundle, t, &m)?))
            }
            None => None,
        };
        let mut dim_is_pad = AlignedBuf::zeroed(m.action_width * 4);
        for (i, v) in dim_is_pad.as_f32_mut().iter_mut().enumerate() {
            *v = if i >= m.action_dims { 1.0 } else { 0.0 };
        }
        let k = m.keystone.as_ref().map_or(1, |k| k.k);
        let keystone = m
            .keystone
            .as_ref()
            .map(|ks| KeyStoneSelector::new(ks, m.action_horizon, m.action_dims));
        let mut names: Vec<String> = vec!["vision".into()];
        names.extend((0..m.llm_splits).map(|i| format!("llm_split{i}")));
        names.extend(["action_context".to_string(), "action_step".to_string()]);
        let f32s = |n: usize| Buf::Host(AlignedBuf::zeroed(n * 4));
        let numel = |v: &[usize]| v.iter().product::<usize>();
        Ok(Self {
            pre: Preprocessor::new(
                m.cameras,
                m.frame_height,
                m.frame_width,
                m.crop_size,
                m.patch_size,
            ),
            state_norm: Normalizer::new(&m.state_norm, m.state_dims),
            action_norm: Normalizer::new(&m.action_norm, m.action_dims),
            vision_io: GraphIo {
                inputs: [pv],
                outputs: [ie],
            },
            split_io,
            context_io: GraphIo {
                inputs: [ck, cv],
                outputs: [kc, vc],
            },
            step_io: GraphIo {
                inputs: [st, ts, sk, sv, em, ip],
                outputs: [nt],
            },
            pixel_values: f32s(m.cameras * grid * grid * m.patch_size * m.patch_size * 3),
            image_embeds: f32s(m.image_tokens * d),
            prompt_hidden: f32s(s * d),
            prompt_instruction: None,
            hidden: [Arc::new(f32s(s * d)), Arc::new(f32s(s * d))],
            keys: f32s(numel(&kv_all)),
            values: f32s(numel(&kv_all)),
            split_kv_bytes: numel(&kv_split) * 4,
            k_ctx: Arc::new(f32s(numel(&k_ctx_shape))),
            v_ctx: Arc::new(f32s(numel(&v_ctx_shape))),
            guard: ScanGuard::start(options.helper_setup.clone()).map_err(|e| {
                PolicyError::Thread {
                    name: "vla-guard",
                    reason: e.to_string(),
                }
            })?,
            fork: start_fork(options)?,
            trajectory: f32s(numel(&traj)),
            step_out: f32s(numel(&traj)),
            timestep: f32s(1),
            dim_is_pad: Buf::Host(dim_is_pad),
            instruction_io: None,
            host_copied: 0,
            candidates: vec![0.0; k * m.action_horizon * m.action_dims],
            keystone,
            last_choice: None,
            timings: Timings::new(&names),
            state_ids: vec![0; m.state_dims],
            fault: None,
            prefix: PrefixBuffers::new(m.action_horizon, m.action_dims),
            vision,
            splits,
            action_context,
            action_step,
            prompt,
            text,
            text_slots: Vec::with_capacity(TEXT_SLOTS),
            text_next: 0,
            settings: m,
        })
    }

    /// Moves every context's inputs and outputs into one HTP shared buffer from `rpc`,
    /// split into a region per pipeline buffer and registered with each context where the
    /// pipeline already chains them (see the module doc): from then on QNN copies nothing
    /// around an execute. The buffers' contents move over once, here. On error every
    /// registration is dropped and the policy stays on client buffers.
    pub fn use_shared_buffers(&mut self, rpc: &Arc<RpcMem>) -> Result<(), PolicyError> {
        if self.on_shared_buffers() {
            return Ok(());
        }
        // No scan may hold a buffer that is about to be replaced.
        let _ = self.guard.verdict();
        let instr = &self.prompt.instructions[0];
        let bias_len = instr.attention_bias.len() * 4;
        let mask_len = instr.encoder_mask.len() * 4;
        // One region per buffer, in this order (`regions` below takes them back out).
        let lens = [
            self.pixel_values.as_bytes().len(),
            self.image_embeds.as_bytes().len(),
            self.prompt_hidden.as_bytes().len(),
            self.hidden[0].as_bytes().len(),
            self.hidden[1].as_bytes().len(),
            self.keys.as_bytes().len(),
            self.values.as_bytes().len(),
            self.k_ctx.as_bytes().len(),
            self.v_ctx.as_bytes().len(),
            self.trajectory.as_bytes().len(),
            self.step_out.as_bytes().len(),
            self.timestep.as_bytes().len(),
            self.dim_is_pad.as_bytes().len(),
            bias_len,
            mask_len,
        ];
        let mut at = 0;
        let ranges = lens.map(|n| {
            let r = at..at + n;
            at += align_region(n);
            r
        });
        let arena = SharedBuffer::allocate(rpc, at).map_err(qnn("molmoact2"))?;
        let regions = arena.into_regions(&ranges).map_err(qnn("molmoact2"))?;
        let regions: [Region; 15] = regions.try_into().expect("one region per range");
        let [pv, ie, ph, h0, h1, k, v, kc, vc, tr, so, ts, pad, bias, mask] = &regions;
        let kv = self.split_kv_bytes;
        let bound = (|| {
            let g = &mut self.vision.graph;
            let (vi, vo) = (self.vision_io.inputs, self.vision_io.outputs);
            g.bind_regions(&permute(vi, [(pv, 0)]), &permute(vo, [(ie, 0)]))
                .map_err(qnn("vision"))?;
            for (i, split) in self.splits.iter_mut().enumerate() {
                let (si, so) = (self.split_io[i].inputs, self.split_io[i].outputs);
                let (src, dst) = match i {
                    0 => (ph, h0),
                    _ if i % 2 == 1 => (h0, h1),
                    _ => (h1, h0),
                };
                split
                    .graph
                    .bind_regions(
                        &permute(si, [(src, 0), (bias, 0)]),
                        &permute(so, [(dst, 0), (k, i * kv), (v, i * kv)]),
                    )
                    .map_err(qnn(&split.component))?;
            }
            let (xi, xo) = (self.context_io.inputs, self.context_io.outputs);
            self.action_context
                .graph
                .bind_regions(
                    &permute(xi, [(k, 0), (v, 0)]),
                    &permute(xo, [(kc, 0), (vc, 0)]),
                )
                .map_err(qnn("action_context"))?;
            let (pi, po) = (self.step_io.inputs, self.step_io.outputs);
            self.action_step
                .graph
                .bind_regions(
                    &permute(
                        pi,
                        [(tr, 0), (ts, 0), (kc, 0), (vc, 0), (mask, 0), (pad, 0)],
                    ),
                    &permute(po, [(so, 0)]),
                )
                .map_err(qnn("action_step"))
        })();
        if let Err(e) = bound {
            let splits = self.splits.iter_mut();
            for g in [
                &mut self.vision,
                &mut self.action_context,
                &mut self.action_step,
            ]
            .into_iter()
            .chain(splits)
            {
                g.graph.unbind_shared();
            }
            return Err(e);
        }
        let [pv, ie, ph, h0, h1, k, v, kc, vc, tr, so, ts, pad, bias, mask] = regions;
        let moved = move_buf;
        moved(&mut self.pixel_values, pv);
        moved(&mut self.image_embeds, ie);
        moved(&mut self.prompt_hidden, ph);
        moved(unique(&mut self.hidden[0]), h0);
        moved(unique(&mut self.hidden[1]), h1);
        moved(&mut self.keys, k);
        moved(&mut self.values, v);
        moved(unique(&mut self.k_ctx), kc);
        moved(unique(&mut self.v_ctx), vc);
        moved(&mut self.trajectory, tr);
        moved(&mut self.step_out, so);
        moved(&mut self.timestep, ts);
        moved(&mut self.dim_is_pad, pad);
        self.instruction_io = Some((Buf::Shared(bias), Buf::Shared(mask)));
        // The next inference writes the scaffold, bias and mask of its instruction.
        self.prompt_instruction = None;
        Ok(())
    }

    /// Whether the contexts run on HTP shared buffers.
    pub fn on_shared_buffers(&self) -> bool {
        self.instruction_io.is_some()
    }

    /// Bytes the host glue has copied from one buffer into another since load, in all
    /// (not what it computes): the scaffold (and on shared buffers the attention bias and
    /// encoder mask) when the instruction changes, and each candidate's rows out of the
    /// trajectory. What QNN copies around client buffers is each graph's
    /// `client_buffer_bytes`.
    pub fn host_copy_bytes(&self) -> u64 {
        self.host_copied
    }

    /// The instruction id of `text` (UTF-8 bytes), rendering it when it is not rendered yet:
    /// a fixed instruction of the same text, else one of [`TEXT_SLOTS`] slots, named
    /// `TEXT_INSTRUCTION_FLAG | slot` (the oldest rendered replaced in place; the others keep their ids). Allocates and renders: never on the hot path. A refusal
    /// leaves every rendered instruction as it was.
    pub fn instruction_from_text(&mut self, text: &[u8]) -> Result<u32, PolicyError> {
        if let Some(i) = self
            .settings
            .instructions
            .iter()
            .position(|t| t.as_bytes() == text)
        {
            return Ok(i as u32);
        }
        if let Some(i) = self.text_slots.iter().position(|t| t == text) {
            return Ok(TEXT_INSTRUCTION_FLAG | i as u32);
        }
        let Some(renderer) = &self.text else {
            return Err(PolicyError::Instruction {
                text: String::from_utf8_lossy(text).into_owned(),
                reason: "this bundle takes only its fixed instructions (no molmoact2.text block)"
                    .into(),
            });
        };
        let instruction = renderer.render(text, &self.settings)?;
        Ok(self.install_text(text.to_vec(), instruction).0)
    }

    /// A renderer of instructions given as text for this policy, to run off the inference
    /// thread; `None` for a bundle without a `text` block.
    pub fn text_renderer(&self) -> Option<TextRenderer> {
        Some(TextRenderer::prompt(
            self.text.clone()?,
            Arc::new(self.settings.clone()),
        ))
    }

    /// Puts `instruction`, rendered from `text` by this policy's [`TextRenderer`], into a
    /// text slot: the first free one, else the oldest rendered (replaced in place; the
    /// others keep their ids). Returns its instruction id and what it replaced, for the
    /// caller to drop off the inference thread. Allocates nothing (the slots' capacity is
    /// reserved at load): fit for the inference thread.
    pub fn install_text(
        &mut self,
        text: Vec<u8>,
        instruction: Instruction,
    ) -> (u32, Option<TextSlot>) {
        let fixed = self.settings.instructions.len();
        let (slot, replaced) = if self.text_slots.len() < TEXT_SLOTS {
            self.text_slots.push(text);
            self.prompt.instructions.push(instruction);
            (self.text_slots.len() - 1, None)
        } else {
            let slot = self.text_next;
            let old_text = std::mem::replace(&mut self.text_slots[slot], text);
            let old = std::mem::replace(&mut self.prompt.instructions[fixed + slot], instruction);
            if self.prompt_instruction == Some(fixed + slot) {
                self.prompt_instruction = None; // the prompt buffer holds the old scaffold
            }
            (slot, Some((old_text, old)))
        };
        self.text_next = (slot + 1) % TEXT_SLOTS;
        (TEXT_INSTRUCTION_FLAG | slot as u32, replaced)
    }

    /// Index of the KeyStone candidate chosen by the last inference.
    pub fn last_choice(&self) -> Option<usize> {
        self.last_choice
    }

    /// The normalized candidates `[K, H, action_dims]` of the last inference.
    pub fn candidates(&self) -> &[f32] {
        &self.candidates
    }

    /// Where an instruction id (checked by [`Self::check_observation`]) sits in
    /// `prompt.instructions`: fixed ids first, then the text slots.
    fn instruction_index(&self, id: u32) -> usize {
        if id & TEXT_INSTRUCTION_FLAG != 0 {
            self.settings.instructions.len() + (id & !TEXT_INSTRUCTION_FLAG) as usize
        } else {
            id as usize
        }
    }

    fn check_observation(&self, obs: &Observation<'_>) -> Result<(), PolicyError> {
        let m = &self.settings;
        let geometry = (obs.cameras, obs.height, obs.width);
        if geometry != (m.cameras, m.frame_height, m.frame_width) {
            return Err(PolicyError::Observation {
                field: "frames",
                expected: format!(
                    "{} cameras of {}x{} RGB8",
                    m.cameras, m.frame_height, m.frame_width
                ),
                found: format!("{} cameras of {}x{}", obs.cameras, obs.height, obs.width),
            });
        }
        if obs.frames.len() != self.pre.frames_len() {
            return Err(PolicyError::Observation {
                field: "frames",
                expected: format!("{} bytes", self.pre.frames_len()),
                found: format!("{} bytes", obs.frames.len()),
            });
        }
        obs.check_state_and_instruction(
            m.state_dims,
            m.instructions.len(),
            self.text_slots.len(),
            None,
        )?;
        // LeRobot's pipeline raises on such a gripper ("set normalize_gripper=True"): no
        // action from it, so none from vlad either (the loop holds), never a clipped one.
        if let Some((i, x)) = self.state_norm.refused(obs.state) {
            return Err(PolicyError::Observation {
                field: "state",
                expected: "pass-through (gripper) values in [-1, 1], as LeRobot's pipeline demands"
                    .into(),
                found: format!("{x} at index {i}"),
            });
        }
        Ok(())
    }

    /// Runs one inference; writes `[H, action_dims]` de-normalized actions to `actions`.
    pub fn infer(&mut self, obs: &Observation<'_>, actions: &mut [f32]) -> Result<(), PolicyError> {
        self.infer_conditioned(obs, None, actions)
    }

    /// [`MolmoAct2::infer`], the flow loop optionally conditioned on `prefix` (every
    /// KeyStone candidate starts from the same prefix).
    pub fn infer_conditioned(
        &mut self,
        obs: &Observation<'_>,
        prefix: Option<&ActionPrefix<'_>>,
        actions: &mut [f32],
    ) -> Result<(), PolicyError> {
        self.check_observation(obs)?;
        if let Some(p) = prefix {
            self.prefix.load(p, &self.action_norm)?;
        }
        let m = &self.settings;
        let (h, dims) = (m.action_horizon, m.action_dims);
        if actions.len() != h * dims {
            return Err(PolicyError::Observation {
                field: "action buffer",
                expected: format!("{} values", h * dims),
                found: format!("{} values", actions.len()),
            });
        }
        self.timings.reset();
        let start = Instant::now();
        // A failed inference may have left a scan outstanding: collect it before the
        // buffers are written again (its verdict belongs to that inference).
        let _ = self.guard.verdict();
        self.run_vision(obs)?;
        self.write_prompt(obs)?;
        self.run_llm(self.instruction_index(obs.instruction_id))?;
        self.run_action_context()?;
        // Flow matching, K times for KeyStone (the LLM/KV work above is shared).
        let candidates = self.settings.keystone.as_ref().map_or(1, |k| k.k);
        for c in 0..candidates {
            self.run_flow(obs, c, prefix.is_some())?;
        }
        let verdict = self.guard.verdict();
        self.fail_on(verdict)?;
        let choice = match &mut self.keystone {
            Some(ks) => ks.select(&self.candidates, h * dims),
            None => 0,
        };
        self.last_choice = self.keystone.as_ref().map(|_| choice);
        let chosen = &self.candidates[choice * h * dims..(choice + 1) * h * dims];
        self.action_norm.denormalize_into(chosen, actions);
        self.timings.total = start.elapsed();
        Ok(())
    }

    /// Preprocess and the vision context: the frames to `image_embeds`.
    fn run_vision(&mut self, obs: &Observation<'_>) -> Result<(), PolicyError> {
        self.pre
            .run_on(&mut self.fork, obs.frames, self.pixel_values.as_f32_mut())
            .map_err(|error| PolicyError::Helper {
                step: "preprocess",
                error,
            })?;
        let t = Instant::now();
        execute(
            &mut self.vision.graph,
            self.vision_io,
            [self.pixel_values.src()],
            [self.image_embeds.dst()],
        )
        .map_err(qnn("vision"))?;
        self.timings.add(0, t.elapsed());
        poison(&self.fault, "vision", &mut self.image_embeds);
        Ok(())
    }

    /// The prompt: scaffold (once per instruction) + image embeds (added) + state rows
    /// (replaced).
    fn write_prompt(&mut self, obs: &Observation<'_>) -> Result<(), PolicyError> {
        let index = self.instruction_index(obs.instruction_id);
        let instr = &self.prompt.instructions[index];
        if self.prompt_instruction != Some(index) {
            instr.write_scaffold(self.prompt_hidden.as_f32_mut());
            let mut copied = self.prompt_hidden.as_bytes().len();
            if let Some((bias, mask)) = &mut self.instruction_io {
                bias.as_f32_mut().copy_from_slice(&instr.attention_bias);
                mask.as_f32_mut().copy_from_slice(&instr.encoder_mask);
                copied += bias.as_bytes().len() + mask.as_bytes().len();
            }
            self.host_copied += copied as u64;
            self.prompt_instruction = Some(index);
        }
        state_token_ids(&self.state_norm, obs.state, &mut self.state_ids);
        // The pass that adds image_embeds counts the non-finite sums: vision's guard.
        let bad = instr
            .embed_observation_on(
                &mut self.fork,
                self.prompt_hidden.as_f32_mut(),
                self.image_embeds.as_f32(),
                &self.prompt.state_token_rows,
                &self.state_ids,
                self.settings.hidden,
            )
            .map_err(|error| PolicyError::Helper {
                step: "prompt rows",
                error,
            })?;
        self.fail_on(Some(Verdict { tag: 0, bad }))
    }

    /// The LLM chain: split 0 reads the prompt buffer, then the hidden state ping-pongs;
    /// KV written in place into the action_context inputs.
    fn run_llm(&mut self, instruction: usize) -> Result<(), PolicyError> {
        let bias = match &self.instruction_io {
            Some((bias, _)) => bias.src(),
            None => Src::Host(bytemuck::cast_slice(
                &self.prompt.instructions[instruction].attention_bias,
            )),
        };
        let kv = self.split_kv_bytes;
        for i in 0..self.splits.len() {
            let split = &mut self.splits[i];
            let (a, b) = self.hidden.split_at_mut(1);
            let (src, dst): (&Buf, _) = match i {
                0 => (&self.prompt_hidden, &mut a[0]),
                _ if i % 2 == 1 => (&a[0], &mut b[0]),
                _ => (&b[0], &mut a[0]),
            };
            // Unique: its last scan (split i - 2's) was collected after split i - 1 ran.
            let out = unique(dst);
            let t = Instant::now();
            execute(
                &mut split.graph,
                self.split_io[i],
                [src.src(), bias],
                [
                    out.dst(),
                    self.keys.part_mut(i * kv..(i + 1) * kv),
                    self.values.part_mut(i * kv..(i + 1) * kv),
                ],
            )
            .map_err(qnn(&split.component))?;
            self.timings.add(1 + i, t.elapsed());
            poison(&self.fault, &split.component, out);
            // The hidden state is small next to the KV and carries any overflow of the
            // layer onward, so it is the one scanned per split, during the next context.
            // The previous verdict (vision's or split i - 1's) is collected here.
            let previous = self.guard.scan(1 + i, dst, None);
            self.fail_on(previous)?;
        }
        Ok(())
    }

    /// action_context straight into the action_step inputs.
    fn run_action_context(&mut self) -> Result<(), PolicyError> {
        let ci = 1 + self.splits.len();
        let t = Instant::now();
        execute(
            &mut self.action_context.graph,
            self.context_io,
            [self.keys.src(), self.values.src()],
            // Unique here: the scan outstanding is the last split's hidden_out.
            [unique(&mut self.k_ctx).dst(), unique(&mut self.v_ctx).dst()],
        )
        .map_err(qnn("action_context"))?;
        self.timings.add(ci, t.elapsed());
        poison(&self.fault, "action_context", unique(&mut self.v_ctx));
        // Scanned beside the flow loop, which only reads them; verdict before the chunk.
        // The last split's verdict is collected here.
        let previous = self.guard.scan(ci, &self.k_ctx, Some(&self.v_ctx));
        self.fail_on(previous)
    }

    /// One flow-matching trajectory from candidate `c`'s noise; its first H rows (the
    /// action dims of each) into `candidates`.
    fn run_flow(
        &mut self,
        obs: &Observation<'_>,
        c: usize,
        prefixed: bool,
    ) -> Result<(), PolicyError> {
        let m = &self.settings;
        let (h, dims, width) = (m.action_horizon, m.action_dims, m.action_width);
        initial_trajectory(
            obs.seed.wrapping_add(c as u64),
            self.trajectory.as_f32_mut(),
            width,
            dims,
        );
        if prefixed {
            self.prefix.seed(self.trajectory.as_f32_mut(), width);
        }
        for step in 0..self.settings.flow_steps {
            self.flow_step(self.instruction_index(obs.instruction_id), step, prefixed)?;
        }
        let x = self.trajectory.as_f32();
        let cand = &mut self.candidates[c * h * dims..(c + 1) * h * dims];
        for r in 0..h {
            cand[r * dims..(r + 1) * dims].copy_from_slice(&x[r * width..r * width + dims]);
        }
        self.host_copied += (h * dims * 4) as u64;
        Ok(())
    }

    /// One action_step execution and the trajectory's update from its output.
    fn flow_step(
        &mut self,
        instruction: usize,
        step: usize,
        prefixed: bool,
    ) -> Result<(), PolicyError> {
        let m = &self.settings;
        let (n, dims, width) = (m.flow_steps, m.action_dims, m.action_width);
        let dt = (1.0f64 / n as f64) as f32;
        let mask = match &self.instruction_io {
            Some((_, mask)) => mask.src(),
            None => Src::Host(bytemuck::cast_slice(
                &self.prompt.instructions[instruction].encoder_mask,
            )),
        };
        self.timestep.as_f32_mut()[0] = (step as f64 / n as f64) as f32;
        let t = Instant::now();
        execute(
            &mut self.action_step.graph,
            self.step_io,
            [
                self.trajectory.src(),
                self.timestep.src(),
                // Read here and by the guard's scan: shared borrows.
                self.k_ctx.src(),
                self.v_ctx.src(),
                mask,
                self.dim_is_pad.src(),
            ],
            [self.step_out.dst()],
        )
        .map_err(qnn("action_step"))?;
        self.timings.add(2 + self.splits.len(), t.elapsed());
        poison(&self.fault, "action_step", &mut self.step_out);
        let out = self.step_out.as_f32();
        let bad = count_non_finite(out);
        if bad > 0 {
            let verdict = self.guard.verdict();
            self.fail_on(verdict)?;
            return Err(PolicyError::NonFinite {
                component: "action_step".into(),
                tensor: "next_trajectory".into(),
                count: bad,
            });
        }
        let x = self.trajectory.as_f32_mut();
        match prefixed.then(|| self.prefix.method()) {
            Some(PrefixMethod::VelocityMask) => {
                self.prefix.update(x, out, m.step_output, dt, width)
            }
            inpaint => {
                integrate_step(x, out, m.step_output, dt, width, dims);
                if inpaint.is_some() {
                    // t runs 0 (noise) -> 1 (data); after this step t = (step + 1) / n.
                    let noise_level = 1.0 - ((step + 1) as f64 / n as f64) as f32;
                    self.prefix.inpaint(x, noise_level, width);
                }
            }
        }
        Ok(())
    }

    /// A failed scan as the error naming its component: the tag is the component's index
    /// in the timings (0 vision, 1 + i split i, then action_context).
    fn fail_on(&self, verdict: Option<Verdict>) -> Result<(), PolicyError> {
        let Some(Verdict { tag, bad }) = verdict.filter(|v| v.bad > 0) else {
            return Ok(());
        };
        let (component, tensor) = match tag {
            0 => ("vision".to_string(), "image_embeds"),
            t if t <= self.splits.len() => (self.splits[t - 1].component.clone(), "hidden_out"),
            _ => return Err(self.locate_non_finite()),
        };
        Err(PolicyError::NonFinite {
            component,
            tensor: tensor.into(),
            count: bad,
        })
    }

    /// Names the first component whose output holds NaN/Inf (called only on failure).
    fn locate_non_finite(&self) -> PolicyError {
        let kv = self.split_kv_bytes / 4;
        for (i, split) in self.splits.iter().enumerate() {
            for (tensor, buf) in [("keys", &self.keys), ("values", &self.values)] {
                let bad = count_non_finite(&buf.as_f32()[i * kv..(i + 1) * kv]);
                if bad > 0 {
                    return PolicyError::NonFinite {
                        component: split.component.clone(),
                        tensor: tensor.into(),
                        count: bad,
                    };
                }
            }
        }
        for (tensor, buf) in [("k_ctx", &self.k_ctx), ("v_ctx", &self.v_ctx)] {
            let bad = count_non_finite(buf.as_f32());
            if bad > 0 {
                return PolicyError::NonFinite {
                    component: "action_context".into(),
                    tensor: tensor.into(),
                    count: bad,
                };
            }
        }
        PolicyError::NonFinite {
            component: "action_context".into(),
            tensor: "k_ctx".into(),
            count: 0,
        }
    }
}

impl MolmoAct2 {
    /// The host-glue intermediates of the last inference by the end-to-end golden's
    /// names, in pipeline order (parity by stage; allocates, never on the hot path).
    pub fn stages(&self, obs: &Observation<'_>) -> Vec<(String, Vec<f32>)> {
        let m = &self.settings;
        let instr = self
            .prompt
            .instructions
            .get(self.instruction_index(obs.instruction_id))
            .map_or_else(Vec::new, |i| i.attention_bias.clone());
        let mut noise = vec![0f32; m.action_horizon * m.action_width];
        initial_trajectory(obs.seed, &mut noise, m.action_width, m.action_dims);
        vec![
            ("pixel_values".into(), self.pixel_values.as_f32().to_vec()),
            ("hidden_states".into(), self.prompt_hidden.as_f32().to_vec()),
            ("attention_bias".into(), instr),
            ("k_ctx".into(), self.k_ctx.as_f32().to_vec()),
            ("v_ctx".into(), self.v_ctx.as_f32().to_vec()),
            ("noise".into(), noise),
        ]
    }
}
