//! Host work per inference at the seeds' full dimensions, on synthetic tensors, with no
//! graph execution: every step between the contexts, through the same `vla-policy`
//! functions the pipelines call, timed step by step, next to the memory-bandwidth floor
//! (bytes the step reads and writes / memcpy rate measured in the same run).
//!
//! The NPU writes its outputs by DMA, so the CPU meets them cold: a 64 MiB buffer (twice
//! the L3 here) is streamed through before each timed step, untimed.

use crate::stats::summary;
use serde_json::{json, Value};
use std::hint::black_box;
use std::time::Instant;
use vla_policy::manifest::{NormMode, Normalization, StepOutput};
use vla_policy::{
    attention_bias, count_non_finite, fill_gaussian, initial_trajectory, integrate_step,
    state_token_ids, wan_actions, wan_sigmas, wan_update, Instruction, Normalizer, Preprocessor,
};

/// MolmoAct2 at one variant's real sizes (the seed model cards).
#[derive(Clone, Copy, Debug)]
pub struct MolmoDims {
    pub name: &'static str,
    pub cameras: usize,
    pub frame: usize,
    pub crop: usize,
    pub patch: usize,
    pub image_tokens: usize,
    pub seq: usize,
    pub hidden: usize,
    pub splits: usize,
    pub layers_per_split: usize,
    pub kv_width: usize,
    /// Layers and width of k_ctx / v_ctx. The cards do not give them; the action expert
    /// has 36 DiT blocks of width 768 (operator-fused card), taken as `[36,1,S,768]`.
    pub ctx_layers: usize,
    pub ctx_width: usize,
    pub horizon: usize,
    pub action_width: usize,
    pub action_dims: usize,
    pub flow_steps: usize,
    pub state_dims: usize,
}

/// The original LIBERO checkpoint: 2 x 196 image tokens, prompt of 488.
pub const ORIGINAL: MolmoDims = MolmoDims {
    name: "molmoact2-original",
    cameras: 2,
    frame: 256,
    crop: 378,
    patch: 14,
    image_tokens: 392,
    seq: 488,
    hidden: 2560,
    splits: 4,
    layers_per_split: 9,
    kv_width: 1024,
    ctx_layers: 36,
    ctx_width: 768,
    horizon: 10,
    action_width: 32,
    action_dims: 7,
    flow_steps: 10,
    state_dims: 8,
};

/// LP-VTP-SD: 2 x 16 image tokens from the grid sampler, prompt of 130, 2 flow steps.
pub const LP_VTP_SD: MolmoDims = MolmoDims {
    name: "molmoact2-lp-vtp-sd",
    image_tokens: 32,
    seq: 130,
    flow_steps: 2,
    ..ORIGINAL
};

/// Fast-WAM's action expert: only the latents change per step; the video KV cache
/// (`2 x [30,1,98,3072]`) and text context (`[1,129,4096]`) are bound once.
#[derive(Clone, Copy, Debug)]
pub struct FastWamDims {
    pub name: &'static str,
    pub horizon: usize,
    pub action_dims: usize,
    pub flow_steps: usize,
    pub shift: f64,
    pub constant_input_bytes: u64,
}

pub const FASTWAM: FastWamDims = FastWamDims {
    name: "fastwam",
    horizon: 32,
    action_dims: 7,
    flow_steps: 10,
    shift: 5.0,
    constant_input_bytes: (2 * 30 * 98 * 3072 + 129 * 4096 + 129) * 4,
};

const F32: u64 = 4;
const EVICT_BYTES: usize = 64 << 20;

