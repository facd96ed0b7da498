//! Prompt tables: per-instruction scaffolds, image/state token positions, state-token rows,
//! and everything derived from them that depends only on the instruction.
//!
//! The device has no tokenizer. The bundle carries the embedded prompt of every supported
//! instruction; the f32 scaffold, the attention bias and the encoder mask of each are
//! computed here once at load, so per inference only the image and state rows change.
//!
//! The bidirectional image block is every image special token (`image_block`, upstream's
//! `token_type_ids`), not only the patch rows that receive embeddings; the action
//! expert's encoder mask is carried per instruction (`encoder_mask`, which masks the EOS
//! rows for checkpoints trained with `action_mode = "both"`). Tables without those arrays
//! fall back to the patch rows and to `valid`. When the manifest states the export's
//! `rope_left_pad`, an instruction padded otherwise is refused: its baked RoPE positions
//! would be shifted.

use crate::error::PolicyError;
use crate::manifest::MolmoAct2Settings;
use half::f16;
use std::path::Path;
use vla_npz::{DType, Npz};

/// What one instruction contributes, precomputed.
pub struct Instruction {
    /// `[S, D]` f32 embedding rows (image rows hold `wte[image_patch_id]`).
    pub scaffold: Vec<f32>,
    /// `[S, S]` additive attention bias.
    pub attention_bias: Vec<f32>,
    /// `[S]` 1.0 for real tokens.
    pub encoder_mask: Vec<f32>,
    pub image_positions: Vec<usize>,
    pub state_positions: Vec<usize>,
    /// The row every image position of the scaffold holds, when they all hold the same
    /// (the upstream layout: `wte[image_patch_id]`): the per-observation add then reads
    /// one cached row instead of an image's worth of scaffold (see [`Instruction::new`]).
    pub image_row: Option<Vec<f32>>,
}

pub struct PromptTables {
    pub instructions: Vec<Instruction>,
    /// `[256, D]` f32 rows of the `<state_k>` tokens.
    pub state_token_rows: Vec<f32>,
}

/// An optional u8 `[n, s]` array as rows of 0/1, checked.
fn optional_mask(
    npz: &Npz,
    name: &str,
    n: usize,
    s: usize,
) -> Result<Option<Vec<u8>>, PolicyError> {
    if !npz.contains(name) {
        return Ok(None);
    }
    let mask = npz
        .expect(name, DType::U8, &[n, s])
        .map_err(PolicyError::Npz)?
        .to_u8()
        .map_err(PolicyError::Npz)?;
    if let Some(i) = mask.iter().position(|&v| v > 1) {
        return Err(PolicyError::Prompt {
            file: npz.label().into(),
            reason: format!(
                "{name}: value {} at instruction {}, row {} is not 0 or 1",
                mask[i],
                i / s,
                i % s
            ),
        });
    }
    Ok(Some(mask))
}

fn positions(raw: &[i32], what: &str, file: &str, seq: usize) -> Result<Vec<usize>, PolicyError> {
    raw.iter()
        .map(|&p| {
            if p < 0 || p as usize >= seq {
                Err(PolicyError::Prompt {
                    file: file.into(),
                    reason: format!("{what} position {p} outside 0..{seq}"),
                })
            } else {
                Ok(p as usize)
            }
        })
        .collect()
}

/// The bias of one instruction: a key is visible to a query when it is a real token and
/// either causal (key <= query) or both are in the image block.
pub fn attention_bias(valid: &[u8], is_image: &[bool], blocked: f32) -> Vec<f32> {
    let s = valid.len();
    let mut bias = vec![blocked; s * s];
    for q in 0..s {
        for k in 0..s {
            if valid[k] != 0 && (k <= q || (is_image[q] && is_image[k])) {
                bias[q * s + k] = 0.0;
            }
        }
    }
    bias
}

impl Instruction {
    /// An instruction; finds the shared image row of its scaffold (`d` the hidden width).
    pub fn new(
        scaffold: Vec<f32>,
        attention_bias: Vec<f32>,
        encoder_mask: Vec<f32>,
        image_positions: Vec<usize>,
        state_positions: Vec<usize>,
        d: usize,
    ) -> Self {
        let row = |p: usize| &scaffold[p * d..(p + 1) * d];
        let image_row = image_positions.first().and_then(|&first| {
            // Bit patterns, so that -0.0 and 0.0 or two NaN payloads never count as equal.
            let same = |p: &usize| {
                row(*p)
                    .iter()
                    .zip(row(first))
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            };
            image_positions
                .iter()
                .all(same)
                .then(|| row(first).to_vec())
        });
        Self {
            scaffold,
            attention_bias,
            encoder_mask,
            image_positions,
            state_positions,
            image_row,
        }
    }

    /// Writes the whole scaffold into `hidden` (`[S, D]`): done once when the instruction
    /// changes, since the text rows never change between observations.
    pub fn write_scaffold(&self, hidden: &mut [f32]) {
        hidden.copy_from_slice(&self.scaffold);
    }

