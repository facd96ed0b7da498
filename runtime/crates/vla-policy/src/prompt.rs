//! Prompt tables: per-instruction scaffolds, image/state token positions, state-token rows,
//! and everything derived from them that depends only on the instruction.
//!
//! The bundle carries the embedded prompt of every fixed instruction (instructions given as
//! text at run time are rendered by the `text` module into the same [`Instruction`]); the f32
//! scaffold, the attention bias and the encoder mask of each are computed here once at load,
//! so per inference only the image and state rows change.
//!
//! The bidirectional image block is every image special token (`image_block`, upstream's
//! `token_type_ids`), not only the patch rows that receive embeddings; the action
//! expert's encoder mask is carried per instruction (`encoder_mask`, which masks the EOS
//! rows for checkpoints trained with `action_mode = "both"`). Tables without those arrays
//! fall back to the patch rows and to `valid`. When the manifest states the export's
//! `rope_left_pad`, an instruction padded otherwise is refused: its baked RoPE positions
//! would be shifted.
//!
//! Tables may name the upstream version whose host glue they follow (`upstream`, utf-8
//! bytes; absent = lerobot 0.6.1, the pin). The runtime computes the same for every version it
//! knows (they differ in padding, which `valid` and `rope_left_pad` carry); a version it does
//! not know is refused rather than run with glue it has not been checked against.

use crate::error::PolicyError;
use crate::exec::non_finite;
use crate::manifest::MolmoAct2Settings;
use half::f16;
use vla_fork::{Fork, HelperFailed};
use vla_npz::{DType, Npz};

/// Image rows below this many bytes are not worth a join (see
/// [`Instruction::embed_observation_on`]).
pub const FORK_MIN_BYTES: usize = 1 << 20;

/// What one instruction contributes, precomputed.
pub struct Instruction {
    /// `[S, D]` f32 embedding rows (image rows hold `wte[image_patch_id]`).
    pub scaffold: Vec<f32>,
    /// `[S, S]` additive attention bias.
    pub attention_bias: Vec<f32>,
    /// `[S]` 1.0 for real tokens.
    pub encoder_mask: Vec<f32>,
    /// Scaffold rows that receive the image embeds, in `image_embeds` row order.
    pub image_positions: Vec<usize>,
    /// Scaffold rows that receive the state tokens, in state dim order.
    pub state_positions: Vec<usize>,
    /// The row every image position of the scaffold holds, when they all hold the same
    /// (the upstream layout: `wte[image_patch_id]`): the per-observation add then reads
    /// one cached row instead of an image's worth of scaffold (see [`Instruction::new`]).
    pub image_row: Option<Vec<f32>>,
    /// The row that splits the image rows in two halves (the first row of the second),
    /// for [`Instruction::embed_observation_on`].
    image_split: usize,
}

pub struct PromptTables {
    pub instructions: Vec<Instruction>,
    /// `[256, D]` f32 rows of the `<state_k>` tokens.
    pub state_token_rows: Vec<f32>,
}

/// The upstream versions whose prompt layout the runtime follows (build_prompt_tables.py
/// `UPSTREAMS`).
pub const UPSTREAMS: [&str; 2] = ["lerobot-0.6.1", "lerobot-main-c13d79e"];

