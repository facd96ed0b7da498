//! Instructions given as text at run time: the bundle's tokenizer, template settings and
//! memory-mapped embedding table render an [`Instruction`] exactly as the importer's tables
//! would hold it (`vla_text::molmoact2`, the one renderer), with the embedding rows taken in
//! the checkpoint's own dtype.
//!
//! Refusals (one line each, [`PolicyError::Instruction`]): invalid UTF-8, `<im_patch>` text,
//! above the pack step's cap, or a token count the exported contexts do not bake RoPE
//! positions for.

use crate::bundle::Bundle;
use crate::error::PolicyError;
use crate::manifest::{MolmoAct2Settings, TextSettings};
use crate::pack::InstructionPacks;
use crate::prompt::{attention_bias, Instruction};
use half::{bf16, f16};
use std::sync::Arc;
use vla_npz::{DType, MappedNpy};
use vla_text::molmoact2::{ActionMode, RenderError, Template, Upstream};
use vla_text::Tokenizer;

/// How the table's rows are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowType {
    F32,
    F16,
    Bf16,
}

/// What renders text into an instruction: loaded once with the bundle.
pub struct TextPrompt {
    tokenizer: Tokenizer,
    template: Template,
    table: MappedNpy,
    rows: RowType,
    vocab: usize,
    pad: u32,
}

fn refused(text: &str, reason: impl Into<String>) -> PolicyError {
    PolicyError::Instruction {
        text: text.into(),
        reason: reason.into(),
    }
}

impl TextPrompt {
    /// Loads the `text` block of MolmoAct2 bundle `bundle`: each file read once through
    /// the bundle ([`Bundle::read`], [`Bundle::table`]).
    pub fn load(
        bundle: &Bundle,
        t: &TextSettings,
        m: &MolmoAct2Settings,
    ) -> Result<Self, PolicyError> {
        let bad = |file: &str, reason: String| PolicyError::Prompt {
            file: file.into(),
            reason,
        };
        let json = |what: &str, rel: &str| -> Result<serde_json::Value, PolicyError> {
            let bytes = bundle.read(what, rel)?;
            serde_json::from_slice(&bytes).map_err(|e| bad(rel, format!("not JSON: {e}")))
        };
        let data = json("tokenizer", &t.tokenizer)?;
        let config = match &t.tokenizer_config {
            Some(c) => Some((json("tokenizer config", c)?, c.as_str())),
            None => None,
        };
        let tokenizer =
            Tokenizer::from_json(&data, &t.tokenizer, config.as_ref().map(|(v, f)| (v, *f)))
                .map_err(|e| bad(&t.tokenizer, e.to_string()))?;
        let upstream = Upstream::from_name(&t.upstream).ok_or_else(|| {
            bad(
                "bundle.json molmoact2.text.upstream",
                format!(
                    "expected one of {}, found {:?}",
                    Upstream::NAMES.join(", "),
                    t.upstream
                ),
            )
        })?;
        let action_mode = match t.action_mode.as_str() {
            "continuous" => ActionMode::Continuous,
            "both" => ActionMode::Both,
            other => {
                return Err(bad(
                    "bundle.json molmoact2.text.action_mode",
                    format!("expected \"continuous\" or \"both\", found {other:?}"),
                ))
            }
        };
        let table = bundle.table("embedding table", &t.embedding)?;
        let rows = match (table.dtype(), t.embedding_dtype.as_deref()) {
            (DType::F32, None) => RowType::F32,
            (DType::F16, None) => RowType::F16,
            (DType::U16, Some("bf16")) => RowType::Bf16,
            (dtype, marker) => {
                return Err(bad(
                    &t.embedding,
                    format!(
                        "dtype {} with embedding_dtype {marker:?}: expected f32, f16, or u16 marked bf16",
                        dtype.name()
                    ),
                ))
            }
        };
        let shape = table.shape();
        if shape.len() != 2 || shape[1] != m.hidden {
            return Err(bad(
                &t.embedding,
                format!(
                    "shape {shape:?}: expected [V, {}] (molmoact2.hidden)",
                    m.hidden
                ),
            ));
        }
        let vocab = shape[0];
        let pad_text = tokenizer.specials().pad.clone().unwrap_or_default();
        let pad = tokenizer
            .token_to_id(&pad_text)
            .ok_or_else(|| bad(&t.tokenizer, format!("no PAD token {pad_text:?}")))?;
        let template = Template {
            cameras: m.cameras,
            grid: (t.grid[0], t.grid[1]),
            col_tokens: t.col_tokens,
            state_dims: m.state_dims,
            setup: t.setup.clone(),
            control: t.control.clone(),
            add_setup_tokens: t.add_setup_tokens,
            add_control_tokens: t.add_control_tokens,
            normalize_language: t.normalize_language,
            upstream,
            max_sequence_length: t.max_sequence_length,
            action_mode,
        };
        if template.image_tokens() != m.image_tokens {
            return Err(bad(
                "bundle.json molmoact2.text.grid",
                format!(
                    "{} cameras of {:?} give {} image tokens, the contexts take {}",
                    m.cameras,
                    t.grid,
                    template.image_tokens(),
                    m.image_tokens
                ),
            ));
        }
        Ok(Self {
            tokenizer,
            template,
            table,
            rows,
            vocab,
            pad,
        })
    }

