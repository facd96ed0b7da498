//! Small helpers shared by the pipelines: binding buffers in graph order, timings, finiteness.

use std::time::Duration;

/// Puts `bufs` (in the pipeline's order) at the graph positions `idx`.
pub fn ordered<const N: usize>(idx: [usize; N], bufs: [&[u8]; N]) -> [&[u8]; N] {
    let mut out: [&[u8]; N] = [&[]; N];
    for (k, &i) in idx.iter().enumerate() {
        out[i] = bufs[k];
    }
    out
}

/// As [`ordered`], for output buffers. `idx` is a permutation (checked at load).
pub fn ordered_mut<'a, const N: usize>(
    idx: [usize; N],
    bufs: [&'a mut [u8]; N],
) -> [&'a mut [u8]; N] {
    let mut out: [Option<&'a mut [u8]>; N] = [const { None }; N];
    for (k, b) in bufs.into_iter().enumerate() {
        out[idx[k]] = Some(b);
    }
    out.map(|o| o.expect("graph positions are a permutation"))
}

/// 1 when `x` is NaN or Inf, else 0. Their exponent bits are all ones, so with the sign
/// masked off their bit pattern exceeds `f32::MAX`'s: an integer compare that vectorizes,
/// where `is_finite` per value does not, so counting over a large output runs at memory
/// speed.
#[inline]
pub(crate) fn non_finite(x: f32) -> u32 {
    const MAX_FINITE: u32 = 0x7f7f_ffff;
    u32::from(x.to_bits() & 0x7fff_ffff > MAX_FINITE)
}

/// NaN and Inf values in `v` (see [`non_finite`]).
pub fn count_non_finite(v: &[f32]) -> usize {
    v.chunks(1 << 20)
        .map(|c| c.iter().map(|&x| non_finite(x)).sum::<u32>() as usize)
        .sum()
}

/// Wall time per component of the last inference; entries are allocated at load and only
/// overwritten afterwards.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Per component, in the order given to [`Timings::new`], its wall time in the last
    /// inference.
    pub components: Vec<(String, Duration)>,
    /// Wall time of the whole last inference.
    pub total: Duration,
}

impl Timings {
    /// Zeroed timings for these component names (allocates; call at load).
    pub fn new(names: &[String]) -> Self {
        Self {
            components: names.iter().map(|n| (n.clone(), Duration::ZERO)).collect(),
            total: Duration::ZERO,
        }
    }

    /// Zeroes every entry before an inference, without allocating.
    pub fn reset(&mut self) {
        self.components
            .iter_mut()
            .for_each(|c| c.1 = Duration::ZERO);
        self.total = Duration::ZERO;
    }

    /// Adds `d` to the component at `index` (its position in the names given to
    /// [`Timings::new`]).
    pub fn add(&mut self, index: usize, d: Duration) {
        self.components[index].1 += d;
    }

    /// Time spent outside the contexts (host glue).
    pub fn host(&self) -> Duration {
        self.total
            .saturating_sub(self.components.iter().map(|c| c.1).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::count_non_finite;

    #[test]
    fn counts_nan_and_both_infinities_only() {
        let mut v = vec![
            0.0f32,
            -0.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
        ];
        assert_eq!(count_non_finite(&v), 0);
        v.extend([f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        v.push(f32::from_bits(0x7f80_0001)); // signalling NaN
        assert_eq!(count_non_finite(&v), 5);
        assert_eq!(count_non_finite(&[]), 0);
    }
}
