//! Loading a bundle of the OTA store so that what was verified is what runs.
//!
//! The signature, the target, the file set, the sizes and every small file are checked
//! with the store's keys (the daemon's own), and the `bundle.json` the policy parsed is
//! the signed one. Each context binary's SHA-256 is not computed then, but immediately
//! before its context is created, while its one open file is read into private memory
//! ([`vla_qnn::BinaryImage`]): the bytes hashed are the bytes QNN receives, and a write
//! to the file after that changes nothing. The load plans with metadata read by path
//! first, and each binary's verified bytes must describe the same. One hashing pass over
//! each file; the cost in memory: one binary's size at a time, until its context exists.
//! Every other file the load and its gate read (goldens, prompt and context tables,
//! world-model inputs, the tokenizer files, the embedding table) is hashed the same way as
//! it is read, once, and parsed from exactly those bytes ([`HashedFiles`]); the embedding
//! table is kept in private memory (its size, for as long as the policy lives) instead of
//! being mapped by path.

use crate::gate::LoadError;
use std::path::Path;
use std::sync::Arc;
use vla_ota::{DeferredDigests, OtaError, Store};
use vla_policy::{Bundle, CheckedRead, OpenBinary, OpenFile, PolicyError};
use vla_qnn::{BinaryImage, ContextBinary, Footprint, QnnLibrary};

/// `bundle` (opened from a directory of `store`) verified against the store's keys as
/// it is about to load: its directory must be named by its manifest's content hash. The
/// digests of the files the load reads are returned for [`hashed`], which checks them as
/// each file is read.
pub(crate) fn verify_for_load(
    store: &Store,
    bundle: &Bundle,
) -> Result<DeferredDigests, LoadError> {
    let dir = bundle.dir.clone();
    let unverified = |source: OtaError| LoadError::Unverified {
        dir: dir.clone(),
        source: Box::new(source),
    };
    let mut deferred = bundle.binary_paths();
    deferred.extend(bundle.data_paths());
    let (verified, digests) = store
        .verify_deferring(&dir, &deferred)
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
    Ok(digests)
}

/// `bundle` with every file it reads hashed as it is read (`digests` defers at least
/// [`Bundle::binary_paths`] and [`Bundle::data_paths`]); `planned`: the footprints the
/// DSP memory plan read from the binaries, which their verified bytes must state too.
pub(crate) fn hashed(bundle: Bundle, digests: DeferredDigests, planned: Vec<Footprint>) -> Bundle {
    bundle
        .with_binaries(Arc::new(HashedBinaries {
            digests: digests.clone(),
            planned,
        }))
        .with_files(Arc::new(HashedFiles { digests }))
}

/// Opens the other files of a verified bundle: each open file is hashed as it is read,
/// over the reader's own buffer (the bytes the policy parses), and the reader's caller
/// ([`Bundle::read`], [`Bundle::table`]) calls `finish` before using them; nothing is
/// read again by path.
#[derive(Debug)]
pub(crate) struct HashedFiles {
    pub(crate) digests: DeferredDigests,
}

/// A file of a verified bundle, hashing what it hands out.
struct HashingReader {
    file: std::fs::File,
    check: vla_ota::DigestCheck,
    path: std::path::PathBuf,
    what: String,
}

impl std::io::Read for HashingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.check.update(&buf[..n]);
        Ok(n)
    }
}

impl CheckedRead for HashingReader {
    fn size(&self) -> u64 {
        self.check.size()
    }

    fn finish(self: Box<Self>) -> Result<(), PolicyError> {
        let Self {
            check, path, what, ..
        } = *self;
        check
            .finish()
            .map_err(|source| PolicyError::UnverifiedFile {
                what,
                path,
                source: Box::new(source),
            })
    }
}

impl OpenFile for HashedFiles {
    fn open(
        &self,
        dir: &Path,
        what: &str,
        rel: &str,
    ) -> Result<Box<dyn CheckedRead + Send>, PolicyError> {
        let path = dir.join(rel);
        let (file, check) =
            self.digests
                .open(rel)
                .map_err(|source| PolicyError::UnverifiedFile {
                    what: what.to_owned(),
                    path: path.clone(),
                    source: Box::new(source),
                })?;
        Ok(Box::new(HashingReader {
            file,
            check,
            path,
            what: what.to_owned(),
        }))
    }
}

