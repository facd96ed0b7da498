//! Loading a bundle of the OTA store so that what was verified is what runs.
//!
//! The signature, the target, the file set, the sizes and every small file are checked
//! with the store's keys (the daemon's own), and the `bundle.json` the policy parsed is
//! the signed one. Each context binary's SHA-256 is not computed then, but while its one
//! open file is read into private memory ([`vla_qnn::BinaryImage`]): the bytes hashed are
//! the bytes QNN receives, and a write to the file after that changes nothing. One pass
//! over each file; the cost is memory: a binary's size until its context exists.

use crate::gate::LoadError;
use std::path::Path;
use std::sync::Arc;
use vla_ota::{DeferredDigests, OtaError, Store};
use vla_policy::{Bundle, OpenBinary, PolicyError};
use vla_qnn::{BinaryImage, ContextBinary, QnnLibrary};

/// `bundle` (opened from a directory of `store`) verified against the store's keys as
/// it is about to load: its directory must be named by its manifest's content hash, and
/// its context binaries are opened through [`HashedBinaries`].
pub(crate) fn verify_for_load(store: &Store, bundle: Bundle) -> Result<Bundle, LoadError> {
    let dir = bundle.dir.clone();
    let unverified = |source: OtaError| LoadError::Unverified {
        dir: dir.clone(),
        source: Box::new(source),
    };
    let (verified, digests) = store
        .verify_deferring(&dir, &bundle.binary_paths())
        .map_err(unverified)?;
    let named = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if verified.content_hash != named {
        return Err(unverified(OtaError::InUseCorrupt {
            hash: named.to_owned(),
            reason: format!("its manifest hashes to {}", verified.content_hash),
        }));
    }
    // Parsed before this verification: the bytes parsed must be the signed ones.
    verified
        .check_bytes("bundle.json", bundle.manifest_bytes())
        .map_err(unverified)?;
    Ok(bundle.with_binaries(Arc::new(HashedBinaries { digests })))
}

/// Opens context binaries of a verified bundle: each file read once into private memory,
/// hashed chunk by chunk as it lands there, and handed to QNN only if the digest is the
/// signed manifest's.
#[derive(Debug)]
pub(crate) struct HashedBinaries {
    pub(crate) digests: DeferredDigests,
}

impl OpenBinary for HashedBinaries {
    fn open(
        &self,
        lib: &QnnLibrary,
        dir: &Path,
        component: &str,
        rel: &str,
    ) -> Result<ContextBinary, PolicyError> {
        let path = dir.join(rel);
        let image = self
            .read(dir, rel)
            .map_err(|source| PolicyError::Unverified {
                component: component.to_owned(),
                path: path.clone(),
                source,
            })?;
        ContextBinary::from_image(lib, image, &path).map_err(|error| PolicyError::Qnn {
            component: component.to_owned(),
            error,
        })
    }
}