    /// Writes row `id` of the table, as f32, into `out`.
    fn row(&self, id: usize, out: &mut [f32]) {
        let d = out.len();
        let data = self.table.data();
        match self.rows {
            RowType::F32 => {
                let bytes = &data[id * d * 4..(id + 1) * d * 4];
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            RowType::F16 | RowType::Bf16 => {
                let bytes = &data[id * d * 2..(id + 1) * d * 2];
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    let bits = u16::from_le_bytes([b[0], b[1]]);
                    *o = if self.rows == RowType::F16 {
                        f16::from_bits(bits).to_f32()
                    } else {
                        bf16::from_bits(bits).to_f32()
                    };
                }
            }
        }
    }

    /// Renders `text` (UTF-8 bytes) into an instruction the contexts can run, or refuses it.
    pub fn render(&self, text: &[u8], m: &MolmoAct2Settings) -> Result<Instruction, PolicyError> {
        let text = std::str::from_utf8(text).map_err(|e| {
            refused(
                &String::from_utf8_lossy(text),
                format!("invalid UTF-8 at byte {}", e.valid_up_to()),
            )
        })?;
        let r = self.template.render(&self.tokenizer, text).map_err(|e| {
            refused(
                text,
                match e {
                    RenderError::OverCap(_) => format!("too many tokens: {e}"),
                    _ => e.to_string(),
                },
            )
        })?;
        let (s, d) = (m.seq_len, m.hidden);
        let pad = m.rope_left_pad.unwrap_or(0);
        let (rows, layout_pad) = self.template.upstream.layout(r.ids.len());
        if rows != s || layout_pad != pad {
            let e = RenderError::Length {
                tokens: r.ids.len(),
                rows,
                pad: layout_pad,
                seq_len: s,
                rope_left_pad: pad,
            };
            let what = if rows > s {
                "too many tokens"
            } else {
                "too few tokens"
            };
            return Err(refused(text, format!("{what} for the bundle: {e}")));
        }
        if let Some(&id) = r.ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(refused(
                text,
                format!(
                    "token id {id} outside the embedding table's {} rows",
                    self.vocab
                ),
            ));
        }
        let mut ids = vec![self.pad; s];
        ids[pad..].copy_from_slice(&r.ids);
        let mut scaffold = vec![0f32; s * d];
        for (row, &id) in scaffold.chunks_exact_mut(d).zip(&ids) {
            self.row(id as usize, row);
        }
        if scaffold.iter().any(|x| !x.is_finite()) {
            return Err(refused(
                text,
                "the embedding table holds a non-finite value in its rows",
            ));
        }
        let mut valid = vec![0u8; s];
        valid[pad..].fill(1);
        let mut is_image = vec![false; s];
        for (i, &b) in r.image_block.iter().enumerate() {
            is_image[pad + i] = b != 0;
        }
        let mut encoder = vec![0f32; s];
        for (i, &e) in r.encoder_mask.iter().enumerate() {
            encoder[pad + i] = f32::from(e);
        }
        Ok(Instruction::new(
            scaffold,
            attention_bias(&valid, &is_image, m.attention_blocked_value),
            encoder,
            r.image_positions.iter().map(|p| p + pad).collect(),
            r.state_positions.iter().map(|p| p + pad).collect(),
            d,
        ))
    }
}

