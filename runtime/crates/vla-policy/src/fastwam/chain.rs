//! The Fast-WAM world-model chain, resident: camera frames + robot state + instruction ->
//! `video_keys`, `video_values`, `context` for action_step, per observation.
//!
//! `wm_vae_enc` (image -> latents), `wm_embed` (latents + context -> video tokens + context
//! embedding), `wm_prefill_split0..K-1` (layer ranges of the video DiT; the tokens
//! ping-pong between two buffers). Every buffer is allocated at load. Chained contexts
//! write where the next one reads: split i writes its keys/values straight into its layer
//! slice of action_step's `video_keys`/`video_values` inputs, and the context buffer that
//! wm_embed reads is action_step's `context` input too. The text rows of the context are
//! written once per instruction change; per observation only the proprio row (the last
//! one) is recomputed on the host: `proprio_weight @ normalize(state) + proprio_bias`, a
//! Linear(state_dims -> context_width) of a few thousand MACs, cheaper here than as a
//! context of its own. The state it normalizes is built first from what the robot wrote
//! (`state_input`, the `state` module), when the observation is accepted.

use super::image::FastWamImage;
use super::norm::FastWamNormalizer;
use super::state::build_state;
use crate::bundle::{Bundle, LoadedGraph};
use crate::error::PolicyError;
use crate::exec::{
    count_non_finite, execute, move_buf, permute, qnn, Buf, Dst, GraphIo, Src, Timings,
};
use crate::manifest::FastWamChain;
use crate::pack::InstructionPacks;
use crate::Observation;
use std::sync::Arc;
use std::time::Instant;
use vla_npz::{DType, Npz};
use vla_qnn::{Backend, Region};
use vla_tensor::AlignedBuf;

/// A prefill split's graph positions.
#[derive(Clone, Copy, Debug)]
struct SplitIo {
    /// Inputs: tokens, context embedding.
    inputs: [usize; 2],
    /// Output `video_tokens_out`; None for the last split, which has none.
    tokens_out: Option<usize>,
    /// Output `keys`.
    keys: usize,
    /// Output `values`.
    values: usize,
}

/// The state's context row: `row = bias + weight @ normalize(state)`, the proprio Linear
/// (`weight` is `[E, state_dims]` row-major). `normalized` is scratch of `state_dims`.
pub fn proprio_row(
    norm: &FastWamNormalizer,
    state: &[f32],
    normalized: &mut [f32],
    weight: &[f32],
    bias: &[f32],
    row: &mut [f32],
) {
    for (i, (s, &x)) in normalized.iter_mut().zip(state).enumerate() {
        *s = norm.forward(x, i);
    }
    let dims = normalized.len();
    for ((r, &b), w) in row.iter_mut().zip(bias).zip(weight.chunks_exact(dims)) {
        *r = b + w.iter().zip(&*normalized).map(|(w, s)| w * s).sum::<f32>();
    }
}

pub struct WorldModel {
    pub settings: FastWamChain,
    pub(crate) vae: LoadedGraph,
    vae_io: GraphIo<1, 1>,
    pub(crate) embed: LoadedGraph,
    embed_io: GraphIo<2, 2>,
    pub(crate) splits: Vec<LoadedGraph>,
    split_io: Vec<SplitIo>,
    /// Byte offset and length of each split's layer slice of video_keys/video_values.
    split_kv: Vec<(usize, usize)>,
    pre: FastWamImage,
    pub(crate) image: Buf,
    pub(crate) latents: Buf,
    /// The video tokens, ping-ponged: wm_embed writes `tokens[0]`, split i reads
    /// `tokens[i % 2]` and writes the other.
    pub(crate) tokens: [Buf; 2],
    pub(crate) context_embedding: Buf,
    state_norm: FastWamNormalizer,
    /// The policy's state (`state_dims`) built from the accepted observation's raw state.
    pub(crate) state: Vec<f32>,
    /// That state normalized, the proprio Linear's input.
    pub(crate) normalized_state: Vec<f32>,
    /// `[instructions, text_tokens * context_width]` f32.
    text_rows: Vec<f32>,
    proprio_weight: Vec<f32>,
    proprio_bias: Vec<f32>,
    text_instruction: Option<u32>,
    /// Instruction packs attached to this bundle (rows mapped, looked up by id): shared
    /// with the text renderers handed out, which look texts up in them.
    pub(crate) packs: Arc<InstructionPacks>,
    /// Bytes of text rows copied into the context since load (on instruction changes).
    pub(crate) text_copied: u64,
}

