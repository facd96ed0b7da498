//! Order statistics over timing samples, shared by every benchmark here: the runtime's
//! nearest-rank quantile (`vla_control::quantile`) and the p50/p99/max summary built on it.

pub use vla_control::quantile;

/// p50, p99 and max of `samples`.
pub fn summary(samples: &mut [f64]) -> (f64, f64, f64) {
    let p50 = quantile(samples, 0.5);
    let p99 = quantile(samples, 0.99);
    (p50, p99, samples.last().copied().unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.5), 50.0);
        assert_eq!(quantile(&mut v, 0.99), 99.0);
        assert_eq!(summary(&mut v), (50.0, 99.0, 100.0));
        assert_eq!(quantile(&mut [], 0.5), 0.0);
        assert_eq!(quantile(&mut [7.0], 0.99), 7.0);
    }
}
