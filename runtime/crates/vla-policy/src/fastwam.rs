//! The Fast-WAM policy: the Wan flow-matching schedule over one resident action_step
//! context, fed either by the resident world-model chain (`chain`: camera frames, robot
//! state and instruction -> video KV cache + context, closed loop) or, in the
//! constant-world-model form, by the fixed inputs of the bundle's `world_model` npz (open
//! loop: the actions depend only on the noise seed).
//!
//! All buffers are allocated at load; one inference allocates nothing.
//!
//! On HTP shared buffers ([`FastWam::use_shared_buffers`]) every buffer a context reads or
//! writes is a region of one registered arena allocated at load, and each context is bound
//! where the buffers already chain: the world-model chain's splits write the video KV
//! cache at their layer slices of action_step's input regions, wm_embed reads the context
//! region action_step reads too, the flow update writes the latents in their input region
//! and the prediction is read where the NPU wrote it. QNN copies nothing around an
//! execute, and the host copies nothing between buffers but an instruction's text rows.
//! In the open-loop form the world-model tensors are moved in once, at that move.

mod chain;
pub mod image;
pub mod norm;
pub mod state;

use crate::bundle::{Bundle, LoadedGraph};
use crate::error::PolicyError;
use crate::exec::{count_non_finite, execute, move_buf, permute, qnn, Buf, GraphIo, Timings};
use crate::manifest::{FastWamSettings, GripperMap};
use crate::noise::fill_gaussian;
use crate::prefix::{ActionPrefix, PrefixBuffers, PrefixMethod};
use crate::Observation;
pub use chain::{proprio_row, WorldModel};
use norm::FastWamNormalizer;
use std::sync::Arc;
use std::time::Instant;
use vla_npz::DType;
use vla_qnn::{align_region, Backend, Region, RpcMem, SharedBuffer};
use vla_tensor::AlignedBuf;

const WORLD_INPUTS: [&str; 4] = ["video_keys", "video_values", "context", "context_mask"];

/// A loaded Fast-WAM policy: its resident contexts and every buffer an inference needs.
pub struct FastWam {
    /// The bundle's `fastwam` block.
    pub settings: FastWamSettings,
    /// The bundle's name and version, which an instruction pack must name.
    bundle_name: String,
    bundle_version: String,
    pub(crate) chain: Option<WorldModel>,
    pub(crate) action_step: LoadedGraph,
    io: GraphIo<6, 1>,
    latents: Buf,
    timestep: Buf,
    /// action_step's video_keys, video_values, context, context_mask: written by the
    /// chain in place, or loaded once from the world-model npz.
    pub(crate) world: [Buf; 4],
    pred: Buf,
    /// sigma_0..sigma_N (sigma_N = 0), f64 as in the reference.
    sigmas: Vec<f64>,
    action_norm: FastWamNormalizer,
    pub(crate) timings: Timings,
    pub(crate) fault: Option<String>,
    prefix: PrefixBuffers,
}

/// The Wan shifted schedule: `u = linspace(1, 0, N+1)[:N]`, `sigma = s*u / (1 + (s-1)*u)`.
pub fn wan_sigmas(n: usize, shift: f64) -> Vec<f64> {
    let step = -1.0 / n as f64;
    let mut s: Vec<f64> = (0..n)
        .map(|i| {
            let u = i as f64 * step + 1.0;
            shift * u / (1.0 + (shift - 1.0) * u)
        })
        .collect();
    s.push(0.0);
    s
}

/// One Euler step of the schedule: `x += pred * f32(sigma_next - sigma)`.
pub fn wan_update(latents: &mut [f32], pred: &[f32], sigma: f64, sigma_next: f64) {
    let delta = (sigma_next - sigma) as f32;
    for (x, p) in latents.iter_mut().zip(pred) {
        *x += p * delta;
    }
}

