//! Seeded Gaussian noise for the flow-matching loop: SplitMix64 + Box-Muller.
//!
//! The generator is part of the bundle contract (`docs/bundle-format.md`, step 6) so that
//! a seed gives the same trajectory here, in the reference and on every device; numpy's
//! generators could not be reproduced bit for bit from Rust.

/// SplitMix64 (Steele, Lea, Flood 2014).
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Fills `out` row-major with standard normals from `seed` (z0 then z1 of each pair).
pub fn fill_gaussian(seed: u64, out: &mut [f32]) {
    let mut rng = SplitMix64::new(seed);
    let two_pow_m53 = 1.0f64 / (1u64 << 53) as f64;
    let mut i = 0;
    while i < out.len() {
        let (r1, r2) = (rng.next_u64(), rng.next_u64());
        let u1 = ((r1 >> 11) + 1) as f64 * two_pow_m53;
        let u2 = (r2 >> 11) as f64 * two_pow_m53;
        let radius = (-2.0 * u1.ln()).sqrt();
        let angle = 2.0 * core::f64::consts::PI * u2;
        out[i] = (radius * angle.cos()) as f32;
        if i + 1 < out.len() {
            out[i + 1] = (radius * angle.sin()) as f32;
        }
        i += 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_published_sequence() {
        // First outputs of SplitMix64 seeded with 0 (reference implementation).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn gaussian_is_seeded_and_roughly_standard() {
        let mut a = vec![0f32; 4001];
        let mut b = vec![0f32; 4001];
        fill_gaussian(7, &mut a);
        fill_gaussian(7, &mut b);
        assert_eq!(a, b);
        fill_gaussian(8, &mut b);
        assert_ne!(a, b);
        let mean = a.iter().map(|x| *x as f64).sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(
            mean.abs() < 0.1 && (var - 1.0).abs() < 0.1,
            "mean {mean} var {var}"
        );
    }
}