/// Opens context binaries of a verified bundle for a load planned from their metadata
/// and fed one context at a time: the metadata is first read from a mapping by path, an
/// unverified description the load only plans with; immediately before each context is
/// created its file is read once into private memory, hashed chunk by chunk as it lands
/// there, compared with the signed manifest's digest, its metadata compared with the
/// description, and only then handed to QNN, which frees it once the context exists
/// ([`ContextBinary::with_bytes_at_creation`]). A group holds one binary at a time.
/// The DSP memory plan, made before the load from its own read of the metadata, must
/// agree with the load's description (so, through the check at creation, with the signed
/// bytes): a binary whose footprint differs is refused before any context is created.
#[derive(Debug)]
pub(crate) struct HashedBinaries {
    pub(crate) digests: DeferredDigests,
    /// The DSP memory plan's footprints, by component (none: no plan to agree with).
    pub(crate) planned: Vec<Footprint>,
}

fn footprint_text(f: &Footprint) -> String {
    format!(
        "{} bytes, spill-fill {}, I/O {}",
        f.weights, f.spill_fill, f.io
    )
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
        let planned = match ContextBinary::open(lib, &path) {
            Ok(planned) => planned,
            // A file that changed since signing may not even parse: its digest is the
            // answer then (a refusal that holds), else the metadata error is.
            Err(error) => {
                return Err(match read_hashed(&self.digests, dir, rel) {
                    Err(source) => PolicyError::Unverified {
                        component: component.to_owned(),
                        path,
                        source,
                    },
                    Ok(_) => PolicyError::of_qnn(component.to_owned(), error),
                })
            }
        };
        if let Some(plan) = self.planned.iter().find(|f| f.name == component) {
            let described = Footprint::of(component, &planned);
            if &described != plan {
                return Err(PolicyError::Unverified {
                    component: component.to_owned(),
                    source: format!(
                        "it states {}, the DSP memory plan read {} (changed between the two reads)",
                        footprint_text(&described),
                        footprint_text(plan)
                    )
                    .into(),
                    path,
                });
            }
        }
        let (digests, dir, rel) = (self.digests.clone(), dir.to_owned(), rel.to_owned());
        Ok(planned.with_bytes_at_creation(Box::new(move || read_hashed(&digests, &dir, &rel))))
    }
}

