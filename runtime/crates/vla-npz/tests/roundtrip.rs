//! Write -> read round trips through files and memory for every dtype and rank, plus the
//! writer's promises: deterministic bytes, atomic replacement, refusing bad array sets.

use std::path::PathBuf;

use half::f16;
use vla_npz::{npz_bytes, read_npy, write_npy, write_npz, Array, DType, Npz, NpzError};

/// A scratch directory unique to this test process and test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vla-npz-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn one_of_each_dtype() -> Vec<Array> {
    vec![
        Array::from_f16(
            "f16",
            &[2, 2],
            &[f16::MIN, f16::NEG_ONE, f16::EPSILON, f16::MAX],
        )
        .unwrap(),
        Array::from_f32(
            "f32",
            &[3, 1, 2],
            &[0.0, -0.0, 1.5, f32::MIN, f32::MAX, f32::NAN],
        )
        .unwrap(),
        Array::from_slice("f64", &[2], &[f64::MIN_POSITIVE, -1e300]).unwrap(),
        Array::from_slice("i8", &[3], &[i8::MIN, 0, i8::MAX]).unwrap(),
        Array::from_slice("i16", &[2], &[i16::MIN, i16::MAX]).unwrap(),
        Array::from_i32("i32", &[1, 2], &[i32::MIN, i32::MAX]).unwrap(),
        Array::from_i64("i64", &[2], &[i64::MIN, i64::MAX]).unwrap(),
        Array::from_u8("u8", &[4], &[0, 1, 254, 255]).unwrap(),
        Array::from_slice("u16", &[2], &[0u16, u16::MAX]).unwrap(),
        Array::from_slice("u32", &[2], &[0u32, u32::MAX]).unwrap(),
        Array::from_u64("u64", &[2], &[0, u64::MAX]).unwrap(),
        Array::from_slice("bool", &[2, 1], &[true, false]).unwrap(),
        Array::from_f32("scalar", &[], &[42.0]).unwrap(),
        Array::from_u8("empty", &[2, 0, 5], &[]).unwrap(),
    ]
}

#[test]
fn every_dtype_round_trips_through_a_file() {
    let arrays = one_of_each_dtype();
    assert_eq!(
        arrays
            .iter()
            .map(Array::dtype)
            .collect::<std::collections::HashSet<_>>()
            .len(),
        DType::ALL.len(),
        "fixture covers every dtype"
    );
    let dir = scratch("file");
    let path = dir.join("all.npz");
    write_npz(&path, &arrays.iter().collect::<Vec<_>>()).unwrap();
    if let Some(export) = std::env::var_os("VLA_NPZ_EXPORT_DIR") {
        // Lets a developer check numpy's view of the writer's output by hand.
        std::fs::copy(&path, PathBuf::from(export).join("all_dtypes.npz")).unwrap();
    }
    let npz = Npz::open(&path).unwrap();
    assert_eq!(npz.len(), arrays.len());
    for array in &arrays {
        let read = npz
            .expect(array.name(), array.dtype(), array.shape())
            .unwrap();
        assert_eq!(&read, array);
        assert_eq!(read.origin(), path.display().to_string());
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_dtype_round_trips_through_npy_bytes() {
    for array in one_of_each_dtype() {
        let bytes = write_npy(&array);
        let read = read_npy(&bytes, &format!("dir/{}.npy", array.name())).unwrap();
        assert_eq!(read, array);
    }
}

#[test]
fn writing_is_deterministic() {
    let arrays = one_of_each_dtype();
    let refs: Vec<&Array> = arrays.iter().collect();
    assert_eq!(npz_bytes(&refs).unwrap(), npz_bytes(&refs).unwrap());
    let dir = scratch("determinism");
    write_npz(dir.join("a.npz"), &refs).unwrap();
    write_npz(dir.join("b.npz"), &refs).unwrap();
    assert_eq!(
        std::fs::read(dir.join("a.npz")).unwrap(),
        std::fs::read(dir.join("b.npz")).unwrap()
    );
    assert_eq!(
        std::fs::read(dir.join("a.npz")).unwrap(),
        npz_bytes(&refs).unwrap()
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_failed_write_leaves_the_existing_file_untouched() {
    let dir = scratch("atomic");
    let path = dir.join("keep.npz");
    let good = Array::from_u8("good", &[1], &[7]).unwrap();
    write_npz(&path, &[&good]).unwrap();
    let before = std::fs::read(&path).unwrap();

    let err = write_npz(&path, &[&good, &good]).unwrap_err();
    assert!(matches!(err, NpzError::DuplicateArray { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary file left behind");

    let missing_dir = dir.join("no/such/dir/x.npz");
    let err = write_npz(&missing_dir, &[&good]).unwrap_err();
    assert!(matches!(err, NpzError::Io { .. }), "{err}");
    assert!(err.to_string().contains("no/such/dir/x.npz"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn writer_refuses_bad_names() {
    let unnamed = Array::from_u8("", &[1], &[1]).unwrap();
    let err = npz_bytes(&[&unnamed]).unwrap_err();
    assert!(err.to_string().contains("must not be empty"), "{err}");
    let long = Array::from_u8("x".repeat(70_000), &[1], &[1]).unwrap();
    assert!(npz_bytes(&[&long]).is_err());
}

#[test]
fn empty_archive_round_trips() {
    let npz = Npz::from_bytes(npz_bytes(&[]).unwrap(), "empty.npz").unwrap();
    assert!(npz.is_empty());
    assert_eq!(
        npz.array("x").unwrap_err().to_string(),
        "empty.npz: no array `x` (has: nothing)"
    );
}

#[test]
fn renamed_array_writes_under_the_new_name() {
    let array = Array::from_i32("old", &[2], &[1, 2])
        .unwrap()
        .renamed("new");
    let npz = Npz::from_bytes(npz_bytes(&[&array]).unwrap(), "r.npz").unwrap();
    assert!(npz.contains("new") && !npz.contains("old"));
    assert_eq!(npz.array("new").unwrap().to_i32().unwrap(), [1, 2]);
}
