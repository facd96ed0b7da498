//! Parity metrics between an output and its golden reference.
//!
//! Cosine similarity is the correctness gate used by the seeds (>= 0.9999 per context);
//! max abs diff and the within-tolerance ratio are reported for diagnosis, since LLM
//! activations span 1e2..1e4 and make absolute tolerances misleading. Sums run in f64 so
//! a long tensor does not lose the last digits the gate looks at.

/// How close `actual` is to `expected`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// Number of element pairs compared: the shorter slice's length.
    pub elements: usize,
    /// Cosine similarity; 1.0 when both are all zero, 0.0 when only one is.
    pub cosine: f64,
    /// Largest `|actual - expected|` over the compared elements; infinite when `actual` holds a
    /// NaN or infinity.
    pub max_abs_diff: f64,
    /// Share of elements with `|a - e| <= atol + rtol * |e|`.
    pub within_tolerance: f64,
    /// NaN or infinite values in `actual`.
    pub non_finite: usize,
}

/// Compares two equally long slices. Panics never: a length mismatch compares the common
/// prefix and is the caller's job to reject first.
pub fn compare(actual: &[f32], expected: &[f32], atol: f64, rtol: f64) -> Comparison {
    let n = actual.len().min(expected.len());
    let (mut dot, mut na, mut ne, mut max_abs) = (0f64, 0f64, 0f64, 0f64);
    let (mut within, mut non_finite) = (0usize, 0usize);
    for (&a, &e) in actual[..n].iter().zip(&expected[..n]) {
        if !a.is_finite() {
            non_finite += 1;
            continue;
        }
        let (a, e) = (a as f64, e as f64);
        dot += a * e;
        na += a * a;
        ne += e * e;
        let d = (a - e).abs();
        max_abs = max_abs.max(d);
        if d <= atol + rtol * e.abs() {
            within += 1;
        }
    }
    let cosine = if non_finite > 0 {
        f64::NAN
    } else if na == 0.0 && ne == 0.0 {
        1.0
    } else if na == 0.0 || ne == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * ne.sqrt())
    };
    Comparison {
        elements: n,
        cosine,
        max_abs_diff: if non_finite > 0 {
            f64::INFINITY
        } else {
            max_abs
        },
        within_tolerance: if n == 0 {
            1.0
        } else {
            within as f64 / n as f64
        },
        non_finite,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_is_one_and_opposite_is_minus_one() {
        let a = [1.0f32, -2.0, 3.0];
        let c = compare(&a, &a, 0.0, 0.0);
        assert!((c.cosine - 1.0).abs() < 1e-12);
        assert_eq!(c.max_abs_diff, 0.0);
        assert_eq!(c.within_tolerance, 1.0);
        let neg: Vec<f32> = a.iter().map(|x| -x).collect();
        assert!((compare(&neg, &a, 0.0, 0.0).cosine + 1.0).abs() < 1e-12);
    }

    #[test]
    fn small_error_is_measured() {
        let e = [1.0f32, 2.0, 3.0, 4.0];
        let a = [1.0f32, 2.0, 3.0, 4.1];
        let c = compare(&a, &e, 0.01, 0.0);
        assert!(c.cosine < 0.99999 && c.cosine > 0.999);
        assert!((c.max_abs_diff - 0.1).abs() < 1e-6);
        assert_eq!(c.within_tolerance, 0.75);
    }

    #[test]
    fn non_finite_output_fails_the_gate() {
        let c = compare(&[1.0, f32::NAN], &[1.0, 1.0], 0.0, 0.0);
        assert_eq!(c.non_finite, 1);
        assert!(c.cosine.is_nan() || c.cosine < 0.9999);
        assert!(c.cosine.partial_cmp(&0.9999) != Some(core::cmp::Ordering::Greater));
    }
}
