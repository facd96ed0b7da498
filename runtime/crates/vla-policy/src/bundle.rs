//! Opening a bundle directory: manifest, files, contexts, and the contract checks that
//! tie each context's tensors to the manifest.
//!
//! Everything is checked before the first inference: a missing file, a manifest rule, a
//! binary built for another SoC, or a tensor whose name, shape or type differs from what
//! the manifest implies is an error naming the component and the tensor.

use crate::error::PolicyError;
use crate::manifest::{Manifest, PolicySettings, RawManifest};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vla_qnn::{create_contexts, Backend, ContextBinary, Graph, TensorInfo};
use vla_tensor::ElementType;

/// The SoC and HTP architecture this runtime is built for (QCS9075, Hexagon v73).
pub const DEVICE_SOC_MODEL: u32 = 77;
/// The Hexagon HTP architecture this runtime is built for (v73).
pub const DEVICE_HTP_ARCH: u32 = 73;

/// A bundle directory with its parsed, validated manifest.
///
/// The manifest file stays open while any clone of the `Bundle` lives: context binaries
/// are unmapped once their contexts exist, so the open file is what shows other
/// processes (`/proc/<pid>/fd`; e.g. a store's garbage collection) that the bundle is in
/// use. Keep the `Bundle` as long as its policy runs.
#[derive(Clone, Debug)]
pub struct Bundle {
    /// The bundle directory; manifest paths are relative to it.
    pub dir: PathBuf,
    /// The parsed and validated `bundle.json`.
    pub manifest: Manifest,
    /// The `bundle.json` bytes `manifest` was parsed from.
    manifest_bytes: Arc<[u8]>,
    /// How the context binaries are opened; `None`: mapped by path.
    binaries: Option<Arc<dyn OpenBinary>>,
    /// How the other files are read; `None`: by path.
    files: Option<Arc<dyn OpenFile>>,
    _in_use: Arc<File>,
}

/// Opens the context binaries of a bundle for a caller that checks their bytes (the
/// daemon, against a signed manifest's digests): the [`ContextBinary`] returned holds
/// the bytes QNN will get.
pub trait OpenBinary: Send + Sync + core::fmt::Debug {
    /// The binary of `component`, at `rel` in bundle directory `dir`.
    fn open(
        &self,
        lib: &vla_qnn::QnnLibrary,
        dir: &Path,
        component: &str,
        rel: &str,
    ) -> Result<ContextBinary, PolicyError>;
}

/// One file of a bundle opened by a caller that checks its bytes as they are read (the
/// daemon: hashes what it hands out): a reader of the file's [`CheckedRead::size`] bytes,
/// and [`CheckedRead::finish`] after the last one, before anything parsed from them is
/// used.
pub trait CheckedRead: std::io::Read {
    /// The number of bytes the checker expects.
    fn size(&self) -> u64;
    /// Whether the bytes read (every one, in order) are the ones the checker expects.
    fn finish(self: Box<Self>) -> Result<(), PolicyError>;
}

/// Opens the bundle's files other than context binaries (goldens, tables, tokenizer
/// files, the embedding table) for a caller that checks their bytes: each is read once
/// through it and parsed from those bytes, never read again by path.
pub trait OpenFile: Send + Sync + core::fmt::Debug {
    /// File `rel` of bundle directory `dir`; `what` says what it is for (errors).
    fn open(
        &self,
        dir: &Path,
        what: &str,
        rel: &str,
    ) -> Result<Box<dyn CheckedRead + Send>, PolicyError>;
}