fn contract(component: &str, tensor: &str, expected: String, found: String) -> PolicyError {
    PolicyError::Contract {
        component: component.into(),
        tensor: tensor.into(),
        expected,
        found,
    }
}

fn table(npz: &Npz, name: &str, shape: &[usize]) -> Result<Vec<f32>, PolicyError> {
    let a = npz.array(name).map_err(PolicyError::Npz)?;
    let values = match a.dtype() {
        DType::F16 => npz
            .expect(name, DType::F16, shape)
            .and_then(|a| a.to_f16())
            .map_err(PolicyError::Npz)?
            .iter()
            .map(|x| x.to_f32())
            .collect(),
        _ => npz
            .expect(name, DType::F32, shape)
            .and_then(|a| a.to_f32())
            .map_err(PolicyError::Npz)?,
    };
    if let Some(i) = values.iter().position(|x: &f32| !x.is_finite()) {
        return Err(PolicyError::Prompt {
            file: npz.label().into(),
            reason: format!("{name}[{i}] is not finite"),
        });
    }
    Ok(values)
}

impl WorldModel {
    /// Loads the chain; `kv_shape` is action_step's `video_keys` shape `[L, 1, T, W]`
    /// and `context_shape` its `context` shape.
    pub fn load(
        bundle: &Bundle,
        backend: &Backend,
        c: &FastWamChain,
        kv_shape: &[usize],
        context_shape: &[usize],
    ) -> Result<Self, PolicyError> {
        let layers: usize = c.prefill_layers.iter().sum();
        let (t, w) = (c.video_tokens, c.video_width);
        if kv_shape != [layers, 1, t, w] {
            return Err(contract(
                "action_step",
                "video_keys",
                format!(
                    "shape [{layers},1,{t},{w}] (fastwam.chain.prefill_layers {:?} add up to \
                     {layers} layers)",
                    c.prefill_layers
                ),
                format!("shape {}", format!("{kv_shape:?}").replace(' ', "")),
            ));
        }
        let m = c.text_tokens + 1;
        let ctx_shape = [1, m, c.context_width];
        if context_shape != ctx_shape {
            return Err(contract(
                "action_step",
                "context",
                format!(
                    "shape [1,{m},{}] (fastwam.chain: text_tokens + the proprio row)",
                    c.context_width
                ),
                format!("shape {}", format!("{context_shape:?}").replace(' ', "")),
            ));
        }
        // Tables first: a missing instruction row is refused before any context loads.
        let path = bundle.path(&c.tables);
        let npz = bundle.npz("context tables", &c.tables)?;
        let n = c.instructions.len();
        if !npz.contains("text_rows") {
            return Err(PolicyError::Prompt {
                file: path.display().to_string(),
                reason: "has no `text_rows` (the instructions' UMT5 rows)".into(),
            });
        }
        let rows_shape = npz
            .array("text_rows")
            .map_err(PolicyError::Npz)?
            .shape()
            .to_vec();
        if rows_shape.len() == 3 && rows_shape[0] < n {
            return Err(PolicyError::Prompt {
                file: path.display().to_string(),
                reason: format!(
                    "text_rows hold {} instructions, but fastwam.chain.instructions lists {n}: \
                     instruction {} has no text rows",
                    rows_shape[0], rows_shape[0]
                ),
            });
        }
        let text_rows = table(&npz, "text_rows", &[n, c.text_tokens, c.context_width])?;
        let proprio_weight = table(&npz, "proprio_weight", &[c.context_width, c.state_dims])?;
        let proprio_bias = table(&npz, "proprio_bias", &[c.context_width])?;

        let image_shape = [1, 3, c.camera_height, c.cameras * c.camera_width];
        let latent_shape = [1, c.latent_channels, c.latent_height, c.latent_width];
        let vae = bundle.load_component(backend, "wm_vae_enc")?;
        vae.expect_counts(1, 1)?;
        let (vi, _) = vae.input("image", Some(&image_shape))?;
        let (vo, _) = vae.output("latents", Some(&latent_shape))?;

        let embed = bundle.load_component(backend, "wm_embed")?;
        embed.expect_counts(2, 2)?;
        let (el, _) = embed.input("latents", Some(&latent_shape))?;
        let (ec, _) = embed.input("context", Some(&ctx_shape))?;
        let (et, _) = embed.output("video_tokens", Some(&[1, t, w]))?;
        let (ee, _) = embed.output("context_embedding", Some(&[1, m, w]))?;

        let k = c.prefill_layers.len();
        let mut splits = Vec::with_capacity(k);
        let mut split_io = Vec::with_capacity(k);
        let mut split_kv = Vec::with_capacity(k);
        let mut offset = 0;
        for (i, &l) in c.prefill_layers.iter().enumerate() {
            let last = i + 1 == k;
            let g = bundle.load_component(backend, &format!("wm_prefill_split{i}"))?;
            g.expect_counts(2, if last { 2 } else { 3 })?;
            let (st, _) = g.input("video_tokens", Some(&[1, t, w]))?;
            let (se, _) = g.input("context_embedding", Some(&[1, m, w]))?;
            let so = match last {
                true => None,
                false => Some(g.output("video_tokens_out", Some(&[1, t, w]))?.0),
            };
            let (sk, _) = g.output("keys", Some(&[l, 1, t, w]))?;
            let (sv, _) = g.output("values", Some(&[l, 1, t, w]))?;
            split_io.push(SplitIo {
                inputs: [st, se],
                tokens_out: so,
                keys: sk,
                values: sv,
            });
            let bytes = l * t * w * 4;
            split_kv.push((offset, bytes));
            offset += bytes;
            splits.push(g);
        }
        let f32s = |n: usize| Buf::Host(AlignedBuf::zeroed(n * 4));
        let pre = FastWamImage::new(
            c.cameras,
            (c.frame_height, c.frame_width),
            (c.camera_height, c.camera_width),
            &c.rotate_180,
        );
        Ok(Self {
            vae_io: GraphIo {
                inputs: [vi],
                outputs: [vo],
            },
            embed_io: GraphIo {
                inputs: [el, ec],
                outputs: [et, ee],
            },
            split_io,
            split_kv,
            image: f32s(pre.output_len()),
            latents: f32s(latent_shape.iter().product()),
            tokens: [f32s(t * w), f32s(t * w)],
            context_embedding: f32s(m * w),
            state_norm: FastWamNormalizer::new(&c.state_norm, c.state_dims),
            state: vec![0.0; c.state_dims],
            normalized_state: vec![0.0; c.state_dims],
            text_rows,
            proprio_weight,
            proprio_bias,
            text_instruction: None,
            packs: Arc::new(InstructionPacks::default()),
            text_copied: 0,
            pre,
            vae,
            embed,
            splits,
            settings: c.clone(),
        })
    }

