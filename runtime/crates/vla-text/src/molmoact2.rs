//! MolmoAct2's prompt, rendered from an instruction's text as upstream's host glue renders it
//! (LeRobot's `processor_molmoact2.py` `_build_robot_text` and the HF `MolmoAct2Processor`):
//! the task normalized, setup and control text wrapped in their markers, one `<|image|>` per
//! camera expanded to `<im_start>`, rows of `<im_patch>` (+ `<im_col>`) and `<im_end>`, the
//! state clause as `<state_0>` placeholders, tokenized, BOS inserted, laid out (left padding)
//! as the `upstream` version's pack step lays out one prompt at batch 1.
//!
//! The result is what the prompt tables hold per instruction: ids, the valid rows, the
//! image block (`token_type_ids`), the action expert's encoder mask, and the rows that take
//! the image features and the state tokens. Refusals name the reason in one line.

use crate::Tokenizer;
use std::fmt;

/// LIBERO's setup and control text (the checkpoint's norm-stats `setup_type`, `control_mode`).
pub const SETUP: &str = "single franka robotic arm in libero";
/// See [`SETUP`].
pub const CONTROL: &str = "delta end-effector pose";
const IMAGE_PROMPT: &str = "<|image|>";
const IM_PATCH: &str = "<im_patch>";
/// Every token the processor marks in `token_type_ids` (the bidirectional image block).
const IMAGE_TOKENS: [&str; 8] = [
    "<im_patch>",
    "<im_col>",
    "<im_start>",
    "<low_res_im_start>",
    "<frame_start>",
    "<im_end>",
    "<frame_end>",
    "<im_low>",
];
const STATE_START: &str = "<state_start>";
const STATE_END: &str = "<state_end>";

/// The upstream versions whose host glue the renderer follows, and how each pads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// lerobot 0.6.1 (the pin): no padding at batch 1; `action_mode` default "both".
    Lerobot061,
    /// lerobot main at c13d79e: the text left-padded to a multiple of 8, then BOS;
    /// `action_mode` default "continuous".
    LerobotMainC13d79e,
}

impl Upstream {
    /// The names the tables and bundles record.
    pub const NAMES: [&'static str; 2] = ["lerobot-0.6.1", "lerobot-main-c13d79e"];

    /// A recorded name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "lerobot-0.6.1" => Some(Self::Lerobot061),
            "lerobot-main-c13d79e" => Some(Self::LerobotMainC13d79e),
            _ => None,
        }
    }

    /// The recorded name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lerobot061 => Self::NAMES[0],
            Self::LerobotMainC13d79e => Self::NAMES[1],
        }
    }

    fn pad_multiple(self) -> Option<usize> {
        match self {
            Self::Lerobot061 => None,
            Self::LerobotMainC13d79e => Some(8),
        }
    }

    /// `(rows, rows of left padding)` the pack step gives one prompt of `tokens` tokens
    /// (BOS included) at batch 1.
    pub fn layout(self, tokens: usize) -> (usize, usize) {
        match self.pad_multiple() {
            None => (tokens, 0),
            Some(m) => {
                let text = tokens - 1;
                let width = text.div_ceil(m) * m;
                (width + 1, width - text)
            }
        }
    }

    /// Why the pack step refuses a prompt of `tokens` real tokens in `rows` rows under
    /// `max_sequence_length` `cap`, or None.
    pub fn over_cap(self, tokens: usize, rows: usize, cap: usize) -> Option<String> {
        match self.pad_multiple() {
            None => (rows > cap).then(|| format!("{rows} rows, above max_sequence_length {cap}")),
            Some(m) => {
                if tokens > cap {
                    return Some(format!("{tokens} tokens, above max_sequence_length {cap}"));
                }
                let bound = cap.saturating_sub(1).div_ceil(m) * m + 1;
                (rows > bound)
                    .then(|| format!("{rows} padded rows, above the bounded width {bound}"))
            }
        }
    }
}

/// Whether the action expert also masks EOS rows and `<action_start>` spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionMode {
    /// The attention mask alone.
    Continuous,
    /// Also every EOS row and each `<action_start>`..`<action_end>` span.
    Both,
}