impl Bundle {
    /// Reads `bundle.json`, validates it and checks that every file it names exists.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, PolicyError> {
        let dir = dir.as_ref().to_owned();
        let path = dir.join("bundle.json");
        let missing = |e: std::io::Error| PolicyError::MissingFile {
            bundle: dir.clone(),
            what: "manifest".into(),
            path: path.clone(),
            reason: e.to_string(),
        };
        let mut file = File::open(&path).map_err(missing)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(missing)?;
        let manifest = RawManifest::from_json(&bytes).map_err(|e| PolicyError::ManifestSyntax {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let manifest = manifest
            .validate()
            .map_err(|invalid| PolicyError::ManifestInvalid {
                path: path.clone(),
                invalid,
            })?;
        for (field, expected, found) in [
            ("soc_model", DEVICE_SOC_MODEL, manifest.soc_model),
            ("htp_arch", DEVICE_HTP_ARCH, manifest.htp_arch),
        ] {
            if expected != found {
                return Err(PolicyError::Target {
                    bundle: dir.clone(),
                    field,
                    expected,
                    found,
                });
            }
        }
        let bundle = Self {
            dir,
            manifest,
            manifest_bytes: bytes.into(),
            binaries: None,
            files: None,
            _in_use: Arc::new(file),
        };
        for name in bundle.manifest.required_components() {
            let c = &bundle.manifest.components[&name];
            bundle.require_file(&format!("context `{name}`"), &c.binary)?;
            bundle.require_file(&format!("golden of `{name}`"), &c.golden)?;
        }
        bundle.require_file("end-to-end golden", &bundle.manifest.end_to_end)?;
        match &bundle.manifest.policy {
            PolicySettings::Molmoact2(m) => bundle.require_file("prompt tables", &m.prompt)?,
            PolicySettings::Fastwam(f) => {
                if let Some(w) = &f.world_model {
                    bundle.require_file("world-model inputs", w)?;
                }
                if let Some(c) = &f.chain {
                    bundle.require_file("context tables", &c.tables)?;
                }
            }
        }
        Ok(bundle)
    }

    /// The exact `bundle.json` bytes [`Bundle::manifest`] was parsed from.
    pub fn manifest_bytes(&self) -> &[u8] {
        &self.manifest_bytes
    }

    /// The bundle with its context binaries opened by `binaries` instead of mapped by
    /// path.
    pub fn with_binaries(mut self, binaries: Arc<dyn OpenBinary>) -> Self {
        self.binaries = Some(binaries);
        self
    }

    /// The bundle with its other files read through `files` instead of by path.
    pub fn with_files(mut self, files: Arc<dyn OpenFile>) -> Self {
        self.files = Some(files);
        self
    }

    /// Every file other than `bundle.json` and the context binaries that loading and
    /// gating the bundle reads, relative to the bundle.
    pub fn data_paths(&self) -> std::collections::BTreeSet<String> {
        let m = &self.manifest;
        // The goldens of the components a policy loads (its gate runs those).
        let mut paths: std::collections::BTreeSet<String> = m
            .required_components()
            .iter()
            .filter_map(|name| m.components.get(name))
            .map(|c| c.golden.clone())
            .collect();
        paths.insert(m.end_to_end.clone());
        if let Some(a) = m.molmoact2() {
            paths.insert(a.prompt.clone());
            if let Some(t) = &a.text {
                paths.insert(t.tokenizer.clone());
                paths.extend(t.tokenizer_config.clone());
                paths.insert(t.embedding.clone());
            }
        }
        if let Some(f) = m.fastwam() {
            paths.extend(f.world_model.clone());
            if let Some(c) = &f.chain {
                paths.insert(c.tables.clone());
            }
        }
        paths
    }

    /// The bytes of file `rel` (`what`: what it is for), read once: through the checker
    /// given to [`Bundle::with_files`] (refused if it refuses them), else by path.
    pub fn read(&self, what: &str, rel: &str) -> Result<Vec<u8>, PolicyError> {
        let unreadable = |e: std::io::Error| PolicyError::MissingFile {
            bundle: self.dir.clone(),
            what: what.into(),
            path: self.path(rel),
            reason: e.to_string(),
        };
        match &self.files {
            None => std::fs::read(self.path(rel)).map_err(unreadable),
            Some(files) => read_checked(files.as_ref(), &self.dir, what, rel),
        }
    }

    /// The npz at `rel`, parsed from the bytes [`Bundle::read`] gives.
    pub fn npz(&self, what: &str, rel: &str) -> Result<vla_npz::Npz, PolicyError> {
        let bytes = self.read(what, rel)?;
        vla_npz::Npz::from_bytes(bytes, &self.path(rel).display().to_string())
            .map_err(PolicyError::Npz)
    }

    /// The `.npy` table at `rel` (`what`: what it is for): mapped by path, or, with a
    /// checker ([`Bundle::with_files`]), read once through it into private memory (the
    /// table's size in anonymous memory for as long as the table lives).
    pub fn table(&self, what: &str, rel: &str) -> Result<vla_npz::MappedNpy, PolicyError> {
        match &self.files {
            None => vla_npz::MappedNpy::open(self.path(rel)).map_err(PolicyError::Npz),
            Some(files) => table_checked(files.as_ref(), &self.dir, what, rel),
        }
    }

    /// The context binaries of the components a policy loads, relative to the bundle.
    pub fn binary_paths(&self) -> std::collections::BTreeSet<String> {
        let m = &self.manifest;
        m.required_components()
            .iter()
            .filter_map(|name| m.components.get(name))
            .map(|c| c.binary.clone())
            .collect()
    }

    /// `rel` inside the bundle.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    fn require_file(&self, what: &str, rel: &str) -> Result<(), PolicyError> {
        let path = self.path(rel);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err(PolicyError::MissingFile {
                bundle: self.dir.clone(),
                what: what.into(),
                path,
                reason: "not a regular file".into(),
            }),
            Err(e) => Err(PolicyError::MissingFile {
                bundle: self.dir.clone(),
                what: what.into(),
                path,
                reason: e.to_string(),
            }),
        }
    }

    /// Maps, checks and makes resident the context of `component`.
    pub fn load_component(
        &self,
        backend: &Backend,
        component: &str,
    ) -> Result<LoadedGraph, PolicyError> {
        let mut graphs = self.load_components(backend, &[component])?;
        Ok(graphs.remove(0))
    }

    /// Maps and checks the binaries of `components`, then makes them resident together:
    /// as one spill-fill group when the binaries report a spill-fill size (the backend
    /// refusing it is logged by vla-qnn, not fatal). Graphs in the order given.
    pub fn load_components(
        &self,
        backend: &Backend,
        components: &[&str],
    ) -> Result<Vec<LoadedGraph>, PolicyError> {
        let qnn = |component: &str| {
            let component = component.to_owned();
            move |error| PolicyError::of_qnn(component, error)
        };
        let mut binaries = Vec::with_capacity(components.len());
        for &component in components {
            let c = &self.manifest.components[component];
            let binary = match &self.binaries {
                Some(open) => open.open(backend.library(), &self.dir, component, &c.binary)?,
                None => ContextBinary::open(backend.library(), self.path(&c.binary))
                    .map_err(qnn(component))?,
            };
            if let Some(soc) = binary.info().soc_model {
                if soc != self.manifest.soc_model {
                    return Err(PolicyError::Target {
                        bundle: self.dir.clone(),
                        field: "soc_model (context binary)",
                        expected: self.manifest.soc_model,
                        found: soc,
                    });
                }
            }
            binaries.push(binary);
        }
        // vla-qnn logs a shared buffer or a refusal; the outcome changes nothing here.
        let group = create_contexts(backend, binaries)
            .map_err(|(i, error)| PolicyError::of_qnn(components[i].into(), error))?;
        components
            .iter()
            .zip(group.contexts)
            .map(|(&component, context)| {
                let c = &self.manifest.components[component];
                let mut graph = context.graph(c.graph.as_deref()).map_err(qnn(component))?;
                graph.set_label(component);
                Ok(LoadedGraph {
                    component: component.into(),
                    golden: self.path(&c.golden),
                    graph,
                })
            })
            .collect()
    }
}

