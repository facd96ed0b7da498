//! [`Array`]: one named, typed, shaped n-d array held as little-endian bytes, with checked
//! constructors and typed accessors that refuse a dtype mismatch instead of reinterpreting.

use half::f16;

use crate::{DType, Element, NpzError};

/// Label used in errors for arrays that were built in memory rather than read from a file.
pub(crate) const IN_MEMORY: &str = "<memory>";

/// A named n-d array in C order; `data` holds exactly `len() * dtype().size()` bytes.
#[derive(Clone, Debug)]
pub struct Array {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<u8>,
    /// Where the array was read from, so accessor errors can name the file.
    origin: String,
}

/// Equality is about content; where an array came from does not make it different.
impl PartialEq for Array {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.dtype == other.dtype
            && self.shape == other.shape
            && self.data == other.data
    }
}

/// Number of elements of `shape`, or `None` if it overflows `usize`.
pub(crate) fn element_count(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |count, &dim| count.checked_mul(dim))
}

impl Array {
    /// Builds an array from raw little-endian bytes; the byte count must match the shape.
    pub fn new(
        name: impl Into<String>,
        dtype: DType,
        shape: Vec<usize>,
        data: Vec<u8>,
    ) -> Result<Array, NpzError> {
        Array::with_origin(name.into(), dtype, shape, data, IN_MEMORY.to_string())
    }

    pub(crate) fn with_origin(
        name: String,
        dtype: DType,
        shape: Vec<usize>,
        data: Vec<u8>,
        origin: String,
    ) -> Result<Array, NpzError> {
        let invalid = |reason: String| NpzError::InvalidArray {
            file: origin.clone(),
            array: name.clone(),
            reason,
        };
        let expected = element_count(&shape)
            .and_then(|count| count.checked_mul(dtype.size()))
            .ok_or_else(|| invalid(format!("shape {shape:?} overflows the address space")))?;
        if data.len() != expected {
            return Err(invalid(format!(
                "shape {shape:?} of {dtype} needs {expected} bytes, got {}",
                data.len()
            )));
        }
        Ok(Array {
            name,
            dtype,
            shape,
            data,
            origin,
        })
    }

    /// Builds an array of `T` elements; `values.len()` must equal the shape's element count.
    pub fn from_slice<T: Element>(
        name: impl Into<String>,
        shape: &[usize],
        values: &[T],
    ) -> Result<Array, NpzError> {
        let mut data = Vec::with_capacity(values.len().saturating_mul(T::DTYPE.size()));
        for &value in values {
            value.push_le(&mut data);
        }
        Array::new(name, T::DTYPE, shape.to_vec(), data)
    }

    /// Builds an f32 array (`<f4`); `values.len()` must equal the shape's element count.
    pub fn from_f32(
        name: impl Into<String>,
        shape: &[usize],
        values: &[f32],
    ) -> Result<Array, NpzError> {
        Array::from_slice(name, shape, values)
    }

    /// Builds an f16 array (`<f2`); `values.len()` must equal the shape's element count.
    pub fn from_f16(
        name: impl Into<String>,
        shape: &[usize],
        values: &[f16],
    ) -> Result<Array, NpzError> {
        Array::from_slice(name, shape, values)
    }

    /// Builds a u8 array (`|u1`); `values.len()` must equal the shape's element count.
    pub fn from_u8(
        name: impl Into<String>,
        shape: &[usize],
        values: &[u8],
    ) -> Result<Array, NpzError> {
        Array::from_slice(name, shape, values)
    }

    /// Builds an i32 array (`<i4`); `values.len()` must equal the shape's element count.
    pub fn from_i32(
        name: impl Into<String>,
        shape: &[usize],
        values: &[i32],
    ) -> Result<Array, NpzError> {
        Array::from_slice(name, shape, values)
    }

    /// Builds an i64 array (`<i8`); `values.len()` must equal the shape's element count.
    pub fn from_i64(
        name: impl Into<String>,
        shape: &[usize],
        values: &[i64],
    ) -> Result<Array, NpzError> {
        Array::from_slice(name, shape, values)
    }

    /// Builds a u64 array (`<u8`); `values.len()` must equal the shape's element count.
    pub fn from_u64(
        name: impl Into<String>,
        shape: &[usize],
        values: &[u64],
    ) -> Result<Array, NpzError> {
        Array::from_slice(name, shape, values)
    }

    /// The array's name inside its archive, without the `.npy` suffix.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The element type the data is stored as.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dimensions in C order; empty for a 0-d array.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The file (or label) the array was read from; `<memory>` for arrays built here.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Number of elements (1 for a 0-d array).
    pub fn len(&self) -> usize {
        self.data.len() / self.dtype.size()
    }

    /// True when the array holds no elements (some dimension is 0).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The raw little-endian element bytes, C order.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Takes the raw little-endian element bytes, C order, without copying.
    pub fn into_bytes(self) -> Vec<u8> {
        self.data
    }

    /// The same array under another name (for writing it into a different archive).
    pub fn renamed(mut self, name: impl Into<String>) -> Array {
        self.name = name.into();
        self
    }

    /// Fails unless the array has exactly this dtype and shape; the error names both.
    pub fn check(&self, dtype: DType, shape: &[usize]) -> Result<(), NpzError> {
        self.check_dtype(dtype)?;
        if self.shape != shape {
            return Err(NpzError::ShapeMismatch {
                file: self.origin.clone(),
                array: self.name.clone(),
                expected: shape.to_vec(),
                found: self.shape.clone(),
            });
        }
        Ok(())
    }

