//! Token ids against upstream's Qwen2Tokenizer (golden/tokenizer-qwen2, made by
//! tools/goldens/vla_goldens/upstream_tokenizer_goldens.py in the upstream venv).

use std::path::PathBuf;
use vla_text::Tokenizer;

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../golden/tokenizer-qwen2")
}

fn load() -> Tokenizer {
    let dir = golden();
    Tokenizer::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap()
}

fn cases() -> Vec<(String, String, Vec<u32>)> {
    let data: serde_json::Value =
        serde_json::from_slice(&std::fs::read(golden().join("cases.json")).unwrap()).unwrap();
    data["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let ids = c["ids"].as_array().unwrap();
            (
                c["category"].as_str().unwrap().to_string(),
                c["text"].as_str().unwrap().to_string(),
                ids.iter().map(|v| v.as_u64().unwrap() as u32).collect(),
            )
        })
        .collect()
}

#[test]
fn every_golden_string_gives_upstreams_ids() {
    let tok = load();
    let cases = cases();
    assert!(cases.len() >= 300, "{} strings", cases.len());
    let mut wrong = vec![];
    for (category, text, want) in &cases {
        let got = tok.encode(text);
        if &got != want {
            wrong.push(format!(
                "{category} {text:?}: got {got:?}, upstream {want:?}"
            ));
        }
    }
    println!(
        "{} of {} strings agree",
        cases.len() - wrong.len(),
        cases.len()
    );
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn special_tokens_and_their_near_misses() {
    let tok = load();
    let patch = tok.token_to_id("<im_patch>").unwrap();
    assert_eq!(tok.encode("<im_patch>"), [patch]);
    assert_eq!(tok.encode("<im_patch><im_patch>"), [patch, patch]);
    assert!(!tok.encode("<im_patc").contains(&patch));
    let eos = tok.token_to_id("<|im_end|>").unwrap();
    assert!(
        !tok.encode("<|IM_END|>").contains(&eos),
        "specials are case-sensitive"
    );
    assert_eq!(tok.specials().bos, None);
    assert_eq!(tok.specials().eos.as_deref(), Some("<|im_end|>"));
    assert_eq!(tok.specials().pad.as_deref(), Some("<|endoftext|>"));
}

#[test]
fn a_whitespace_run_leaves_its_last_space_to_the_next_word() {
    let tok = load();
    let two_then_word = tok.encode("  robot");
    let one = tok.encode(" ");
    assert_eq!(
        two_then_word[0], one[0],
        "\"  robot\" splits as \" \" + \" robot\""
    );
    assert_eq!(&two_then_word[1..], &tok.encode(" robot")[..]);
}

#[test]
fn a_file_that_is_not_a_byte_level_bpe_is_refused_in_one_line() {
    let stand_in =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../golden/tokenizer/tokenizer.json");
    let msg = Tokenizer::from_files(&stand_in, None)
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("model.type") && !msg.contains('\n'), "{msg}");
}

#[test]
fn arbitrary_text_never_panics_and_gives_ids_of_the_vocabulary() {
    // Text reaches the device from the robot: any UTF-8 must tokenize. Seeded random code
    // points (controls, surrogate-free planes, specials' pieces), lengths 0..400.
    let tok = load();
    let max = tok.token_to_id("<state_255>").unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..300 {
        let len = (next() % 400) as usize;
        let text: String = (0..len)
            .map(|_| match next() % 4 {
                0 => {
                    let pieces = b"<>|_ \t\n\r'sS0";
                    char::from(pieces[(next() % pieces.len() as u64) as usize])
                }
                1 => char::from_u32((next() % 0x80) as u32).unwrap(),
                _ => char::from_u32((next() % 0x11_0000) as u32).unwrap_or('\u{fffd}'),
            })
            .collect();
        let ids = tok.encode(&text);
        assert!(ids.iter().all(|&i| i <= max), "{text:?}");
        assert_eq!(text.is_empty(), ids.is_empty(), "{text:?}");
    }
}
