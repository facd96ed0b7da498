//! Training-free prefix conditioning inside the host flow loop. Two methods, both with
//! the per-row mask `m`: 0 on the `frozen` rows that execute before the new chunk can
//! land, `(1 - e^(-k u)) / (1 - e^(-k))` (k = 6, `u` evenly spaced in (0, 1)) over the
//! rest of the overlap, 1 beyond. No extra context calls: only the host arithmetic
//! between them changes, so any compiled denoiser works.
//!
//! - [`PrefixMethod::VelocityMask`] (GR00T N1.7's native RTC): the overlap starts from
//!   the previous chunk's remaining (normalized) actions and each flow update moves row
//!   `j` by `m_j` of itself. It relies on the denoiser pulling a data-valued start
//!   towards its prediction; one that does not (an untrained network) adds `m_j` of its
//!   velocity to the prefix chunk after chunk, a random walk.
//! - [`PrefixMethod::Inpaint`] (Diffuser-style replacement with RTC's soft mask): the
//!   trajectory starts from noise as usual; after every update row `j` becomes
//!   `(1 - m_j) * prefix_j(s) + m_j * x_j`, `prefix_j(s)` the prefix noised to the
//!   update's noise level `s` with the row's own initial noise. The denoiser always sees
//!   inputs on its noise-to-data path; at the end a row is `(1 - m_j) * prefix + m_j *
//!   output`: the frozen rows exactly the prefix, the rest a convex blend, bounded by
//!   the model's own outputs whatever the model.

use crate::error::PolicyError;
use crate::manifest::StepOutput;
use crate::norm::Normalizer;

/// Steepness of the mask's ramp over the free part of the overlap.
const RAMP_K: f32 = 6.0;

/// How a prefix conditions the flow loop (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefixMethod {
    /// GR00T-style velocity mask: the overlap starts from the prefix (the `prefix` merge).
    #[default]
    VelocityMask,
    /// Inpainting: the overlap rows are replaced by the noised prefix after every update (the
    /// `inpaint` merge).
    Inpaint,
}

/// The previous chunk's actions re-indexed to the new observation's time, de-normalized,
/// `[H, action_dims]`, padded beyond `overlap` with its last real action.
#[derive(Clone, Copy, Debug)]
pub struct ActionPrefix<'a> {
    /// `[H, action_dims]` de-normalized actions.
    pub actions: &'a [f32],
    /// Rows that execute before the new chunk can land: held exactly to the prefix (mask 0).
    pub frozen: usize,
    /// Rows the prefix covers (at least `frozen`); the mask ramps up over those after `frozen`.
    pub overlap: usize,
    /// How the prefix conditions the flow loop.
    pub method: PrefixMethod,
}

/// Per-row update weight: 0 frozen, ramp over the rest of the overlap, 1 beyond.
pub fn prefix_mask(frozen: usize, overlap: usize, mask: &mut [f32]) {
    let free = overlap.saturating_sub(frozen);
    for (j, m) in mask.iter_mut().enumerate() {
        *m = if j < frozen {
            0.0
        } else if j < overlap {
            let u = (j - frozen + 1) as f32 / (free + 1) as f32;
            (1.0 - (-RAMP_K * u).exp()) / (1.0 - (-RAMP_K).exp())
        } else {
            1.0
        };
    }
}

/// The normalized prefix and its mask, allocated once at load.
pub(crate) struct PrefixBuffers {
    /// `[H, dims]` normalized.
    values: Vec<f32>,
    /// The overlap rows' initial noise, `[H, dims]` (inpainting).
    noise: Vec<f32>,
    mask: Vec<f32>,
    dims: usize,
    overlap: usize,
    method: PrefixMethod,
}

impl PrefixBuffers {
    pub(crate) fn new(horizon: usize, dims: usize) -> Self {
        Self {
            values: vec![0.0; horizon * dims],
            noise: vec![0.0; horizon * dims],
            mask: vec![1.0; horizon],
            dims,
            overlap: 0,
            method: PrefixMethod::VelocityMask,
        }
    }

    /// Normalizes `p` and computes its mask.
    pub(crate) fn load(
        &mut self,
        p: &ActionPrefix<'_>,
        norm: &Normalizer,
    ) -> Result<(), PolicyError> {
        self.load_with(p, |a, i| norm.normalize(a, i))
    }