    /// Component names in pipeline order (for the timings).
    pub fn names(&self) -> Vec<String> {
        let mut v = vec!["wm_vae_enc".to_string(), "wm_embed".to_string()];
        v.extend(self.splits.iter().map(|s| s.component.clone()));
        v
    }

    /// Refuses an observation that does not fit the chain, before any context runs, and
    /// builds the policy's state from it (a quaternion that does not convert is refused
    /// here too).
    pub fn accept(&mut self, obs: &Observation<'_>) -> Result<(), PolicyError> {
        let c = &self.settings;
        if (obs.cameras, obs.height, obs.width) != (c.cameras, c.frame_height, c.frame_width)
            || obs.frames.len() != self.pre.frames_len()
        {
            return Err(PolicyError::Observation {
                field: "frames",
                expected: format!(
                    "{} cameras of {}x{} RGB8 ({} bytes)",
                    c.cameras,
                    c.frame_height,
                    c.frame_width,
                    self.pre.frames_len()
                ),
                found: format!(
                    "{} cameras of {}x{} ({} bytes)",
                    obs.cameras,
                    obs.height,
                    obs.width,
                    obs.frames.len()
                ),
            });
        }
        obs.check_state_and_instruction(
            c.ring_state_dims(),
            c.instructions.len(),
            0,
            Some(&self.packs),
        )?;
        build_state(c.state_input, obs.state, &mut self.state)
    }