    /// Writes the rows that depend on the observation into a `hidden` that already holds
    /// this instruction's scaffold: image rows become `scaffold + image_embeds` (added in
    /// one pass, so each row is read and written once), then state rows are replaced by
    /// the rows of their token ids. `d` is the hidden width.
    pub fn embed_observation(
        &self,
        hidden: &mut [f32],
        image_embeds: &[f32],
        state_token_rows: &[f32],
        state_ids: &[usize],
        d: usize,
    ) {
        for (j, &pos) in self.image_positions.iter().enumerate() {
            let row = pos * d..(pos + 1) * d;
            let base = match &self.image_row {
                Some(shared) => &shared[..],
                None => &self.scaffold[row.clone()],
            };
            for ((h, s), e) in hidden[row]
                .iter_mut()
                .zip(base)
                .zip(&image_embeds[j * d..(j + 1) * d])
            {
                *h = s + e;
            }
        }
        for (&pos, &id) in self.state_positions.iter().zip(state_ids) {
            hidden[pos * d..(pos + 1) * d].copy_from_slice(&state_token_rows[id * d..(id + 1) * d]);
        }
    }
}

impl PromptTables {
    pub fn load(path: &Path, m: &MolmoAct2Settings) -> Result<Self, PolicyError> {
        let file = path.display().to_string();
        let npz = Npz::open(path).map_err(PolicyError::Npz)?;
        let n = m.instructions.len();
        let (s, d) = (m.seq_len, m.hidden);
        let scaffold = npz
            .expect("scaffold", DType::F16, &[n, s, d])
            .map_err(PolicyError::Npz)?
            .to_f16()
            .map_err(PolicyError::Npz)?;
        let valid = npz
            .expect("valid", DType::U8, &[n, s])
            .map_err(PolicyError::Npz)?
            .to_u8()
            .map_err(PolicyError::Npz)?;
        let image = npz
            .expect("image_positions", DType::I32, &[n, m.image_tokens])
            .map_err(PolicyError::Npz)?
            .to_i32()
            .map_err(PolicyError::Npz)?;
        let state = npz
            .expect("state_positions", DType::I32, &[n, m.state_dims])
            .map_err(PolicyError::Npz)?
            .to_i32()
            .map_err(PolicyError::Npz)?;
        let rows = npz
            .expect("state_token_rows", DType::F16, &[256, d])
            .map_err(PolicyError::Npz)?
            .to_f16()
            .map_err(PolicyError::Npz)?;
        let image_block = optional_mask(&npz, "image_block", n, s)?;
        let encoder_mask = optional_mask(&npz, "encoder_mask", n, s)?;
        let mut instructions = Vec::with_capacity(n);
        for i in 0..n {
            let v = &valid[i * s..(i + 1) * s];
            if let Some(pad) = m.rope_left_pad {
                let real = v.iter().filter(|&&x| x != 0).count();
                if v[..pad].iter().any(|&x| x != 0) || v[pad..].contains(&0) {
                    return Err(PolicyError::Prompt {
                        file,
                        reason: format!(
                            "instruction {i} has {real} tokens after {} rows of padding, but \
                             the contexts bake RoPE positions for {} tokens after {pad} rows \
                             (molmoact2.rope_left_pad): it would run with shifted positions",
                            v.iter().take_while(|&&x| x == 0).count(),
                            s - pad
                        ),
                    });
                }
            }
            let image_positions = positions(
                &image[i * m.image_tokens..(i + 1) * m.image_tokens],
                "image",
                &file,
                s,
            )?;
            let state_positions = positions(
                &state[i * m.state_dims..(i + 1) * m.state_dims],
                "state",
                &file,
                s,
            )?;
            if let Some(p) = image_positions
                .iter()
                .chain(&state_positions)
                .find(|p| v[**p] == 0)
            {
                return Err(PolicyError::Prompt {
                    file,
                    reason: format!("instruction {i}: token position {p} is padding"),
                });
            }
            let scaffold: Vec<f32> = scaffold[i * s * d..(i + 1) * s * d]
                .iter()
                .map(|x| x.to_f32())
                .collect();
            if scaffold.iter().any(|x| !x.is_finite()) {
                return Err(PolicyError::Prompt {
                    file,
                    reason: format!("instruction {i}: scaffold holds a non-finite value"),
                });
            }
            let is_image: Vec<bool> = match &image_block {
                Some(block) => block[i * s..(i + 1) * s].iter().map(|&x| x != 0).collect(),
                None => {
                    let mut rows = vec![false; s];
                    image_positions.iter().for_each(|&p| rows[p] = true);
                    rows
                }
            };
            if let Some(p) = image_positions.iter().find(|&&p| !is_image[p]) {
                return Err(PolicyError::Prompt {
                    file,
                    reason: format!(
                        "instruction {i}: image row {p} is outside the image_block it attends in"
                    ),
                });
            }
            let encoder = match &encoder_mask {
                Some(mask) => &mask[i * s..(i + 1) * s],
                None => v,
            };
            if let Some(p) = (0..s).find(|&p| encoder[p] != 0 && v[p] == 0) {
                return Err(PolicyError::Prompt {
                    file,
                    reason: format!("instruction {i}: encoder_mask admits padding row {p}"),
                });
            }
            instructions.push(Instruction::new(
                scaffold,
                attention_bias(v, &is_image, m.attention_blocked_value),
                encoder.iter().map(|&x| f32::from(x)).collect(),
                image_positions,
                state_positions,
                d,
            ));
        }
        let state_token_rows = rows.iter().map(|x: &f16| x.to_f32()).collect();
        Ok(Self {
            instructions,
            state_token_rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observation_rows_are_added_or_replaced_and_text_rows_kept() {
        // S = 4, D = 2: [text, img, state, img]
        let instr = |scaffold: Vec<f32>| {
            Instruction::new(
                scaffold,
                vec![0.0; 16],
                vec![1.0; 4],
                vec![1, 3],
                vec![2],
                2,
            )
        };
        let rows = [0.0, 0.0, 7.0, 8.0];
        let distinct = instr(vec![1.0, 2.0, 10.0, 20.0, 5.0, 6.0, 30.0, 40.0]);
        assert!(distinct.image_row.is_none());
        let mut hidden = vec![0.0; 8];
        distinct.write_scaffold(&mut hidden);
        distinct.embed_observation(&mut hidden, &[0.5, 0.25, 1.0, 2.0], &rows, &[1], 2);
        assert_eq!(hidden, [1.0, 2.0, 10.5, 20.25, 7.0, 8.0, 31.0, 42.0]);
        // A second observation starts again from the scaffold, not from the last sum.
        distinct.embed_observation(&mut hidden, &[1.0, 1.0, 0.0, 0.0], &rows, &[0], 2);
        assert_eq!(hidden, [1.0, 2.0, 11.0, 21.0, 0.0, 0.0, 30.0, 40.0]);
        // The upstream layout: every image row holds the patch token's row; one row is
        // kept and the result is the same as from the full scaffold.
        let shared = instr(vec![1.0, 2.0, 10.0, 20.0, 5.0, 6.0, 10.0, 20.0]);
        assert_eq!(shared.image_row.as_deref(), Some(&[10.0, 20.0][..]));
        let mut from_row = vec![0.0; 8];
        shared.write_scaffold(&mut from_row);
        shared.embed_observation(&mut from_row, &[0.5, 0.25, 1.0, 2.0], &rows, &[1], 2);
        assert_eq!(from_row, [1.0, 2.0, 10.5, 20.25, 7.0, 8.0, 11.0, 22.0]);
        // -0.0 and 0.0 add differently to -0.0: never merged.
        assert!(instr(vec![0.0, 0.0, -0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
            .image_row
            .is_none());
    }

    #[test]
    fn bias_is_causal_with_bidirectional_images_and_masks_padding() {
        // [pad, text, img, img, text]
        let valid = [0u8, 1, 1, 1, 1];
        let b = attention_bias(&valid, &[false, false, true, true, false], -1.0);
        let allowed = |q: usize, k: usize| b[q * 5 + k] == 0.0;
        assert!(!allowed(4, 0), "padding is never visible");
        assert!(allowed(4, 1) && allowed(4, 4));
        assert!(!allowed(1, 2), "text does not see later tokens");
        assert!(allowed(2, 3), "image tokens see each other both ways");
        assert!(allowed(3, 2));
        assert!(!allowed(0, 0), "a pad query sees nothing real");
    }

    #[test]
    fn the_image_block_spans_every_image_special_token() {
        // The fixture's prompt: "Image 1" <im_start> <im_patch> <im_patch> <im_col> ...
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../golden/bundles/molmoact2-original");
        let manifest: crate::manifest::Manifest =
            serde_json::from_slice(&std::fs::read(root.join("bundle.json")).unwrap()).unwrap();
        let m = manifest.molmoact2.unwrap();
        let tables = PromptTables::load(&root.join(&m.prompt), &m).unwrap();
        let npz = Npz::open(root.join(&m.prompt)).unwrap();
        let block = npz.array("image_block").unwrap().to_u8().unwrap();
        let s = m.seq_len;
        let instr = &tables.instructions[0];
        let first = instr.image_positions[0];
        let (start, col) = (first - 1, first + 2);
        assert!(block[start] == 1 && block[col] == 1 && !instr.image_positions.contains(&start));
        let allowed = |q: usize, k: usize| instr.attention_bias[q * s + k] == 0.0;
        assert!(
            allowed(start, first),
            "<im_start> sees the patches after it"
        );
        assert!(allowed(start, col), "and the <im_col> after them");
        assert!(!allowed(start - 1, first), "text before the image does not");
        assert!(
            tables.instructions.iter().all(|i| i.image_row.is_some()),
            "the builder's tables hold wte[image_patch_id] at every patch position"
        );
    }
}
