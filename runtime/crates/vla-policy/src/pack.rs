//! Fast-WAM instruction packs: the UMT5 context rows of instructions imported after the
//! bundle (Wan's text encoder is far too large for the device), with their texts, in a
//! signed file set beside the bundle (the OTA store verifies it; see vla-ota). This module
//! reads a verified pack's `pack.json`, maps its `rows.npy` (never copied onto the heap)
//! and answers which rows an instruction id or a text names.
//!
//! Ids: a pack instruction's id has [`PACK_INSTRUCTION_FLAG`] (bit 30) set and bit 31
//! ([`crate::TEXT_INSTRUCTION_FLAG`]) clear, so it never collides with the bundle's fixed ids
//! (0..n) nor with a text id of the instruction segment. The importer numbers them; two
//! packs of one bundle may not share an id or a text (the later one is refused whole).
//!
//! Hot attach: a pack installed while the policy runs is attached without a reload. A
//! [`PackAttacher`] (from [`crate::Policy::pack_attacher`], on a non-real-time thread)
//! checks it against the running bundle and maps its rows into a new [`AttachedPacks`]
//! (the attached packs' mappings shared, the new one's added); the inference thread swaps
//! it in with [`crate::Policy::install_packs`] (two `Arc`s exchanged: no allocation, no
//! file I/O) and hands back the set it replaced, to be dropped off its critical path.
//!
//! Texts: matched exactly after the whitespace normalization upstream's tokenizer applies
//! (`clean="whitespace"`: stripped, every run of Unicode white space one space), against
//! both the text the importer was given and the text its encoder saw (HTML entities
//! unescaped by the importer; the device does not unescape).

use crate::bundle::{read_checked, table_checked, OpenFile};
use crate::error::PolicyError;
use crate::manifest::FastWamChain;
use half::f16;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vla_npz::{DType, MappedNpy};

/// Set in a pack instruction's id (bit 30); bit 31 stays clear (that is a text id).
pub const PACK_INSTRUCTION_FLAG: u32 = 1 << 30;

/// The file naming a pack (vla-ota's identity file of a pack).
pub const PACK_FILE: &str = "pack.json";

/// `pack.json` as the importer writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PackFile {
    format: u32,
    kind: String,
    label: String,
    /// The bundle it goes with (also checked by the store's verification).
    name: String,
    version: String,
    policy: String,
    #[allow(dead_code)]
    soc_model: u32,
    #[allow(dead_code)]
    htp_arch: u32,
    #[allow(dead_code)]
    min_runtime_version: String,
    rows: String,
    text_tokens: usize,
    context_width: usize,
    instructions: Vec<PackEntry>,
}

/// One instruction of a pack; row i of `rows` is instruction i's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PackEntry {
    id: u32,
    /// The text as the importer was given it.
    text: String,
    /// The text the encoder saw (upstream's cleaning).
    normalized: String,
    /// Tokens of the rendered prompt (rows past it are zero); for diagnosis.
    #[allow(dead_code)]
    #[serde(default)]
    length: Option<usize>,
}

/// One attached pack.
struct Pack {
    /// The directory it was attached from.
    dir: PathBuf,
    label: String,
    rows: MappedNpy,
    f16: bool,
}

/// Every pack attached to a Fast-WAM policy, looked up by id or text. A clone shares the
/// packs' mappings.
#[derive(Clone, Default)]
pub struct InstructionPacks {
    packs: Vec<Arc<Pack>>,
    /// (id, pack, row), sorted by id.
    ids: Vec<(u32, usize, usize)>,
    /// (normalized text, id): both texts of each instruction.
    texts: Vec<(String, u32)>,
    /// `text_tokens * context_width`.
    row_len: usize,
}

/// Upstream's whitespace cleaning without the HTML step: Python's `strip()` (which also
/// strips U+001C..U+001F), every run of Unicode White_Space (the `regex` module's `\s`)
/// one space, stripped again.
pub fn normalize_pack_text(text: &str) -> String {
    let py_space = |c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c);
    let stripped = text.trim_matches(py_space);
    let collapsed = stripped
        .split(char::is_whitespace)
        .filter(|s| !s.is_empty());
    let mut out = String::with_capacity(stripped.len());
    for (i, word) in collapsed.enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word);
    }
    out.trim_matches(py_space).to_owned()
}

impl InstructionPacks {
    /// Packs attached.
    pub fn len(&self) -> usize {
        self.packs.len()
    }

    /// No pack attached.
    pub fn is_empty(&self) -> bool {
        self.packs.is_empty()
    }

    /// Instructions of every attached pack.
    pub fn instructions(&self) -> usize {
        self.ids.len()
    }