/// The tables' `upstream` field, when present, must be one of [`UPSTREAMS`].
fn check_upstream(npz: &Npz) -> Result<(), PolicyError> {
    if !npz.contains("upstream") {
        return Ok(());
    }
    let array = npz.array("upstream").map_err(PolicyError::Npz)?;
    array
        .check(DType::U8, &[array.len()])
        .map_err(PolicyError::Npz)?;
    let bytes = array.to_u8().map_err(PolicyError::Npz)?;
    let name = String::from_utf8_lossy(&bytes);
    if UPSTREAMS.contains(&name.as_ref()) {
        return Ok(());
    }
    Err(PolicyError::Prompt {
        file: npz.label().into(),
        reason: format!(
            "upstream: expected one of {} (the versions whose host glue vlad follows), found {name:?}",
            UPSTREAMS.join(", ")
        ),
    })
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
        let mut sorted = image_positions.clone();
        sorted.sort_unstable();
        let image_split = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
        Self {
            scaffold,
            attention_bias,
            encoder_mask,
            image_positions,
            state_positions,
            image_row,
            image_split,
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
    /// the rows of their token ids. `d` is the hidden width. Returns how many sums are
    /// NaN/Inf: the scaffold is finite (checked at load), so a non-finite sum is a
    /// non-finite `image_embeds` value (or one so large the sum overflows), and this
    /// count is the vision output's guard, taken in the pass that reads it anyway.
    pub fn embed_observation(
        &self,
        hidden: &mut [f32],
        image_embeds: &[f32],
        state_token_rows: &[f32],
        state_ids: &[usize],
        d: usize,
    ) -> usize {
        let bad = self.add_image_rows(hidden, 0, image_embeds, d);
        self.replace_state_rows(hidden, state_token_rows, state_ids, d);
        bad
    }

    /// [`Instruction::embed_observation`] with the image rows split between the caller
    /// and `fork`'s helper, half each, when there are enough of them: a join costs about
    /// what adding a megabyte of rows does (0.03-0.08 ms measured in a VM), so fewer
    /// image rows than [`FORK_MIN_BYTES`] are added here alone (LP-VTP-SD's 32).
    pub fn embed_observation_on(
        &self,
        fork: &mut Fork,
        hidden: &mut [f32],
        image_embeds: &[f32],
        state_token_rows: &[f32],
        state_ids: &[usize],
        d: usize,
    ) -> Result<usize, HelperFailed> {
        if self.image_positions.len() * d * 4 < FORK_MIN_BYTES {
            return Ok(self.embed_observation(
                hidden,
                image_embeds,
                state_token_rows,
                state_ids,
                d,
            ));
        }
        let (lo, hi) = hidden.split_at_mut(self.image_split * d);
        let split = self.image_split;
        let (a, b) = fork.join(
            || self.add_image_rows(lo, 0, image_embeds, d),
            || self.add_image_rows(hi, split, image_embeds, d),
        )?;
        self.replace_state_rows(hidden, state_token_rows, state_ids, d);
        Ok(a + b)
    }

    /// Adds the image rows that fall in `rows`, which holds hidden rows `first..`;
    /// returns how many sums are NaN/Inf.
    fn add_image_rows(
        &self,
        rows: &mut [f32],
        first: usize,
        image_embeds: &[f32],
        d: usize,
    ) -> usize {
        let held = first..first + rows.len() / d;
        let mut bad = 0;
        for (j, &pos) in self.image_positions.iter().enumerate() {
            if !held.contains(&pos) {
                continue;
            }
            let base = match &self.image_row {
                Some(shared) => &shared[..],
                None => &self.scaffold[pos * d..(pos + 1) * d],
            };
            let at = (pos - first) * d;
            // Counted on the value just written, while it is in a register.
            bad += rows[at..at + d]
                .iter_mut()
                .zip(base)
                .zip(&image_embeds[j * d..(j + 1) * d])
                .map(|((h, s), e)| {
                    *h = s + e;
                    non_finite(*h)
                })
                .sum::<u32>() as usize;
        }
        bad
    }

    fn replace_state_rows(&self, hidden: &mut [f32], rows: &[f32], ids: &[usize], d: usize) {
        for (&pos, &id) in self.state_positions.iter().zip(ids) {
            hidden[pos * d..(pos + 1) * d].copy_from_slice(&rows[id * d..(id + 1) * d]);
        }
    }
}

impl PromptTables {
    pub fn load(npz: &Npz, m: &MolmoAct2Settings) -> Result<Self, PolicyError> {
        let file = npz.label().to_owned();
        check_upstream(npz)?;
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
        let image_block = optional_mask(npz, "image_block", n, s)?;
        let encoder_mask = optional_mask(npz, "encoder_mask", n, s)?;
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
    fn an_upstream_version_vlad_does_not_follow_is_refused_in_one_line() {
        let npz = |array: vla_npz::Array| {
            Npz::from_bytes(vla_npz::npz_bytes(&[&array]).unwrap(), "prompt_tables.npz").unwrap()
        };
        let named = |name: &str| {
            npz(vla_npz::Array::from_u8("upstream", &[name.len()], name.as_bytes()).unwrap())
        };
        for known in UPSTREAMS {
            check_upstream(&named(known)).unwrap();
        }
        let absent = npz(vla_npz::Array::from_u8("valid", &[1], &[1]).unwrap());
        check_upstream(&absent).unwrap();
        let msg = check_upstream(&named("lerobot-0.7.0"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "prompt tables prompt_tables.npz: upstream: expected one of lerobot-0.6.1, \
             lerobot-main-c13d79e (the versions whose host glue vlad follows), found \"lerobot-0.7.0\""
        );
        let wide = npz(vla_npz::Array::from_i32("upstream", &[1], &[7]).unwrap());
        let msg = check_upstream(&wide).unwrap_err().to_string();
        assert!(msg.contains("upstream") && !msg.contains('\n'), "{msg}");
    }

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
    fn halves_on_the_fork_write_what_one_pass_writes_and_count_non_finite_embeds() {
        // S = 6: [text, img, img, state, img, text]; the split falls between rows. D is
        // wide enough that the image rows are worth a join.
        let d = FORK_MIN_BYTES / 4 / 3 + 1;
        assert!(3 * d * 4 >= FORK_MIN_BYTES);
        let scaffold: Vec<f32> = (0..6 * d).map(|i| (i % 1000) as f32).collect();
        let instr = Instruction::new(
            scaffold.clone(),
            vec![0.0; 36],
            vec![1.0; 6],
            vec![4, 1, 2],
            vec![3],
            d,
        );
        assert_eq!(instr.image_split, 2, "the median image row");
        let rows: Vec<f32> = (0..2 * d).map(|i| 100.0 + (i % 7) as f32).collect();
        let mut embeds: Vec<f32> = (0..3 * d).map(|i| 0.5 * (i % 13) as f32).collect();
        let (mut one, mut two) = (vec![0.0; 6 * d], vec![0.0; 6 * d]);
        instr.write_scaffold(&mut one);
        instr.write_scaffold(&mut two);
        let mut fork = Fork::start("vla-fork-test", || {}).unwrap();
        assert_eq!(
            instr.embed_observation(&mut one, &embeds, &rows, &[1], d),
            0
        );
        assert_eq!(
            instr.embed_observation_on(&mut fork, &mut two, &embeds, &rows, &[1], d),
            Ok(0)
        );
        assert!(one
            .iter()
            .zip(&two)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        for (image, row) in [(0, 4), (1, 1), (2, 2)] {
            let want: Vec<f32> = (0..d)
                .map(|k| scaffold[row * d + k] + embeds[image * d + k])
                .collect();
            assert_eq!(
                &two[row * d..(row + 1) * d],
                &want[..],
                "image {image} in row {row}"
            );
        }
        assert_eq!(&two[3 * d..4 * d], &rows[d..2 * d], "state row replaced");
        assert_eq!(&two[..d], &scaffold[..d], "text row kept");
        // A NaN on one side of the split, an Inf on the other.
        embeds[5] = f32::NAN; // image 0 -> row 4 (second half)
        embeds[d + 5] = f32::INFINITY; // image 1 -> row 1 (first half)
        assert_eq!(
            instr.embed_observation(&mut one, &embeds, &rows, &[1], d),
            2
        );
        assert_eq!(
            instr.embed_observation_on(&mut fork, &mut two, &embeds, &rows, &[1], d),
            Ok(2)
        );
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
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../golden/bundles/molmoact2-original");
        let manifest: crate::manifest::RawManifest =
            serde_json::from_slice(&std::fs::read(root.join("bundle.json")).unwrap()).unwrap();
        let m = manifest.molmoact2.unwrap();
        let tables = PromptTables::load(&Npz::open(root.join(&m.prompt)).unwrap(), &m).unwrap();
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