/// Everything but the instruction that decides a prompt.
#[derive(Clone, Debug)]
pub struct Template {
    /// Camera images, each one `<|image|>`.
    pub cameras: usize,
    /// Pooled patch grid per camera `(rows, cols)`.
    pub grid: (usize, usize),
    /// `<im_col>` after each row of patches.
    pub col_tokens: bool,
    /// State dims, one `<state_k>` row each.
    pub state_dims: usize,
    /// Setup text.
    pub setup: String,
    /// Control mode text.
    pub control: String,
    /// Wrap setup in `<setup_start>`..`<setup_end>`.
    pub add_setup_tokens: bool,
    /// Wrap control in `<control_start>`..`<control_end>`.
    pub add_control_tokens: bool,
    /// Normalize the task text.
    pub normalize_language: bool,
    /// Whose padding and cap rules apply.
    pub upstream: Upstream,
    /// The pack step's cap on the prompt, when the checkpoint states one.
    pub max_sequence_length: Option<usize>,
    /// The checkpoint's action mode.
    pub action_mode: ActionMode,
}

/// A prompt that upstream would refuse or the bundle cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderError {
    /// The tokenizer lacks a token the template needs.
    MissingToken(String),
    /// The instruction holds `<im_patch>` text: upstream would find more patch rows than
    /// image features.
    PatchText {
        /// Patch rows found.
        found: usize,
        /// Image features the cameras give.
        expected: usize,
    },
    /// The state clause was not found as `state_dims` rows.
    StateRows {
        /// Rows found.
        found: usize,
        /// State dims.
        expected: usize,
    },
    /// Above the pack step's `max_sequence_length`.
    OverCap(String),
    /// Not the length the exported contexts bake RoPE positions for.
    Length {
        /// Tokens the instruction renders to (BOS included).
        tokens: usize,
        /// Rows of that layout.
        rows: usize,
        /// Left padding of that layout.
        pad: usize,
        /// The contexts' sequence length.
        seq_len: usize,
        /// The contexts' left padding.
        rope_left_pad: usize,
    },
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingToken(t) => write!(f, "the tokenizer has no token {t:?}"),
            Self::PatchText { found, expected } => write!(
                f,
                "{found} <im_patch> rows but the images give {expected} features (<im_patch> text \
                 in the instruction): upstream refuses it"
            ),
            Self::StateRows { found, expected } => {
                write!(f, "{found} state rows, expected {expected}")
            }
            Self::OverCap(why) => write!(f, "{why}: the pack step refuses such a prompt"),
            Self::Length {
                tokens,
                rows,
                pad,
                seq_len,
                rope_left_pad,
            } => write!(
                f,
                "renders to {tokens} tokens ({rows} rows after {pad} rows of padding), but the \
                 contexts bake RoPE positions for {} tokens after {rope_left_pad} rows (seq_len \
                 {seq_len}): it would run with shifted positions",
                seq_len - rope_left_pad
            ),
        }
    }
}

impl std::error::Error for RenderError {}

/// One rendered instruction, unpadded (BOS first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// Token ids (the state rows hold `<state_0>`).
    pub ids: Vec<u32>,
    /// 1 where the token is an image special token.
    pub image_block: Vec<u8>,
    /// The action expert's encoder mask.
    pub encoder_mask: Vec<u8>,
    /// Rows that receive the image features, in order.
    pub image_positions: Vec<usize>,
    /// Rows of the state clause, in dim order.
    pub state_positions: Vec<usize>,
    /// Rows of left padding the `upstream` layout puts before these.
    pub pad: usize,
}

/// Python's `str.isspace` (what `re`'s `\s` and `str.strip()` use): Unicode White_Space
/// plus the four information separators U+001C..U+001F.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `re.IGNORECASE` equality of a text char with an ASCII lowercase pattern letter: the
/// char's simple lowercase, plus `sre`'s equivalences (dotless i, long s).
fn ci(c: char, p: char) -> bool {
    let lower = match c {
        '\u{130}' => 'i',
        '\u{131}' if p == 'i' => 'i',
        '\u{17f}' if p == 's' => 's',
        _ => {
            let mut l = c.to_lowercase();
            match (l.next(), l.next()) {
                (Some(x), None) => x,
                _ => c,
            }
        }
    };
    lower == p
}

