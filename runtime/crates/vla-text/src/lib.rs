//! Qwen2's byte-level BPE, as `transformers.Qwen2Tokenizer.from_pretrained` (transformers 5)
//! loads a checkpoint's tokenizer: text in, upstream's token ids out, on the device.
//!
//! What is taken from the checkpoint's `tokenizer.json`: the vocabulary, the merges, the added
//! tokens (with their `normalized`, `lstrip`, `rstrip`, `single_word` flags) and a
//! `TemplateProcessing` post-processor. What is not: its normalizer, pre-tokenizer and decoder.
//! transformers 5 builds those for the class itself (NFC, the Qwen2 split regex, byte-level
//! without its own regex), whatever the file says; golden/tokenizer-qwen2 checks that rule
//! against upstream. From `tokenizer_config.json`: BOS, EOS and PAD (the processor inserts
//! BOS, else EOS) and `add_prefix_space` (only false/absent is supported, as Qwen2 saves it).
//!
//! The steps mirror the `tokenizers` crate (upstream's core): added tokens are split out of
//! the raw text by a leftmost-longest automaton (those with `normalized` after NFC), each other
//! piece is NFC-normalized with the same tables (`unicode-normalization-alignments`), split by
//! the Qwen2 pattern, mapped byte-to-unicode, and merged by rank (lowest first, leftmost on
//! ties). The pattern's one look-ahead, `\s+(?!\S)`, is applied by hand after the `regex`
//! crate's leftmost-first match, which gives the same pieces as upstream's backtracking engine.
//!
//! Why not the `tokenizers` crate itself: it builds and links (pure Rust with `fancy-regex`),
//! but brings 86 crates (rayon, serde derive, esaxx, spm tables) for the one model vlad
//! needs; the figures are in docs/prompt-text.md.

pub mod molmoact2;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use regex::Regex;
use serde_json::Value;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::path::Path;
use unicode_normalization_alignments::UnicodeNormalization;

/// The Qwen2 split pattern without its look-ahead alternative (see the module doc).
const SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

/// A tokenizer that cannot be loaded, with the file and the reason.
#[derive(Debug)]
pub struct TextError {
    /// The file (or setting) at fault.
    pub file: String,
    /// Why, in one line.
    pub reason: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl TextError {
    fn new(file: &str, reason: impl Into<String>) -> Self {
        Self {
            file: file.into(),
            reason: reason.into(),
            source: None,
        }
    }
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tokenizer {}: {}", self.file, self.reason)
    }
}

impl std::error::Error for TextError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// One added token and the flags that decide where it matches.
#[derive(Clone, Debug)]
struct Added {
    id: u32,
    lstrip: bool,
    rstrip: bool,
    single_word: bool,
}

/// The special tokens the prompt needs, as `Qwen2Tokenizer` reads them from
/// `tokenizer_config.json` (defaults: no BOS, EOS and PAD `<|endoftext|>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Specials {
    /// BOS text, when set.
    pub bos: Option<String>,
    /// EOS text, when set.
    pub eos: Option<String>,
    /// PAD text, when set.
    pub pad: Option<String>,
}

/// A loaded tokenizer.
pub struct Tokenizer {
    vocab: HashMap<String, u32>,
    /// `(left id, right id) -> (rank, merged id)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Byte -> the id of its byte-level symbol.
    byte_ids: [u32; 256],
    added: Vec<Added>,
    added_ids: HashMap<String, u32>,
    /// Automata over the added tokens matched on raw text and on NFC text, with each
    /// pattern's index into `added`.
    raw: Option<(AhoCorasick, Vec<usize>)>,
    normalized: Option<(AhoCorasick, Vec<usize>)>,
    split: Regex,
    word_start: Regex,
    word_end: Regex,
    /// Ids the post-processor puts before and after the sequence.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    specials: Specials,
}

/// GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to 256 + n.
pub fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut n = 0;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            n += 1;
            255 + n
        };
        table[b as usize] = char::from_u32(c).expect("below the surrogates");
    }
    table
}

fn token_text(v: Option<&Value>) -> Option<Option<String>> {
    match v {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::String(s)) => Some(Some(s.clone())),
        Some(Value::Object(o)) => Some(o.get("content").and_then(|c| c.as_str()).map(String::from)),
        Some(_) => Some(None),
    }
}

fn read_json(path: &Path) -> Result<Value, TextError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| TextError {
        source: Some(Box::new(e)),
        ..TextError::new(&file, "cannot read")
    })?;
    serde_json::from_slice(&bytes).map_err(|e| TextError::new(&file, format!("not JSON: {e}")))
}

