//! Element types: the supported numpy dtypes, their `.npy` descriptors, and the sealed
//! [`Element`] trait that moves Rust values to and from little-endian bytes.

use std::fmt;

use half::f16;

/// The numpy dtypes this crate reads and writes (always little-endian, C order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE half precision (`<f2`), 2 bytes.
    F16,
    /// IEEE single precision (`<f4`), 4 bytes.
    F32,
    /// IEEE double precision (`<f8`), 8 bytes.
    F64,
    /// Signed 8-bit integer (`|i1`).
    I8,
    /// Signed 16-bit integer (`<i2`).
    I16,
    /// Signed 32-bit integer (`<i4`).
    I32,
    /// Signed 64-bit integer (`<i8`).
    I64,
    /// Unsigned 8-bit integer (`|u1`).
    U8,
    /// Unsigned 16-bit integer (`<u2`).
    U16,
    /// Unsigned 32-bit integer (`<u4`).
    U32,
    /// Unsigned 64-bit integer (`<u8`).
    U64,
    /// numpy's bool (`|b1`): one byte, 0 or 1.
    Bool,
}

impl DType {
    /// Every supported dtype, for exhaustive tests and tooling.
    pub const ALL: [DType; 12] = [
        DType::F16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The numpy name (`float32`, `uint8`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::Bool => "bool",
        }
    }

    /// The `.npy` `descr` string numpy writes for this dtype.
    pub fn descr(self) -> &'static str {
        match self {
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            DType::I8 => "|i1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
            DType::U16 => "<u2",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
            DType::Bool => "|b1",
        }
    }

    /// Interprets a `.npy` `descr`. `Err` carries why it is not supported, for the caller
    /// to wrap with file and array names.
    pub(crate) fn from_descr(descr: &str) -> Result<DType, String> {
        let mut chars = descr.chars();
        let (order, kind_and_size) = match chars.next() {
            Some(c @ ('<' | '>' | '|' | '=')) => (c, chars.as_str()),
            _ => ('=', descr),
        };
        let dtype = match kind_and_size {
            "f2" => DType::F16,
            "f4" => DType::F32,
            "f8" => DType::F64,
            "i1" => DType::I8,
            "i2" => DType::I16,
            "i4" => DType::I32,
            "i8" => DType::I64,
            "u1" => DType::U8,
            "u2" => DType::U16,
            "u4" => DType::U32,
            "u8" => DType::U64,
            "b1" => DType::Bool,
            _ => {
                return Err(format!(
                    "dtype descr '{descr}' is not one of the supported dtypes"
                ))
            }
        };
        // Byte order is irrelevant for one-byte types; numpy writes '|' but accepts any.
        if dtype.size() == 1 {
            return Ok(dtype);
        }
        match order {
            '<' => Ok(dtype),
            '>' => Err(format!(
                "dtype descr '{descr}' is big-endian (only little-endian is supported)"
            )),
            _ => Err(format!(
                "dtype descr '{descr}' has no explicit little-endian byte order"
            )),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type stored as one [`DType`]; sealed so the dtype table stays the single source.
pub trait Element: Copy + sealed::Sealed {
    /// The dtype this Rust type is stored as in a `.npy`.
    const DTYPE: DType;
    /// Decodes one element; `bytes` is exactly `DTYPE.size()` long.
    fn from_le_slice(bytes: &[u8]) -> Self;
    /// Appends the little-endian encoding of `self`.
    fn push_le(self, out: &mut Vec<u8>);
}

macro_rules! numeric_element {
    ($($ty:ty => $dtype:ident),* $(,)?) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
            fn from_le_slice(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$ty>()];
                raw.copy_from_slice(bytes);
                <$ty>::from_le_bytes(raw)
            }
            fn push_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

numeric_element!(
    f16 => F16, f32 => F32, f64 => F64,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
);

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    /// numpy stores 0/1; any other byte (possible through views) is truthy as in numpy.
    fn from_le_slice(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn push_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descr_round_trips_for_every_dtype() {
        for dtype in DType::ALL {
            assert_eq!(DType::from_descr(dtype.descr()), Ok(dtype));
        }
    }

    #[test]
    fn element_sizes_match_dtype_sizes() {
        fn size_of_encoding<T: Element>(value: T) -> usize {
            let mut out = Vec::new();
            value.push_le(&mut out);
            assert_eq!(out.len(), T::DTYPE.size());
            out.len()
        }
        assert_eq!(size_of_encoding(f16::ONE), 2);
        assert_eq!(size_of_encoding(1u64), 8);
        assert_eq!(size_of_encoding(true), 1);
    }

    #[test]
    fn one_byte_types_ignore_byte_order_but_wide_types_do_not() {
        assert_eq!(DType::from_descr("<u1"), Ok(DType::U8));
        assert_eq!(DType::from_descr(">b1"), Ok(DType::Bool));
        assert!(DType::from_descr(">f4").unwrap_err().contains("big-endian"));
        assert!(DType::from_descr("=i4").is_err());
        assert!(DType::from_descr("<c8").unwrap_err().contains("supported"));
        assert!(DType::from_descr("").is_err());
    }
}