    /// [`PrefixBuffers::load`] with the policy's own action -> normalized map.
    pub(crate) fn load_with(
        &mut self,
        p: &ActionPrefix<'_>,
        normalize: impl Fn(f32, usize) -> f32,
    ) -> Result<(), PolicyError> {
        let horizon = self.mask.len();
        if p.actions.len() != self.values.len() || p.overlap > horizon || p.frozen > p.overlap {
            return Err(PolicyError::Observation {
                field: "prefix",
                expected: format!(
                    "{} values, frozen <= overlap <= {horizon}",
                    self.values.len()
                ),
                found: format!(
                    "{} values, frozen {}, overlap {}",
                    p.actions.len(),
                    p.frozen,
                    p.overlap
                ),
            });
        }
        if let Some(i) = p.actions.iter().position(|v| !v.is_finite()) {
            return Err(PolicyError::Observation {
                field: "prefix",
                expected: "finite values".into(),
                found: format!("{} at index {i}", p.actions[i]),
            });
        }
        for (j, (v, &a)) in self.values.iter_mut().zip(p.actions).enumerate() {
            *v = normalize(a, j % self.dims);
        }
        prefix_mask(p.frozen, p.overlap, &mut self.mask);
        self.overlap = p.overlap;
        self.method = p.method;
        Ok(())
    }

    /// Starts a `[H, width]` trajectory that holds its initial noise: velocity masking
    /// starts the overlap from the prefix, inpainting keeps the noise (and a copy of it).
    pub(crate) fn seed(&mut self, x: &mut [f32], width: usize) {
        let d = self.dims;
        for j in 0..self.overlap {
            let (row, own) = (j * width..j * width + d, j * d..(j + 1) * d);
            match self.method {
                PrefixMethod::VelocityMask => x[row].copy_from_slice(&self.values[own]),
                PrefixMethod::Inpaint => self.noise[own].copy_from_slice(&x[row]),
            }
        }
    }

    pub(crate) fn method(&self) -> PrefixMethod {
        self.method
    }

    /// Inpainting, after the policy's own (unmasked) flow update of a `[H, width]`
    /// trajectory: each overlap row becomes `(1 - m) * noised prefix + m * x`.
    /// `noise_level` is the share of noise the trajectory holds after that update on its
    /// noise-to-data path (MolmoAct2: `1 - t_next`; Fast-WAM: `sigma_next`).
    pub(crate) fn inpaint(&self, x: &mut [f32], noise_level: f32, width: usize) {
        let d = self.dims;
        for j in 0..self.overlap {
            let keep = 1.0 - self.mask[j];
            let row = &mut x[j * width..j * width + d];
            let (p, z) = (
                &self.values[j * d..(j + 1) * d],
                &self.noise[j * d..(j + 1) * d],
            );
            for ((xv, &pv), &zv) in row.iter_mut().zip(p).zip(z) {
                let target = noise_level * zv + (1.0 - noise_level) * pv;
                *xv = keep * target + (1.0 - keep) * *xv;
            }
        }
    }

