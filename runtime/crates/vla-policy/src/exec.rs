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

pub fn count_non_finite(v: &[f32]) -> usize {
    v.iter().filter(|x| !x.is_finite()).count()
}

/// Wall time per component of the last inference; entries are allocated at load and only
/// overwritten afterwards.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub components: Vec<(String, Duration)>,
    pub total: Duration,
}

impl Timings {
    pub fn new(names: &[String]) -> Self {
        Self {
            components: names.iter().map(|n| (n.clone(), Duration::ZERO)).collect(),
            total: Duration::ZERO,
        }
    }

    pub fn reset(&mut self) {
        self.components
            .iter_mut()
            .for_each(|c| c.1 = Duration::ZERO);
        self.total = Duration::ZERO;
    }

    pub fn add(&mut self, index: usize, d: Duration) {
        self.components[index].1 += d;
    }

    /// Time spent outside the contexts (host glue).
    pub fn host(&self) -> Duration {
        self.total
            .saturating_sub(self.components.iter().map(|c| c.1).sum())
    }
}