/// The gripper (last) dim of one de-normalized action row, as the bundle says:
/// `libero` is upstream LIBERO eval's `g*2 - 1`, inverted, then `sign` when binarizing;
/// `none` keeps the format-1 rule (binarize on `g >= 0` only).
pub fn map_gripper(g: f32, map: GripperMap, binarize: bool) -> f32 {
    match (map, binarize) {
        (GripperMap::Libero, false) => -(g * 2.0 - 1.0),
        (GripperMap::Libero, true) => {
            let g = -(g * 2.0 - 1.0);
            // np.sign: 0 stays 0.
            if g > 0.0 {
                1.0
            } else if g < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        (GripperMap::None, true) => {
            if g >= 0.0 {
                1.0
            } else {
                -1.0
            }
        }
        (GripperMap::None, false) => g,
    }
}

/// The action chunk from the final latents: de-normalize (Fast-WAM's normalizer, not
/// clamped), then the gripper dim per [`map_gripper`].
pub fn wan_actions(
    norm: &FastWamNormalizer,
    latents: &[f32],
    actions: &mut [f32],
    dims: usize,
    map: GripperMap,
    gripper_binarize: bool,
) {
    norm.backward_into(latents, actions);
    for row in actions.chunks_exact_mut(dims) {
        row[dims - 1] = map_gripper(row[dims - 1], map, gripper_binarize);
    }
}

impl FastWam {
    /// Makes the bundle's Fast-WAM contexts resident (action_step, and the world-model chain
    /// when the bundle has one), checks their tensors against the manifest and allocates every
    /// buffer; `settings` is the bundle's `fastwam` block (what [`crate::Policy::load`]
    /// passes).
    pub fn load(
        bundle: &Bundle,
        settings: &FastWamSettings,
        backend: &Backend,
    ) -> Result<Self, PolicyError> {
        let f = settings.clone();
        let g = bundle.load_component(backend, "action_step")?;
        g.expect_counts(6, 1)?;
        let latent_shape = [1, f.action_horizon, f.action_dims];
        let (la, _) = g.input("latents_action", Some(&latent_shape))?;
        let (ts, _) = g.input("timestep", Some(&[1]))?;
        let mut world: [AlignedBuf; 4] = Default::default();
        // Built as host memory here, then held as `Buf`s below.
        let mut world_idx = [0usize; 4];
        let mut shapes: [Vec<usize>; 4] = Default::default();
        for (k, name) in WORLD_INPUTS.iter().enumerate() {
            let (i, shape) = g.input(name, None)?;
            world_idx[k] = i;
            world[k] = AlignedBuf::zeroed(shape.iter().product::<usize>() * 4);
            shapes[k] = shape;
        }
        let chain = match (&f.chain, &f.world_model) {
            (Some(c), _) => {
                if shapes[1] != shapes[0] {
                    return Err(PolicyError::Contract {
                        component: "action_step".into(),
                        tensor: "video_values".into(),
                        expected: format!("the shape of video_keys {:?}", shapes[0]),
                        found: format!("{:?}", shapes[1]),
                    });
                }
                if shapes[3] != [1, c.text_tokens + 1] {
                    return Err(PolicyError::Contract {
                        component: "action_step".into(),
                        tensor: "context_mask".into(),
                        expected: format!("shape [1,{}]", c.text_tokens + 1),
                        found: format!("shape {}", format!("{:?}", shapes[3]).replace(' ', "")),
                    });
                }
                // Upstream's context mask is all ones (padded text rows are zeroed instead).
                world[3].as_f32_mut().fill(1.0);
                Some(WorldModel::load(
                    bundle, backend, c, &shapes[0], &shapes[2],
                )?)
            }
            (None, Some(path)) => {
                let npz = bundle.npz("world-model inputs", path)?;
                for (k, name) in WORLD_INPUTS.iter().enumerate() {
                    let a = npz
                        .expect(name, DType::F32, &shapes[k])
                        .map_err(PolicyError::Npz)?;
                    let values = a.to_f32().map_err(PolicyError::Npz)?;
                    if let Some(j) = values.iter().position(|x| !x.is_finite()) {
                        return Err(PolicyError::NonFinite {
                            component: "world_model".into(),
                            tensor: format!("{name}[{j}]"),
                            count: count_non_finite(&values),
                        });
                    }
                    world[k].as_f32_mut().copy_from_slice(&values);
                }
                None
            }
            (None, None) => unreachable!("validated: world_model or chain"),
        };
        let (pn, _) = g.output("pred_noise", Some(&latent_shape))?;
        let n = f.action_horizon * f.action_dims;
        let mut names = chain.as_ref().map_or_else(Vec::new, WorldModel::names);
        names.push("action_step".to_string());
        Ok(Self {
            io: GraphIo {
                inputs: [
                    la,
                    ts,
                    world_idx[0],
                    world_idx[1],
                    world_idx[2],
                    world_idx[3],
                ],
                outputs: [pn],
            },
            latents: Buf::Host(AlignedBuf::zeroed(n * 4)),
            timestep: Buf::Host(AlignedBuf::zeroed(4)),
            world: world.map(Buf::Host),
            pred: Buf::Host(AlignedBuf::zeroed(n * 4)),
            sigmas: wan_sigmas(f.flow_steps, f.shift),
            action_norm: FastWamNormalizer::new(&f.action_norm, f.action_dims),
            timings: Timings::new(&names),
            fault: None,
            prefix: PrefixBuffers::new(f.action_horizon, f.action_dims),
            action_step: g,
            chain,
            settings: f,
            bundle_name: bundle.manifest.name.clone(),
            bundle_version: bundle.manifest.version.clone(),
        })
    }

    /// Moves every context's inputs and outputs into one HTP shared buffer from `rpc`,
    /// a region per buffer, each context registered where the buffers chain (see the
    /// module doc). The buffers' contents move over once, here (the open-loop form's
    /// world-model tensors included). On error every registration is dropped and the
    /// policy stays on client buffers.
    pub fn use_shared_buffers(&mut self, rpc: &Arc<RpcMem>) -> Result<(), PolicyError> {
        if self.on_shared_buffers() {
            return Ok(());
        }
        // One region per buffer: action_step's six inputs and its output, then the
        // chain's own buffers.
        let mut lens = vec![
            self.latents.as_bytes().len(),
            self.timestep.as_bytes().len(),
            self.world[0].as_bytes().len(),
            self.world[1].as_bytes().len(),
            self.world[2].as_bytes().len(),
            self.world[3].as_bytes().len(),
            self.pred.as_bytes().len(),
        ];
        if let Some(c) = &self.chain {
            lens.extend(c.buffer_lens());
        }
        let mut at = 0;
        let ranges: Vec<_> = lens
            .iter()
            .map(|&n| {
                let r = at..at + n;
                at += align_region(n);
                r
            })
            .collect();
        let component = if self.chain.is_some() {
            "fastwam"
        } else {
            "action_step"
        };
        let arena = SharedBuffer::allocate(rpc, at).map_err(qnn(component))?;
        let mut regions = arena.into_regions(&ranges).map_err(qnn(component))?;
        let own: Option<[Region; 5]> = self.chain.as_ref().map(|_| {
            regions
                .split_off(7)
                .try_into()
                .unwrap_or_else(|_| unreachable!("five chain regions"))
        });
        let step: [Region; 7] = regions
            .try_into()
            .unwrap_or_else(|_| unreachable!("seven action_step regions"));
        let [lat, ts, k, v, ctx, mask, pred] = &step;
        let (ii, oi) = (self.io.inputs, self.io.outputs);
        let mut bound = self
            .action_step
            .graph
            .bind_regions(
                &permute(ii, [(lat, 0), (ts, 0), (k, 0), (v, 0), (ctx, 0), (mask, 0)]),
                &permute(oi, [(pred, 0)]),
            )
            .map_err(qnn("action_step"));
        if let (Ok(()), Some(c), Some([im, la, t0, t1, em])) = (&bound, &mut self.chain, &own) {
            bound = c.bind_regions([im, la, t0, t1, em], ctx, k, v);
        }
        if let Err(e) = bound {
            for g in self.graphs_mut() {
                g.graph.unbind_shared();
            }
            return Err(e);
        }
        let [lat, ts, k, v, ctx, mask, pred] = step;
        move_buf(&mut self.latents, lat);
        move_buf(&mut self.timestep, ts);
        for (old, region) in self.world.iter_mut().zip([k, v, ctx, mask]) {
            move_buf(old, region);
        }
        move_buf(&mut self.pred, pred);
        if let (Some(c), Some(own)) = (&mut self.chain, own) {
            c.move_into(own);
        }
        Ok(())
    }

    /// Bytes the host has copied from one buffer into another since load, in all: an
    /// instruction's text rows into the context when the instruction changes (the
    /// world-model chain). Nothing else: the noise, the flow update and the timestep are
    /// computed into their buffers, the prediction is read in place. What QNN copies is
    /// each graph's `client_buffer_bytes`.
    pub fn host_copy_bytes(&self) -> u64 {
        self.chain.as_ref().map_or(0, |c| c.text_copied)
    }

    /// Whether the contexts run on HTP shared buffers.
    pub fn on_shared_buffers(&self) -> bool {
        self.action_step.graph.is_shared()
    }

    /// One action_step execute of the flow loop on the current latents and timestep; the
    /// prediction lands in `self.pred`.
    fn execute_step(&mut self) -> Result<(), vla_qnn::QnnError> {
        let [k, v, ctx, mask] = &self.world;
        execute(
            &mut self.action_step.graph,
            self.io,
            [
                self.latents.src(),
                self.timestep.src(),
                k.src(),
                v.src(),
                ctx.src(),
                mask.src(),
            ],
            [self.pred.dst()],
        )
    }

    /// The instruction id of `text`: a fixed instruction of the same normalized text, else
    /// an attached pack's (see the `pack` module); refused in one line otherwise (Fast-WAM
    /// has no text encoder on the device) and for an open-loop bundle.
    pub fn instruction_from_text(&mut self, text: &[u8]) -> Result<u32, PolicyError> {
        match &self.chain {
            Some(c) => crate::text::pack_lookup(&c.packs, &self.settings_instructions(), text),
            None => Err(PolicyError::Instruction {
                text: String::from_utf8_lossy(text).into_owned(),
                reason: "an open-loop Fast-WAM bundle takes no instruction".into(),
            }),
        }
    }

    fn settings_instructions(&self) -> Vec<String> {
        self.settings
            .chain
            .as_ref()
            .map_or_else(Vec::new, |c| c.instructions.clone())
    }

    /// A lookup of texts in the fixed list and the attached packs, to run off the
    /// inference thread; `None` for an open-loop bundle.
    pub fn text_renderer(&self) -> Option<crate::TextRenderer> {
        let chain = self.chain.as_ref()?;
        Some(crate::TextRenderer::packs(
            chain.packs.clone(),
            Arc::new(self.settings_instructions()),
        ))
    }

    /// Attaches the instruction pack in `dir` (see [`crate::Policy::attach_pack`]).
    pub fn attach_pack(
        &mut self,
        dir: &std::path::Path,
        files: Option<&dyn crate::OpenFile>,
    ) -> Result<(String, usize), PolicyError> {
        let refused = |reason: &str| PolicyError::Pack {
            pack: dir.display().to_string(),
            reason: reason.into(),
        };
        let Some(chain) = self.chain.as_mut() else {
            return Err(refused("an open-loop Fast-WAM bundle takes no instruction"));
        };
        let settings = self
            .settings
            .chain
            .as_ref()
            .expect("a chain has its settings");
        let packs = Arc::get_mut(&mut chain.packs)
            .ok_or_else(|| refused("packs are attached before any text renderer is handed out"))?;
        packs.attach(
            dir,
            (&self.bundle_name, &self.bundle_version),
            settings,
            files,
        )
    }

    /// An attacher of packs to this policy while it runs (chain bundles; see the `pack`
    /// module).
    pub fn pack_attacher(&self) -> Option<crate::PackAttacher> {
        let chain = self.chain.as_ref()?;
        Some(crate::PackAttacher::new(
            chain.packs.clone(),
            (self.bundle_name.clone(), self.bundle_version.clone()),
            self.settings.chain.clone()?,
        ))
    }

    /// Installs `set` (see [`crate::Policy::install_packs`]).
    pub fn install_packs(
        &mut self,
        mut set: crate::AttachedPacks,
    ) -> Result<crate::AttachedPacks, crate::AttachedPacks> {
        match self.chain.as_mut() {
            Some(chain) if Arc::ptr_eq(&chain.packs, &set.base) => {
                // The instructions attached before keep their ids and rows: the context
                // written for the current instruction stays valid.
                std::mem::swap(&mut chain.packs, &mut set.packs);
                // `base` and `packs` are now the same set: this frees nothing here.
                set.base = set.packs.clone();
                Ok(set)
            }
            _ => Err(set),
        }
    }

    /// The attached instruction packs (chain bundles).
    pub fn packs(&self) -> Option<&crate::InstructionPacks> {
        self.chain.as_ref().map(|c| &*c.packs)
    }

    /// Every resident graph in pipeline order.
    pub(crate) fn graphs_mut(&mut self) -> Vec<&mut LoadedGraph> {
        let mut v = Vec::new();
        if let Some(c) = &mut self.chain {
            v.push(&mut c.vae);
            v.push(&mut c.embed);
            v.extend(c.splits.iter_mut());
        }
        v.push(&mut self.action_step);
        v
    }

    /// The host-glue intermediates of the last inference, by the end-to-end golden's
    /// names, in pipeline order (parity by stage).
    pub fn stages(&self, seed: u64) -> Vec<(String, Vec<f32>)> {
        let mut v = Vec::new();
        if let Some(c) = &self.chain {
            // Not `state`: the end-to-end goldens use that name for the ring input.
            v.push(("policy_state".into(), c.state.clone()));
            v.push(("normalized_state".into(), c.normalized_state.clone()));
            v.push(("image".into(), c.image.as_f32().to_vec()));
            v.push(("latents".into(), c.latents.as_f32().to_vec()));
            v.push(("context".into(), self.world[2].as_f32().to_vec()));
            for (i, &(off, len)) in c.split_ranges().iter().enumerate() {
                let r = off / 4..(off + len) / 4;
                v.push((
                    format!("keys_split{i}"),
                    self.world[0].as_f32()[r.clone()].to_vec(),
                ));
                v.push((
                    format!("values_split{i}"),
                    self.world[1].as_f32()[r].to_vec(),
                ));
            }
        }
        let mut noise = vec![0f32; self.latents.as_f32().len()];
        fill_gaussian(seed, &mut noise);
        v.push(("noise".into(), noise));
        v
    }

    /// One inference: `actions` (`action_horizon x action_dims`) from the observation (ignored
    /// in the open-loop form) and its seed. Allocates nothing.
    pub fn infer(&mut self, obs: &Observation<'_>, actions: &mut [f32]) -> Result<(), PolicyError> {
        self.infer_conditioned(obs, None, actions)
    }

    /// [`FastWam::infer`], the denoising loop optionally conditioned on `prefix`. Wan's
    /// sigma runs from 1 (noise) to 0 (data); the masked Euler delta is the same.
    pub fn infer_conditioned(
        &mut self,
        obs: &Observation<'_>,
        prefix: Option<&ActionPrefix<'_>>,
        actions: &mut [f32],
    ) -> Result<(), PolicyError> {
        if let Some(c) = &mut self.chain {
            c.accept(obs)?;
        }
        if let Some(p) = prefix {
            let (norm, f) = (&self.action_norm, &self.settings);
            let last = f.action_dims - 1;
            self.prefix.load_with(p, |a, i| {
                // Undo the libero gripper map (g' = -(2g - 1)) before normalizing.
                let a = match f.gripper_map {
                    GripperMap::Libero if i == last => (1.0 - a) / 2.0,
                    _ => a,
                };
                norm.forward(a, i)
            })?;
        }
        let f = &self.settings;
        let dims = f.action_dims;
        if actions.len() != f.action_horizon * dims {
            return Err(PolicyError::Observation {
                field: "action buffer",
                expected: format!("{} values", f.action_horizon * dims),
                found: format!("{} values", actions.len()),
            });
        }
        self.timings.reset();
        let start = Instant::now();
        let step_slot = match &mut self.chain {
            Some(c) => {
                let (keys, rest) = self.world.split_at_mut(1);
                let (values, rest) = rest.split_at_mut(1);
                c.run(
                    obs,
                    &mut rest[0],
                    &mut keys[0],
                    &mut values[0],
                    &mut self.timings,
                    self.fault.as_deref(),
                )?;
                2 + c.splits.len()
            }
            None => 0,
        };
        fill_gaussian(obs.seed, self.latents.as_f32_mut());
        if prefix.is_some() {
            self.prefix.seed(self.latents.as_f32_mut(), dims);
        }
        let (flow_steps, gripper_map, gripper_binarize) =
            (f.flow_steps, f.gripper_map, f.gripper_binarize);
        for i in 0..flow_steps {
            self.timestep.as_f32_mut()[0] = (self.sigmas[i] * 1000.0) as f32;
            let t = Instant::now();
            self.execute_step().map_err(|error| PolicyError::Qnn {
                component: "action_step".into(),
                error,
            })?;
            self.timings.add(step_slot, t.elapsed());
            if cfg!(feature = "fault-injection") && self.fault.as_deref() == Some("action_step") {
                self.pred.as_f32_mut()[0] = f32::INFINITY;
            }
            let pred = self.pred.as_f32();
            let bad = count_non_finite(pred);
            if bad > 0 {
                return Err(PolicyError::NonFinite {
                    component: "action_step".into(),
                    tensor: "pred_noise".into(),
                    count: bad,
                });
            }
            let x = self.latents.as_f32_mut();
            match prefix.map(|_| self.prefix.method()) {
                Some(PrefixMethod::VelocityMask) => self.prefix.update(
                    x,
                    pred,
                    crate::manifest::StepOutput::Velocity,
                    (self.sigmas[i + 1] - self.sigmas[i]) as f32,
                    dims,
                ),
                inpaint => {
                    wan_update(x, pred, self.sigmas[i], self.sigmas[i + 1]);
                    if inpaint.is_some() {
                        // sigma runs 1 (noise) -> 0 (data): the noise left is sigma_next.
                        self.prefix.inpaint(x, self.sigmas[i + 1] as f32, dims);
                    }
                }
            }
        }
        wan_actions(
            &self.action_norm,
            self.latents.as_f32(),
            actions,
            dims,
            gripper_map,
            gripper_binarize,
        );
        self.timings.total = start.elapsed();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn wan_schedule_matches_the_published_timesteps() {
        let s = super::wan_sigmas(10, 5.0);
        let expected = [
            1000.0, 978.261, 952.381, 921.053, 882.353, 833.333, 769.231, 681.818, 555.556, 357.143,
        ];
        for (sig, e) in s.iter().zip(expected) {
            assert!((sig * 1000.0 - e).abs() < 1e-3, "{} vs {e}", sig * 1000.0);
        }
        assert_eq!(s[10], 0.0);
    }

    #[test]
    fn gripper_is_mapped_as_upstream_libero_eval() {
        use super::map_gripper;
        use crate::manifest::GripperMap::{Libero, None};
        // Hand-checked: g = 0.8 -> 0.8*2 - 1 = 0.6 -> inverted -0.6 -> sign -1.
        assert!((map_gripper(0.8, Libero, false) + 0.6).abs() < 1e-6);
        assert_eq!(map_gripper(0.8, Libero, true), -1.0);
        assert_eq!(map_gripper(0.1, Libero, true), 1.0);
        assert_eq!(map_gripper(0.5, Libero, true), 0.0, "np.sign(0) = 0");
        assert_eq!(map_gripper(0.8, None, false), 0.8);
        assert_eq!(map_gripper(-0.2, None, true), -1.0);
    }
}
