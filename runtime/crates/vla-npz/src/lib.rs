//! NumPy `.npy`/`.npz` reading and writing for golden tensors, prompt tables and
//! observations.
//!
//! The bytes come from outside (bundles, host tools), so parsing never panics and never
//! allocates on a header's word alone: every size is checked against the data present, and
//! every failure is an [`NpzError`] naming the file and the array. Supported: zip stored and
//! deflate entries (with zip64, CRC-32 checked), `.npy` versions 1-3, little-endian
//! `f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1` in C order. Big-endian, `fortran_order: True`
//! and other dtypes are refused with an "unsupported" error rather than misread.
//!
//! ```
//! use vla_npz::{npz_bytes, Array, DType, Npz};
//! let actions = Array::from_f32("actions", &[2, 3], &[0.0, 0.1, 0.2, 1.0, 1.1, 1.2])?;
//! let npz = Npz::from_bytes(npz_bytes(&[&actions])?, "golden.npz")?;
//! let read = npz.expect("actions", DType::F32, &[2, 3])?;
//! assert_eq!(read.to_f32()?[4], 1.1);
//! assert_eq!(
//!     npz.array("obs").unwrap_err().to_string(),
//!     "golden.npz: no array `obs` (has: actions)"
//! );
//! # Ok::<(), vla_npz::NpzError>(())
//! ```

// Unsafe code only in `mapped` (the one memory map).
#![deny(unsafe_code)]

mod array;
mod dtype;
mod error;
#[allow(unsafe_code)]
mod mapped;
mod npy;
mod npz;
mod zip;

pub use array::Array;
pub use dtype::{DType, Element};
pub use error::NpzError;
pub use mapped::MappedNpy;
pub use npy::{open_npy, read_npy, write_npy};
pub use npz::{npz_bytes, write_npz, Npz};

/// Runs every parser path over untrusted bytes, for fuzz targets: the archive (central
/// directory, local headers, inflate, CRC, every entry's `.npy` header and data) and the
/// bytes as a bare `.npy`. Errors are expected and ignored. Whatever parses is re-encoded
/// and parsed again, and a difference panics: that would be a bug, which is what a fuzzer
/// should find.
pub fn parse_for_fuzz(bytes: &[u8]) {
    if let Ok(npz) = Npz::from_bytes(bytes.to_vec(), "fuzz.npz") {
        let names: Vec<String> = npz.names().map(str::to_string).collect();
        let mut decoded = Vec::new();
        for name in &names {
            assert!(npz.contains(name));
            if let Ok(array) = npz.array(name) {
                exercise_array(&array);
                decoded.push(array);
            }
        }
        let refs: Vec<&Array> = decoded.iter().collect();
        if let Ok(rewritten) = npz_bytes(&refs) {
            let reread = Npz::from_bytes(rewritten, "fuzz-rewritten.npz")
                .expect("an archive this crate wrote must parse");
            for array in &decoded {
                let again = reread
                    .array(array.name())
                    .expect("a written array must read back");
                assert_eq!(&again, array, "array changed in an npz round trip");
            }
        }
    }
    if let Ok(array) = read_npy(bytes, "fuzz.npy") {
        exercise_array(&array);
    }
}

fn exercise_array(array: &Array) {
    let converted = array
        .to_f32()
        .expect("every supported dtype converts to f32");
    assert_eq!(converted.len(), array.len());
    let reread = read_npy(&write_npy(array), array.name()).expect("a written .npy must read back");
    assert_eq!(reread.dtype(), array.dtype());
    assert_eq!(reread.shape(), array.shape());
    assert_eq!(reread.bytes(), array.bytes());
}
