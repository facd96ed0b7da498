//! State normalization and action de-normalization with per-dimension pass-through.
//!
//! Arithmetic follows the reference in f32, operation by operation, so the same inputs
//! give the same bits as the golden's numpy path.

use crate::manifest::{NormMode, Normalization};

/// Statistics resolved into dense per-dimension arrays once at load.
#[derive(Clone, Debug)]
pub struct Normalizer {
    mode: NormMode,
    a: Vec<f32>,
    b: Vec<f32>,
    passthrough: Vec<bool>,
}

impl Normalizer {
    /// `n` dimensions; the manifest was validated to have the statistics `mode` needs.
    pub fn new(n: &Normalization, dims: usize) -> Self {
        let pick = |v: &Option<Vec<f32>>| v.clone().unwrap_or_else(|| vec![0.0; dims]);
        let (a, b) = match n.mode {
            NormMode::Quantile | NormMode::MinMax => (pick(&n.low), pick(&n.high)),
            NormMode::MeanStd => (pick(&n.mean), pick(&n.std)),
            NormMode::Identity => (vec![0.0; dims], vec![1.0; dims]),
        };
        let passthrough = n.passthrough.clone().unwrap_or_else(|| vec![false; dims]);
        Self {
            mode: n.mode,
            a,
            b,
            passthrough,
        }
    }

    /// Raw state -> normalized (the inverse of [`Normalizer::denormalize`]).
    pub fn normalize(&self, x: f32, i: usize) -> f32 {
        if self.passthrough[i] {
            return x;
        }
        let (a, b) = (self.a[i], self.b[i]);
        match self.mode {
            NormMode::Quantile | NormMode::MinMax => (x - a) / (b - a) * 2.0 - 1.0,
            NormMode::MeanStd => (x - a) / b,
            NormMode::Identity => x,
        }
    }

    /// De-normalizes a row-major chunk `[rows, dims]` into `out` (same length).
    pub fn denormalize_into(&self, x: &[f32], out: &mut [f32]) {
        let dims = self.passthrough.len();
        for (j, (a, &v)) in out.iter_mut().zip(x).enumerate() {
            *a = self.denormalize(v, j % dims);
        }
    }

    /// Normalized model output -> robot units.
    pub fn denormalize(&self, x: f32, i: usize) -> f32 {
        if self.passthrough[i] {
            return x;
        }
        let (a, b) = (self.a[i], self.b[i]);
        match self.mode {
            NormMode::Quantile => (x.clamp(-1.0, 1.0) + 1.0) * (b - a) / 2.0 + a,
            NormMode::MinMax => (x + 1.0) / 2.0 * (b - a) + a,
            NormMode::MeanStd => x * b + a,
            NormMode::Identity => x,
        }
    }
}

/// The state-token id of one normalized state value: `rint((clip(s) + 1) / 2 * 255)`.
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
            low: Some(vec![-2.0, 0.0]),
            high: Some(vec![2.0, 1.0]),
            mean: Some(vec![1.0, 0.0]),
            std: Some(vec![2.0, 1.0]),
            passthrough: Some(vec![false, true]),
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
            assert_eq!(n.denormalize(0.3, 1), 0.3);
            assert_eq!(n.normalize(7.0, 1), 7.0);
        }
        let q = Normalizer::new(&norm(NormMode::Quantile), 2);
        assert_eq!(q.denormalize(5.0, 0), 2.0, "quantile clips to [-1, 1]");
        assert_eq!(q.denormalize(-1.0, 0), -2.0);
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
