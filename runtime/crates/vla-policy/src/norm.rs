//! State normalization and action de-normalization with per-dimension pass-through, as
//! whichever of upstream's two normalizers the bundle says its checkpoint is run with
//! (`follows`), in f32, operation by operation.
//!
//! - `hf_feature_normalizer` (`_FeatureNormalizer` in the HF remote code, `predict_action`):
//!   ranges and `std` floored at [`RANGE_FLOOR`]; quantile and min_max values clipped to
//!   [-1, 1] both ways (on the way out every dim, the pass-through gripper too, is clipped
//!   before de-normalizing); dims whose dataset min equals its max normalize to 0; mean_std
//!   is never clipped.
//! - `lerobot_pipeline` (LeRobot's `select_action`: the masked normalizer, the clamp of the
//!   normalized state, the clamp of every action dim, the masked unnormalizer): a range of
//!   exactly 0 divides by its `eps` (1e-8), any other range by itself; `std + eps`; no zero
//!   mask; every mode clipped both ways; a pass-through value outside [-1, 1] refused.
//!
//! Checked bit for bit against golden/upstream/ and golden/upstream/lerobot_norm/.

use crate::manifest::{NormFollows, NormMode, Normalization};

/// Upstream's `eps`: the least range (`high - low`) or `std` a normalization divides by.
pub const RANGE_FLOOR: f32 = 1e-6;

/// LeRobot's normalizer `eps` when the bundle does not state it (its dataclass default).
pub const LEROBOT_EPS: f32 = 1e-8;

/// Statistics resolved into dense per-dimension arrays once at load.
#[derive(Clone, Debug)]
pub struct Normalizer {
    mode: NormMode,
    lerobot: bool,
    a: Vec<f32>,
    b: Vec<f32>,
    /// The divisor of `normalize` (and LeRobot's multiplier of quantile / min_max
    /// `denormalize`): HF `max(high - low, RANGE_FLOOR)` / `max(std, RANGE_FLOOR)`, LeRobot
    /// `high - low` (`eps` when exactly 0) / `std + eps`.
    denom: Vec<f32>,
    passthrough: Vec<bool>,
    constant: Vec<bool>,
}

impl Normalizer {
    /// `n` dimensions; the manifest was validated to have the statistics `mode` needs.
    pub fn new(n: &Normalization, dims: usize) -> Self {
        let lerobot = n.follows == NormFollows::LerobotPipeline;
        let eps = n.eps.unwrap_or(LEROBOT_EPS);
        let pick = |v: &Option<Vec<f32>>| v.clone().unwrap_or_else(|| vec![0.0; dims]);
        let (a, b) = match n.mode {
            NormMode::Quantile | NormMode::MinMax => (pick(&n.low), pick(&n.high)),
            NormMode::MeanStd => (pick(&n.mean), pick(&n.std)),
            NormMode::Identity => (vec![0.0; dims], vec![1.0; dims]),
        };
        let denom = a
            .iter()
            .zip(&b)
            .map(|(&a, &b)| match (n.mode, lerobot) {
                (NormMode::Quantile | NormMode::MinMax, false) => (b - a).max(RANGE_FLOOR),
                (NormMode::Quantile | NormMode::MinMax, true) if b - a == 0.0 => eps,
                (NormMode::Quantile | NormMode::MinMax, true) => b - a,
                (NormMode::MeanStd, false) => b.max(RANGE_FLOOR),
                (NormMode::MeanStd, true) => b + eps,
                (NormMode::Identity, _) => 1.0,
            })
            .collect();
        let mut constant = n.constant.clone().unwrap_or_else(|| vec![false; dims]);
        if n.mode == NormMode::MinMax && !lerobot {
            // The HF min_max zero mask is `min == max` of the very stats it uses.
            for (c, (lo, hi)) in constant.iter_mut().zip(a.iter().zip(&b)) {
                *c |= lo == hi;
            }
        }
        let passthrough = n.passthrough.clone().unwrap_or_else(|| vec![false; dims]);
        Self {
            mode: n.mode,
            lerobot,
            a,
            b,
            denom,
            passthrough,
            constant,
        }
    }

    /// Whether values are clipped to [-1, 1] after normalizing and before de-normalizing:
    /// LeRobot's clamp steps clip every mode, the HF normalizer the bounded ones.
    fn clips(&self) -> bool {
        self.lerobot || matches!(self.mode, NormMode::Quantile | NormMode::MinMax)
    }

    /// The first dim of `x` (a raw state or action) the normalizer refuses, with its
    /// value: LeRobot's masked steps raise on a pass-through value outside [-1, 1] ("set
    /// normalize_gripper=True"); the HF normalizer refuses nothing. NaN is not caught here
    /// (upstream lets it through; the caller refuses non-finite input before).
    pub fn refused(&self, x: &[f32]) -> Option<(usize, f32)> {
        if !self.lerobot {
            return None;
        }
        x.iter()
            .zip(&self.passthrough)
            .position(|(&v, &p)| p && !(-1.0..=1.0).contains(&v))
            .map(|i| (i, x[i]))
    }

    /// Raw state -> normalized (the inverse of [`Normalizer::denormalize`]). A constant
    /// dim is 0 in the HF clipping modes, as upstream's `zero_mask` (which mean_std lacks).
    pub fn normalize(&self, x: f32, i: usize) -> f32 {
        if self.constant[i] && self.clips() {
            return 0.0;
        }
        if self.passthrough[i] {
            return x;
        }
        let (a, denom) = (self.a[i], self.denom[i]);
        let y = match self.mode {
            NormMode::Quantile | NormMode::MinMax => 2.0 * (x - a) / denom - 1.0,
            NormMode::MeanStd => (x - a) / denom,
            NormMode::Identity => x,
        };
        if self.clips() {
            y.clamp(-1.0, 1.0)
        } else {
            y
        }
    }