impl Tokenizer {
    /// Loads `tokenizer.json` and, when given, `tokenizer_config.json`.
    pub fn from_files(tokenizer: &Path, config: Option<&Path>) -> Result<Self, TextError> {
        let data = read_json(tokenizer)?;
        let cfg = match config {
            Some(p) => Some((read_json(p)?, p.display().to_string())),
            None => None,
        };
        Self::from_json(
            &data,
            &tokenizer.display().to_string(),
            cfg.as_ref().map(|(v, f)| (v, f.as_str())),
        )
    }

    /// [`Tokenizer::from_files`] on parsed JSON (`file` names it in errors).
    pub fn from_json(
        data: &Value,
        file: &str,
        config: Option<(&Value, &str)>,
    ) -> Result<Self, TextError> {
        let err = |r: String| TextError::new(file, r);
        let model = data.get("model").ok_or_else(|| err("no model".into()))?;
        if model.get("type").and_then(|t| t.as_str()) != Some("BPE") {
            return Err(err(format!(
                "model.type: expected \"BPE\" (Qwen2Tokenizer), found {}",
                model.get("type").unwrap_or(&Value::Null)
            )));
        }
        let vocab: HashMap<String, u32> = model
            .get("vocab")
            .and_then(|v| v.as_object())
            .ok_or_else(|| err("model.vocab: expected an object".into()))?
            .iter()
            .map(|(k, v)| {
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .map(|id| (k.clone(), id))
                    .ok_or_else(|| err(format!("model.vocab[{k:?}]: expected an id, found {v}")))
            })
            .collect::<Result<_, _>>()?;
        let chars = byte_chars();
        let mut byte_ids = [0u32; 256];
        for (b, c) in chars.iter().enumerate() {
            byte_ids[b] = *vocab.get(&c.to_string()).ok_or_else(|| {
                err(format!(
                    "model.vocab: no symbol for byte {b:#04x} ({c:?}): not a byte-level vocabulary"
                ))
            })?;
        }
        let mut merges = HashMap::new();
        let list = model
            .get("merges")
            .and_then(|m| m.as_array())
            .ok_or_else(|| err("model.merges: expected a list".into()))?;
        for (rank, m) in list.iter().enumerate() {
            let (a, b) = match m {
                Value::String(s) => s
                    .split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string())),
                Value::Array(p) if p.len() == 2 => p[0]
                    .as_str()
                    .zip(p[1].as_str())
                    .map(|(a, b)| (a.to_string(), b.to_string())),
                _ => None,
            }
            .ok_or_else(|| err(format!("model.merges[{rank}]: expected \"a b\" or [a, b]")))?;
            let id = |s: &str| {
                vocab.get(s).copied().ok_or_else(|| {
                    err(format!(
                        "model.merges[{rank}]: {s:?} is not in the vocabulary"
                    ))
                })
            };
            merges.insert((id(&a)?, id(&b)?), (rank as u32, id(&format!("{a}{b}"))?));
        }
        let mut added = Vec::new();
        let mut added_ids = HashMap::new();
        let (mut raw, mut normalized) = ((vec![], vec![]), (vec![], vec![]));
        for (i, t) in data
            .get("added_tokens")
            .and_then(|a| a.as_array())
            .map(|a| &a[..])
            .unwrap_or(&[])
            .iter()
            .enumerate()
        {
            let flag = |k: &str| t.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
            let content = t
                .get("content")
                .and_then(|c| c.as_str())
                .filter(|c| !c.is_empty())
                .ok_or_else(|| err(format!("added_tokens[{i}]: no content")))?;
            let id = t
                .get("id")
                .and_then(|v| v.as_u64())
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| err(format!("added_tokens[{i}] {content:?}: no id")))?;
            let at = added.len();
            added.push(Added {
                id,
                lstrip: flag("lstrip"),
                rstrip: flag("rstrip"),
                single_word: flag("single_word"),
            });
            // As `tokenizers` partitions them: by the flag alone, normalized ones NFC'd.
            added_ids.insert(content.to_string(), id);
            if !flag("normalized") {
                raw.0.push(content.to_string());
                raw.1.push(at);
            } else {
                normalized
                    .0
                    .push(content.nfc().map(|(c, _)| c).collect::<String>());
                normalized.1.push(at);
            }
        }
        let automaton = |(patterns, index): (Vec<String>, Vec<usize>)| {
            if patterns.is_empty() {
                return Ok(None);
            }
            AhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&patterns)
                .map(|a| Some((a, index)))
                .map_err(|e| err(format!("added_tokens: {e}")))
        };
        let (prefix, suffix) = post_processor(data.get("post_processor"), file)?;
        let mut specials = Specials {
            bos: None,
            eos: Some("<|endoftext|>".into()),
            pad: Some("<|endoftext|>".into()),
        };
        if let Some((cfg, cfg_file)) = config {
            if let Some(v) = token_text(cfg.get("bos_token")) {
                specials.bos = v;
            }
            if let Some(v) = token_text(cfg.get("eos_token")) {
                specials.eos = v;
            }
            if let Some(v) = token_text(cfg.get("pad_token")) {
                specials.pad = v;
            }
            if cfg.get("add_prefix_space").and_then(|v| v.as_bool()) == Some(true) {
                return Err(TextError::new(
                    cfg_file,
                    "add_prefix_space: true is not supported (Qwen2 saves false or null)",
                ));
            }
        }
        let regex = |p: &str| Regex::new(p).expect("a fixed pattern");
        Ok(Self {
            vocab,
            merges,
            byte_ids,
            added,
            added_ids,
            raw: automaton(raw)?,
            normalized: automaton(normalized)?,
            split: regex(SPLIT),
            word_start: regex(r"^\w"),
            word_end: regex(r"\w$"),
            prefix,
            suffix,
            specials,
        })
    }

    /// The id of a token's text (vocabulary or added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added_ids
            .get(token)
            .or_else(|| self.vocab.get(token))
            .copied()
    }

    /// BOS, EOS and PAD as the config names them.
    pub fn specials(&self) -> &Specials {
        &self.specials
    }

    /// Ids of `text` as `tokenizer(text)["input_ids"]` gives them (post-processor included).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = self.prefix.clone();
        for (piece, id) in self.split_added(text, self.raw.as_ref()) {
            if let Some(id) = id {
                ids.push(id);
                continue;
            }
            let nfc: String = piece.nfc().map(|(c, _)| c).collect();
            for (part, id) in self.split_added(&nfc, self.normalized.as_ref()) {
                match id {
                    Some(id) => ids.push(id),
                    None => self.encode_plain(part, &mut ids),
                }
            }
        }
        ids.extend_from_slice(&self.suffix);
        ids
    }

    /// Splits out added tokens (`tokenizers`' `find_matches`).
    fn split_added<'a>(
        &self,
        text: &'a str,
        automaton: Option<&(AhoCorasick, Vec<usize>)>,
    ) -> Vec<(&'a str, Option<u32>)> {
        let Some((ac, index)) = automaton else {
            return vec![(text, None)];
        };
        let mut out = Vec::new();
        let mut offset = 0;
        for m in ac.find_iter(text) {
            let (mut start, mut stop) = (m.start(), m.end());
            let t = &self.added[index[m.pattern().as_usize()]];
            if t.single_word {
                let start_space = start == 0 || !self.word_end.is_match(&text[..start]);
                let stop_space = stop == text.len() || !self.word_start.is_match(&text[stop..]);
                if !(start_space && stop_space) {
                    continue;
                }
            }
            if t.lstrip {
                let head = &text[..start];
                let trimmed = head.trim_end_matches(char::is_whitespace).len();
                start = trimmed.max(offset);
            }
            if t.rstrip {
                let tail = &text[stop..];
                stop += tail.len() - tail.trim_start_matches(char::is_whitespace).len();
            }
            if offset < start {
                out.push((&text[offset..start], None));
            }
            out.push((&text[start..stop], Some(t.id)));
            offset = stop;
        }
        if offset < text.len() {
            out.push((&text[offset..], None));
        }
        out
    }

    /// The pre-tokenizer's pieces of normalized text, then BPE on each.
    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) {
        let mut at = 0;
        while at < text.len() {
            let m = self
                .split
                .find_at(text, at)
                .expect("every character matches");
            let mut end = m.end();
            let piece = &text[m.start()..end];
            // `\s+(?!\S)` before `\s+`: a whitespace run (not ending in CR/LF, which the
            // `\s*[\r\n]+` alternative took) followed by a non-space leaves its last char
            // to the next piece when it has more than one.
            if piece.chars().all(char::is_whitespace)
                && !piece.ends_with(['\r', '\n'])
                && end < text.len()
            {
                let last = piece.chars().next_back().expect("non-empty").len_utf8();
                if piece.len() > last {
                    end -= last;
                }
            }
            self.bpe(&text[m.start()..end], ids);
            at = end;
        }
    }

    /// Byte-level BPE of one piece (`tokenizers`' `Word::merge_all` without dropout).
    fn bpe(&self, piece: &str, ids: &mut Vec<u32>) {
        let mut syms: Vec<u32> = piece.bytes().map(|b| self.byte_ids[b as usize]).collect();
        if syms.len() > 1 {
            merge_all(&mut syms, &self.merges);
        }
        ids.extend_from_slice(&syms);
    }
}