    /// Every pack instruction id, ascending.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().map(|e| e.0)
    }

    /// Whether `id` names a pack instruction. No allocation (a binary search).
    pub fn contains(&self, id: u32) -> bool {
        self.ids.binary_search_by_key(&id, |e| e.0).is_ok()
    }

    /// The id of the instruction whose text is `text` (normalized), if any.
    pub fn find_text(&self, text: &str) -> Option<u32> {
        let key = normalize_pack_text(text);
        self.texts.iter().find(|(t, _)| *t == key).map(|e| e.1)
    }

    /// Writes the rows of pack instruction `id` as f32 into `out` (`text_tokens *
    /// context_width`); false if no pack holds `id`. No allocation: fit for the inference
    /// thread (reads the mapped rows).
    pub fn write_rows(&self, id: u32, out: &mut [f32]) -> bool {
        let Ok(i) = self.ids.binary_search_by_key(&id, |e| e.0) else {
            return false;
        };
        let (_, p, row) = self.ids[i];
        let pack = &self.packs[p];
        let n = self.row_len;
        let data = pack.rows.data();
        if pack.f16 {
            let bytes = &data[row * n * 2..(row + 1) * n * 2];
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        } else {
            let bytes = &data[row * n * 4..(row + 1) * n * 4];
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        true
    }

    /// Attaches the pack in `dir` (verified by the caller's store) to a Fast-WAM chain
    /// bundle `name` `version`: its `pack.json` must name that bundle, its rows fit the
    /// chain's `[text_tokens, context_width]` (f32 or f16, finite), its ids carry
    /// [`PACK_INSTRUCTION_FLAG`] alone and neither ids nor texts repeat those attached.
    /// Returns the pack's label and instruction count; a refusal attaches nothing.
    pub fn attach(
        &mut self,
        dir: &Path,
        bundle: (&str, &str),
        chain: &FastWamChain,
        files: Option<&dyn OpenFile>,
    ) -> Result<(String, usize), PolicyError> {
        let pack_json = dir.join(PACK_FILE);
        let label = dir.display().to_string();
        let bad = |reason: String| PolicyError::Pack {
            pack: label.clone(),
            reason,
        };
        let bytes = match files {
            None => std::fs::read(&pack_json)
                .map_err(|e| bad(format!("reading {}: {e}", pack_json.display())))?,
            Some(files) => read_checked(files, dir, "instruction pack file", PACK_FILE)?,
        };
        let file: PackFile =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("{PACK_FILE}: {e}")))?;
        if file.format != 1 || file.kind != "instruction-pack" {
            return Err(bad(format!(
                "{PACK_FILE}: format {} kind {:?}: expected format 1, kind \"instruction-pack\"",
                file.format, file.kind
            )));
        }
        if (
            file.name.as_str(),
            file.version.as_str(),
            file.policy.as_str(),
        ) != (bundle.0, bundle.1, "fastwam")
        {
            return Err(bad(format!(
                "is for bundle {} {} ({}), not for {} {} (fastwam)",
                file.name, file.version, file.policy, bundle.0, bundle.1
            )));
        }
        let (m, e) = (chain.text_tokens, chain.context_width);
        if (file.text_tokens, file.context_width) != (m, e) {
            return Err(bad(format!(
                "rows of {} x {}, the bundle's context takes {m} x {e} (fastwam.chain)",
                file.text_tokens, file.context_width
            )));
        }
        let rows_path = relative(dir, &file.rows)
            .ok_or_else(|| bad(format!("rows {:?} is not a plain relative path", file.rows)))?;
        let rows = match files {
            None => MappedNpy::open(&rows_path).map_err(PolicyError::Npz)?,
            Some(files) => table_checked(files, dir, "instruction pack rows", &file.rows)?,
        };
        let n = file.instructions.len();
        let f16 = match rows.dtype() {
            DType::F32 => false,
            DType::F16 => true,
            other => {
                return Err(bad(format!(
                    "{}: dtype {}, expected f32 or f16 (as the bundle's text_rows)",
                    file.rows,
                    other.name()
                )))
            }
        };
        if rows.shape() != [n, m, e] {
            return Err(bad(format!(
                "{}: shape {:?}, expected [{n}, {m}, {e}] ({n} instructions)",
                file.rows,
                rows.shape()
            )));
        }
        let finite = if f16 {
            rows.data()
                .chunks_exact(2)
                .all(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).is_finite())
        } else {
            rows.data()
                .chunks_exact(4)
                .all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
        };
        if !finite {
            return Err(bad(format!("{}: holds a non-finite value", file.rows)));
        }
        let mut ids = Vec::with_capacity(n);
        let mut texts = Vec::with_capacity(2 * n);
        for (row, entry) in file.instructions.iter().enumerate() {
            let id = entry.id;
            if id & PACK_INSTRUCTION_FLAG == 0 || id & crate::TEXT_INSTRUCTION_FLAG != 0 {
                return Err(bad(format!(
                    "instruction id {id:#x} ({:?}): a pack id has bit 30 set and bit 31 clear",
                    entry.text
                )));
            }
            if self.contains(id) || ids.iter().any(|&(i, _, _)| i == id) {
                return Err(bad(format!(
                    "instruction id {id:#x} ({:?}) is already taken by an attached pack",
                    entry.text
                )));
            }
            for key in [
                normalize_pack_text(&entry.text),
                normalize_pack_text(&entry.normalized),
            ] {
                let seen = |t: &[(String, u32)]| t.iter().any(|(k, i)| *k == key && *i != id);
                if key.is_empty() || seen(&self.texts) || seen(&texts) {
                    return Err(bad(format!(
                        "instruction text {key:?} is empty or already names another instruction"
                    )));
                }
                if !texts.iter().any(|(k, i)| *k == key && *i == id) {
                    texts.push((key, id));
                }
            }
            ids.push((id, self.packs.len(), row));
        }
        let pack_label = file.label.clone();
        self.row_len = m * e;
        self.packs.push(Arc::new(Pack {
            dir: dir.to_owned(),
            label: pack_label.clone(),
            rows,
            f16,
        }));
        self.ids.extend(ids);
        self.ids.sort_unstable_by_key(|e| e.0);
        self.texts.extend(texts);
        Ok((pack_label, n))
    }

    /// The labels of the attached packs, in attach order.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.packs.iter().map(|p| p.label.as_str())
    }

    /// Whether the pack in `dir` (as it was given to attach) is attached.
    pub fn holds_dir(&self, dir: &Path) -> bool {
        self.packs.iter().any(|p| p.dir == dir)
    }
}

