//! Prompts rendered by `vla_text::molmoact2` against upstream's processor output
//! (golden/upstream/, made by tools/goldens/vla_goldens/upstream_molmoact2.py and
//! tools/goldens/vla_goldens/upstream_processor_configs.py running lerobot's MolmoAct2 code): token ids, the
//! image block, patch and state rows, padding per upstream version, encoder masks, refusals.

use serde_json::Value;
use std::path::PathBuf;
use vla_text::molmoact2::{normalize_task, ActionMode, RenderError, Template, Upstream};
use vla_text::Tokenizer;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../golden")
}

fn json(path: PathBuf) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn upstream_tokenizer() -> Tokenizer {
    let dir = root().join("upstream/tokenizer");
    Tokenizer::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap()
}

fn template(manifest: &Value, grid: (usize, usize), col: bool) -> Template {
    Template {
        col_tokens: col,
        setup: manifest["setup_type"].as_str().unwrap().into(),
        control: manifest["control_mode"].as_str().unwrap().into(),
        ..Template::libero(2, grid, 8)
    }
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// `want` with the state rows blanked (upstream rendered the state's bins there; the
/// scaffold holds placeholders the runtime replaces per tick).
fn without_states(ids: &[i64], states: &[usize]) -> Vec<i64> {
    let mut v = ids.to_vec();
    states.iter().for_each(|&p| v[p] = -1);
    v
}

#[test]
fn task_text_is_normalized_as_upstream_normalizes_it() {
    let cases = json(root().join("tokenizer-qwen2/cases.json"));
    let cases = cases["cases"].as_array().unwrap();
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let text = c["text"].as_str().unwrap();
            let got = normalize_task(text);
            (got != c["normalized"].as_str().unwrap())
                .then(|| format!("{text:?}: got {got:?}, upstream {}", c["normalized"]))
        })
        .collect();
    println!(
        "{} of {} normalized as upstream",
        cases.len() - wrong.len(),
        cases.len()
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let manifest = json(root().join("upstream/manifest.json"));
    let want: Vec<&str> = manifest["prompts"]["fixture_crop56_nocol"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let got: Vec<String> = manifest["instructions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| normalize_task(t.as_str().unwrap()))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn each_instruction_renders_as_the_upstream_processor_does() {
    let tok = upstream_tokenizer();
    let manifest = json(root().join("upstream/manifest.json"));
    let bos = manifest["bos_token_id_used"].as_i64().unwrap();
    for (file, prefix, grid, col) in [
        ("prompts_fixture.npz", "", (2, 2), false),
        ("prompts_fixture.npz", "col_", (2, 2), true),
        ("prompts_real.npz", "", (14, 14), false),
        ("prompts_real.npz", "col_", (14, 14), true),
    ] {
        let npz = vla_npz::Npz::open(root().join("upstream").join(file)).unwrap();
        let get = |name: &str| npz.array(&format!("{prefix}{name}")).unwrap();
        let (ids, lengths, types, patches) = (
            get("input_ids"),
            get("lengths").to_i64().unwrap(),
            get("token_type_ids"),
            get("im_patch_positions"),
        );
        let width = ids.shape()[1];
        let (ids, types, patches) = (
            ids.to_i64().unwrap(),
            types.to_i64().unwrap(),
            patches.to_i64().unwrap(),
        );
        let t = template(&manifest, grid, col);
        let n_img = t.image_tokens();
        for (i, text) in manifest["instructions"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let n = lengths[i] as usize;
            let r = t.render(&tok, text.as_str().unwrap()).unwrap();
            let want = &ids[i * width..i * width + n];
            let got: Vec<i64> = r.ids.iter().map(|&x| x as i64).collect();
            assert_eq!(
                without_states(&got, &r.state_positions),
                without_states(want, &r.state_positions),
                "{file} {prefix} instruction {i}"
            );
            assert_eq!(got[0], bos);
            let block: Vec<i64> = r.image_block.iter().map(|&x| x as i64).collect();
            assert_eq!(&block[..], &types[i * width..i * width + n]);
            let pos: Vec<i64> = r.image_positions.iter().map(|&x| x as i64).collect();
            assert_eq!(&pos[..], &patches[i * n_img..(i + 1) * n_img]);
            assert_eq!(r.pad, 0);
        }
    }
}

#[test]
fn each_upstream_versions_pack_step_is_followed() {
    let tok = upstream_tokenizer();
    let manifest = json(root().join("upstream/processors/manifest.json"));
    for version in Upstream::NAMES {
        let golden = json(root().join(format!("upstream/processors/pack_{version}.json")));
        let mut t = template(&manifest, (2, 2), false);
        t.upstream = Upstream::from_name(version).unwrap();
        t.action_mode = ActionMode::Continuous;
        let mut pads = std::collections::BTreeSet::new();
        for (text, row) in golden["instructions"]
            .as_array()
            .unwrap()
            .iter()
            .zip(golden["rows"].as_array().unwrap())
        {
            let want = ints(&row["input_ids"]);
            let r = t.render(&tok, text.as_str().unwrap()).unwrap();
            let (rows, pad) = t.upstream.layout(r.ids.len());
            assert_eq!((rows, pad), (want.len(), r.pad), "{version} {text}");
            pads.insert(pad);
            let mut got = vec![-1i64; pad];
            got.extend(r.ids.iter().map(|&x| x as i64));
            let states: Vec<usize> = r.state_positions.iter().map(|p| p + pad).collect();
            // Upstream's padding rows hold PAD; the tables hold PAD there too.
            let pad_id = tok.token_to_id("<|endoftext|>").unwrap() as i64;
            got[..pad].iter_mut().for_each(|x| *x = pad_id);
            assert_eq!(
                without_states(&got, &states),
                without_states(&want, &states),
                "{version} {text}"
            );
            let mut valid = vec![0i64; pad];
            valid.extend(std::iter::repeat_n(1, r.ids.len()));
            assert_eq!(valid, ints(&row["attention_mask"]), "{version} {text}");
            let mut block = vec![0i64; pad];
            block.extend(r.image_block.iter().map(|&x| x as i64));
            assert_eq!(block, ints(&row["token_type_ids"]), "{version} {text}");
        }
        let want: std::collections::BTreeSet<usize> = if version == "lerobot-0.6.1" {
            [0].into()
        } else {
            [0, 1, 4, 7].into()
        };
        assert_eq!(pads, want, "{version}");
        for case in golden["cap_refusals"].as_array().unwrap() {
            t.max_sequence_length = Some(case["cap"].as_u64().unwrap() as usize);
            let got = t.render(&tok, case["instruction"].as_str().unwrap());
            match case["error"].as_str() {
                None => assert!(got.is_ok(), "{version} {case}"),
                Some(_) => {
                    let msg = got.unwrap_err().to_string();
                    assert!(
                        msg.contains("above max_sequence_length"),
                        "{version} {case}: {msg}"
                    );
                }
            }
        }
    }
}

#[test]
fn special_token_text_in_an_instruction_is_rendered_and_masked_as_upstream() {
    let tok = upstream_tokenizer();
    let manifest = json(root().join("upstream/processors/manifest.json"));
    let special = manifest["special"].as_object().unwrap();
    let mut refused = 0;
    for (text, golden) in special {
        let want = ints(&golden["input_ids"]);
        for (mode, key) in [
            (ActionMode::Both, "encoder_mask_both"),
            (ActionMode::Continuous, "encoder_mask_continuous"),
        ] {
            let mut t = template(&manifest, (2, 2), false);
            t.action_mode = mode;
            let got = t.render(&tok, text);
            if !golden["upstream_error"].is_null() {
                assert!(
                    matches!(got, Err(RenderError::PatchText { .. })),
                    "{text}: {got:?}"
                );
                refused += 1;
                continue;
            }
            let r = got.unwrap();
            let states: Vec<usize> = ints(&golden["state_positions"])
                .iter()
                .map(|&x| x as usize)
                .collect();
            assert_eq!(r.state_positions, states, "{text}");
            let ids: Vec<i64> = r.ids.iter().map(|&x| x as i64).collect();
            assert_eq!(
                without_states(&ids, &states),
                without_states(&want, &states),
                "{text}"
            );
            let block: Vec<i64> = r.image_block.iter().map(|&x| x as i64).collect();
            assert_eq!(block, ints(&golden["token_type_ids"]), "{text}");
            let mask: Vec<i64> = r.encoder_mask.iter().map(|&x| x as i64).collect();
            assert_eq!(mask, ints(&golden[key]), "{text} {key}");
        }
    }
    assert_eq!(refused, 2, "the <im_patch> case, under both modes");
}