/// The bytes of file `rel` of `dir` (`what`: what it is for), read once through `files`
/// and refused unless its checker accepts them.
pub(crate) fn read_checked(
    files: &dyn OpenFile,
    dir: &Path,
    what: &str,
    rel: &str,
) -> Result<Vec<u8>, PolicyError> {
    let mut file = files.open(dir, what, rel)?;
    let size = file.size();
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // One byte past the expected size, so a longer file is the checker's to refuse.
    (&mut file)
        .take(size.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| PolicyError::MissingFile {
            bundle: dir.to_owned(),
            what: what.into(),
            path: dir.join(rel),
            reason: e.to_string(),
        })?;
    file.finish()?;
    Ok(bytes)
}

/// The `.npy` table `rel` of `dir` read once through `files` into private memory, refused
/// unless its checker accepts the bytes.
pub(crate) fn table_checked(
    files: &dyn OpenFile,
    dir: &Path,
    what: &str,
    rel: &str,
) -> Result<vla_npz::MappedNpy, PolicyError> {
    let mut file = files.open(dir, what, rel)?;
    let size = file.size();
    let read = vla_npz::MappedNpy::read(&mut file, size, &dir.join(rel).display().to_string());
    // The checker's verdict first: a changed file is refused as such, whatever it parses to.
    file.finish()?;
    read.map_err(PolicyError::Npz)
}

