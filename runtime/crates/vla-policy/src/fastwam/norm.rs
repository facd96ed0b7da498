//! Fast-WAM's dataset normalizer (upstream `SingleFieldLinearNormalizer`), kept apart from
//! MolmoAct2's `Normalizer` because the two checkpoints were trained with different rules.
//!
//! As upstream, a per-dim `scale` and `offset` are computed once in f32 and applied as
//! `x * scale + offset` (forward, the robot state, then clamped to [-5, 5]) and
//! `(x - offset) / scale` (backward, the actions, never clamped): z-score
//! `scale = 1 / (std + 1e-8)`, `offset = -mean / (std + 1e-8)`; `min_max` / `quantile` an
//! affine map onto [-1, 1], `scale = 2 / range`, `offset = -1 - scale * low`, except that a
//! dim whose range is below 1e-4 gets `scale = 1`, `offset = -low` (so forward is `x - low`,
//! not 0). Bit for bit against upstream's own outputs (golden/upstream-fastwam/,
//! tests/upstream_fastwam.rs): the same f32 operations in the same order, no fused
//! multiply-add. `passthrough` dims (a bundle setting) are left as they are both ways.

use crate::manifest::{NormMode, Normalization};

/// Added to `std` before dividing (upstream's `std_reg`).
pub const STD_EPS: f32 = 1e-8;
/// A `min_max`/`quantile` dim whose range is below this (upstream's `range_tol`) is only
/// shifted by `-low`.
pub const MIN_RANGE: f32 = 1e-4;
/// The forward (state) clamp.
pub const STATE_CLAMP: f32 = 5.0;

/// Fast-WAM's own normalizer (upstream `SingleFieldLinearNormalizer`): per dim
/// `scale` and `offset`, computed once from a normalization block.
#[derive(Clone, Debug)]
pub struct FastWamNormalizer {
    scale: Vec<f32>,
    offset: Vec<f32>,
    passthrough: Vec<bool>,
}

impl FastWamNormalizer {
    /// `dims` dimensions; the manifest was validated to carry what `mode` needs.
    pub fn new(n: &Normalization, dims: usize) -> Self {
        let get = |v: &Option<Vec<f32>>, d: f32| v.clone().unwrap_or_else(|| vec![d; dims]);
        let (scale, offset) = match n.mode {
            NormMode::Quantile | NormMode::MinMax => {
                let (lo, hi) = (get(&n.low, 0.0), get(&n.high, 1.0));
                lo.iter()
                    .zip(&hi)
                    .map(|(&l, &h)| {
                        let range = h - l;
                        if range < MIN_RANGE {
                            (1.0, 0.0 - l)
                        } else {
                            let scale = 2.0 / range;
                            (scale, -1.0 - scale * l)
                        }
                    })
                    .unzip()
            }
            NormMode::MeanStd => get(&n.mean, 0.0)
                .iter()
                .zip(&get(&n.std, 1.0))
                .map(|(&m, &s)| {
                    let d = s + STD_EPS;
                    (1.0 / d, -m / d)
                })
                .unzip(),
            NormMode::Identity => (vec![1.0; dims], vec![0.0; dims]),
        };
        Self {
            scale,
            offset,
            passthrough: n.passthrough.clone().unwrap_or_else(|| vec![false; dims]),
        }
    }

    /// Number of dims.
    pub fn dims(&self) -> usize {
        self.passthrough.len()
    }

    /// Raw state value of dim `i` -> normalized, clamped to [-5, 5].
    pub fn forward(&self, x: f32, i: usize) -> f32 {
        if self.passthrough[i] {
            return x;
        }
        (x * self.scale[i] + self.offset[i]).clamp(-STATE_CLAMP, STATE_CLAMP)
    }

    /// Normalized action value of dim `i` -> robot units (no clamp).
    pub fn backward(&self, x: f32, i: usize) -> f32 {
        if self.passthrough[i] {
            return x;
        }
        (x - self.offset[i]) / self.scale[i]
    }

    /// [`FastWamNormalizer::backward`] over a row-major chunk `[rows, dims]`.
    pub fn backward_into(&self, x: &[f32], out: &mut [f32]) {
        let dims = self.dims();
        for (j, (o, &v)) in out.iter_mut().zip(x).enumerate() {
            *o = self.backward(v, j % dims);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(mode: NormMode) -> Normalization {
        Normalization {
            mode,
            follows: Default::default(),
            eps: None,
            low: Some(vec![-2.0, 0.5]),
            high: Some(vec![2.0, 0.5 + 5e-5]),
            mean: Some(vec![1.0, 0.0]),
            std: Some(vec![0.5, 0.0]),
            passthrough: None,
            constant: None,
        }
    }

    #[test]
    fn state_is_clamped_to_five_and_actions_are_not_clamped() {
        // Hand-checked: min_max low -2 high 2: x = 30 -> 2*32/4 - 1 = 15 -> clamped 5.
        let n = FastWamNormalizer::new(&norm(NormMode::MinMax), 2);
        assert_eq!(n.forward(30.0, 0), 5.0);
        assert_eq!(n.forward(-30.0, 0), -5.0);
        assert_eq!(n.forward(1.0, 0), 0.5);
        // Range 5e-5 < 1e-4: upstream only shifts the dim by -low (0.7 - 0.5), both ways.
        assert_eq!(n.forward(0.7, 1), 0.7 - 0.5);
        assert_eq!(n.backward(0.2, 1), 0.2 + 0.5);
        // Backward: (3 + 1) / 2 * 4 - 2 = 6, beyond `high`, not clamped (MolmoAct2's would be).
        assert_eq!(n.backward(3.0, 0), 6.0);
        let z = FastWamNormalizer::new(&norm(NormMode::MeanStd), 2);
        // (4 - 1) / (0.5 + 1e-8) = 6 -> clamped 5; backward 12 * 0.5 + 1 = 7.
        assert_eq!(z.forward(4.0, 0), 5.0);
        assert!((z.forward(1.5, 0) - 1.0).abs() < 1e-6);
        assert!((z.backward(12.0, 0) - 7.0).abs() < 1e-6);
        // std 0 divides by 1e-8 and clamps rather than overflowing.
        assert_eq!(z.forward(1.0, 1), 5.0);
    }
}
