//! Tensor element types, the conversions between them and the parity metrics.
//!
//! This crate is a building block: it knows nothing of QNN, files or policies. Contexts
//! compiled for the HTP take f32, f16 or fixed-point (u8/u16 with scale and offset) buffers,
//! while the host glue computes in f32; everything that crosses that boundary goes through
//! [`encode_f32`] and [`decode_f32`], which check lengths instead of trusting them.

#![forbid(unsafe_code)]

mod buffer;
mod convert;
mod metrics;

pub use buffer::AlignedBuf;
pub use convert::{decode_f32, encode_f32, ConvertError};
pub use metrics::{compare, Comparison};

/// Affine quantization: `real = (q + offset) * scale` (QNN's convention; `offset` is
/// usually negative).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantization {
    /// Size of one quantization step in real units; must be non-zero and finite (the
    /// context binary supplies it).
    pub scale: f32,
    /// Integer added to the stored value before scaling; `-offset` is the stored value that
    /// decodes to 0.0.
    pub offset: i32,
}

/// How one element of a tensor buffer is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ElementType {
    /// IEEE 754 single precision, 4 bytes little-endian.
    F32,
    /// IEEE 754 half precision, 2 bytes little-endian.
    F16,
    /// Signed 32-bit integer (token ids, positions); decodes to f32, cannot be encoded from
    /// real values.
    I32,
    /// Raw unsigned byte (e.g. image pixels); decodes to f32, cannot be encoded from real values.
    U8,
    /// One byte per element, 0 or 1 (masks); decodes to f32, cannot be encoded from real values.
    Bool,
    /// Unsigned 8-bit fixed point.
    UFixed8(Quantization),
    /// Unsigned 16-bit fixed point.
    UFixed16(Quantization),
    /// Signed 8-bit fixed point.
    SFixed8(Quantization),
    /// Signed 16-bit fixed point.
    SFixed16(Quantization),
}

impl ElementType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElementType::F32 | ElementType::I32 => 4,
            ElementType::F16 | ElementType::UFixed16(_) | ElementType::SFixed16(_) => 2,
            ElementType::U8
            | ElementType::Bool
            | ElementType::UFixed8(_)
            | ElementType::SFixed8(_) => 1,
        }
    }

    /// The quantization parameters of a fixed-point type.
    pub fn quantization(self) -> Option<Quantization> {
        match self {
            ElementType::UFixed8(q)
            | ElementType::UFixed16(q)
            | ElementType::SFixed8(q)
            | ElementType::SFixed16(q) => Some(q),
            _ => None,
        }
    }

    /// Short lower-case name, as printed by `vlad inspect`.
    pub fn name(self) -> &'static str {
        match self {
            ElementType::F32 => "f32",
            ElementType::F16 => "f16",
            ElementType::I32 => "i32",
            ElementType::U8 => "u8",
            ElementType::Bool => "bool",
            ElementType::UFixed8(_) => "ufixed8",
            ElementType::UFixed16(_) => "ufixed16",
            ElementType::SFixed8(_) => "sfixed8",
            ElementType::SFixed16(_) => "sfixed16",
        }
    }
}

impl core::fmt::Display for ElementType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.quantization() {
            Some(q) => write!(f, "{}(scale={}, offset={})", self.name(), q.scale, q.offset),
            None => f.write_str(self.name()),
        }
    }
}

/// Number of elements of a shape (1 for a scalar), `None` on overflow.
pub fn element_count(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}