impl HashedBinaries {
    /// File `rel` of `dir` in private memory, its bytes the signed manifest's.
    fn read(
        &self,
        dir: &Path,
        rel: &str,
    ) -> Result<BinaryImage, Box<dyn std::error::Error + Send + Sync>> {
        let (file, mut check) = self.digests.open(rel)?;
        // Shorter or longer than signed while read: a changed file, refused as such.
        let image = BinaryImage::read(file, check.size(), &dir.join(rel), |chunk| {
            check.update(chunk)
        })?;
        check.finish()?;
        Ok(image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::os::unix::fs::FileExt;
    use vla_qnn::Context;

    /// A writer of the store's files (the vla user owns them) changes a context binary in
    /// place after its bytes were taken and hashed, before QNN creates the context.
    #[test]
    fn the_bytes_hashed_are_the_bytes_qnn_gets_whatever_the_file_becomes() {
        let Some(lib_dir) = vla_test_support::qnn_lib_dir() else {
            return;
        };
        let tmp = std::env::temp_dir().join(format!("vlad-hashed-bin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let b = tmp.join("bundle");
        vla_test_support::copy_dir(
            &vla_test_support::repo_root().join("golden/bundles/fastwam"),
            &b,
        );
        vla_ota::pack_until(&b, u64::MAX / 2).unwrap();
        let key = tmp.join("signing.key");
        let public = vla_ota::keygen(&key).unwrap();
        vla_ota::sign(&b, &key).unwrap();
        let target = vla_ota::DeviceTarget {
            soc_model: 77,
            htp_arch: 73,
            runtime_version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        let rel = "ctx/action_step_socid77_archv73.bin";
        let defer = BTreeSet::from([rel.to_owned()]);
        let (_, digests) = vla_ota::verify_deferring(&b, &[public], 1, &target, &defer).unwrap();
        let common = crate::cli::Common {
            lib_dir: Some(lib_dir),
            log_level: None,
        };
        let (lib, backend) = crate::qnn_setup::load_backend(&common).expect("QNN backend");
        let signed = std::fs::read(b.join(rel)).unwrap();
        let binaries = HashedBinaries { digests };

        let hashed = binaries.open(&lib, &b, "action_step", rel).unwrap();
        // How the binary reached QNN before: a mapping of the file.
        let mapped = ContextBinary::open(&lib, b.join(rel)).unwrap();
        let middle = signed.len() as u64 / 2;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(b.join(rel))
            .unwrap();
        file.write_at(&[signed[middle as usize] ^ 0x01], middle)
            .unwrap();
        drop(file);

        assert_ne!(
            mapped.bytes().unwrap(),
            &signed[..],
            "a mapping of the file shows the write: QNN would get bytes nobody hashed"
        );
        assert_eq!(
            hashed.bytes().unwrap(),
            &signed[..],
            "the hashed bytes are kept"
        );
        drop(mapped);
        let context = Context::create(&backend, hashed).expect("context from the hashed bytes");
        let mut graph = context.graph(None).expect("graph");
        let mut io = graph.allocate_io();
        graph.execute_io(&mut io).expect("execute");

        // The changed file, loaded again, is refused before QNN sees any of it.
        let refused = binaries.open(&lib, &b, "action_step", rel).unwrap_err();
        assert!(
            matches!(refused, PolicyError::Unverified { .. }),
            "{refused}"
        );
        let line = refused.to_string();
        assert!(
            line.contains("SHA-256") && line.contains(rel) && !line.contains('\n'),
            "{line}"
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// What verifying at load costs, the way it was (every file hashed by path, then the
    /// binaries mapped and every page of them read, as QNN does) and the way it is (the
    /// binaries hashed as they are read into private memory): wall time over a fixture
    /// bundle, with a large padding file standing in for a GB-sized binary. Prints figures.
    #[test]
    #[ignore = "benchmark: prints figures (cargo test -p vlad --bin vlad load_verification_cost -- --ignored --nocapture)"]
    fn load_verification_cost() {
        use std::time::Instant;
        let Some(lib_dir) = vla_test_support::qnn_lib_dir() else {
            return;
        };
        let name = std::env::var("VLA_BENCH_BUNDLE").unwrap_or("molmoact2-original".into());
        let pad_mib: usize = std::env::var("VLA_BENCH_PAD_MIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256);
        let tmp = std::env::temp_dir().join(format!("vlad-verify-cost-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let b = tmp.join("bundle");
        vla_test_support::copy_dir(
            &vla_test_support::repo_root()
                .join("golden/bundles")
                .join(&name),
            &b,
        );
        let pad: Vec<u8> = (0..pad_mib << 20)
            .map(|i| ((i * 2654435761usize) >> 13) as u8)
            .collect();
        std::fs::write(b.join("pad.bin"), &pad).unwrap();
        drop(pad);
        vla_ota::pack_until(&b, u64::MAX / 2).unwrap();
        let key = tmp.join("signing.key");
        let public = vla_ota::keygen(&key).unwrap();
        vla_ota::sign(&b, &key).unwrap();
        let target = vla_ota::DeviceTarget {
            soc_model: 77,
            htp_arch: 73,
            runtime_version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        let bundle = Bundle::open(&b).unwrap();
        let mut rels: Vec<String> = bundle.binary_paths().into_iter().collect();
        let binary_bytes: u64 = rels
            .iter()
            .map(|r| std::fs::metadata(b.join(r)).unwrap().len())
            .sum();
        rels.push("pad.bin".into());
        let defer: BTreeSet<String> = rels.iter().cloned().collect();
        let common = crate::cli::Common {
            lib_dir: Some(lib_dir),
            log_level: None,
        };
        let (lib, _backend) = crate::qnn_setup::load_backend(&common).expect("QNN backend");
        let touch = |bytes: &[u8]| bytes.iter().step_by(4096).fold(0u8, |a, &x| a ^ x);
        let before = || {
            let t = Instant::now();
            vla_ota::verify(&b, &[public], &target).unwrap();
            let mut seen = 0u8;
            for rel in &rels {
                let path = b.join(rel);
                // The stand-in is no context binary: its mapping is not counted (page
                // faults on a warm page cache, small next to hashing it).
                if rel != "pad.bin" {
                    let bin = ContextBinary::open(&lib, &path).unwrap();
                    seen ^= touch(bin.bytes().unwrap());
                }
            }
            std::hint::black_box(seen);
            t.elapsed().as_secs_f64() * 1e3
        };
        let after = || {
            let t = Instant::now();
            let (_, digests) =
                vla_ota::verify_deferring(&b, &[public], 1, &target, &defer).unwrap();
            let hashed = HashedBinaries { digests };
            for rel in &rels {
                let image = hashed.read(&b, rel).unwrap();
                if rel != "pad.bin" {
                    let bin = ContextBinary::from_image(&lib, image, b.join(rel)).unwrap();
                    std::hint::black_box(bin.size());
                }
            }
            t.elapsed().as_secs_f64() * 1e3
        };
        // The part of `after` that is the price of owning the bytes: the stand-in read
        // into private memory, nothing hashed.
        let copy_only = || {
            let t = Instant::now();
            let file = std::fs::File::open(b.join("pad.bin")).unwrap();
            let image = BinaryImage::read(file, (pad_mib << 20) as u64, &b, |_| {}).unwrap();
            std::hint::black_box(image.bytes().len());
            t.elapsed().as_secs_f64() * 1e3
        };
        before();
        after();
        let (mut old, mut new, mut copy) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..5 {
            old.push(before());
            new.push(after());
            copy.push(copy_only());
        }
        old.sort_by(f64::total_cmp);
        new.sort_by(f64::total_cmp);
        copy.sort_by(f64::total_cmp);
        println!(
            "bundle {name}: {} binaries, {binary_bytes} bytes, plus a {pad_mib} MiB stand-in binary; \
             median of 5 (min-max), page cache warm:\n  \
             verify all by path, then map and read every page (stand-in not mapped): {:.1} ms ({:.1}-{:.1})\n  \
             verify the rest, hash each binary as it is read into private memory: {:.1} ms ({:.1}-{:.1})\n  \
             of which reading the stand-in into private memory, unhashed: {:.1} ms ({:.1}-{:.1})",
            rels.len() - 1,
            old[2], old[0], old[4], new[2], new[0], new[4], copy[2], copy[0], copy[4]
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
