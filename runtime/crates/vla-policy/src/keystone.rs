//! KeyStone: geometric best-of-K selection over candidate action chunks.
//!
//! In f32 on preallocated scratch, operation by operation as KeyStone's `selection.py`
//! computes on the policy's f32 candidates (`docs/bundle-format.md` step 7): l1 / l2 as
//! `torch.cdist`'s CPU kernel (per pair, `|a - b|` mapped and summed left to right, sqrt
//! for l2), cosine `1 - (a / (|a| + 1e-8)) . (b / (|b| + 1e-8))`, row sums for the medoid
//! (first index on ties), the guard's spread `||mean - medoid|| / (median + 1e-8)` against
//! the threshold as an f32 (torch compares an f32 tensor with the Python float so), the
//! median `torch.median`'s lower middle value, and `_kmeans_assignments` with C clusters
//! (first C points, at most 10 rounds, `allclose`, one last assignment), the largest
//! cluster by `bincount.argmax` (first on ties). Three selectors, as upstream's three
//! aggregations: the medoid, the guarded medoid, the unguarded cluster medoid.
//! Where torch sums in another order (its vectorized mean and norm, the BLAS `bmm` of the
//! cosine) the last bit can differ: tests/upstream.rs states where.

use crate::manifest::{Distance, KeyStone, Selector};

/// Scratch sized for K candidates of `dims` values each, allocated once.
pub struct KeyStoneSelector {
    settings: KeyStone,
    k: usize,
    dims: usize,
    clusters: usize,
    points: Vec<f32>,
    /// Cosine only: each point divided by `norm + 1e-8`.
    unit: Vec<f32>,
    dist: Vec<f32>,
    pairwise: Vec<f32>,
    centroids: Vec<f32>,
    moved: Vec<f32>,
    assign: Vec<usize>,
    counts: Vec<usize>,
    mean: Vec<f32>,
}

/// Left-to-right f32 sum of `f(a_i, b_i)`.
fn fold(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    a.iter().zip(b).fold(0.0f32, |acc, (&x, &y)| acc + f(x, y))
}

/// `torch.cdist` p = 2 on the CPU: `sqrt(sum |a - b|^2)`, summed left to right.
fn l2(a: &[f32], b: &[f32]) -> f32 {
    fold(a, b, |x, y| {
        let d = (x - y).abs();
        d * d
    })
    .sqrt()
}

impl KeyStoneSelector {
    /// `rows` x `cols` is one candidate (horizon x action dims); only the first
    /// `executed_steps` rows take part when that is set.
    pub fn new(settings: &KeyStone, rows: usize, cols: usize) -> Self {
        let k = settings.k;
        let used_rows = settings.executed_steps.unwrap_or(rows).min(rows);
        let dims = used_rows * cols;
        // Upstream clusters into min(C, K); C <= 1 puts every candidate in cluster 0.
        let clusters = settings.num_clusters.min(k).max(1);
        Self {
            settings: settings.clone(),
            k,
            dims,
            clusters,
            points: vec![0.0; k * dims],
            unit: vec![0.0; k * dims],
            dist: vec![0.0; k * k],
            pairwise: vec![0.0; k * k.saturating_sub(1) / 2],
            centroids: vec![0.0; clusters * dims],
            moved: vec![0.0; clusters * dims],
            assign: vec![0; k],
            counts: vec![0; clusters],
            mean: vec![0.0; dims],
        }
    }

    /// The `K x K` distance matrix of the last [`KeyStoneSelector::select`].
    pub fn distances(&self) -> &[f32] {
        &self.dist
    }

    fn point(&self, i: usize) -> &[f32] {
        &self.points[i * self.dims..(i + 1) * self.dims]
    }

    fn distance(&self, i: usize, j: usize) -> f32 {
        let d = self.dims;
        match self.settings.distance {
            Distance::L2 => l2(self.point(i), self.point(j)),
            Distance::L1 => fold(self.point(i), self.point(j), |x, y| (x - y).abs()),
            Distance::Cosine => {
                1.0 - fold(
                    &self.unit[i * d..(i + 1) * d],
                    &self.unit[j * d..(j + 1) * d],
                    |x, y| x * y,
                )
            }
        }
    }

