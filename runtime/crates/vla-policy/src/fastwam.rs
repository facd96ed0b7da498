//! The Fast-WAM action expert: the Wan flow-matching schedule over one resident
//! action_step context, with the video KV cache and text context as constant inputs.
//!
//! The video world-model prefill and the VAE still run off the NPU upstream; their output
//! (the `world_model` npz of the bundle) is loaded once into the context's input buffers.

use crate::bundle::{Bundle, LoadedGraph};
use crate::error::PolicyError;
use crate::exec::{count_non_finite, ordered, ordered_mut, Timings};
use crate::manifest::FastWamSettings;
use crate::noise::fill_gaussian;
use crate::norm::Normalizer;
use crate::prefix::{ActionPrefix, PrefixBuffers};
use crate::Observation;
use std::time::Instant;
use vla_npz::{DType, Npz};
use vla_qnn::Backend;
use vla_tensor::AlignedBuf;

const WORLD_INPUTS: [&str; 4] = ["video_keys", "video_values", "context", "context_mask"];

pub struct FastWam {
    pub settings: FastWamSettings,
    pub(crate) action_step: LoadedGraph,
    io: ([usize; 6], [usize; 1]),
    latents: AlignedBuf,
    timestep: AlignedBuf,
    world: [AlignedBuf; 4],
    pred: AlignedBuf,
    /// sigma_0..sigma_N (sigma_N = 0), f64 as in the reference.
    sigmas: Vec<f64>,
    action_norm: Normalizer,
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

/// The action chunk from the final latents: de-normalize, then (with `gripper_binarize`)
/// map the last dim to +1 / -1.
pub fn wan_actions(
    norm: &Normalizer,
    latents: &[f32],
    actions: &mut [f32],
    dims: usize,
    gripper_binarize: bool,
) {
    norm.denormalize_into(latents, actions);
    if gripper_binarize {
        for row in actions.chunks_exact_mut(dims) {
            let g = &mut row[dims - 1];
            *g = if *g >= 0.0 { 1.0 } else { -1.0 };
        }
    }
}

impl FastWam {
    pub fn load(bundle: &Bundle, backend: &Backend) -> Result<Self, PolicyError> {
        let f = bundle
            .manifest
            .fastwam
            .clone()
            .expect("validated: fastwam settings present");
        let g = bundle.load_component(backend, "action_step")?;
        g.expect_counts(6, 1)?;
        let latent_shape = [1, f.action_horizon, f.action_dims];
        let (la, _) = g.input("latents_action", Some(&latent_shape))?;
        let (ts, _) = g.input("timestep", Some(&[1]))?;
        let npz = Npz::open(bundle.path(&f.world_model)).map_err(PolicyError::Npz)?;
        let mut world: [AlignedBuf; 4] = Default::default();
        let mut world_idx = [0usize; 4];
        for (k, name) in WORLD_INPUTS.iter().enumerate() {
            let (i, shape) = g.input(name, None)?;
            let a = npz
                .expect(name, DType::F32, &shape)
                .map_err(PolicyError::Npz)?;
            let values = a.to_f32().map_err(PolicyError::Npz)?;
            if let Some(j) = values.iter().position(|x| !x.is_finite()) {
                return Err(PolicyError::NonFinite {
                    component: "world_model".into(),
                    tensor: format!("{name}[{j}]"),
                    count: count_non_finite(&values),
                });
            }
            let mut buf = AlignedBuf::zeroed(values.len() * 4);
            buf.as_f32_mut().copy_from_slice(&values);
            world[k] = buf;
            world_idx[k] = i;
        }
        let (pn, _) = g.output("pred_noise", Some(&latent_shape))?;
        let n = f.action_horizon * f.action_dims;
        Ok(Self {
            io: (
                [
                    la,
                    ts,
                    world_idx[0],
                    world_idx[1],
                    world_idx[2],
                    world_idx[3],
                ],
                [pn],
            ),
            latents: AlignedBuf::zeroed(n * 4),
            timestep: AlignedBuf::zeroed(4),
            world,
            pred: AlignedBuf::zeroed(n * 4),
            sigmas: wan_sigmas(f.flow_steps, f.shift),
            action_norm: Normalizer::new(&f.action_norm, f.action_dims),
            timings: Timings::new(&["action_step".to_string()]),
            fault: None,
            prefix: PrefixBuffers::new(f.action_horizon, f.action_dims),
            action_step: g,
            settings: f,
        })
    }

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
        if let Some(p) = prefix {
            self.prefix.load(p, &self.action_norm)?;
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
        fill_gaussian(obs.seed, self.latents.as_f32_mut());
        if prefix.is_some() {
            self.prefix.seed(self.latents.as_f32_mut(), dims);
        }
        let (ii, oi) = self.io;
        for i in 0..f.flow_steps {
            self.timestep.as_f32_mut()[0] = (self.sigmas[i] * 1000.0) as f32;
            let t = Instant::now();
            self.action_step
                .graph
                .execute(
                    &ordered(
                        ii,
                        [
                            self.latents.as_bytes(),
                            self.timestep.as_bytes(),
                            self.world[0].as_bytes(),
                            self.world[1].as_bytes(),
                            self.world[2].as_bytes(),
                            self.world[3].as_bytes(),
                        ],
                    ),
                    &mut ordered_mut(oi, [self.pred.as_bytes_mut()]),
                )
                .map_err(|error| PolicyError::Qnn {
                    component: "action_step".into(),
                    error,
                })?;
            self.timings.add(0, t.elapsed());
            if cfg!(feature = "fault-injection") && self.fault.as_deref() == Some("action_step") {
                self.pred.as_f32_mut()[0] = f32::INFINITY;
            }
            let bad = count_non_finite(self.pred.as_f32());
            if bad > 0 {
                return Err(PolicyError::NonFinite {
                    component: "action_step".into(),
                    tensor: "pred_noise".into(),
                    count: bad,
                });
            }
            match prefix {
                Some(_) => self.prefix.update(
                    self.latents.as_f32_mut(),
                    self.pred.as_f32(),
                    crate::manifest::StepOutput::Velocity,
                    (self.sigmas[i + 1] - self.sigmas[i]) as f32,
                    dims,
                ),
                None => wan_update(
                    self.latents.as_f32_mut(),
                    self.pred.as_f32(),
                    self.sigmas[i],
                    self.sigmas[i + 1],
                ),
            }
        }
        wan_actions(
            &self.action_norm,
            self.latents.as_f32(),
            actions,
            dims,
            f.gripper_binarize,
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
}
