//! f32 <-> storage-type conversions with explicit length checks.
//!
//! Rounding follows the usual affine quantizers: round half away from zero, then clamp to
//! the storage range, so out-of-range activations saturate instead of wrapping.

use crate::{ElementType, Quantization};
use half::f16;

/// A conversion that could not run because the buffers do not match.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConvertError {
    /// The byte buffer does not hold exactly `elements` values of the element type.
    Length {
        /// Name of the element type, as [`ElementType::name`] prints it.
        element_type: &'static str,
        /// Number of values the caller asked to convert.
        elements: usize,
        /// `elements` times the element size.
        expected_bytes: usize,
        /// Length of the byte buffer that was passed.
        found_bytes: usize,
    },
    /// The element type cannot carry real values (bool/u8/i32 decode fine, but encoding
    /// a float into them would silently truncate).
    NotReal {
        /// Name of the element type, as [`ElementType::name`] prints it.
        element_type: &'static str,
    },
}

impl core::fmt::Display for ConvertError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConvertError::Length { element_type, elements, expected_bytes, found_bytes } => write!(
                f,
                "{elements} {element_type} values need {expected_bytes} bytes, buffer has {found_bytes}"
            ),
            ConvertError::NotReal { element_type } => {
                write!(f, "cannot encode real values as {element_type}")
            }
        }
    }
}

impl std::error::Error for ConvertError {}

fn check(ty: ElementType, elements: usize, bytes: usize) -> Result<(), ConvertError> {
    let expected = elements.saturating_mul(ty.size());
    if expected != bytes {
        return Err(ConvertError::Length {
            element_type: ty.name(),
            elements,
            expected_bytes: expected,
            found_bytes: bytes,
        });
    }
    Ok(())
}

fn quantize(x: f32, q: Quantization, lo: f32, hi: f32) -> f32 {
    // real = (q + offset) * scale  =>  q = real / scale - offset
    let v = (x / q.scale).round() - q.offset as f32;
    if v.is_nan() {
        lo.max(0.0).min(hi)
    } else {
        v.clamp(lo, hi)
    }
}

fn dequantize(v: f32, q: Quantization) -> f32 {
    (v + q.offset as f32) * q.scale
}

/// Writes `src` into `dst` stored as `ty`. `dst` must be exactly `src.len() * ty.size()`.
pub fn encode_f32(src: &[f32], ty: ElementType, dst: &mut [u8]) -> Result<(), ConvertError> {
    check(ty, src.len(), dst.len())?;
    match ty {
        ElementType::F32 => {
            for (o, x) in dst.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        ElementType::F16 => {
            for (o, x) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
            }
        }
        ElementType::UFixed8(q) => {
            for (o, x) in dst.iter_mut().zip(src) {
                *o = quantize(*x, q, 0.0, 255.0) as u8;
            }
        }
        ElementType::SFixed8(q) => {
            for (o, x) in dst.iter_mut().zip(src) {
                *o = (quantize(*x, q, -128.0, 127.0) as i8) as u8;
            }
        }
        ElementType::UFixed16(q) => {
            for (o, x) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&(quantize(*x, q, 0.0, 65535.0) as u16).to_le_bytes());
            }
        }
        ElementType::SFixed16(q) => {
            for (o, x) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&(quantize(*x, q, -32768.0, 32767.0) as i16).to_le_bytes());
            }
        }
        ElementType::I32 | ElementType::U8 | ElementType::Bool => {
            return Err(ConvertError::NotReal {
                element_type: ty.name(),
            })
        }
    }
    Ok(())
}

/// Reads `src` stored as `ty` into `dst` as f32. `src` must be exactly `dst.len() * ty.size()`.
pub fn decode_f32(src: &[u8], ty: ElementType, dst: &mut [f32]) -> Result<(), ConvertError> {
    check(ty, dst.len(), src.len())?;
    match ty {
        ElementType::F32 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        ElementType::F16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        ElementType::I32 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32;
            }
        }
        ElementType::U8 | ElementType::Bool => {
            for (o, b) in dst.iter_mut().zip(src) {
                *o = *b as f32;
            }
        }
        ElementType::UFixed8(q) => {
            for (o, b) in dst.iter_mut().zip(src) {
                *o = dequantize(*b as f32, q);
            }
        }
        ElementType::SFixed8(q) => {
            for (o, b) in dst.iter_mut().zip(src) {
                *o = dequantize(*b as i8 as f32, q);
            }
        }
        ElementType::UFixed16(q) => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = dequantize(u16::from_le_bytes([b[0], b[1]]) as f32, q);
            }
        }
        ElementType::SFixed16(q) => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = dequantize(i16::from_le_bytes([b[0], b[1]]) as f32, q);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_and_f16_round_trip() {
        let src = [0.0f32, 1.5, -2.25, 65504.0, 1e-3];
        for ty in [ElementType::F32, ElementType::F16] {
            let mut bytes = vec![0u8; src.len() * ty.size()];
            encode_f32(&src, ty, &mut bytes).unwrap();
            let mut back = [0f32; 5];
            decode_f32(&bytes, ty, &mut back).unwrap();
            for (a, b) in src.iter().zip(back) {
                assert!((a - b).abs() <= a.abs() * 1e-3, "{ty}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn quantize_uses_qnn_offset_convention_and_saturates() {
        // real = (q + offset) * scale with offset -128: q = 128 is real 0.
        let q = Quantization {
            scale: 0.5,
            offset: -128,
        };
        let src = [0.0f32, 1.0, -64.0, 63.5, 1000.0, -1000.0, f32::NAN];
        let mut bytes = [0u8; 7];
        encode_f32(&src, ElementType::UFixed8(q), &mut bytes).unwrap();
        assert_eq!(bytes, [128, 130, 0, 255, 255, 0, 0]);
        let mut back = [0f32; 7];
        decode_f32(&bytes, ElementType::UFixed8(q), &mut back).unwrap();
        assert_eq!(&back[..4], &[0.0, 1.0, -64.0, 63.5]);

        let q16 = Quantization {
            scale: 1.0 / 1024.0,
            offset: -32768,
        };
        let mut b16 = [0u8; 4];
        encode_f32(&[0.25, -0.5], ElementType::UFixed16(q16), &mut b16).unwrap();
        let mut r16 = [0f32; 2];
        decode_f32(&b16, ElementType::UFixed16(q16), &mut r16).unwrap();
        assert_eq!(r16, [0.25, -0.5]);
    }

    #[test]
    fn lengths_are_checked_not_trusted() {
        let mut short = [0u8; 7];
        let err = encode_f32(&[1.0, 2.0], ElementType::F32, &mut short).unwrap_err();
        assert_eq!(err.to_string(), "2 f32 values need 8 bytes, buffer has 7");
        let mut out = [0f32; 3];
        assert!(decode_f32(&[0u8; 4], ElementType::F16, &mut out).is_err());
        assert!(matches!(
            encode_f32(&[1.0], ElementType::I32, &mut [0u8; 4]),
            Err(ConvertError::NotReal { .. })
        ));
    }
}