/// A set of attached packs built off the inference thread, for
/// [`crate::Policy::install_packs`]; or the set an install replaced (or refused), whose drop
/// frees lookup tables and may unmap rows: drop it off the inference thread.
pub struct AttachedPacks {
    pub(crate) packs: Arc<InstructionPacks>,
    /// The set it was built on: installed only over that one (the policy did not change
    /// meanwhile).
    pub(crate) base: Arc<InstructionPacks>,
}

impl AttachedPacks {
    /// The packs of this set.
    pub fn packs(&self) -> &InstructionPacks {
        &self.packs
    }
}

/// Attaches packs to a running Fast-WAM policy from another thread (see the module doc):
/// holds the policy's packs as last handed out, the bundle's identity and its chain's
/// shape. Made by [`crate::Policy::pack_attacher`].
#[derive(Clone)]
pub struct PackAttacher {
    packs: Arc<InstructionPacks>,
    bundle: (String, String),
    chain: FastWamChain,
    fixed: Arc<Vec<String>>,
}

impl PackAttacher {
    pub(crate) fn new(
        packs: Arc<InstructionPacks>,
        bundle: (String, String),
        chain: FastWamChain,
    ) -> Self {
        let fixed = Arc::new(chain.instructions.clone());
        Self {
            packs,
            bundle,
            chain,
            fixed,
        }
    }

    /// The bundle's name and version (what its packs name).
    pub fn bundle(&self) -> (&str, &str) {
        (&self.bundle.0, &self.bundle.1)
    }

    /// The packs attached so far (at load and by this attacher).
    pub fn packs(&self) -> &InstructionPacks {
        &self.packs
    }

    /// Checks the pack in `dir` (verified by the caller's store) as
    /// [`crate::Policy::attach_pack`] does and maps its rows into a new set holding the
    /// attached packs and it, to hand to [`crate::Policy::install_packs`]; later attaches
    /// build on it. Returns the set, the pack's label and its instruction count; a refusal
    /// changes nothing. Allocates and reads files: never on the inference thread. `files`
    /// opens the pack's files as [`crate::Policy::attach_pack`]'s does.
    pub fn attach(
        &mut self,
        dir: &Path,
        files: Option<&dyn OpenFile>,
    ) -> Result<(AttachedPacks, String, usize), PolicyError> {
        let mut next = InstructionPacks::clone(&self.packs);
        let (label, n) = next.attach(dir, self.bundle(), &self.chain, files)?;
        let next = Arc::new(next);
        let base = std::mem::replace(&mut self.packs, next.clone());
        Ok((AttachedPacks { packs: next, base }, label, n))
    }

    /// A text renderer over the fixed list and the packs attached so far.
    pub fn renderer(&self) -> crate::TextRenderer {
        crate::TextRenderer::packs(self.packs.clone(), self.fixed.clone())
    }
}

/// `dir/rel` when `rel` is a plain relative path (no `..`, not absolute).
fn relative(dir: &Path, rel: &str) -> Option<PathBuf> {
    let ok = !rel.is_empty()
        && !rel.starts_with('/')
        && rel
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..");
    ok.then(|| dir.join(rel))
}

#[cfg(test)]
mod tests {
    use super::normalize_pack_text;

    #[test]
    fn texts_are_cleaned_as_upstreams_whitespace_step() {
        for (given, expected) in [
            (
                "  put the bowl\ton the  plate \n",
                "put the bowl on the plate",
            ),
            ("open\u{3000}the\u{a0}\u{2009}drawer", "open the drawer"),
            ("\u{1c}\u{1f} pick it\u{85}up\u{1e}", "pick it up"),
            ("keep\u{1c}inside", "keep\u{1c}inside"),
            ("", ""),
        ] {
            assert_eq!(normalize_pack_text(given), expected, "{given:?}");
        }
    }
}