/// A resident graph with the component it serves and its golden file.
pub struct LoadedGraph {
    /// The manifest's component name (`vision`, `action_step`, ...).
    pub component: String,
    /// Absolute path of the component's golden I/O npz.
    pub golden: PathBuf,
    /// The resident graph.
    pub graph: Graph,
}

fn dims_text(d: &[usize]) -> String {
    format!("{d:?}").replace(' ', "")
}

fn find<'g>(
    list: &'g [TensorInfo],
    component: &str,
    tensor: &str,
    direction: &str,
) -> Result<(usize, &'g TensorInfo), PolicyError> {
    list.iter()
        .enumerate()
        .find(|(_, t)| t.name == tensor)
        .ok_or_else(|| PolicyError::Contract {
            component: component.into(),
            tensor: tensor.into(),
            expected: format!("an {direction} of that name"),
            found: format!(
                "{direction}s {}",
                list.iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
}

fn check(
    t: &TensorInfo,
    component: &str,
    expected: Option<&[usize]>,
) -> Result<Vec<usize>, PolicyError> {
    let shape = t.shape();
    if let Some(e) = expected {
        if shape != e {
            return Err(PolicyError::Contract {
                component: component.into(),
                tensor: t.name.clone(),
                expected: format!("shape {} (from bundle.json)", dims_text(e)),
                found: format!("shape {}", dims_text(&shape)),
            });
        }
    }
    if t.element != Some(ElementType::F32) {
        return Err(PolicyError::Contract {
            component: component.into(),
            tensor: t.name.clone(),
            expected: "f32 (the host glue exchanges f32 with every context)".into(),
            found: t.element.map_or_else(
                || vla_qnn::data_type_name(t.data_type).to_string(),
                |e| e.to_string(),
            ),
        });
    }
    Ok(shape)
}

impl LoadedGraph {
    /// Index of input `tensor`, checked to be f32 of shape `expected` (any shape if None).
    pub fn input(
        &self,
        tensor: &str,
        expected: Option<&[usize]>,
    ) -> Result<(usize, Vec<usize>), PolicyError> {
        let (i, t) = find(self.graph.inputs(), &self.component, tensor, "input")?;
        Ok((i, check(t, &self.component, expected)?))
    }

    /// Index of output `tensor`, checked like [`LoadedGraph::input`].
    pub fn output(
        &self,
        tensor: &str,
        expected: Option<&[usize]>,
    ) -> Result<(usize, Vec<usize>), PolicyError> {
        let (i, t) = find(self.graph.outputs(), &self.component, tensor, "output")?;
        Ok((i, check(t, &self.component, expected)?))
    }

    /// The graph must have exactly `inputs` inputs and `outputs` outputs (no extras the
    /// glue would leave unbound).
    pub fn expect_counts(&self, inputs: usize, outputs: usize) -> Result<(), PolicyError> {
        for (dir, list, n) in [
            ("inputs", self.graph.inputs(), inputs),
            ("outputs", self.graph.outputs(), outputs),
        ] {
            if list.len() != n {
                return Err(PolicyError::Contract {
                    component: self.component.clone(),
                    tensor: format!("({dir})"),
                    expected: format!("{n} {dir}"),
                    found: format!(
                        "{} ({})",
                        list.len(),
                        list.iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_manifests(dir: &Path) -> usize {
        let target = dir.join("bundle.json");
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == target))
            .count()
    }

    #[test]
    fn an_open_bundle_holds_its_manifest_open_until_dropped() {
        let dir = std::fs::canonicalize(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../golden/bundles/fastwam"),
        )
        .unwrap();
        let before = open_manifests(&dir);
        let bundle = Bundle::open(&dir).unwrap();
        let clone = bundle.clone();
        assert_eq!(
            open_manifests(&dir),
            before + 1,
            "visible in /proc/<pid>/fd"
        );
        drop(bundle);
        assert_eq!(open_manifests(&dir), before + 1, "a clone keeps it");
        drop(clone);
        assert_eq!(open_manifests(&dir), before);
    }
}