    /// The masked form of one host flow update of a `[H, width]` trajectory: a velocity
    /// (or Euler delta already scaled by the step) moves row `j` by `m_j` of itself; a
    /// next-trajectory output is blended `m_j out + (1 - m_j) prefix` on the overlap.
    /// Padded dims (`>= dims`) stay 0.
    pub(crate) fn update(
        &self,
        x: &mut [f32],
        out: &[f32],
        kind: StepOutput,
        scale: f32,
        width: usize,
    ) {
        let d = self.dims;
        for (i, (xv, &ov)) in x.iter_mut().zip(out).enumerate() {
            let (j, c) = (i / width, i % width);
            if c >= d {
                *xv = 0.0;
                continue;
            }
            let m = self.mask[j];
            *xv = match kind {
                StepOutput::Velocity => *xv + m * scale * ov,
                StepOutput::NextTrajectory if j < self.overlap => {
                    m * ov + (1.0 - m) * self.values[j * d + c]
                }
                StepOutput::NextTrajectory => ov,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{NormMode, Normalization};

    fn identity(dims: usize) -> Normalizer {
        Normalizer::new(
            &Normalization {
                mode: NormMode::Identity,
                follows: Default::default(),
                eps: None,
                mean: None,
                std: None,
                low: None,
                high: None,
                passthrough: None,
                constant: None,
            },
            dims,
        )
    }

    #[test]
    fn the_mask_freezes_ramps_then_frees() {
        let mut m = [9.0f32; 7];
        prefix_mask(2, 5, &mut m);
        assert_eq!(&m[..2], &[0.0, 0.0]);
        assert!(
            m[2] > 0.0 && m[2] < m[3] && m[3] < m[4] && m[4] < 1.0,
            "{m:?}"
        );
        assert_eq!(&m[5..], &[1.0, 1.0]);
    }

    #[test]
    fn frozen_rows_keep_the_prefix_through_both_kinds_of_update() {
        let (h, dims, width) = (4, 2, 3);
        let mut b = PrefixBuffers::new(h, dims);
        let prefix = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 5.0, 6.0];
        b.load(
            &ActionPrefix {
                actions: &prefix,
                frozen: 1,
                overlap: 3,
                method: PrefixMethod::VelocityMask,
            },
            &identity(dims),
        )
        .unwrap();
        let mut x = vec![7.0f32; h * width];
        b.seed(&mut x, width);
        assert_eq!(&x[..3], &[1.0, 2.0, 7.0]);
        assert_eq!(
            &x[9..],
            &[7.0, 7.0, 7.0],
            "beyond the overlap: the noise stays"
        );
        let out = vec![10.0f32; h * width];
        let mut v = x.clone();
        b.update(&mut v, &out, StepOutput::Velocity, 0.5, width);
        assert_eq!(
            &v[..3],
            &[1.0, 2.0, 0.0],
            "frozen row unchanged, pad dim zeroed"
        );
        assert!(
            v[3] > 3.0 && v[3] < 8.0,
            "ramped row moves part way: {}",
            v[3]
        );
        assert_eq!(&v[9..11], &[12.0, 12.0], "free row: full update");
        let mut n = x.clone();
        b.update(&mut n, &out, StepOutput::NextTrajectory, 1.0, width);
        assert_eq!(&n[..2], &[1.0, 2.0]);
        assert!(n[3] > 3.0 && n[3] < 10.0);
        assert_eq!(&n[9..11], &[10.0, 10.0]);
    }

    #[test]
    fn inpainting_starts_from_noise_and_ends_frozen_blended_then_free() {
        let (h, dims, width) = (4, 1, 2);
        let mut b = PrefixBuffers::new(h, dims);
        let prefix = [1.0, 2.0, 3.0, 3.0];
        b.load(
            &ActionPrefix {
                actions: &prefix,
                frozen: 1,
                overlap: 3,
                method: PrefixMethod::Inpaint,
            },
            &identity(dims),
        )
        .unwrap();
        // Initial noise 9 in every row; the pad column stays 0.
        let mut x = vec![9.0, 0.0, 9.0, 0.0, 9.0, 0.0, 9.0, 0.0];
        b.seed(&mut x, width);
        assert_eq!(x[0], 9.0, "the overlap keeps its noise");
        // Half way (noise level 0.5), the frozen row is the prefix noised half way.
        b.inpaint(&mut x, 0.5, width);
        assert_eq!(x[0], 0.5 * 9.0 + 0.5 * 1.0);
        // The model's last output is 20 everywhere; at noise level 0 the frozen row is
        // the prefix, the ramped rows lie between prefix and output, the free row is 20.
        let mut y = vec![20.0, 0.0, 20.0, 0.0, 20.0, 0.0, 20.0, 0.0];
        b.inpaint(&mut y, 0.0, width);
        assert_eq!(y[0], 1.0);
        assert!(
            y[2] > 2.0 && y[2] < 20.0 && y[4] > 3.0 && y[4] < 20.0,
            "{y:?}"
        );
        assert!(
            y[2] - 2.0 < y[4] - 3.0,
            "the ramp lets the later row go further: {y:?}"
        );
        assert_eq!((y[6], y[1], y[3]), (20.0, 0.0, 0.0));
    }

    #[test]
    fn a_malformed_or_non_finite_prefix_is_refused() {
        let mut b = PrefixBuffers::new(2, 1);
        let bad = [f32::NAN, 1.0];
        let p = ActionPrefix {
            actions: &bad,
            frozen: 0,
            overlap: 2,
            method: PrefixMethod::VelocityMask,
        };
        assert!(b.load(&p, &identity(1)).is_err());
        let p = ActionPrefix {
            actions: &[1.0, 1.0],
            frozen: 2,
            overlap: 1,
            method: PrefixMethod::Inpaint,
        };
        assert!(b.load(&p, &identity(1)).is_err());
    }
}
