//! KeyStone: geometric best-of-K selection over candidate action chunks.
//!
//! All distances in f64 on preallocated scratch, as `docs/bundle-format.md` step 7 and
//! the public KeyStone code (`selection.py`, `_cluster_medoid_guarded_aggregation` and
//! `_kmeans_assignments`) do it: plain medoid, or the guarded medoid that falls back to
//! the medoid of the larger 2-means cluster when the candidates spread out. The median
//! of the pairwise distances is `torch.median`'s, the lower middle value; 2-means stops
//! when the centroids stop moving (`torch.allclose`) and then assigns once more.

use crate::manifest::{Distance, KeyStone, Selector};

/// Scratch sized for K candidates of `dims` values each, allocated once.
pub struct KeyStoneSelector {
    settings: KeyStone,
    k: usize,
    dims: usize,
    points: Vec<f64>,
    dist: Vec<f64>,
    pairwise: Vec<f64>,
    centroids: Vec<f64>,
    moved: Vec<f64>,
    assign: Vec<u8>,
    mean: Vec<f64>,
}

fn distance(a: &[f64], b: &[f64], kind: Distance) -> f64 {
    match kind {
        Distance::L2 => a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f64>()
            .sqrt(),
        Distance::L1 => a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum(),
        Distance::Cosine => {
            // Upstream normalises each vector by `norm + 1e-8` before the dot product.
            let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            let na = a.iter().map(|x| x * x).sum::<f64>().sqrt();
            let nb = b.iter().map(|x| x * x).sum::<f64>().sqrt();
            1.0 - dot / ((na + 1e-8) * (nb + 1e-8))
        }
    }
}

impl KeyStoneSelector {
    /// `rows` x `cols` is one candidate (horizon x action dims); only the first
    /// `executed_steps` rows take part when that is set.
    pub fn new(settings: &KeyStone, rows: usize, cols: usize) -> Self {
        let k = settings.k;
        let used_rows = settings.executed_steps.unwrap_or(rows).min(rows);
        let dims = used_rows * cols;
        Self {
            settings: settings.clone(),
            k,
            dims,
            points: vec![0.0; k * dims],
            dist: vec![0.0; k * k],
            pairwise: vec![0.0; k * k.saturating_sub(1) / 2],
            centroids: vec![0.0; 2 * dims],
            moved: vec![0.0; 2 * dims],
            assign: vec![0; k],
            mean: vec![0.0; dims],
        }
    }

    fn point(&self, i: usize) -> &[f64] {
        &self.points[i * self.dims..(i + 1) * self.dims]
    }

    /// Medoid among `members` (argmin of row sums restricted to them; first on ties).
    fn medoid_of(&self, members: impl Iterator<Item = usize> + Clone) -> usize {
        let mut best = (f64::INFINITY, usize::MAX);
        for i in members.clone() {
            let s: f64 = members.clone().map(|j| self.dist[i * self.k + j]).sum();
            if s < best.0 {
                best = (s, i);
            }
        }
        best.1
    }

    /// Chooses among `candidates` (`K` chunks, each `candidate_len` f32 values laid out
    /// rows x cols, of which the first `dims` take part). Returns the chosen index.
    pub fn select(&mut self, candidates: &[f32], candidate_len: usize) -> usize {
        let (k, dims) = (self.k, self.dims);
        for i in 0..k {
            for d in 0..dims {
                self.points[i * dims + d] = candidates[i * candidate_len + d] as f64;
            }
        }
        for i in 0..k {
            for j in 0..k {
                self.dist[i * k + j] =
                    distance(self.point(i), self.point(j), self.settings.distance);
            }
        }
        let medoid = self.medoid_of(0..k);
        if self.settings.selector == Selector::Medoid || k == 1 {
            return medoid;
        }
        // spread = ||mean - medoid|| / (median pairwise distance + 1e-8)
        self.mean.iter_mut().for_each(|m| *m = 0.0);
        for i in 0..k {
            for d in 0..dims {
                self.mean[d] += self.points[i * dims + d];
            }
        }
        self.mean.iter_mut().for_each(|m| *m /= k as f64);
        let spread_num = self
            .mean
            .iter()
            .zip(self.point(medoid))
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>()
            .sqrt();
        let mut n = 0;
        for i in 0..k {
            for j in i + 1..k {
                self.pairwise[n] = self.dist[i * k + j];
                n += 1;
            }
        }
        self.pairwise.sort_unstable_by(|a, b| a.total_cmp(b));
        // torch.median: the lower of the two middle values when n is even.
        let median = self.pairwise[(n - 1) / 2];
        let spread = spread_num / (median + 1e-8);
        if spread <= self.settings.spread_threshold {
            return medoid;
        }
        self.two_means();
        let count0 = self.assign.iter().filter(|a| **a == 0).count();
        let cluster = if count0 >= k - count0 { 0 } else { 1 };
        let assign = &self.assign;
        self.medoid_of((0..k).filter(move |i| assign[*i] == cluster))
    }