    /// Medoid among `members` (argmin of row sums restricted to them, summed in member
    /// order; first on ties).
    fn medoid_of(&self, members: impl Iterator<Item = usize> + Clone) -> usize {
        let mut best = (f32::INFINITY, usize::MAX);
        for i in members.clone() {
            let s = members
                .clone()
                .fold(0.0f32, |acc, j| acc + self.dist[i * self.k + j]);
            if s < best.0 || best.1 == usize::MAX {
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
            self.points[i * dims..(i + 1) * dims]
                .copy_from_slice(&candidates[i * candidate_len..i * candidate_len + dims]);
        }
        if self.settings.distance == Distance::Cosine {
            for i in 0..k {
                let p = &self.points[i * dims..(i + 1) * dims];
                let norm = fold(p, p, |x, y| x * y).sqrt() + 1e-8;
                for (u, x) in self.unit[i * dims..(i + 1) * dims].iter_mut().zip(p) {
                    *u = x / norm;
                }
            }
        }
        for i in 0..k {
            for j in 0..k {
                self.dist[i * k + j] = self.distance(i, j);
            }
        }
        let medoid = self.medoid_of(0..k);
        let cluster = match self.settings.selector {
            Selector::Medoid => false,
            Selector::GuardedMedoid => k > 1 && self.spread_above_threshold(medoid),
            Selector::ClusterMedoid => true,
        };
        if !cluster {
            return medoid;
        }
        self.k_means();
        self.counts.iter_mut().for_each(|c| *c = 0);
        for &a in &self.assign {
            self.counts[a] += 1;
        }
        let largest = (0..self.clusters).fold(0, |best, c| {
            if self.counts[c] > self.counts[best] {
                c
            } else {
                best
            }
        });
        let assign = &self.assign;
        self.medoid_of((0..k).filter(move |i| assign[*i] == largest))
    }

    /// The guard: `||mean - medoid|| / (median pairwise distance + 1e-8) > threshold`.
    fn spread_above_threshold(&mut self, medoid: usize) -> bool {
        let (k, dims) = (self.k, self.dims);
        self.mean.iter_mut().for_each(|m| *m = 0.0);
        for i in 0..k {
            for d in 0..dims {
                self.mean[d] += self.points[i * dims + d];
            }
        }
        self.mean.iter_mut().for_each(|m| *m /= k as f32);
        let gap = l2(&self.mean, &self.points[medoid * dims..(medoid + 1) * dims]);
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
        gap / (median + 1e-8) > self.settings.spread_threshold as f32
    }

    /// Each point to its nearest centroid by l2 (the first on equal distance, as argmin).
    fn assign_points(&mut self) {
        let dims = self.dims;
        for (i, p) in self.points.chunks_exact(dims).enumerate() {
            let mut best = (f32::INFINITY, 0);
            for (c, centroid) in self.centroids.chunks_exact(dims).enumerate() {
                let d = l2(p, centroid);
                if d < best.0 {
                    best = (d, c);
                }
            }
            self.assign[i] = best.1;
        }
    }

    /// Upstream `_kmeans_assignments`: centroids start at the first C points; at most 10
    /// rounds of assign + mean (an empty cluster keeps its centroid), stopping once the
    /// new centroids are `allclose` (atol 1e-6, rtol 1e-5) to the old; then one last
    /// assignment against the centroids kept. C = 1 is every point in cluster 0.
    fn k_means(&mut self) {
        let (k, dims, clusters) = (self.k, self.dims, self.clusters);
        if clusters == 1 {
            self.assign.iter_mut().for_each(|a| *a = 0);
            return;
        }
        self.centroids
            .copy_from_slice(&self.points[..clusters * dims]);
        for _ in 0..10 {
            self.assign_points();
            self.moved.copy_from_slice(&self.centroids);
            for c in 0..clusters {
                let members = self.assign.iter().filter(|a| **a == c).count();
                if members == 0 {
                    continue;
                }
                let centroid = &mut self.moved[c * dims..(c + 1) * dims];
                centroid.iter_mut().for_each(|x| *x = 0.0);
                for i in (0..k).filter(|i| self.assign[*i] == c) {
                    for (acc, p) in centroid
                        .iter_mut()
                        .zip(&self.points[i * dims..(i + 1) * dims])
                    {
                        *acc += p;
                    }
                }
                centroid.iter_mut().for_each(|x| *x /= members as f32);
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
            num_clusters: 2,
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