    /// Writes the context rows of `obs` (accepted) into `context` (`[1, text_tokens + 1, E]`).
    pub fn write_context(&mut self, obs: &Observation<'_>, context: &mut [f32]) {
        let c = &self.settings;
        let (e, text) = (c.context_width, c.text_tokens * c.context_width);
        if self.text_instruction != Some(obs.instruction_id) {
            let id = obs.instruction_id;
            // A pack id (accepted: the packs hold it) reads the pack's mapped rows.
            if !self.packs.write_rows(id, &mut context[..text]) {
                let i = id as usize;
                context[..text].copy_from_slice(&self.text_rows[i * text..(i + 1) * text]);
            }
            self.text_instruction = Some(id);
            self.text_copied += (text * 4) as u64;
        }
        proprio_row(
            &self.state_norm,
            &self.state,
            &mut self.normalized_state,
            &self.proprio_weight,
            &self.proprio_bias,
            &mut context[text..text + e],
        );
    }

    /// Runs the chain for `obs` (accepted): fills `context`, then `keys`/`values`
    /// (action_step's inputs) in place. `t0` is the first timing slot of the chain.
    pub fn run(
        &mut self,
        obs: &Observation<'_>,
        context: &mut Buf,
        keys: &mut Buf,
        values: &mut Buf,
        timings: &mut Timings,
        fault: Option<&str>,
    ) -> Result<(), PolicyError> {
        let poison = |name: &str, buf: &mut Buf| {
            if cfg!(feature = "fault-injection") && fault == Some(name) {
                buf.as_f32_mut()[0] = f32::NAN;
            }
        };
        let finite = |component: &str, tensor: &str, buf: &Buf| match count_non_finite(buf.as_f32())
        {
            0 => Ok(()),
            count => Err(PolicyError::NonFinite {
                component: component.into(),
                tensor: tensor.into(),
                count,
            }),
        };
        self.pre.run(obs.frames, self.image.as_f32_mut());
        let t = Instant::now();
        execute(
            &mut self.vae.graph,
            self.vae_io,
            [self.image.src()],
            [self.latents.dst()],
        )
        .map_err(qnn("wm_vae_enc"))?;
        timings.add(0, t.elapsed());
        poison("wm_vae_enc", &mut self.latents);
        finite("wm_vae_enc", "latents", &self.latents)?;

        self.write_context(obs, context.as_f32_mut());
        let t = Instant::now();
        let (a, b) = self.tokens.split_at_mut(1);
        execute(
            &mut self.embed.graph,
            self.embed_io,
            [self.latents.src(), context.src()],
            [a[0].dst(), self.context_embedding.dst()],
        )
        .map_err(qnn("wm_embed"))?;
        timings.add(1, t.elapsed());
        poison("wm_embed", &mut a[0]);
        finite("wm_embed", "video_tokens", &a[0])?;

        for (i, (split, io)) in self.splits.iter_mut().zip(&self.split_io).enumerate() {
            let (src, dst) = if i % 2 == 0 {
                (&a[0], &mut b[0])
            } else {
                (&b[0], &mut a[0])
            };
            let (off, len) = self.split_kv[i];
            // On registered memory the split was bound at its layer slice of the regions.
            let k: Dst<'_> = keys.part_mut(off..off + len);
            let v: Dst<'_> = values.part_mut(off..off + len);
            let inputs: [Src<'_>; 2] = [src.src(), self.context_embedding.src()];
            let t = Instant::now();
            match io.tokens_out {
                Some(o) => execute(
                    &mut split.graph,
                    GraphIo {
                        inputs: io.inputs,
                        outputs: [o, io.keys, io.values],
                    },
                    inputs,
                    [dst.dst(), k, v],
                ),
                None => execute(
                    &mut split.graph,
                    GraphIo {
                        inputs: io.inputs,
                        outputs: [io.keys, io.values],
                    },
                    inputs,
                    [k, v],
                ),
            }
            .map_err(|error| PolicyError::Qnn {
                component: split.component.clone(),
                error,
            })?;
            timings.add(2 + i, t.elapsed());
            if io.tokens_out.is_some() {
                poison(&split.component, dst);
                finite(&split.component, "video_tokens_out", dst)?;
            }
        }
        // The last split has no token output: its keys/values are scanned instead (the
        // earlier splits' overflow would have shown in their tokens).
        let (off, len) = *self.split_kv.last().expect("validated: at least one split");
        let last = self.splits.last().expect("at least one split");
        if cfg!(feature = "fault-injection") && fault == Some(last.component.as_str()) {
            values.as_f32_mut()[off / 4] = f32::NAN;
        }
        for (tensor, buf) in [("keys", &*keys), ("values", &*values)] {
            let bad = count_non_finite(&buf.as_f32()[off / 4..(off + len) / 4]);
            if bad > 0 {
                return Err(PolicyError::NonFinite {
                    component: last.component.clone(),
                    tensor: tensor.into(),
                    count: bad,
                });
            }
        }
        Ok(())
    }

    /// Byte lengths of the chain's own buffers, in the order [`WorldModel::bind_regions`]
    /// and [`WorldModel::move_into`] take their regions: image, latents, the two token
    /// buffers, the context embedding.
    pub(crate) fn buffer_lens(&self) -> [usize; 5] {
        [
            self.image.as_bytes().len(),
            self.latents.as_bytes().len(),
            self.tokens[0].as_bytes().len(),
            self.tokens[1].as_bytes().len(),
            self.context_embedding.as_bytes().len(),
        ]
    }

    /// Registers every chain context at the regions its buffers chain through: the VAE's
    /// latents are wm_embed's input, wm_embed reads `context` (action_step's input too)
    /// and writes the tokens split 0 reads, the tokens ping-pong between the splits, and
    /// each split writes its keys/values at its layer slice of action_step's
    /// `keys`/`values` regions. `own` are the regions of [`WorldModel::buffer_lens`]. On
    /// error the graphs bound so far stay bound (the caller unbinds every graph).
    pub(crate) fn bind_regions(
        &mut self,
        own: [&Region; 5],
        context: &Region,
        keys: &Region,
        values: &Region,
    ) -> Result<(), PolicyError> {
        let [image, latents, t0, t1, emb] = own;
        let (vi, vo) = (self.vae_io.inputs, self.vae_io.outputs);
        self.vae
            .graph
            .bind_regions(&permute(vi, [(image, 0)]), &permute(vo, [(latents, 0)]))
            .map_err(qnn("wm_vae_enc"))?;
        let (ei, eo) = (self.embed_io.inputs, self.embed_io.outputs);
        self.embed
            .graph
            .bind_regions(
                &permute(ei, [(latents, 0), (context, 0)]),
                &permute(eo, [(t0, 0), (emb, 0)]),
            )
            .map_err(qnn("wm_embed"))?;
        for (i, (split, io)) in self.splits.iter_mut().zip(&self.split_io).enumerate() {
            let (src, dst) = if i % 2 == 0 { (t0, t1) } else { (t1, t0) };
            let off = self.split_kv[i].0;
            let inputs = permute(io.inputs, [(src, 0), (emb, 0)]);
            match io.tokens_out {
                Some(o) => split.graph.bind_regions(
                    &inputs,
                    &permute(
                        [o, io.keys, io.values],
                        [(dst, 0), (keys, off), (values, off)],
                    ),
                ),
                None => split.graph.bind_regions(
                    &inputs,
                    &permute([io.keys, io.values], [(keys, off), (values, off)]),
                ),
            }
            .map_err(qnn(&split.component))?;
        }
        Ok(())
    }

    /// Moves the chain's buffers into `own` (bound by [`WorldModel::bind_regions`]),
    /// contents included.
    pub(crate) fn move_into(&mut self, own: [Region; 5]) {
        let [image, latents, t0, t1, emb] = own;
        let [a, b] = &mut self.tokens;
        for (old, region) in [
            (&mut self.image, image),
            (&mut self.latents, latents),
            (a, t0),
            (b, t1),
            (&mut self.context_embedding, emb),
        ] {
            move_buf(old, region);
        }
    }

    /// Byte ranges of each split's keys/values in action_step's inputs (parity stages).
    pub fn split_ranges(&self) -> &[(usize, usize)] {
        &self.split_kv
    }
}