    /// Number of dimensions.
    pub fn dims(&self) -> usize {
        self.passthrough.len()
    }

    /// De-normalizes a row-major chunk `[rows, dims]` into `out` (same length).
    pub fn denormalize_into(&self, x: &[f32], out: &mut [f32]) {
        let dims = self.dims();
        for (j, (a, &v)) in out.iter_mut().zip(x).enumerate() {
            *a = self.denormalize(v, j % dims);
        }
    }

    /// Normalized model output -> robot units. Clipped first (see [`Normalizer::clips`]),
    /// every dim: a pass-through dim comes out clipped too.
    pub fn denormalize(&self, x: f32, i: usize) -> f32 {
        let x = if self.clips() { x.clamp(-1.0, 1.0) } else { x };
        if self.passthrough[i] {
            return x;
        }
        let (a, b) = (self.a[i], self.b[i]);
        match (self.mode, self.lerobot) {
            (NormMode::Quantile | NormMode::MinMax, false) => (x + 1.0) * (b - a) / 2.0 + a,
            // LeRobot's own orders: quantile `(x + 1) * denom / 2 + q01`, min_max
            // `(x + 1) / 2 * denom + min`, with the eps-substituted range.
            (NormMode::Quantile, true) => (x + 1.0) * self.denom[i] / 2.0 + a,
            (NormMode::MinMax, true) => (x + 1.0) / 2.0 * self.denom[i] + a,
            (NormMode::MeanStd, _) => x * b + a,
            (NormMode::Identity, _) => x,
        }
    }
}

/// The state-token id of one normalized state value: `rint((clip(s) + 1) / 2 * 255)`
/// (upstream `_build_discrete_state_string`; the clip also covers pass-through dims).
pub fn state_token_id(normalized: f32) -> usize {
    let s = normalized.clamp(-1.0, 1.0);
    let id = ((s + 1.0) / 2.0 * 255.0).round_ties_even();
    // NaN clamps to NaN; the caller rejects non-finite state before this point.
    id.clamp(0.0, 255.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(mode: NormMode) -> Normalization {
        Normalization {
            mode,
            follows: NormFollows::HfFeatureNormalizer,
            eps: None,
            low: Some(vec![-2.0, 0.0]),
            high: Some(vec![2.0, 1.0]),
            mean: Some(vec![1.0, 0.0]),
            std: Some(vec![2.0, 1.0]),
            passthrough: Some(vec![false, true]),
            constant: None,
        }
    }

    #[test]
    fn modes_round_trip_and_passthrough_is_untouched() {
        for mode in [
            NormMode::Quantile,
            NormMode::MinMax,
            NormMode::MeanStd,
            NormMode::Identity,
        ] {
            let n = Normalizer::new(&norm(mode), 2);
            for x in [-1.5f32, 0.0, 1.25] {
                let y = n.denormalize(n.normalize(x, 0), 0);
                assert!((x - y).abs() < 1e-6, "{mode:?}: {x} -> {y}");
            }
            assert_eq!(n.normalize(7.0, 1), 7.0);
        }
        let q = Normalizer::new(&norm(NormMode::Quantile), 2);
        assert_eq!(q.denormalize(5.0, 0), 2.0, "quantile clips to [-1, 1]");
        assert_eq!(
            q.denormalize(3.0, 1),
            1.0,
            "the pass-through gripper is clipped too"
        );
        assert_eq!(
            q.normalize(9.0, 0),
            1.0,
            "and normalized states are clipped"
        );
        let ms = Normalizer::new(&norm(NormMode::MeanStd), 2);
        assert_eq!(ms.denormalize(3.0, 0), 7.0, "mean_std never clips");
        assert_eq!(ms.denormalize(3.0, 1), 3.0);
    }

    #[test]
    fn tiny_ranges_are_floored_and_constant_dims_are_zero() {
        let n = Normalizer::new(
            &Normalization {
                mode: NormMode::Quantile,
                follows: NormFollows::HfFeatureNormalizer,
                eps: None,
                low: Some(vec![0.5, 0.5]),
                high: Some(vec![0.5, 0.5 + 1e-7]),
                mean: None,
                std: None,
                passthrough: None,
                constant: Some(vec![true, false]),
            },
            2,
        );
        assert_eq!(n.normalize(0.8, 0), 0.0, "a constant dim normalizes to 0");
        assert_eq!(n.normalize(0.5, 1), -1.0);
        // 2 * 3e-7 / 1e-6 - 1 = -0.4: divided by the floor, not by the 1e-7 range.
        assert!((n.normalize(0.5 + 3e-7, 1) + 0.4).abs() < 1e-2);
        let ms = Normalizer::new(
            &Normalization {
                mode: NormMode::MeanStd,
                follows: NormFollows::HfFeatureNormalizer,
                eps: None,
                low: None,
                high: None,
                mean: Some(vec![1.0]),
                std: Some(vec![0.0]),
                passthrough: None,
                constant: None,
            },
            1,
        );
        assert_eq!(
            ms.normalize(1.5, 0),
            0.5 / RANGE_FLOOR,
            "std 0 divides by the floor"
        );
    }

    #[test]
    fn state_token_ids_round_half_to_even_and_clip() {
        assert_eq!(state_token_id(-1.0), 0);
        assert_eq!(state_token_id(1.0), 255);
        assert_eq!(state_token_id(7.0), 255);
        assert_eq!(state_token_id(-3.0), 0);
        // (s + 1) / 2 * 255 = 127.5 exactly -> 128 (even).
        assert_eq!(state_token_id(0.0), 128);
        assert_eq!(state_token_id(1.0 / 255.0), 128);
    }
}