/// Merges by rank, lowest first and leftmost on ties, over a linked list of symbols.
fn merge_all(syms: &mut Vec<u32>, merges: &HashMap<(u32, u32), (u32, u32)>) {
    use std::cmp::Reverse;
    let n = syms.len();
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut alive = vec![true; n];
    let mut heap = BinaryHeap::new();
    for i in 0..n - 1 {
        if let Some(&(rank, new)) = merges.get(&(syms[i], syms[i + 1])) {
            heap.push(Reverse((rank, i, new)));
        }
    }
    while let Some(Reverse((_, pos, new))) = heap.pop() {
        if !alive[pos] || next[pos] >= n {
            continue;
        }
        let right = next[pos];
        // A stale entry: the pair at `pos` changed since it was queued.
        if merges.get(&(syms[pos], syms[right])).map(|m| m.1) != Some(new) {
            continue;
        }
        syms[pos] = new;
        alive[right] = false;
        next[pos] = next[right];
        if next[pos] < n {
            prev[next[pos]] = pos;
        }
        let p = prev[pos];
        if p < n {
            if let Some(&(rank, m)) = merges.get(&(syms[p], syms[pos])) {
                heap.push(Reverse((rank, p, m)));
            }
        }
        if next[pos] < n {
            if let Some(&(rank, m)) = merges.get(&(syms[pos], syms[next[pos]])) {
                heap.push(Reverse((rank, pos, m)));
            }
        }
    }
    let mut out = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        out.push(syms[i]);
        i = next[i];
    }
    *syms = out;
}