/// File `rel` of `dir` in private memory, its bytes the signed manifest's.
fn read_hashed(
    digests: &DeferredDigests,
    dir: &Path,
    rel: &str,
) -> Result<BinaryImage, Box<dyn std::error::Error + Send + Sync>> {
    let (file, mut check) = digests.open(rel)?;
    // Shorter or longer than signed while read: a changed file, refused as such.
    let image = BinaryImage::read(file, check.size(), &dir.join(rel), |chunk| {
        check.update(chunk)
    })?;
    check.finish()?;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::os::unix::fs::FileExt;
    use std::path::PathBuf;
    use vla_qnn::Context;

    /// The fixture bundle `name` copied into `bundle` under a fresh directory named for
    /// `tag` and this process; returns that directory and the copy.
    fn fixture_copy(name: &str, tag: &str) -> (PathBuf, PathBuf) {
        let tmp = std::env::temp_dir().join(format!("vlad-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let b = tmp.join("bundle");
        vla_test_support::copy_dir(
            &vla_test_support::repo_root()
                .join("golden/bundles")
                .join(name),
            &b,
        );
        (tmp, b)
    }

    /// `dir` packed and signed with a new key written to `key`; returns its public key.
    fn signed(dir: &Path, key: &Path) -> vla_ota::PublicKey {
        vla_ota::pack_until(dir, u64::MAX / 2).unwrap();
        let public = vla_ota::keygen(key).unwrap();
        vla_ota::sign(dir, key).unwrap();
        public
    }

    /// The device the fixtures are built for (QCS9075, v73) at this runtime's version.
    fn device_target() -> vla_ota::DeviceTarget {
        vla_ota::DeviceTarget {
            soc_model: 77,
            htp_arch: 73,
            runtime_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// The QNN backend from `lib_dir`, loaded as the daemon loads it.
    fn qnn_backend(lib_dir: PathBuf) -> (Arc<QnnLibrary>, vla_qnn::Backend) {
        let common = crate::cli::Common {
            lib_dir: Some(lib_dir),
            log_level: None,
        };
        crate::qnn_setup::load_backend(&common).expect("QNN backend")
    }

    /// A writer of the store's files (the vla user owns them) changes a context binary in
    /// place after its bytes were taken and hashed, before QNN creates the context.
    #[test]
    fn the_bytes_hashed_are_the_bytes_qnn_gets_whatever_the_file_becomes() {
        let Some(lib_dir) = vla_test_support::qnn_lib_dir() else {
            return;
        };
        let (tmp, b) = fixture_copy("fastwam", "hashed-bin");
        let public = signed(&b, &tmp.join("signing.key"));
        let target = device_target();
        let rel = "ctx/action_step_socid77_archv73.bin";
        let defer = BTreeSet::from([rel.to_owned()]);
        let (_, digests) = vla_ota::verify_deferring(&b, &[public], 1, &target, &defer).unwrap();
        let (lib, backend) = qnn_backend(lib_dir);
        let signed = std::fs::read(b.join(rel)).unwrap();
        let binaries = HashedBinaries {
            digests,
            planned: Vec::new(),
        };

        // The load plans with this (nothing taken yet), and takes the bytes at creation.
        let planned = binaries.open(&lib, &b, "action_step", rel).unwrap();
        assert!(planned.bytes().is_none(), "no bytes held while planning");
        // How the binary reached QNN before: a mapping of the file.
        let mapped = ContextBinary::open(&lib, b.join(rel)).unwrap();
        let flip = {
            let (path, signed) = (b.join(rel), signed.clone());
            move || {
                let middle = signed.len() / 2;
                let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                file.write_at(&[signed[middle] ^ 0x01], middle as u64)
                    .unwrap();
            }
        };
        // The bytes taken and hashed as the load takes them; the file written in place
        // after that and before QNN creates the context.
        let (digests, dir, kept) = (binaries.digests.clone(), b.clone(), signed.clone());
        let hashed = ContextBinary::open(&lib, b.join(rel))
            .unwrap()
            .with_bytes_at_creation(Box::new(move || {
                let image = read_hashed(&digests, &dir, rel)?;
                flip();
                assert_eq!(image.bytes(), &kept[..], "the hashed bytes are kept");
                Ok(image)
            }));
        let context = Context::create(&backend, hashed).expect("context from the hashed bytes");
        assert_ne!(
            mapped.bytes().unwrap(),
            &signed[..],
            "a mapping of the file shows the write: QNN would get bytes nobody hashed"
        );
        drop(mapped);
        let mut graph = context.graph(None).expect("graph");
        let mut io = graph.allocate_io();
        graph.execute_io(&mut io).expect("execute");

        // Planned before the file changed, loaded after: refused before QNN sees any of it.
        let error = Context::create(&backend, planned).err().expect("refused");
        let refused = PolicyError::of_qnn("action_step".into(), error);
        // And so is the changed file loaded again.
        let again = Bundle::open(&b)
            .unwrap()
            .with_binaries(Arc::new(binaries))
            .load_component(&backend, "action_step")
            .err()
            .expect("refused");
        for refused in [refused, again] {
            assert!(
                matches!(refused, PolicyError::Unverified { .. }),
                "{refused}"
            );
            let line = refused.to_string();
            assert!(
                line.contains("SHA-256") && line.contains(rel) && !line.contains('\n'),
                "{line}"
            );
        }
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// The signed fixture bundle `name` in a fresh directory, with the binaries' digests
    /// deferred to their reads, and the QNN backend.
    fn signed_bundle(
        name: &str,
        tag: &str,
    ) -> Option<(
        std::path::PathBuf,
        Bundle,
        DeferredDigests,
        std::sync::Arc<QnnLibrary>,
        vla_qnn::Backend,
    )> {
        let lib_dir = vla_test_support::qnn_lib_dir()?;
        let (tmp, b) = fixture_copy(name, tag);
        let public = signed(&b, &tmp.join("signing.key"));
        let target = device_target();
        let bundle = Bundle::open(&b).unwrap();
        // What a load under OTA defers: every file it reads.
        let mut deferred = bundle.binary_paths();
        deferred.extend(bundle.data_paths());
        let (_, digests) = vla_ota::verify_deferring(&b, &[public], 1, &target, &deferred).unwrap();
        let (lib, backend) = qnn_backend(lib_dir);
        Some((tmp, bundle, digests, lib, backend))
    }

    /// A bundle's binaries loaded together (MolmoAct2's: one spill-fill group of every
    /// binary) are each read, hashed and handed to QNN one after the other: at most one
    /// binary's private image is alive at a time, and none once the contexts exist.
    #[test]
    fn a_group_load_holds_one_binary_in_private_memory_at_a_time() {
        let Some((tmp, bundle, digests, _lib, backend)) =
            signed_bundle("molmoact2-original", "one-image")
        else {
            return;
        };
        let sizes: Vec<u64> = bundle
            .binary_paths()
            .iter()
            .map(|r| std::fs::metadata(bundle.path(r)).unwrap().len())
            .collect();
        assert!(sizes.len() > 1, "a group of binaries");
        let largest = *sizes.iter().max().unwrap();
        let bundle = bundle.with_binaries(Arc::new(HashedBinaries {
            digests,
            planned: Vec::new(),
        }));
        let names: Vec<&str> = bundle
            .manifest
            .components
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            BinaryImage::census().live,
            0,
            "a fresh thread holds no image"
        );
        BinaryImage::reset_census_peak();
        let graphs = bundle
            .load_components(&backend, &names)
            .expect("the group loads");
        assert_eq!(graphs.len(), names.len());
        let census = BinaryImage::census();
        assert_eq!(census.live, 0, "every image freed once its context exists");
        assert_eq!(
            (census.peak, census.peak_bytes),
            (1, largest),
            "one binary in private memory at a time ({} binaries, {} bytes in all)",
            sizes.len(),
            sizes.iter().sum::<u64>()
        );
        drop(graphs);
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// Byte `at` of `rel` in `dir` flipped in place (same inode, same size), as a writer
    /// of the store's files could; returns the signed bytes.
    fn flip(dir: &Path, rel: &str, at: usize) -> Vec<u8> {
        let signed = std::fs::read(dir.join(rel)).unwrap();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(rel))
            .unwrap();
        file.write_at(&[signed[at] ^ 0x01], at as u64).unwrap();
        signed
    }

    /// The signed bytes written back in place.
    fn restore(dir: &Path, rel: &str, signed: &[u8]) {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(rel))
            .unwrap();
        file.write_all_at(signed, 0).unwrap();
    }

    /// The error names SHA-256 and the file, on one line, and is a refusal of the
    /// bundle's verification (which the daemon holds on instead of retrying).
    fn assert_refused(error: PolicyError, rel: &str) {
        let line = error.to_string();
        assert!(
            matches!(error, PolicyError::UnverifiedFile { .. }),
            "{rel}: {line}"
        );
        assert!(
            line.contains("SHA-256") && line.contains(rel) && !line.contains('\n'),
            "{line}"
        );
    }

    /// The daemon's file opener, counting what it opens.
    #[derive(Debug)]
    struct Counting {
        inner: HashedFiles,
        opened: std::sync::Mutex<Vec<String>>,
    }

    impl OpenFile for Counting {
        fn open(
            &self,
            dir: &Path,
            what: &str,
            rel: &str,
        ) -> Result<Box<dyn CheckedRead + Send>, PolicyError> {
            self.opened.lock().unwrap().push(rel.to_owned());
            self.inner.open(dir, what, rel)
        }
    }

    /// `bundle` with the daemon's openers, the file opener counting what it opens.
    fn counted(bundle: Bundle, digests: DeferredDigests) -> (Bundle, Arc<Counting>) {
        let files = Arc::new(Counting {
            inner: HashedFiles {
                digests: digests.clone(),
            },
            opened: Default::default(),
        });
        let bundle = bundle
            .with_binaries(Arc::new(HashedBinaries {
                digests,
                planned: Vec::new(),
            }))
            .with_files(files.clone());
        (bundle, files)
    }

    fn opened(files: &Counting) -> Vec<String> {
        let mut opened = std::mem::take(&mut *files.opened.lock().unwrap());
        opened.sort();
        opened
    }

    /// Under OTA a policy's load reads its prompt tables and text files (tokenizer, its
    /// config, the embedding table) once, through the daemon's hashing opener, none by
    /// path: prompt tables changed after the bundle was verified are refused in one line,
    /// naming SHA-256 and the file, and nothing parsed from the changed bytes runs.
    #[test]
    fn prompt_tables_changed_after_verification_are_refused_in_one_line() {
        let Some((tmp, bundle, digests, _lib, backend)) =
            signed_bundle("molmoact2-upstream-original", "prompt-files")
        else {
            return;
        };
        let b = bundle.dir.clone();
        let (bundle, files) = counted(bundle, digests);
        let m = bundle.manifest.molmoact2().cloned().unwrap();
        let text = m.text.clone().expect("a text block");
        drop(vla_policy::Policy::load(&bundle, &backend).expect("signed bytes load"));
        let mut every = vec![
            m.prompt.clone(),
            text.tokenizer,
            text.tokenizer_config.expect("a tokenizer config"),
            text.embedding,
        ];
        every.sort();
        assert_eq!(opened(&files), every, "each read once, through the opener");

        let size = std::fs::metadata(b.join(&m.prompt)).unwrap().len() as usize;
        flip(&b, &m.prompt, size / 2);
        let error = vla_policy::Policy::load(&bundle, &backend)
            .err()
            .expect("changed prompt tables: loaded");
        assert_refused(error, &m.prompt);
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// Under OTA a load and its parity gate read every file they use once, through the
    /// daemon's hashing opener: a context's golden or the end-to-end golden changed after
    /// the bundle was verified is refused in one line, naming SHA-256 and the file.
    #[test]
    fn a_golden_changed_after_verification_is_refused_in_one_line() {
        let Some((tmp, bundle, digests, _lib, backend)) =
            signed_bundle("fastwam-closed-loop", "golden-files")
        else {
            return;
        };
        let b = bundle.dir.clone();
        let (bundle, files) = counted(bundle, digests);
        let mut policy = vla_policy::Policy::load(&bundle, &backend).expect("signed bytes load");
        let report = bundle.parity(&mut policy).expect("signed goldens");
        assert!(report.failure_summary().is_none(), "the gate passes");
        let every: Vec<String> = bundle.data_paths().into_iter().collect();
        assert_eq!(opened(&files), every, "each read once, through the opener");

        let golden = bundle
            .manifest
            .components
            .values()
            .next()
            .unwrap()
            .golden
            .clone();
        for rel in [&golden, &bundle.manifest.end_to_end] {
            let size = std::fs::metadata(b.join(rel)).unwrap().len() as usize;
            let signed = flip(&b, rel, size / 2);
            let error = bundle
                .parity(&mut policy)
                .expect_err("changed golden: gated");
            assert_refused(error, rel);
            restore(&b, rel, &signed);
        }
        drop(policy);
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// The DSP memory plan reads the binaries' metadata before the load does: a binary
    /// replaced for that read (another valid binary, the signed one back for the load)
    /// would place the contexts by sizes nobody signed. The load's description must
    /// state the plan's footprint, else the binary is refused before any context exists.
    #[test]
    fn a_binary_that_differs_from_the_dsp_plans_read_is_refused() {
        let Some((tmp, bundle, digests, lib, _backend)) =
            signed_bundle("fastwam-closed-loop", "dsp-plan")
        else {
            return;
        };
        let b = bundle.dir.clone();
        let mut names = bundle.manifest.components.iter();
        let ((first, one), (_, other)) = (names.next().unwrap(), names.next().unwrap());
        let footprint =
            |rel: &str| Footprint::of(first, &ContextBinary::open(&lib, b.join(rel)).unwrap());
        let (signed, replaced) = (footprint(&one.binary), footprint(&other.binary));
        assert_ne!(signed, replaced, "two binaries of different footprints");
        let agreeing = HashedBinaries {
            digests: digests.clone(),
            planned: vec![signed],
        };
        assert!(agreeing.open(&lib, &b, first, &one.binary).is_ok());
        let misled = HashedBinaries {
            digests,
            planned: vec![replaced],
        };
        let error = misled
            .open(&lib, &b, first, &one.binary)
            .expect_err("refused");
        let line = error.to_string();
        assert!(matches!(error, PolicyError::Unverified { .. }), "{line}");
        assert!(
            line.contains("DSP memory plan") && line.contains(&one.binary) && !line.contains('\n'),
            "{line}"
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// An instruction pack for the fastwam-closed-loop fixture, signed, in `dir`: two
    /// instructions, rows `[2, 8, 24]` f32; returns its rows and digests (every file
    /// deferred, as the daemon's pack scan defers them).
    fn signed_pack(dir: &Path) -> (Vec<f32>, DeferredDigests) {
        let flag = vla_policy::PACK_INSTRUCTION_FLAG;
        let rows: Vec<f32> = (0..2 * 8 * 24)
            .map(|i| (i % 17) as f32 / 16.0 - 0.5)
            .collect();
        vla_test_support::InstructionPack {
            label: "extra",
            name: "fastwam-closed-loop-tiny",
            version: "0.1.0",
            min_runtime_version: "0.1.0",
            shape: [8, 24],
            instructions: &[
                (flag | 1, "open the drawer"),
                (flag | 2, "close the drawer"),
            ],
            rows: &rows,
        }
        .write(dir);
        let public = signed(dir, &dir.with_extension("key"));
        let target = device_target();
        let defer = BTreeSet::from(["pack.json".to_owned(), "rows.npy".to_owned()]);
        let (_, digests) = vla_ota::verify_deferring(dir, &[public], 1, &target, &defer).unwrap();
        (rows, digests)
    }

    /// An instruction pack's rows changed after the pack was verified are refused in one
    /// line (nothing attached); attached from the signed bytes, the rows the policy runs
    /// are those bytes whatever the file becomes (a private copy, not a mapping).
    #[test]
    fn a_pack_changed_after_verification_is_not_attached_and_an_attached_one_keeps_its_bytes() {
        let Some((tmp, bundle, digests, _lib, backend)) =
            signed_bundle("fastwam-closed-loop", "pack")
        else {
            return;
        };
        let bundle = hashed(bundle, digests, Vec::new());
        let mut policy = vla_policy::Policy::load(&bundle, &backend).expect("signed bytes load");
        let dir = tmp.join("pack");
        let (rows, digests) = signed_pack(&dir);
        let files = HashedFiles { digests };
        let size = std::fs::metadata(dir.join("rows.npy")).unwrap().len() as usize;
        let signed = flip(&dir, "rows.npy", size - 1);
        let error = policy
            .attach_pack(&dir, Some(&files))
            .expect_err("changed rows");
        assert_refused(error, "rows.npy");
        assert!(!policy.has_pack_instruction(vla_policy::PACK_INSTRUCTION_FLAG | 1));
        restore(&dir, "rows.npy", &signed);
        assert_eq!(
            policy.attach_pack(&dir, Some(&files)).expect("signed pack"),
            ("extra".to_owned(), 2)
        );
        flip(&dir, "rows.npy", size - 1);
        let mut out = vec![0f32; 8 * 24];
        let packs = match &policy {
            vla_policy::Policy::FastWam(p) => p.packs().expect("a chain bundle"),
            _ => unreachable!("a Fast-WAM bundle"),
        };
        assert!(packs.write_rows(vla_policy::PACK_INSTRUCTION_FLAG | 2, &mut out));
        assert_eq!(
            out,
            rows[8 * 24..],
            "the rows hashed, not the file's new last byte"
        );
        drop(policy);
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// The embedding table of a verified bundle is the bytes hashed, in private memory:
    /// a write to the file afterwards shows in a mapping of it (how the table was read
    /// before) and not in the table the policy renders from.
    #[test]
    fn the_embedding_table_is_the_bytes_hashed_whatever_the_file_becomes() {
        let Some((tmp, bundle, digests, _lib, _backend)) =
            signed_bundle("molmoact2-upstream-original", "table")
        else {
            return;
        };
        let b = bundle.dir.clone();
        let bundle = hashed(bundle, digests, Vec::new());
        let rel = bundle
            .manifest
            .molmoact2()
            .unwrap()
            .text
            .as_ref()
            .unwrap()
            .embedding
            .clone();
        let table = bundle
            .table("embedding table", &rel)
            .expect("verified table");
        assert!(!table.is_mapped(), "a private copy");
        let mapped = vla_npz::MappedNpy::open(b.join(&rel)).unwrap();
        assert!(mapped.is_mapped());
        let size = std::fs::metadata(b.join(&rel)).unwrap().len() as usize;
        let signed = flip(&b, &rel, size - 1);
        let data = &signed[size - table.data().len()..];
        assert_eq!(table.data(), data, "the table keeps the hashed bytes");
        assert_ne!(mapped.data(), data, "a mapping shows the write");
        let error = bundle
            .table("embedding table", &rel)
            .err()
            .expect("refused");
        assert_refused(error, &rel);
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
        let (tmp, b) = fixture_copy(&name, "verify-cost");
        let pad: Vec<u8> = (0..pad_mib << 20)
            .map(|i| ((i * 2654435761usize) >> 13) as u8)
            .collect();
        std::fs::write(b.join("pad.bin"), &pad).unwrap();
        drop(pad);
        let public = signed(&b, &tmp.join("signing.key"));
        let target = device_target();
        let bundle = Bundle::open(&b).unwrap();
        let mut rels: Vec<String> = bundle.binary_paths().into_iter().collect();
        let binary_bytes: u64 = rels
            .iter()
            .map(|r| std::fs::metadata(b.join(r)).unwrap().len())
            .sum();
        rels.push("pad.bin".into());
        let defer: BTreeSet<String> = rels.iter().cloned().collect();
        let (lib, _backend) = qnn_backend(lib_dir);
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
            for rel in &rels {
                // The load's planning read by path (the stand-in is no context binary),
                // then the bytes taken at creation, their metadata read again.
                if rel != "pad.bin" {
                    let planned = ContextBinary::open(&lib, b.join(rel)).unwrap();
                    std::hint::black_box(planned.info().graphs.len());
                }
                let image = read_hashed(&digests, &b, rel).unwrap();
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
             verify the rest, plan from a mapping, hash each binary as it is read into private memory: {:.1} ms ({:.1}-{:.1})\n  \
             of which reading the stand-in into private memory, unhashed: {:.1} ms ({:.1}-{:.1})",
            rels.len() - 1,
            old[2], old[0], old[4], new[2], new[0], new[4], copy[2], copy[0], copy[4]
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// What hashing the embedding table over the bytes used costs: before, the table
    /// hashed by path at verification and then mapped (every page read once); now, read
    /// once into private memory through the hashing opener. A stand-in table of
    /// `VLA_BENCH_TABLE_MIB` (default 256) MiB of u16 rows 2560 wide. Prints figures.
    #[test]
    #[ignore = "benchmark: prints figures (cargo test -p vlad --bin vlad embedding_table_cost -- --ignored --nocapture)"]
    fn embedding_table_cost() {
        use std::time::Instant;
        let mib: usize = std::env::var("VLA_BENCH_TABLE_MIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256);
        let (tmp, b) = fixture_copy("fastwam", "table-cost");
        let rows = (mib << 20) / (2560 * 2);
        let values: Vec<u16> = (0..rows * 2560).map(|i| (i * 40503) as u16).collect();
        let array = vla_npz::Array::from_slice("wte", &[rows, 2560], &values).unwrap();
        drop(values);
        std::fs::write(b.join("table.npy"), vla_npz::write_npy(&array)).unwrap();
        drop(array);
        let public = signed(&b, &tmp.join("signing.key"));
        let target = device_target();
        let defer = BTreeSet::from(["table.npy".to_owned()]);
        let touch = |bytes: &[u8]| bytes.iter().step_by(4096).fold(0u8, |a, &x| a ^ x);
        let before = || {
            let t = Instant::now();
            vla_ota::verify(&b, &[public], &target).unwrap();
            let table = vla_npz::MappedNpy::open(b.join("table.npy")).unwrap();
            std::hint::black_box(touch(table.data()));
            t.elapsed().as_secs_f64() * 1e3
        };
        let after = || {
            let t = Instant::now();
            let (_, digests) =
                vla_ota::verify_deferring(&b, &[public], 1, &target, &defer).unwrap();
            let bundle = Bundle::open(&b)
                .unwrap()
                .with_files(Arc::new(HashedFiles { digests }));
            let table = bundle.table("embedding table", "table.npy").unwrap();
            std::hint::black_box(touch(table.data()));
            t.elapsed().as_secs_f64() * 1e3
        };
        before();
        after();
        let (mut old, mut new) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            old.push(before());
            new.push(after());
        }
        old.sort_by(f64::total_cmp);
        new.sort_by(f64::total_cmp);
        println!(
            "a {mib} MiB table, median of 5 (min-max), page cache warm:\n  \
             verify all by path, then map it and read every page: {:.1} ms ({:.1}-{:.1})\n  \
             verify the rest, read it once into private memory, hashed: {:.1} ms ({:.1}-{:.1})",
            old[2], old[0], old[4], new[2], new[0], new[4]
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