/// Matches `words` (separated by `\s+`, case-insensitive) at the start of `t`; the byte
/// length matched.
fn match_words(t: &str, words: &[&str]) -> Option<usize> {
    let mut chars = t.char_indices().peekable();
    for (k, w) in words.iter().enumerate() {
        if k > 0 {
            let mut n = 0;
            while chars.next_if(|&(_, c)| py_space(c)).is_some() {
                n += 1;
            }
            if n == 0 {
                return None;
            }
        }
        for p in w.chars() {
            match chars.next() {
                Some((_, c)) if c == p || ci(c, p) => {}
                _ => return None,
            }
        }
    }
    Some(chars.peek().map(|&(i, _)| i).unwrap_or(t.len()))
}

fn skip_space(t: &str) -> &str {
    t.trim_start_matches(py_space)
}

/// The two prefix patterns of `_normalize_question_text`, each removed once (with `.strip()`).
fn strip_prefixes(mut t: String) -> String {
    // ^(?:task|instruction|language[_ ]instruction|goal)\s*[:\-]\s*
    let first = [
        &["task"][..],
        &["instruction"],
        &["language_instruction"],
        &["language", "instruction"],
        &["goal"],
    ];
    for words in first {
        // `language[_ ]instruction` takes exactly one space: the `\s+` of match_words is
        // only right after whitespace collapsing, where runs are single spaces.
        if let Some(n) = match_words(&t, words) {
            let rest = skip_space(&t[n..]);
            if let Some(rest) = rest.strip_prefix([':', '-']) {
                t = skip_space(rest).trim_matches(py_space).to_string();
                break;
            }
        }
    }
    // ^(?:the\s+task\s+is\s+to|your\s+task\s+is\s+to)\s+
    for words in [
        &["the", "task", "is", "to"][..],
        &["your", "task", "is", "to"],
    ] {
        if let Some(n) = match_words(&t, words) {
            let rest = &t[n..];
            if rest.starts_with(py_space) {
                t = skip_space(rest).trim_matches(py_space).to_string();
                break;
            }
        }
    }
    t
}

/// Upstream `_normalize_question_text`: whitespace collapsed; surrounding quotes and
/// brackets, "task:"-style prefixes and trailing punctuation stripped until nothing changes;
/// several sentences joined with "; "; lowercased.
pub fn normalize_task(text: &str) -> String {
    const TRAILING_PUNCT: &[char] = &['.', ',', '!', '?', ';', ':', '\u{2026}'];
    const CLOSERS: &[char] = &['"', '\'', '\u{201d}', '\u{2019}', ')', ']', '}'];
    const SURROUNDING: &[char] = &[
        '"', '\'', '`', '\u{201c}', '\u{201d}', '\u{2018}', '\u{2019}', '[', ']', '(', ')', '{',
        '}',
    ];
    let mut t = String::with_capacity(text.len());
    let mut in_space = false;
    for c in text.chars() {
        if py_space(c) {
            if !in_space {
                t.push(' ');
            }
            in_space = true;
        } else {
            t.push(c);
            in_space = false;
        }
    }
    let mut t = t.trim_matches(py_space).to_string();
    let mut previous: Option<String> = None;
    while !t.is_empty() && previous.as_deref() != Some(&t) {
        previous = Some(t.clone());
        t = t
            .trim_matches(py_space)
            .trim_matches(SURROUNDING)
            .trim_matches(py_space)
            .to_string();
        t = strip_prefixes(t);
        t = t
            .trim_end_matches(TRAILING_PUNCT)
            .trim_end_matches(py_space)
            .trim_end_matches(CLOSERS)
            .trim_end_matches(py_space)
            .trim_end_matches(TRAILING_PUNCT)
            .trim_end_matches(py_space)
            .to_string();
    }
    let chunks: Vec<&str> = t
        .split(['.', '!', '?'])
        .map(|c| c.trim_matches(py_space))
        .filter(|c| !c.is_empty())
        .collect();
    if chunks.len() > 1 {
        t = chunks.join("; ");
    }
    t.to_lowercase()
}