    /// Each point to the nearer centroid (cluster 0 on equal distance, as argmin).
    fn assign_points(&mut self) {
        let dims = self.dims;
        for (i, p) in self.points.chunks_exact(dims).enumerate() {
            let d0: f64 = p
                .iter()
                .zip(&self.centroids[..dims])
                .map(|(a, b)| (a - b) * (a - b))
                .sum();
            let d1: f64 = p
                .iter()
                .zip(&self.centroids[dims..])
                .map(|(a, b)| (a - b) * (a - b))
                .sum();
            self.assign[i] = u8::from(d1 < d0);
        }
    }

    /// Upstream `_kmeans_assignments` with two clusters: centroids start at points 0 and
    /// 1; at most 10 rounds of assign + mean (an empty cluster keeps its centroid),
    /// stopping once the new centroids are `allclose` (atol 1e-6, rtol 1e-5) to the old;
    /// then one last assignment against the centroids kept.
    fn two_means(&mut self) {
        let (k, dims) = (self.k, self.dims);
        self.centroids[..2 * dims].copy_from_slice(&self.points[..2 * dims]);
        for _ in 0..10 {
            self.assign_points();
            self.moved.copy_from_slice(&self.centroids);
            for c in 0..2u8 {
                let members = self.assign.iter().filter(|a| **a == c).count();
                if members == 0 {
                    continue;
                }
                let centroid = &mut self.moved[c as usize * dims..(c as usize + 1) * dims];
                centroid.iter_mut().for_each(|x| *x = 0.0);
                for i in (0..k).filter(|i| self.assign[*i] == c) {
                    for (acc, p) in centroid
                        .iter_mut()
                        .zip(&self.points[i * dims..(i + 1) * dims])
                    {
                        *acc += p;
                    }
                }
                centroid.iter_mut().for_each(|x| *x /= members as f64);
            }
            let settled = self
                .centroids
                .iter()
                .zip(&self.moved)
                .all(|(old, new)| (old - new).abs() <= 1e-6 + 1e-5 * new.abs());
            if settled {
                break;
            }
            self.centroids.copy_from_slice(&self.moved);
        }
        self.assign_points();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(selector: Selector) -> KeyStone {
        KeyStone {
            k: 5,
            selector,
            distance: Distance::L2,
            executed_steps: None,
            spread_threshold: 0.3,
        }
    }

    #[test]
    fn plain_medoid_is_the_central_candidate() {
        // Points on a line: 0, 1, 2, 3, 10 -> medoid 2.
        let c: Vec<f32> = [0.0, 1.0, 2.0, 3.0, 10.0].to_vec();
        let mut s = KeyStoneSelector::new(&settings(Selector::Medoid), 1, 1);
        assert_eq!(s.select(&c, 1), 2);
    }

    #[test]
    fn guarded_medoid_picks_inside_the_larger_cluster() {
        // Two clusters: three points near 0, two near 10 (first two in different clusters).
        let c: Vec<f32> = [0.0, 10.0, 0.2, 10.1, -0.1].to_vec();
        let mut plain = KeyStoneSelector::new(&settings(Selector::Medoid), 1, 1);
        let mut guarded = KeyStoneSelector::new(&settings(Selector::GuardedMedoid), 1, 1);
        let p = plain.select(&c, 1);
        let g = guarded.select(&c, 1);
        assert!([0, 2, 4].contains(&g), "guarded chose {g}");
        assert_eq!(g, 0, "0.0 is the medoid of {{0.0, 0.2, -0.1}}");
        assert_eq!(p, 2, "the plain medoid of all five is 0.2");
    }

    #[test]
    fn median_of_an_even_count_is_the_lower_middle_value() {
        // K = 5 -> 10 pairwise distances. Points 0, 1, 2, 3.5, 5.5 on a line: sorted
        // distances 1, 1, 1.5, 2, [2, 2.5], 3.5, 3.5, 4.5, 5.5. Medoid 2.0 (row sums 12,
        // 9, 8, 9.5, 15.5), mean 2.4, gap 0.4. Lower median 2 -> spread 0.2 > 0.19:
        // 2-means runs and settles on {0, 1, 2} vs {3.5, 5.5}, whose medoid is 1.0.
        // The average of the middle pair (2.25) would give 0.178 and the global medoid.
        let c: Vec<f32> = [0.0, 1.0, 2.0, 3.5, 5.5].to_vec();
        let mut s = settings(Selector::GuardedMedoid);
        s.spread_threshold = 0.19;
        let mut sel = KeyStoneSelector::new(&s, 1, 1);
        let g = sel.select(&c, 1);
        assert_eq!(g, 1, "medoid of the larger cluster {{0, 1, 2}}");
    }
}