/// The ids a `TemplateProcessing` post-processor puts around a single sequence (none for
/// `ByteLevel` or absent).
fn post_processor(v: Option<&Value>, file: &str) -> Result<(Vec<u32>, Vec<u32>), TextError> {
    let err = |r: String| TextError::new(file, format!("post_processor: {r}"));
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok((vec![], vec![]));
    };
    match v.get("type").and_then(|t| t.as_str()) {
        Some("ByteLevel") => Ok((vec![], vec![])),
        Some("TemplateProcessing") => {
            let (mut prefix, mut suffix, mut seen) = (vec![], vec![], false);
            let single = v
                .get("single")
                .and_then(|s| s.as_array())
                .ok_or_else(|| err("TemplateProcessing without single".into()))?;
            for piece in single {
                if piece.get("Sequence").is_some() {
                    seen = true;
                } else if let Some(name) = piece
                    .get("SpecialToken")
                    .and_then(|s| s.get("id"))
                    .and_then(|s| s.as_str())
                {
                    let ids = v
                        .get("special_tokens")
                        .and_then(|s| s.get(name))
                        .and_then(|s| s.get("ids"))
                        .and_then(|s| s.as_array())
                        .ok_or_else(|| err(format!("special token {name:?} without ids")))?;
                    let into = if seen { &mut suffix } else { &mut prefix };
                    for id in ids {
                        into.push(
                            id.as_u64()
                                .and_then(|i| u32::try_from(i).ok())
                                .ok_or_else(|| err(format!("{name:?}: bad id {id}")))?,
                        );
                    }
                } else {
                    return Err(err(format!("unknown template piece {piece}")));
                }
            }
            Ok((prefix, suffix))
        }
        other => Err(err(format!(
            "type {other:?}: expected TemplateProcessing or ByteLevel (what Qwen2Tokenizer saves)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2s() {
        let t = byte_chars();
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[b' ' as usize], '\u{120}');
        assert_eq!(t[b'\n' as usize], '\u{10a}');
        assert_eq!(t[0], '\u{100}');
        assert_eq!(t[0xad], '\u{143}');
    }

    #[test]
    fn merges_lowest_rank_first_and_leftmost_on_ties() {
        // vocab ids: a=0 b=1 ab=2 aa=3 aab=4
        let merges: HashMap<(u32, u32), (u32, u32)> =
            [((0, 0), (1, 3)), ((0, 1), (0, 2)), ((3, 1), (2, 4))]
                .into_iter()
                .collect();
        let mut s = vec![0, 0, 1];
        merge_all(&mut s, &merges);
        assert_eq!(s, [0, 2], "a+b outranks a+a");
        let mut s = vec![0, 0, 0];
        merge_all(&mut s, &merges);
        assert_eq!(s, [3, 0], "the leftmost a+a merges first");
    }
}