fn wrap(text: &str, start: &str, end: &str, add: bool) -> String {
    if (text.starts_with(start) && text.ends_with(end)) || text.is_empty() || !add {
        text.to_string()
    } else {
        format!("{start}{text}{end}")
    }
}

impl Template {
    /// The template of the LIBERO checkpoints for `cameras` of `grid` patches and
    /// `state_dims`: column tokens, LIBERO's setup and control texts ([`SETUP`],
    /// [`CONTROL`]) each wrapped in its tokens, normalized language, lerobot 0.6.1's rules,
    /// no cap on the prompt, both action modes.
    pub fn libero(cameras: usize, grid: (usize, usize), state_dims: usize) -> Self {
        Template {
            cameras,
            grid,
            col_tokens: true,
            state_dims,
            setup: SETUP.into(),
            control: CONTROL.into(),
            add_setup_tokens: true,
            add_control_tokens: true,
            normalize_language: true,
            upstream: Upstream::Lerobot061,
            max_sequence_length: None,
            action_mode: ActionMode::Both,
        }
    }

    fn state_clause(&self, k: usize) -> String {
        format!(
            "{STATE_START}{}{STATE_END}",
            format!("<state_{k}>").repeat(self.state_dims)
        )
    }

    /// Upstream `_build_robot_text` as the pack step calls it, images as `<|image|>`.
    pub fn render_text(&self, task: &str) -> String {
        let task = if self.normalize_language {
            normalize_task(task)
        } else {
            task.to_string()
        };
        let setup = wrap(
            &self.setup,
            "<setup_start>",
            "<setup_end>",
            self.add_setup_tokens,
        );
        let control = wrap(
            &self.control,
            "<control_start>",
            "<control_end>",
            self.add_control_tokens,
        );
        let body = format!(
            "The task is to {task}. The setup is {setup}. The current state of the robot is {}. \
             The expected control mode is {control}. Given these, what action should the robot \
             take to complete the task?",
            self.state_clause(0)
        );
        let images = match self.cameras {
            0 => String::new(),
            1 => IMAGE_PROMPT.to_string(),
            n => (1..=n)
                .map(|i| format!("Image {i}{IMAGE_PROMPT}"))
                .collect(),
        };
        format!(
            "{images}<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n<action_output>"
        )
    }

    /// The full text upstream tokenizes: the first `cameras` placeholders expanded.
    pub fn render_prompt(&self, task: &str) -> String {
        let (rows, cols) = self.grid;
        let row = format!(
            "{}{}",
            IM_PATCH.repeat(cols),
            if self.col_tokens { "<im_col>" } else { "" }
        );
        let image = format!("<im_start>{}<im_end>", row.repeat(rows));
        self.render_text(task)
            .replacen(IMAGE_PROMPT, &image, self.cameras)
    }

    /// Image features the cameras give.
    pub fn image_tokens(&self) -> usize {
        self.cameras * self.grid.0 * self.grid.1
    }

