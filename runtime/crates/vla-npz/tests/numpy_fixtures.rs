//! Reads archives and `.npy` files written by real numpy (tests/data, made by
//! make_fixtures.py) and checks every value, so the reader agrees with numpy rather than
//! only with this crate's own writer.

use std::path::PathBuf;

use half::f16;
use vla_npz::{npz_bytes, open_npy, Array, DType, Npz, NpzError};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn f32_3d_values() -> Vec<f32> {
    (0..24).map(|i| i as f32 / 4.0 - 3.0).collect()
}

fn check_full_fixture(npz: &Npz) {
    let names: Vec<&str> = npz.names().collect();
    assert_eq!(
        names,
        [
            "f16",
            "f32_3d",
            "f32_special",
            "f64",
            "u8",
            "i8",
            "i16",
            "u16",
            "i32",
            "u32",
            "i64",
            "u64",
            "bool",
            "scalar",
            "empty"
        ]
    );

    let f16s = npz.expect("f16", DType::F16, &[2, 3]).unwrap();
    let want: Vec<f16> = [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    assert_eq!(f16s.to_f16().unwrap(), want);
    assert_eq!(f16s.to_f32().unwrap(), [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]);

    let cube = npz.expect("f32_3d", DType::F32, &[2, 3, 4]).unwrap();
    assert_eq!(cube.to_f32().unwrap(), f32_3d_values());

    let special = npz
        .expect("f32_special", DType::F32, &[5])
        .unwrap()
        .to_f32()
        .unwrap();
    assert!(special[0].is_nan());
    assert_eq!(special[1], f32::INFINITY);
    assert_eq!(special[2], f32::NEG_INFINITY);
    assert_eq!(special[3].to_bits(), (-0.0f32).to_bits());
    assert_eq!(special[4].to_bits(), 1, "smallest subnormal survives");

    let f64s = npz.expect("f64", DType::F64, &[2]).unwrap();
    assert_eq!(f64s.to_vec::<f64>().unwrap(), [1.0 / 3.0, -2.5]);
    assert_eq!(
        npz.expect("u8", DType::U8, &[5]).unwrap().to_u8().unwrap(),
        [0, 1, 127, 128, 255]
    );
    assert_eq!(
        npz.expect("i8", DType::I8, &[4])
            .unwrap()
            .to_vec::<i8>()
            .unwrap(),
        [-128, -1, 0, 127]
    );
    assert_eq!(
        npz.expect("i16", DType::I16, &[2])
            .unwrap()
            .to_vec::<i16>()
            .unwrap(),
        [i16::MIN, i16::MAX]
    );
    assert_eq!(
        npz.expect("u16", DType::U16, &[2])
            .unwrap()
            .to_vec::<u16>()
            .unwrap(),
        [0, u16::MAX]
    );
    assert_eq!(
        npz.expect("i32", DType::I32, &[2, 2])
            .unwrap()
            .to_i32()
            .unwrap(),
        [i32::MIN, -1, 0, i32::MAX]
    );
    assert_eq!(
        npz.expect("u32", DType::U32, &[1])
            .unwrap()
            .to_vec::<u32>()
            .unwrap(),
        [u32::MAX]
    );
    assert_eq!(
        npz.expect("i64", DType::I64, &[2])
            .unwrap()
            .to_i64()
            .unwrap(),
        [i64::MIN, i64::MAX]
    );
    assert_eq!(
        npz.expect("u64", DType::U64, &[3])
            .unwrap()
            .to_u64()
            .unwrap(),
        [0, u64::MAX, 12345678901234567890]
    );
    assert_eq!(
        npz.expect("bool", DType::Bool, &[4])
            .unwrap()
            .to_vec::<bool>()
            .unwrap(),
        [true, false, false, true]
    );
    let scalar = npz.expect("scalar", DType::F32, &[]).unwrap();
    assert_eq!((scalar.len(), scalar.to_f32().unwrap()), (1, vec![7.25]));
    let empty = npz.expect("empty", DType::F32, &[0, 3]).unwrap();
    assert!(empty.is_empty());
}

#[test]
fn reads_np_savez() {
    let npz = Npz::open(data("savez.npz")).unwrap();
    assert_eq!(npz.path(), Some(data("savez.npz").as_path()));
    check_full_fixture(&npz);
}

#[test]
fn reads_np_savez_compressed() {
    check_full_fixture(&Npz::open(data("savez_compressed.npz")).unwrap());
}

#[test]
fn reads_savez_to_a_stream_with_data_descriptors() {
    let npz = Npz::open(data("savez_streamed.npz")).unwrap();
    assert_eq!(npz.names().collect::<Vec<_>>(), ["f32_3d", "u8"]);
    assert_eq!(
        npz.expect("f32_3d", DType::F32, &[2, 3, 4])
            .unwrap()
            .to_f32()
            .unwrap(),
        f32_3d_values()
    );
    assert_eq!(
        npz.array("u8").unwrap().to_u8().unwrap(),
        [0, 1, 127, 128, 255]
    );
}

#[test]
fn stored_and_compressed_fixtures_hold_identical_arrays() {
    let stored = Npz::open(data("savez.npz")).unwrap();
    let deflated = Npz::open(data("savez_compressed.npz")).unwrap();
    for name in stored.names() {
        assert_eq!(
            stored.array(name).unwrap(),
            deflated.array(name).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn rewriting_numpy_arrays_preserves_them() {
    let original = Npz::open(data("savez.npz")).unwrap();
    let arrays: Vec<Array> = original
        .names()
        .map(|n| original.array(n).unwrap())
        .collect();
    let refs: Vec<&Array> = arrays.iter().collect();
    let rewritten = Npz::from_bytes(npz_bytes(&refs).unwrap(), "rewritten.npz").unwrap();
    check_full_fixture(&rewritten);
}

#[test]
fn reads_npy_versions_1_2_and_3() {
    for version in 1..=3 {
        let path = data(&format!("f32_3d_v{version}.npy"));
        let array = open_npy(&path).unwrap();
        assert_eq!(array.name(), format!("f32_3d_v{version}"));
        assert_eq!(array.shape(), &[2, 3, 4]);
        assert_eq!(array.to_f32().unwrap(), f32_3d_values());
        assert_eq!(array.origin(), path.display().to_string());
    }
}

#[test]
fn numpy_fortran_big_endian_and_complex_are_refused_clearly() {
    let cases = [
        ("fortran.npy", "fortran_order is True"),
        ("big_endian.npy", "'>f4' is big-endian"),
        ("complex.npy", "'<c8' is not one of the supported dtypes"),
    ];
    for (file, needle) in cases {
        let err = open_npy(data(file)).unwrap_err();
        assert!(
            matches!(err, NpzError::UnsupportedNpy { .. }),
            "{file}: {err}"
        );
        let text = err.to_string();
        assert!(text.contains(needle), "{text}");
        assert!(text.contains(file), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
}
