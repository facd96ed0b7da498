//! An owned byte buffer with 8-byte alignment, viewable as bytes, f32, f16 or i32.
//!
//! Tensor buffers are allocated once at start-up and handed to the backend as bytes, while
//! the host glue reads and writes them as numbers in place. Backing the bytes with `u64`s
//! makes every typed view aligned, so the views are plain safe casts.

use half::f16;

/// Zero-initialized, 8-byte aligned bytes of a fixed length.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self {
            words: vec![0u64; len.div_ceil(8)],
            len,
        }
    }

    /// Length in bytes, as requested from [`AlignedBuf::zeroed`] (the backing words may hold up
    /// to 7 more, which no view exposes).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length buffer (a tensor with a zero dimension).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer as raw little-endian bytes, exactly [`len`](Self::len) of them; what the
    /// backend reads and writes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
    /// The bytes, writable in place (e.g. for the backend to fill an output).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    /// The bytes as f32 (the length must be a multiple of 4).
    pub fn as_f32(&self) -> &[f32] {
        bytemuck::cast_slice(self.as_bytes())
    }
    /// The bytes as f32, writable in place (the length must be a multiple of 4, or this panics).
    pub fn as_f32_mut(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(self.as_bytes_mut())
    }
    /// The bytes as f16 (the length must be a multiple of 2, or this panics).
    pub fn as_f16(&self) -> &[f16] {
        bytemuck::cast_slice(self.as_bytes())
    }
    /// The bytes as f16, writable in place (the length must be a multiple of 2, or this panics).
    pub fn as_f16_mut(&mut self) -> &mut [f16] {
        bytemuck::cast_slice_mut(self.as_bytes_mut())
    }
    /// The bytes as i32 (the length must be a multiple of 4, or this panics).
    pub fn as_i32(&self) -> &[i32] {
        bytemuck::cast_slice(self.as_bytes())
    }
    /// The bytes as i32, writable in place (the length must be a multiple of 4, or this panics).
    pub fn as_i32_mut(&mut self) -> &mut [i32] {
        bytemuck::cast_slice_mut(self.as_bytes_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_share_the_bytes() {
        let mut b = AlignedBuf::zeroed(12);
        b.as_f32_mut()[1] = 1.5;
        assert_eq!(&b.as_bytes()[4..8], &1.5f32.to_le_bytes());
        assert_eq!(b.as_f32(), &[0.0, 1.5, 0.0]);
        assert_eq!(b.as_bytes().as_ptr() as usize % 8, 0);
        let odd = AlignedBuf::zeroed(3);
        assert_eq!(odd.as_bytes().len(), 3);
    }
}