/// Deterministic values in [-1, 1) (xorshift), finite like real activations.
fn synthetic(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Streams through a buffer larger than the last-level cache so the next step starts cold.
struct Evictor(Vec<u64>);

impl Evictor {
    fn new() -> Self {
        Self(vec![1; EVICT_BYTES / 8])
    }
    fn run(&mut self) {
        for (i, w) in self.0.iter_mut().enumerate() {
            *w = w.wrapping_add(i as u64);
        }
        black_box(&self.0);
    }
}

/// memcpy of 64 MiB (twice the L3 here), sampled through the run: the machine is shared,
/// so the floor uses the best rate seen, the most demanding one. Also sampled as two
/// halves on two threads (the pipeline's fork), to show what a second core adds to the
/// bandwidth the two-thread steps share.
pub struct Memcpy {
    src: Vec<u8>,
    dst: Vec<u8>,
    fork: vla_fork::Fork,
    /// Bytes moved per second of each sample (a copy of n bytes reads n and writes n).
    pub rates: Vec<f64>,
    /// The same, the copy split in halves across the caller and the fork's helper.
    pub two_thread_rates: Vec<f64>,
}

impl Memcpy {
    pub fn new() -> Self {
        let n = 64 << 20;
        let src = vec![1u8; n];
        let mut dst = vec![0u8; n];
        dst.copy_from_slice(&src);
        Self {
            src,
            dst,
            fork: vla_fork::Fork::start("vla-bench-copy", || {}).expect("start a copy helper"),
            rates: Vec::with_capacity(1024),
            two_thread_rates: Vec::with_capacity(1024),
        }
    }

    pub fn sample(&mut self, reps: usize) {
        let bytes = (2 * self.src.len()) as f64;
        for _ in 0..reps {
            let t = Instant::now();
            self.dst.copy_from_slice(black_box(&self.src));
            black_box(&self.dst);
            self.rates.push(bytes / t.elapsed().as_secs_f64());
            let half = self.src.len() / 2;
            let (d0, d1) = self.dst.split_at_mut(half);
            let (s0, s1) = self.src.split_at(half);
            let t = Instant::now();
            self.fork
                .join(
                    || d0.copy_from_slice(black_box(s0)),
                    || d1.copy_from_slice(black_box(s1)),
                )
                .expect("copy halves");
            black_box(&self.dst);
            self.two_thread_rates
                .push(bytes / t.elapsed().as_secs_f64());
        }
    }

    pub fn best(&self) -> f64 {
        self.rates.iter().copied().fold(0.0, f64::max)
    }

    pub fn best_two_threads(&self) -> f64 {
        self.two_thread_rates.iter().copied().fold(0.0, f64::max)
    }

    pub fn median(&self) -> f64 {
        let mut r = self.rates.clone();
        crate::stats::quantile(&mut r, 0.5)
    }
}

/// One timed host step: its traffic per inference and its samples (ms).
struct Step {
    name: &'static str,
    what: &'static str,
    bytes: u64,
    samples: Vec<f64>,
    /// The pipeline runs it on a helper thread while a context executes.
    off_critical_path: bool,
}

impl Step {
    fn new(name: &'static str, what: &'static str, bytes: u64) -> Self {
        Self {
            name,
            what,
            bytes,
            samples: Vec::new(),
            off_critical_path: false,
        }
    }

    fn off_critical_path(self) -> Self {
        Self {
            off_critical_path: true,
            ..self
        }
    }

    fn json(&mut self) -> Value {
        let (p50, p99, max) = summary(&mut self.samples);
        json!({
            "step": self.name,
            "what": self.what,
            "bytes": self.bytes,
            "off_critical_path": self.off_critical_path,
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": max,
        })
    }
}

/// Milliseconds `f` takes on cold caches.
fn cold(evict: &mut Evictor, f: impl FnOnce()) -> f64 {
    evict.run();
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e3
}

fn time(step: &mut Step, evict: &mut Evictor, f: impl FnOnce()) {
    let ms = cold(evict, f);
    step.samples.push(ms);
}

fn quantile_norm(dims: usize, low: f32, high: f32) -> Normalization {
    Normalization {
        mode: NormMode::Quantile,
        follows: Default::default(),
        eps: None,
        low: Some(vec![low; dims]),
        high: Some(vec![high; dims]),
        mean: None,
        std: None,
        passthrough: None,
        constant: None,
    }
}

fn counting<T>(allocs: &dyn Fn() -> u64, f: impl FnOnce() -> T) -> (T, u64) {
    let before = allocs();
    let out = f();
    (out, allocs() - before)
}

/// The buffers of one MolmoAct2 inference's host work, filled with synthetic values at
/// the variant's sizes.
struct MolmoWork {
    pre: Preprocessor,
    frames: Vec<u8>,
    pixel_values: Vec<f32>,
    image_embeds: Vec<f32>,
    valid: Vec<u8>,
    image_block: Vec<bool>,
    instr: Instruction,
    state_rows: Vec<f32>,
    state: Vec<f32>,
    state_ids: Vec<usize>,
    prompt_hidden: Vec<f32>,
    hidden_out: [Vec<f32>; 2],
    k_ctx: Vec<f32>,
    v_ctx: Vec<f32>,
    trajectory: Vec<f32>,
    step_out: Vec<f32>,
    chunk: Vec<f32>,
    actions: Vec<f32>,
    state_norm: Normalizer,
    action_norm: Normalizer,
}

impl MolmoWork {
    fn new(d: &MolmoDims) -> Self {
        let (s, h) = (d.seq, d.hidden);
        let pre = Preprocessor::new(d.cameras, d.frame, d.frame, d.crop, d.patch);
        let frames: Vec<u8> = synthetic(pre.frames_len() / 4 + 1, 1)
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .take(pre.frames_len())
            .collect();
        let pixel_values = vec![0f32; pre.output_len()];
        // Image rows first (two cameras back to back after a short preamble), state rows
        // near the end, as in the real prompt layout.
        let image_positions: Vec<usize> = (4..4 + d.image_tokens).collect();
        let state_positions: Vec<usize> = (s - 40..s - 40 + d.state_dims).collect();
        let valid = vec![1u8; s];
        // The image block: the patch rows plus each camera's <im_start>/<im_end> around them.
        let image_block: Vec<bool> = (0..s)
            .map(|r| (3..5 + d.image_tokens).contains(&r))
            .collect();
        // As the real tables: every image position holds the patch token's row.
        let mut scaffold = synthetic(s * h, 3);
        let patch_row = scaffold[image_positions[0] * h..][..h].to_vec();
        for &p in &image_positions {
            scaffold[p * h..(p + 1) * h].copy_from_slice(&patch_row);
        }
        let instr = Instruction::new(
            scaffold,
            attention_bias(&valid, &image_block, f32::MIN),
            vec![1.0; s],
            image_positions,
            state_positions,
            h,
        );
        let ctx_len = d.ctx_layers * s * d.ctx_width;
        let traj_len = d.horizon * d.action_width;
        Self {
            pre,
            frames,
            pixel_values,
            image_embeds: synthetic(d.image_tokens * h, 2),
            valid,
            image_block,
            instr,
            state_rows: synthetic(256 * h, 4),
            state: synthetic(d.state_dims, 5),
            state_ids: vec![0usize; d.state_dims],
            prompt_hidden: vec![0f32; s * h],
            hidden_out: [synthetic(s * h, 6), synthetic(s * h, 7)],
            k_ctx: synthetic(ctx_len, 8),
            v_ctx: synthetic(ctx_len, 9),
            trajectory: vec![0f32; traj_len],
            step_out: synthetic(traj_len, 10),
            chunk: vec![0f32; d.horizon * d.action_dims],
            actions: vec![0f32; d.horizon * d.action_dims],
            state_norm: Normalizer::new(&quantile_norm(d.state_dims, -2.0, 2.0), d.state_dims),
            action_norm: Normalizer::new(&quantile_norm(d.action_dims, -1.0, 1.0), d.action_dims),
        }
    }

    /// The steps timed, each with the bytes it reads and writes.
    fn steps(&self, d: &MolmoDims) -> [Step; 7] {
        let hidden_bytes = (d.seq * d.hidden) as u64 * F32;
        let row_bytes = d.hidden as u64 * F32;
        let traj_bytes = self.trajectory.len() as u64 * F32;
        [
            Step::new(
                "preprocess",
                "frames -> resize, normalize, patchify -> pixel_values; half on the vla-fork helper",
                self.pre.frames_len() as u64 + self.pixel_values.len() as u64 * F32,
            ),
            Step::new(
                "prompt rows",
                "image rows = patch row + embeds (counting NaN/Inf: vision's guard), state rows replaced; half on the vla-fork helper",
                self.image_embeds.len() as u64 * F32 * 2 + d.state_dims as u64 * row_bytes * 2,
            ),
            Step::new(
                "chain guards",
                "non-finite scan of each split's hidden_out, off the critical path (helper thread, during the next split)",
                d.splits as u64 * hidden_bytes,
            )
            .off_critical_path(),
            Step::new(
                "KV assembly",
                "none: each split writes its keys/values in place in action_context's inputs",
                0,
            ),
            Step::new(
                "action_context guard",
                "non-finite scan of k_ctx and v_ctx, off the critical path (helper thread, during the flow loop)",
                2 * self.k_ctx.len() as u64 * F32,
            )
            .off_critical_path(),
            Step::new(
                "flow loop",
                "noise, per step: guard + Euler update with pad mask",
                traj_bytes * (1 + 3 * d.flow_steps as u64),
            ),
            Step::new(
                "de-normalize",
                "chunk -> robot units",
                self.chunk.len() as u64 * F32 * 2,
            ),
        ]
    }

    /// One inference's host work, each step timed on cold caches into `steps`; the two
    /// steps split across threads also timed on one thread, into `one_thread`.
    fn run(
        &mut self,
        d: &MolmoDims,
        steps: &mut [Step; 7],
        one_thread: &mut [Vec<f64>; 2],
        evict: &mut Evictor,
        fork: &mut vla_fork::Fork,
    ) {
        let h = d.hidden;
        let w = self;
        one_thread[0].push(cold(evict, || w.pre.run(&w.frames, &mut w.pixel_values)));
        time(&mut steps[0], evict, || {
            w.pre
                .run_on(fork, &w.frames, &mut w.pixel_values)
                .expect("preprocess halves")
        });
        one_thread[1].push(cold(evict, || {
            state_token_ids(&w.state_norm, &w.state, &mut w.state_ids);
            black_box(w.instr.embed_observation(
                &mut w.prompt_hidden,
                &w.image_embeds,
                &w.state_rows,
                &w.state_ids,
                h,
            ));
        }));
        time(&mut steps[1], evict, || {
            state_token_ids(&w.state_norm, &w.state, &mut w.state_ids);
            black_box(
                w.instr
                    .embed_observation_on(
                        fork,
                        &mut w.prompt_hidden,
                        &w.image_embeds,
                        &w.state_rows,
                        &w.state_ids,
                        h,
                    )
                    .expect("prompt row halves"),
            );
        });
        // Each split's output is fresh from the NPU: every scan starts cold.
        let chain: f64 = (0..d.splits)
            .map(|i| {
                cold(evict, || {
                    black_box(count_non_finite(&w.hidden_out[i % 2]));
                })
            })
            .sum();
        steps[2].samples.push(chain);
        steps[3].samples.push(0.0);
        time(&mut steps[4], evict, || {
            black_box(count_non_finite(&w.k_ctx) + count_non_finite(&w.v_ctx));
        });
        time(&mut steps[5], evict, || w.flow_loop(d));
        time(&mut steps[6], evict, || {
            w.action_norm.denormalize_into(&w.chunk, &mut w.actions);
            black_box(&w.actions);
        });
    }

    /// Noise, then per step the guard and the Euler update; the chunk's rows out.
    fn flow_loop(&mut self, d: &MolmoDims) {
        let n = d.flow_steps;
        let dt = (1.0f64 / n as f64) as f32;
        initial_trajectory(7, &mut self.trajectory, d.action_width, d.action_dims);
        for _ in 0..n {
            black_box(count_non_finite(&self.step_out));
            integrate_step(
                &mut self.trajectory,
                &self.step_out,
                StepOutput::Velocity,
                dt,
                d.action_width,
                d.action_dims,
            );
        }
        for (r, row) in self.chunk.chunks_exact_mut(d.action_dims).enumerate() {
            row.copy_from_slice(&self.trajectory[r * d.action_width..][..d.action_dims]);
        }
    }

    /// Milliseconds of the work done once per instruction (not per inference): the
    /// scaffold into the prompt buffer and the attention bias.
    fn once_per_instruction(&mut self) -> f64 {
        let t = Instant::now();
        self.instr.write_scaffold(&mut self.prompt_hidden);
        let bias = attention_bias(&self.valid, &self.image_block, f32::MIN);
        let once_ms = t.elapsed().as_secs_f64() * 1e3;
        black_box((&self.prompt_hidden, bias));
        once_ms
    }
}

/// The last sample's total over all steps, and over the critical path's.
fn last_totals(steps: &[Step]) -> (f64, f64) {
    let last = |s: &Step| *s.samples.last().unwrap_or(&0.0);
    let total = steps.iter().map(last).sum::<f64>();
    let off_path: f64 = steps.iter().filter(|s| s.off_critical_path).map(last).sum();
    (total, total - off_path)
}

/// Host work of one MolmoAct2 inference, `iterations` times after one warm-up.
pub fn molmoact2(
    d: &MolmoDims,
    iterations: usize,
    mem: &mut Memcpy,
    allocs: &dyn Fn() -> u64,
) -> Value {
    let (s, h, n) = (d.seq, d.hidden, d.flow_steps);
    let mut work = MolmoWork::new(d);
    let mut evict = Evictor::new();
    // The pipeline's second helper: half of the preprocess and of the prompt rows.
    let mut fork = vla_fork::Fork::start("vla-fork", || {}).expect("start the vla-fork helper");
    // The same two steps on one thread, timed in the same iterations for comparison.
    let mut one_thread = [
        Vec::with_capacity(iterations + 1),
        Vec::with_capacity(iterations + 1),
    ];
    let mut steps = work.steps(d);
    steps
        .iter_mut()
        .for_each(|s| s.samples.reserve(iterations + 1));
    let mut totals = Vec::with_capacity(iterations);
    let mut critical = Vec::with_capacity(iterations);
    let mut allocations = 0u64;
    for iteration in 0..=iterations {
        let ((), count) = counting(allocs, || {
            work.run(d, &mut steps, &mut one_thread, &mut evict, &mut fork)
        });
        mem.sample(1);
        if iteration > 0 {
            allocations += count;
            let (total, critical_path) = last_totals(&steps);
            totals.push(total);
            critical.push(critical_path);
        } else {
            steps.iter_mut().for_each(|s| s.samples.clear());
            one_thread.iter_mut().for_each(Vec::clear);
        }
    }
    let once_ms = work.once_per_instruction();

    let total_bytes: u64 = steps.iter().map(|s| s.bytes).sum();
    let (p50, p99, _) = summary(&mut totals);
    let (critical_p50, critical_p99, _) = summary(&mut critical);
    // What the critical path cannot avoid writing: pixel_values, the observation's prompt
    // rows (image and state), and the trajectory (initial noise + one update per step).
    let written = work.pixel_values.len() as u64 * F32
        + (d.image_tokens + d.state_dims) as u64 * h as u64 * F32
        + work.trajectory.len() as u64 * F32 * (1 + n as u64);
    let grid = d.crop / d.patch;
    json!({
        "variant": d.name,
        "dims": {
            "frames": [d.cameras, d.frame, d.frame, 3],
            "pixel_values": [1, d.cameras, grid * grid, d.patch * d.patch * 3],
            "seq": s, "hidden": h, "image_tokens": d.image_tokens,
            "kv": [d.splits * d.layers_per_split, 1, s, d.kv_width],
            "k_ctx": [d.ctx_layers, 1, s, d.ctx_width],
            "flow_steps": n,
        },
        "iterations": iterations,
        "steps": steps.iter_mut().map(Step::json).collect::<Vec<_>>(),
        "total_p50_ms": p50,
        "total_p99_ms": p99,
        "critical_path_p50_ms": critical_p50,
        "critical_path_p99_ms": critical_p99,
        "critical_path_written_bytes": written,
        "bytes_per_inference": total_bytes,
        "kv_bytes_not_copied": (d.splits * d.layers_per_split * s * d.kv_width) as u64 * F32 * 2,
        "once_per_instruction_ms": once_ms,
        "allocations_per_inference": allocations as f64 / iterations as f64,
        "one_thread_p50_ms": {
            "preprocess": summary(&mut one_thread[0]).0,
            "prompt rows": summary(&mut one_thread[1]).0,
        },
    })
}

/// Host work of one Fast-WAM inference (the world-model inputs stay bound: 0 bytes).
pub fn fastwam(
    f: &FastWamDims,
    iterations: usize,
    mem: &mut Memcpy,
    allocs: &dyn Fn() -> u64,
) -> Value {
    let n = f.horizon * f.action_dims;
    let sigmas = wan_sigmas(f.flow_steps, f.shift);
    let mut latents = vec![0f32; n];
    let pred = synthetic(n, 11);
    let mut actions = vec![0f32; n];
    let mut timestep = [0f32];
    let norm =
        vla_policy::FastWamNormalizer::new(&quantile_norm(f.action_dims, -1.0, 1.0), f.action_dims);
    let mut evict = Evictor::new();
    let bytes = n as u64 * F32 * (1 + 3 * f.flow_steps as u64 + 2);
    let mut step = Step::new(
        "flow loop + de-normalize",
        "noise, per step: timestep, guard, Euler update; actions",
        bytes,
    );
    step.samples.reserve(iterations + 1);
    let mut allocations = 0u64;
    for iteration in 0..=iterations {
        let ((), count) = counting(allocs, || {
            time(&mut step, &mut evict, || {
                fill_gaussian(7, &mut latents);
                for i in 0..f.flow_steps {
                    timestep[0] = (sigmas[i] * 1000.0) as f32;
                    black_box(count_non_finite(&pred));
                    wan_update(&mut latents, &pred, sigmas[i], sigmas[i + 1]);
                }
                wan_actions(
                    &norm,
                    &latents,
                    &mut actions,
                    f.action_dims,
                    vla_policy::manifest::GripperMap::Libero,
                    true,
                );
                black_box((&actions, &timestep));
            });
        });
        mem.sample(1);
        if iteration == 0 {
            step.samples.clear();
        } else {
            allocations += count;
        }
    }
    let mut totals = step.samples.clone();
    let (p50, p99, _) = summary(&mut totals);
    json!({
        "variant": f.name,
        "dims": {
            "latents": [1, f.horizon, f.action_dims],
            "flow_steps": f.flow_steps,
            "constant_inputs_bytes": f.constant_input_bytes,
        },
        "iterations": iterations,
        "steps": [
            step.json(),
            {"step": "world-model inputs", "what": "none: video KV cache and context bound once at load",
             "bytes": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0},
        ],
        "total_p50_ms": p50,
        "total_p99_ms": p99,
        "bytes_per_inference": bytes,
        "allocations_per_inference": allocations as f64 / iterations as f64,
    })
}

/// Fast-WAM's closed-loop world-model chain at the card's dimensions: the host work
/// before the first world-model context (two 256x256 LIBERO frames turned, resized and
/// laid side by side into `[1, 3, 224, 448]`; the state normalized and projected into
/// context row 128 of `[1, 129, 4096]`). The text rows are copied once per instruction
/// and the video keys/values land in place in action_step's inputs: no host work.
pub fn fastwam_chain(iterations: usize, mem: &mut Memcpy, allocs: &dyn Fn() -> u64) -> Value {
    let (frame, cam, cameras, state_dims, width) = (256usize, 224usize, 2usize, 8usize, 4096usize);
    let mut image = vla_policy::FastWamImage::new(cameras, (frame, frame), (cam, cam), &[true; 2]);
    let frames: Vec<u8> = synthetic(image.frames_len(), 21)
        .iter()
        .map(|v| ((v + 1.0) * 127.5) as u8)
        .collect();
    let mut pixels = vec![0f32; image.output_len()];
    let norm =
        vla_policy::FastWamNormalizer::new(&quantile_norm(state_dims, -1.0, 1.0), state_dims);
    let state = synthetic(state_dims, 22);
    let weight = synthetic(width * state_dims, 23);
    let bias = synthetic(width, 24);
    let mut normalized = vec![0f32; state_dims];
    let mut row = vec![0f32; width];
    let mut evict = Evictor::new();
    let image_bytes = (image.frames_len() + image.output_len() * F32 as usize) as u64;
    let row_bytes = ((width * state_dims + 2 * width) as u64) * F32;
    let mut steps = [
        Step::new(
            "camera frames -> image",
            "turn 180 degrees, Pillow bilinear 256 -> 224, side by side, x*2/255-1",
            image_bytes,
        ),
        Step::new(
            "state -> proprio row",
            "normalize (clamp [-5, 5]), Linear 8 -> 4096 into context row 128",
            row_bytes,
        ),
    ];
    steps
        .iter_mut()
        .for_each(|s| s.samples.reserve(iterations + 1));
    let mut allocations = 0u64;
    for iteration in 0..=iterations {
        let ((), count) = counting(allocs, || {
            time(&mut steps[0], &mut evict, || {
                image.run(&frames, &mut pixels);
                black_box(&pixels);
            });
            time(&mut steps[1], &mut evict, || {
                vla_policy::proprio_row(&norm, &state, &mut normalized, &weight, &bias, &mut row);
                black_box(&row);
            });
        });
        mem.sample(1);
        if iteration == 0 {
            steps.iter_mut().for_each(|s| s.samples.clear());
        } else {
            allocations += count;
        }
    }
    let mut totals: Vec<f64> = (0..iterations)
        .map(|i| steps.iter().map(|s| s.samples[i]).sum())
        .collect();
    let (p50, p99, _) = summary(&mut totals);
    json!({
        "variant": "fastwam-closed-loop",
        "dims": {
            "frames": [cameras, frame, frame, 3],
            "image": [1, 3, cam, cameras * cam],
            "context": [1, 129, width],
            "latents": [1, 48, 14, 28],
            "video_kv": [30, 1, 98, 3072],
        },
        "iterations": iterations,
        "steps": steps.iter_mut().map(Step::json).collect::<Vec<_>>(),
        "total_p50_ms": p50,
        "total_p99_ms": p99,
        "bytes_per_inference": image_bytes + row_bytes,
        "allocations_per_inference": allocations as f64 / iterations as f64,
    })
}

/// Adds the floor (bytes / best memcpy rate of the run) to every step and variant.
pub fn add_floors(variants: &mut [Value], bytes_per_s: f64) {
    let floor = |v: &Value| v["bytes"].as_f64().unwrap_or(0.0) / bytes_per_s * 1e3;
    for v in variants {
        if let Some(steps) = v["steps"].as_array_mut() {
            for s in steps {
                s["floor_ms"] = json!(floor(s));
            }
        }
        v["floor_ms"] = json!(v["bytes_per_inference"].as_f64().unwrap_or(0.0) / bytes_per_s * 1e3);
        if let Some(w) = v["critical_path_written_bytes"].as_f64() {
            v["critical_path_floor_ms"] = json!(w / bytes_per_s * 1e3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_sizes_match_the_model_cards() {
        assert_eq!(ORIGINAL.crop / ORIGINAL.patch, 27, "729 patches per crop");
        assert_eq!(ORIGINAL.patch * ORIGINAL.patch * 3, 588);
        let kv = ORIGINAL.splits * ORIGINAL.layers_per_split * ORIGINAL.seq * ORIGINAL.kv_width * 4;
        assert_eq!(kv, 71_958_528, "[36,1,488,1024] f32");
        assert_eq!(
            (LP_VTP_SD.seq, LP_VTP_SD.image_tokens, LP_VTP_SD.flow_steps),
            (130, 32, 2)
        );
        assert_eq!(FASTWAM.constant_input_bytes, 72_253_440 + 2_113_536 + 516);
    }

    #[test]
    fn synthetic_values_are_finite_and_bounded() {
        let v = synthetic(10_000, 3);
        assert!(v.iter().all(|x| x.is_finite() && (-1.0..1.0).contains(x)));
        assert_ne!(v[0], v[1]);
    }
}
