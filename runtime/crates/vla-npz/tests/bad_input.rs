//! Hostile and broken input: every case must come back as a typed error naming the file
//! (and the array where there is one), and no truncation or single-byte mutation of a real
//! archive may panic.

use std::path::PathBuf;

use vla_npz::{npz_bytes, parse_for_fuzz, Array, DType, Npz, NpzError};

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read(path).unwrap()
}

/// A stored archive of two small arrays written by this crate.
fn small_archive() -> Vec<u8> {
    let a = Array::from_f32("alpha", &[2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let b = Array::from_u8("beta", &[3], &[7, 8, 9]).unwrap();
    npz_bytes(&[&a, &b]).unwrap()
}

fn find(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(|(_, window)| *window == needle)
        .map(|(at, _)| at)
        .collect()
}

fn assert_one_line_naming(err: &NpzError, parts: &[&str]) {
    let text = err.to_string();
    assert!(!text.contains('\n'), "{text}");
    for part in parts {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
}

#[test]
fn empty_file_is_not_a_zip() {
    let err = Npz::from_bytes(Vec::new(), "empty.npz").unwrap_err();
    assert!(matches!(err, NpzError::NotZip { len: 0, .. }), "{err}");
    assert_one_line_naming(&err, &["empty.npz", "not a zip"]);
}

#[test]
fn other_files_are_not_zips() {
    for bytes in [
        fixture("f32_3d_v1.npy"),
        b"PK\x03\x04 but nothing else".to_vec(),
        vec![0; 100],
    ] {
        let err = Npz::from_bytes(bytes, "x.npz").unwrap_err();
        assert!(matches!(err, NpzError::NotZip { .. }), "{err}");
    }
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let err = Npz::open("/nonexistent/golden/vision_io.npz").unwrap_err();
    assert!(matches!(err, NpzError::Io { .. }), "{err}");
    assert_one_line_naming(&err, &["/nonexistent/golden/vision_io.npz", "reading"]);
}

#[test]
fn truncation_at_each_structure_is_reported() {
    let full = fixture("savez_compressed.npz");
    let eocd = *find(&full, b"PK\x05\x06").last().unwrap();
    let central = find(&full, b"PK\x01\x02")[0];
    // Cut inside the end record, inside the central directory, inside the data.
    for len in [
        full.len() - 1,
        eocd + 10,
        eocd,
        central + 20,
        central,
        full.len() / 2,
        30,
        4,
    ] {
        let err = Npz::from_bytes(full[..len].to_vec(), "cut.npz").unwrap_err();
        assert!(
            matches!(err, NpzError::NotZip { .. } | NpzError::CorruptZip { .. }),
            "{len}: {err}"
        );
        assert_one_line_naming(&err, &["cut.npz"]);
    }
}

#[test]
fn crc_mismatch_in_stored_data_names_the_entry() {
    let mut bytes = small_archive();
    let at = find(&bytes, &[7, 8, 9])[0];
    bytes[at + 1] ^= 0x10;
    let npz = Npz::from_bytes(bytes, "flip.npz").unwrap();
    assert!(npz.array("alpha").is_ok(), "other entries stay readable");
    let err = npz.array("beta").unwrap_err();
    assert!(matches!(err, NpzError::CrcMismatch { .. }), "{err}");
    assert_one_line_naming(&err, &["flip.npz", "beta.npy", "CRC-32 mismatch"]);
}

#[test]
fn crc_mismatch_in_deflated_entry_is_caught() {
    let mut bytes = fixture("savez_compressed.npz");
    // The central directory record of `u8.npy`: its CRC field sits 16 bytes into it.
    let name_at = *find(&bytes, b"u8.npy").last().unwrap();
    let record = name_at - 46;
    assert_eq!(&bytes[record..record + 4], b"PK\x01\x02");
    bytes[record + 16] ^= 0xFF;
    let npz = Npz::from_bytes(bytes, "deflated.npz").unwrap();
    let err = npz.array("u8").unwrap_err();
    assert!(matches!(err, NpzError::CrcMismatch { .. }), "{err}");
    assert!(npz.array("i8").is_ok());
}

#[test]
fn header_claiming_a_huge_shape_is_refused_without_allocating() {
    let mut bytes = small_archive();
    let shape_at = find(&bytes, b"'shape': (3,)")[0] + "'shape': (".len();
    // Same length, so the archive stays consistent up to the CRC, which is recomputed.
    bytes[shape_at] = b'9';
    let fixed = fix_crc(bytes, "beta.npy");
    let npz = Npz::from_bytes(fixed.clone(), "huge.npz").unwrap();
    let err = npz.array("beta").unwrap_err();
    assert!(matches!(err, NpzError::BadNpy { .. }), "{err}");
    assert_one_line_naming(
        &err,
        &["huge.npz", "`beta`", "needs 9 bytes but only 3 follow"],
    );

    let mut enormous = small_archive();
    let text = "'shape': (3,), }";
    let at = find(&enormous, text.as_bytes())[0];
    let replacement = "'shape':(9999999999999,99999999999)}";
    let padded_end = find(&enormous[at..], b"\n")[0] + at;
    assert!(padded_end - at >= replacement.len());
    enormous[at..at + replacement.len()].copy_from_slice(replacement.as_bytes());
    for byte in &mut enormous[at + replacement.len()..padded_end] {
        *byte = b' ';
    }
    let npz = Npz::from_bytes(fix_crc(enormous, "beta.npy"), "huge.npz").unwrap();
    let err = npz.array("beta").unwrap_err();
    assert!(
        err.to_string().contains("overflows") || err.to_string().contains("only 3 follow"),
        "{err}"
    );
}

/// Recomputes the CRC of a stored entry in both its local and central headers, so a test
/// can edit content and reach the parser behind the CRC check.
fn fix_crc(mut bytes: Vec<u8>, entry: &str) -> Vec<u8> {
    let names = find(&bytes, entry.as_bytes());
    let local = names[0] - 30;
    let central = names[names.len() - 1] - 46;
    let name_len = entry.len();
    let extra_len = usize::from(u16::from_le_bytes([bytes[local + 28], bytes[local + 29]]));
    let size = u32::from_le_bytes(bytes[local + 18..local + 22].try_into().unwrap()) as usize;
    let start = local + 30 + name_len + extra_len;
    let crc = crc32_reference(&bytes[start..start + size]);
    bytes[local + 14..local + 18].copy_from_slice(&crc.to_le_bytes());
    bytes[central + 16..central + 20].copy_from_slice(&crc.to_le_bytes());
    bytes
}

fn crc32_reference(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                0xEDB8_8320 ^ (crc >> 1)
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn archive_with_patched_header(from: &str, to: &str) -> Npz {
    assert_eq!(from.len(), to.len(), "patches keep lengths");
    let mut bytes = small_archive();
    let at = find(&bytes, from.as_bytes())[0];
    bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
    Npz::from_bytes(fix_crc(bytes, "alpha.npy"), "patched.npz").unwrap()
}

#[test]
fn unsupported_descr_is_refused_by_name() {
    let npz = archive_with_patched_header("'descr': '<f4'", "'descr': '<c8'");
    let err = npz.array("alpha").unwrap_err();
    assert!(matches!(err, NpzError::UnsupportedNpy { .. }), "{err}");
    assert_one_line_naming(&err, &["patched.npz", "`alpha`", "'<c8'"]);

    let npz = archive_with_patched_header("'descr': '<f4'", "'descr': '>f4'");
    let err = npz.array("alpha").unwrap_err();
    assert_one_line_naming(&err, &["big-endian"]);
}

#[test]
fn fortran_order_is_refused() {
    let npz = archive_with_patched_header("'fortran_order': False", "'fortran_order': True ");
    let err = npz.array("alpha").unwrap_err();
    assert!(matches!(err, NpzError::UnsupportedNpy { .. }), "{err}");
    assert_one_line_naming(&err, &["patched.npz", "`alpha`", "fortran_order is True"]);
}

#[test]
fn missing_array_lists_what_exists() {
    let npz = Npz::from_bytes(small_archive(), "golden/vision_io.npz").unwrap();
    let err = npz.array("gamma").unwrap_err();
    assert_eq!(
        err.to_string(),
        "golden/vision_io.npz: no array `gamma` (has: alpha, beta)"
    );
    assert!(!npz.contains("gamma"));
}

#[test]
fn wrong_dtype_or_shape_names_expected_and_found() {
    let npz = Npz::from_bytes(small_archive(), "g.npz").unwrap();
    let err = npz.expect("alpha", DType::F16, &[2, 2]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "g.npz: array `alpha`: expected dtype float16, found float32"
    );
    let err = npz.expect("alpha", DType::F32, &[4]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "g.npz: array `alpha`: expected shape [4], found [2, 2]"
    );
    let err = npz.array("beta").unwrap().to_i32().unwrap_err();
    assert_eq!(
        err.to_string(),
        "g.npz: array `beta`: expected dtype int32, found uint8"
    );
}

#[test]
fn duplicate_names_are_refused_at_open() {
    let a = Array::from_u8("xx", &[1], &[1]).unwrap();
    let b = Array::from_u8("yy", &[1], &[2]).unwrap();
    let mut bytes = npz_bytes(&[&a, &b]).unwrap();
    for at in find(&bytes, b"yy.npy") {
        bytes[at..at + 6].copy_from_slice(b"xx.npy");
    }
    let err = Npz::from_bytes(bytes, "dup.npz").unwrap_err();
    assert!(matches!(err, NpzError::DuplicateArray { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "dup.npz: array `xx` appears more than once"
    );
}

#[test]
fn local_header_must_agree_with_the_central_directory() {
    let mut bytes = small_archive();
    let first = find(&bytes, b"alpha.npy")[0];
    bytes[first] = b'A';
    let err = Npz::from_bytes(bytes, "mismatch.npz").unwrap_err();
    assert!(matches!(err, NpzError::CorruptZip { .. }), "{err}");
    assert_one_line_naming(&err, &["mismatch.npz", "alpha.npy", "local header"]);
}

#[test]
fn unsupported_compression_is_refused_per_entry() {
    let mut bytes = small_archive();
    let central = find(&bytes, b"PK\x01\x02")[1];
    bytes[central + 10] = 14; // LZMA
    let npz = Npz::from_bytes(bytes, "lzma.npz").unwrap();
    assert!(npz.array("alpha").is_ok());
    let err = npz.array("beta").unwrap_err();
    assert!(matches!(err, NpzError::UnsupportedZip { .. }), "{err}");
    assert_one_line_naming(&err, &["lzma.npz", "beta.npy", "compression method 14"]);
}

/// Every prefix and a spread of single-byte edits of each fixture: errors are fine, panics
/// (including the round-trip oracle in `parse_for_fuzz`) are not. Edits per byte are few
/// for the larger fixtures to keep the debug-build run short; the small archive below gets
/// every byte value.
#[test]
fn no_truncation_or_byte_mutation_panics() {
    let mut cases = 0usize;
    let fixtures = [
        ("savez_streamed.npz", 5),
        ("savez_compressed.npz", 1),
        ("savez.npz", 1),
        ("f32_3d_v2.npy", 5),
    ];
    for (name, edits_per_byte) in fixtures {
        let original = fixture(name);
        for len in 0..original.len() {
            parse_for_fuzz(&original[..len]);
            cases += 1;
        }
        let mut mutated = original.clone();
        for at in 0..original.len() {
            let edits = [
                original[at] ^ 0x80,
                original[at] ^ 0x01,
                0x00,
                0xFF,
                original[at].wrapping_add(1),
            ];
            for value in &edits[..edits_per_byte] {
                mutated[at] = *value;
                parse_for_fuzz(&mutated);
                cases += 1;
            }
            mutated[at] = original[at];
        }
    }
    assert!(cases > 15_000, "{cases}");
}

/// Every value of every byte of the zip structures (local headers, central directory, end
/// record), where sizes and offsets live.
#[test]
fn every_byte_value_in_zip_structures_is_survived() {
    let original = small_archive();
    let central = find(&original, b"PK\x01\x02")[0];
    let mut positions: Vec<usize> = (central..original.len()).collect();
    for local in find(&original, b"PK\x03\x04") {
        positions.extend(local..local + 40);
    }
    let mut mutated = original.clone();
    for at in positions {
        for value in 0..=255u8 {
            mutated[at] = value;
            parse_for_fuzz(&mutated);
        }
        mutated[at] = original[at];
    }
}

#[test]
fn an_io_error_names_its_cause_in_the_message_and_not_again_in_source() {
    use std::error::Error;
    let path = "/nonexistent/golden/vision_io.npz";
    let os = std::fs::File::open(path).unwrap_err().to_string();
    let err = Npz::open(path).unwrap_err();
    assert_one_line_naming(&err, &[path, &os]);
    assert!(err.source().is_none(), "{:?}", err.source());
}
