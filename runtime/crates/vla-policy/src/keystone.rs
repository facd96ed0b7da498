//! KeyStone: geometric best-of-K selection over candidate action chunks.
//!
//! All distances in f64 on preallocated scratch, exactly as `docs/bundle-format.md` step 7:
//! plain medoid, or the guarded medoid that falls back to the medoid of the larger
//! 2-means cluster when the candidates spread out.

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
    assign: Vec<u8>,
    previous: Vec<u8>,
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
            let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            let na = a.iter().map(|x| x * x).sum::<f64>().sqrt();
            let nb = b.iter().map(|x| x * x).sum::<f64>().sqrt();
            1.0 - dot / (na * nb + 1e-12)
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
            assign: vec![0; k],
            previous: vec![0; k],
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
        if self.settings.selector == Selector::Medoid || k < 3 {
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
        let median = if n % 2 == 1 {
            self.pairwise[n / 2]
        } else {
            (self.pairwise[n / 2 - 1] + self.pairwise[n / 2]) / 2.0
        };
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

    fn two_means(&mut self) {
        let (k, dims) = (self.k, self.dims);
        self.centroids[..2 * dims].copy_from_slice(&self.points[..2 * dims]);
        for iteration in 0..10 {
            for i in 0..k {
                let p = &self.points[i * dims..(i + 1) * dims];
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
            if iteration > 0 && self.assign == self.previous {
                break;
            }
            self.previous.copy_from_slice(&self.assign);
            for c in 0..2u8 {
                let members = self.assign.iter().filter(|a| **a == c).count();
                if members == 0 {
                    continue;
                }
                let centroid = &mut self.centroids[c as usize * dims..(c as usize + 1) * dims];
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
        }
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
}