    fn check_dtype(&self, dtype: DType) -> Result<(), NpzError> {
        if self.dtype != dtype {
            return Err(NpzError::DTypeMismatch {
                file: self.origin.clone(),
                array: self.name.clone(),
                expected: dtype,
                found: self.dtype,
            });
        }
        Ok(())
    }

    /// The elements as `T`; fails unless the dtype is exactly `T`'s (no silent casts).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, NpzError> {
        self.check_dtype(T::DTYPE)?;
        Ok(self
            .data
            .chunks_exact(T::DTYPE.size())
            .map(T::from_le_slice)
            .collect())
    }

    /// The elements widened or narrowed to f32 from any dtype: exact for f16, 8/16-bit ints
    /// and bool (0/1); rounded for f64 and ints beyond 24 bits.
    pub fn to_f32(&self) -> Result<Vec<f32>, NpzError> {
        fn map<T: Element>(data: &[u8], convert: impl Fn(T) -> f32) -> Vec<f32> {
            data.chunks_exact(T::DTYPE.size())
                .map(|bytes| convert(T::from_le_slice(bytes)))
                .collect()
        }
        let data = &self.data;
        Ok(match self.dtype {
            DType::F32 => map(data, |v: f32| v),
            DType::F16 => map(data, |v: f16| v.to_f32()),
            DType::F64 => map(data, |v: f64| v as f32),
            DType::I8 => map(data, |v: i8| f32::from(v)),
            DType::I16 => map(data, |v: i16| f32::from(v)),
            DType::I32 => map(data, |v: i32| v as f32),
            DType::I64 => map(data, |v: i64| v as f32),
            DType::U8 => map(data, |v: u8| f32::from(v)),
            DType::U16 => map(data, |v: u16| f32::from(v)),
            DType::U32 => map(data, |v: u32| v as f32),
            DType::U64 => map(data, |v: u64| v as f32),
            DType::Bool => map(data, |v: bool| f32::from(u8::from(v))),
        })
    }

    /// The elements as f16; fails unless the dtype is exactly f16.
    pub fn to_f16(&self) -> Result<Vec<f16>, NpzError> {
        self.to_vec()
    }

    /// The elements as u8; fails unless the dtype is exactly u8.
    pub fn to_u8(&self) -> Result<Vec<u8>, NpzError> {
        self.to_vec()
    }

    /// The elements as i32; fails unless the dtype is exactly i32.
    pub fn to_i32(&self) -> Result<Vec<i32>, NpzError> {
        self.to_vec()
    }

    /// The elements as i64; fails unless the dtype is exactly i64.
    pub fn to_i64(&self) -> Result<Vec<i64>, NpzError> {
        self.to_vec()
    }

    /// The elements as u64; fails unless the dtype is exactly u64.
    pub fn to_u64(&self) -> Result<Vec<u64>, NpzError> {
        self.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructor_rejects_data_that_does_not_fill_the_shape() {
        let err = Array::from_f32("x", &[2, 3], &[1.0; 5]).unwrap_err();
        assert!(matches!(err, NpzError::InvalidArray { .. }), "{err}");
        assert!(err.to_string().contains("`x`"), "{err}");
        let err = Array::new("y", DType::U8, vec![usize::MAX, 2], vec![]).unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
    }

    #[test]
    fn zero_d_array_has_one_element_and_empty_dims_have_none() {
        let scalar = Array::from_f32("s", &[], &[4.5]).unwrap();
        assert_eq!(scalar.len(), 1);
        assert_eq!(scalar.to_f32().unwrap(), vec![4.5]);
        let empty = Array::from_f32("e", &[0, 3], &[]).unwrap();
        assert_eq!(empty.len(), 0);
        assert!(empty.is_empty());
    }

    #[test]
    fn typed_accessor_refuses_other_dtypes_and_names_both() {
        let a = Array::from_i32("ids", &[2], &[1, -2]).unwrap();
        assert_eq!(a.to_i32().unwrap(), vec![1, -2]);
        let err = a.to_u8().unwrap_err();
        assert_eq!(
            err.to_string(),
            "<memory>: array `ids`: expected dtype uint8, found int32"
        );
    }

    #[test]
    fn to_f32_converts_every_dtype() {
        let cases: Vec<Array> = vec![
            Array::from_slice("a", &[2], &[f16::from_f32(1.5), f16::from_f32(-2.0)]).unwrap(),
            Array::from_slice("a", &[2], &[1.5f64, -2.0]).unwrap(),
            Array::from_slice("a", &[2], &[1i8, -2]).unwrap(),
            Array::from_slice("a", &[2], &[1i16, -2]).unwrap(),
            Array::from_slice("a", &[2], &[1i64, -2]).unwrap(),
            Array::from_slice("a", &[2], &[1u16, 2]).unwrap(),
            Array::from_slice("a", &[2], &[1u32, 2]).unwrap(),
            Array::from_slice("a", &[2], &[1u64, 2]).unwrap(),
            Array::from_slice("a", &[2], &[true, false]).unwrap(),
        ];
        let expected = [
            [1.5, -2.0],
            [1.5, -2.0],
            [1.0, -2.0],
            [1.0, -2.0],
            [1.0, -2.0],
            [1.0, 2.0],
            [1.0, 2.0],
            [1.0, 2.0],
            [1.0, 0.0],
        ];
        for (array, want) in cases.iter().zip(expected) {
            assert_eq!(array.to_f32().unwrap(), want, "{:?}", array.dtype());
        }
    }

    #[test]
    fn check_reports_expected_and_found_shape() {
        let a = Array::from_u8("img", &[2, 2], &[0; 4]).unwrap();
        a.check(DType::U8, &[2, 2]).unwrap();
        let err = a.check(DType::U8, &[4]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "<memory>: array `img`: expected shape [4], found [2, 2]"
        );
    }
}