/// Turns instructions given as text into something the policy runs, on any thread:
/// MolmoAct2 renders the prompt (sharing the bundle's tokenizer, template and mapped
/// embedding table), Fast-WAM looks the text up in its fixed list and its instruction
/// packs (no encoder on the device). Rendering allocates; hand the result to
/// [`crate::Policy::install_text`] on the inference thread.
#[derive(Clone)]
pub struct TextRenderer(Renderer);

#[derive(Clone)]
enum Renderer {
    Prompt {
        prompt: Arc<TextPrompt>,
        settings: Arc<MolmoAct2Settings>,
    },
    Packs {
        packs: Arc<InstructionPacks>,
        fixed: Arc<Vec<String>>,
    },
}

/// What a [`TextRenderer`] made of a text.
pub enum RenderedText {
    /// A MolmoAct2 prompt, to install into a text slot.
    Prompt(Instruction),
    /// An instruction the policy already holds (a Fast-WAM fixed or pack instruction), by id.
    Existing(u32),
}

impl TextRenderer {
    pub(crate) fn prompt(prompt: Arc<TextPrompt>, settings: Arc<MolmoAct2Settings>) -> Self {
        Self(Renderer::Prompt { prompt, settings })
    }

    pub(crate) fn packs(packs: Arc<InstructionPacks>, fixed: Arc<Vec<String>>) -> Self {
        Self(Renderer::Packs { packs, fixed })
    }

    /// Renders (or looks up) `text` (UTF-8 bytes), or refuses it in one line
    /// ([`PolicyError::Instruction`]).
    pub fn render(&self, text: &[u8]) -> Result<RenderedText, PolicyError> {
        match &self.0 {
            Renderer::Prompt { prompt, settings } => {
                prompt.render(text, settings).map(RenderedText::Prompt)
            }
            Renderer::Packs { packs, fixed } => {
                pack_lookup(packs, fixed, text).map(RenderedText::Existing)
            }
        }
    }
}

/// The Fast-WAM instruction id of `text`: a fixed instruction of the same normalized
/// text, else a pack instruction's; anything else is refused in one line.
pub(crate) fn pack_lookup(
    packs: &InstructionPacks,
    fixed: &[String],
    text: &[u8],
) -> Result<u32, PolicyError> {
    let text = std::str::from_utf8(text).map_err(|e| {
        refused(
            &String::from_utf8_lossy(text),
            format!("invalid UTF-8 at byte {}", e.valid_up_to()),
        )
    })?;
    let key = crate::pack::normalize_pack_text(text);
    if let Some(i) = fixed
        .iter()
        .position(|t| crate::pack::normalize_pack_text(t) == key)
    {
        return Ok(i as u32);
    }
    packs.find_text(text).ok_or_else(|| {
        refused(
            text,
            format!(
                "not in this Fast-WAM bundle's {} fixed instructions nor its {} instruction \
                 pack(s) ({} instructions; Fast-WAM has no text encoder on the device)",
                fixed.len(),
                packs.len(),
                packs.instructions()
            ),
        )
    })
}