    /// Renders and tokenizes one instruction, refusing what upstream refuses.
    pub fn render(&self, tok: &Tokenizer, task: &str) -> Result<Rendered, RenderError> {
        let id = |t: &str| {
            tok.token_to_id(t)
                .ok_or_else(|| RenderError::MissingToken(t.into()))
        };
        let sp = tok.specials();
        let eos = id(sp
            .eos
            .as_deref()
            .ok_or_else(|| RenderError::MissingToken("EOS (null)".into()))?)?;
        let bos = match sp.bos.as_deref() {
            Some(b) => id(b)?,
            None => eos,
        };
        let patch = id(IM_PATCH)?;
        let prompt = self.render_prompt(task);
        let encode = |text: &str| {
            let mut ids = tok.encode(text);
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
            ids
        };
        let ids = encode(&prompt);
        let (rows, pad) = self.upstream.layout(ids.len());
        if let Some(cap) = self.max_sequence_length {
            if let Some(why) = self.upstream.over_cap(ids.len(), rows, cap) {
                return Err(RenderError::OverCap(why));
            }
        }
        // The state clause's rows: where the prompt with every state at bin 1 differs (a
        // `<state_0>` in the instruction itself is text, as upstream renders it).
        let clause = self.state_clause(0);
        let state_positions = match prompt.rfind(&clause) {
            Some(at) => {
                let probe = format!(
                    "{}{}{}",
                    &prompt[..at],
                    self.state_clause(1),
                    &prompt[at + clause.len()..]
                );
                let probe = encode(&probe);
                if probe.len() == ids.len() {
                    (0..ids.len()).filter(|&i| ids[i] != probe[i]).collect()
                } else {
                    vec![]
                }
            }
            None => vec![],
        };
        if state_positions.len() != self.state_dims {
            return Err(RenderError::StateRows {
                found: state_positions.len(),
                expected: self.state_dims,
            });
        }
        let image_positions: Vec<usize> = (0..ids.len()).filter(|&i| ids[i] == patch).collect();
        if image_positions.len() != self.image_tokens() {
            return Err(RenderError::PatchText {
                found: image_positions.len(),
                expected: self.image_tokens(),
            });
        }
        let block: Vec<u32> = IMAGE_TOKENS
            .iter()
            .filter_map(|t| tok.token_to_id(t))
            .collect();
        let image_block = ids.iter().map(|i| u8::from(block.contains(i))).collect();
        let mut encoder_mask = vec![1u8; ids.len()];
        if self.action_mode == ActionMode::Both {
            for (m, &i) in encoder_mask.iter_mut().zip(&ids) {
                if i == eos {
                    *m = 0;
                }
            }
            if let (Some(start), Some(end)) = (
                tok.token_to_id("<action_start>"),
                tok.token_to_id("<action_end>"),
            ) {
                mask_action_spans(&ids, &mut encoder_mask, start, end);
            }
        }
        Ok(Rendered {
            ids,
            image_block,
            encoder_mask,
            image_positions,
            state_positions,
            pad,
        })
    }
}

/// Upstream `_mask_discrete_output_span`: each `<action_start>` masks through the next
/// `<action_end>`, or to the end when none follows.
fn mask_action_spans(ids: &[u32], mask: &mut [u8], start: u32, end: u32) {
    let ends: Vec<usize> = (0..ids.len()).filter(|&i| ids[i] == end).collect();
    let mut e = 0;
    for s in (0..ids.len()).filter(|&i| ids[i] == start) {
        while e < ends.len() && ends[e] < s {
            e += 1;
        }
        if e >= ends.len() {
            mask[s..].iter_mut().for_each(|m| *m = 0);
            return;
        }
        mask[s..=ends[e]].iter_mut().for_each(|m| *m = 0);
        e += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_follows_pythons_whitespace_and_case_rules() {
        assert_eq!(
            normalize_task("\"Task: Turn on the stove.\""),
            "turn on the stove"
        );
        assert_eq!(
            normalize_task("Open the drawer. Put the bowl inside! Close it?"),
            "open the drawer; put the bowl inside; close it"
        );
        // U+001F is whitespace to Python, not to Unicode's White_Space.
        assert_eq!(normalize_task("a\u{1f}\u{1f}b"), "a b");
        // Python's re.IGNORECASE matches dotless i and long s.
        assert_eq!(normalize_task("goal: x"), "x");
        assert_eq!(normalize_task("\u{130}nstruction - y"), "y");
        assert_eq!(normalize_task("ta\u{17f}k: z"), "z");
        assert_eq!(normalize_task("your task is to  go"), "go");
    }

    #[test]
    fn layouts_pad_to_a_multiple_of_eight_before_bos() {
        assert_eq!(Upstream::Lerobot061.layout(121), (121, 0));
        assert_eq!(Upstream::LerobotMainC13d79e.layout(121), (121, 0));
        assert_eq!(Upstream::LerobotMainC13d79e.layout(122), (129, 7));
    }
}
