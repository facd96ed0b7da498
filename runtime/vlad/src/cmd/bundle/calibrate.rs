//! `vlad bundle calibrate DIR --from GATES.json`: writes the per-output parity gates a board
//! bring-up report proposes (`scripts/bringup/report.py` writes `gates.json`: each output's
//! minimum cosine measured on the NPU over N observations, less a stated margin) into the
//! bundle's `bundle.json`, each with the report's SHA-256 in its reason.
//!
//! It runs before `vlad bundle pack` and `sign`: a packed bundle is refused, since changing
//! `bundle.json` would break its signed manifest. Only outputs whose proposal lies below the
//! bundle's default (`parity.context_cosine`) get an entry; the others keep what they have
//! (the default, or an entry already there, such as a card's), and the end-to-end gate is
//! never touched. Nothing is written unless the whole edited
//! manifest validates (context and output names, every gate in (floor, 1]). bundle.json is
//! rewritten whole, its keys in sorted order (the manifest's meaning does not depend on it).

use crate::Failure;
use sha2::{Digest, Sha256};
use std::path::Path;
use vla_policy::{Manifest, RawManifest};

/// The format tag of the bring-up kit's gate proposals.
const REPORT_FORMAT: &str = "vla-bringup-gates/1";

/// One proposal of the report: a context output, or (`context` None) a stage of the
/// end-to-end run.
struct Proposal {
    context: Option<String>,
    output: String,
    measured: f64,
    observations: u64,
    gate: f64,
}

fn refuse(report: &Path, what: impl std::fmt::Display) -> Failure {
    Failure::Error(format!("{}: {what}", report.display()))
}

fn proposals(report: &Path, doc: &serde_json::Value) -> Result<(f64, Vec<Proposal>), Failure> {
    if doc.get("format").and_then(|f| f.as_str()) != Some(REPORT_FORMAT) {
        return Err(refuse(
            report,
            format!("`format` is not {REPORT_FORMAT:?} (a bring-up kit gates.json)"),
        ));
    }
    let margin = doc
        .get("margin")
        .and_then(|m| m.as_f64())
        .ok_or_else(|| refuse(report, "`margin` is not a number"))?;
    let outputs = doc
        .get("outputs")
        .and_then(|o| o.as_array())
        .ok_or_else(|| refuse(report, "`outputs` is not a list"))?;
    // A report without stage proposals has none to apply.
    let empty = Vec::new();
    let stages = match doc.get("stages") {
        None => &empty,
        Some(s) => s
            .as_array()
            .ok_or_else(|| refuse(report, "`stages` is not a list"))?,
    };
    let mut found = Vec::new();
    for (list, items) in [("outputs", outputs), ("stages", stages)] {
        for (i, o) in items.iter().enumerate() {
            let text = |key: &str| {
                o.get(key)
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
                    .ok_or_else(|| refuse(report, format!("{list}[{i}].{key} is not a string")))
            };
            let number = |key: &str| {
                o.get(key)
                    .and_then(|v| v.as_f64())
                    .ok_or_else(|| refuse(report, format!("{list}[{i}].{key} is not a number")))
            };
            let (context, output) = if list == "outputs" {
                (Some(text("context")?), text("output")?)
            } else {
                (None, text("stage")?)
            };
            let observations = o.get("observations").and_then(|v| v.as_u64());
            let measured = number("min_cosine")?;
            let gate = number("proposed_gate")?;
            // A gate above 1 or at 0 is a broken report, not one to read as "the default holds".
            if !(gate > 0.0 && gate <= 1.0) {
                return Err(refuse(
                    report,
                    format!("{list}[{i}].proposed_gate {gate} is not in (0, 1]"),
                ));
            }
            // A gate above what was measured would fail the very runs it came from.
            if gate > measured {
                return Err(refuse(
                    report,
                    format!(
                        "{list}[{i}].proposed_gate {gate} is above its measured minimum {measured}"
                    ),
                ));
            }
            found.push(Proposal {
                context,
                output,
                measured,
                observations: observations.ok_or_else(|| {
                    refuse(report, format!("{list}[{i}].observations is not a count"))
                })?,
                gate,
            });
        }
    }
    Ok((margin, found))
}

/// Every array a context's golden holds, its inputs and outputs alike: a proposal naming
/// none of them is refused here. Which are outputs only the graph knows, and reading it needs
/// the QNN libraries this host step may lack: an entry naming an input is refused when the
/// bundle is gated (before anything runs), not here.
fn golden_arrays(dir: &Path, manifest: &Manifest, context: &str) -> Result<Vec<String>, Failure> {
    let c = &manifest.components[context];
    let npz = vla_npz::Npz::open(dir.join(&c.golden))?;
    Ok(npz.names().map(str::to_owned).collect())
}

/// Applies the proposals of `report` to the bundle in `dir`.
pub fn calibrate(dir: &Path, report: &Path) -> Result<(), Failure> {
    if dir.join(vla_ota::MANIFEST_FILE).exists() {
        return Err(Failure::Error(format!(
            "bundle {} is already packed ({}): calibrate before pack and sign, on a copy without it",
            dir.display(),
            vla_ota::MANIFEST_FILE
        )));
    }
    let bytes = std::fs::read(report)
        .map_err(|e| Failure::Error(format!("cannot read {}: {e}", report.display())))?;
    let hash = vla_ota::hex::encode(&Sha256::digest(&bytes));
    let doc: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| refuse(report, format!("not JSON: {e}")))?;
    let (margin, found) = proposals(report, &doc)?;
    let manifest_path = dir.join("bundle.json");
    let manifest_bytes = std::fs::read(&manifest_path)
        .map_err(|e| Failure::Error(format!("cannot read {}: {e}", manifest_path.display())))?;
    // The bundle as it stands must be valid: what is refused below is the report's doing.
    let bundle = vla_policy::Bundle::open(dir)?;
    for key in ["bundle", "version"] {
        let ours = if key == "bundle" {
            &bundle.manifest.name
        } else {
            &bundle.manifest.version
        };
        if doc.get(key).and_then(|v| v.as_str()) != Some(ours.as_str()) {
            return Err(refuse(
                report,
                format!(
                    "`{key}` is {}, the bundle's is {ours:?}: this report measured another bundle",
                    doc.get(key).unwrap_or(&serde_json::Value::Null)
                ),
            ));
        }
    }
    let mut edited: serde_json::Value = serde_json::from_slice(&manifest_bytes)
        .map_err(|e| Failure::Error(format!("{}: {e}", manifest_path.display())))?;
    let default = bundle.manifest.parity.context_cosine;
    let mut written = Vec::new();
    let end_to_end = vla_npz::Npz::open(dir.join(&bundle.manifest.end_to_end))?;
    for p in &found {
        match &p.context {
            Some(context) => {
                if !bundle.manifest.components.contains_key(context) {
                    return Err(refuse(
                        report,
                        format!("context `{context}` is no component of the bundle"),
                    ));
                }
                if !golden_arrays(dir, &bundle.manifest, context)?.contains(&p.output) {
                    return Err(refuse(
                        report,
                        format!(
                            "output `{}` of context `{context}` is not in its golden",
                            p.output
                        ),
                    ));
                }
            }
            // A stage is gated only where the end-to-end golden stores it.
            None if !end_to_end.contains(&p.output) || p.output == "actions" => {
                return Err(refuse(
                    report,
                    format!(
                        "stage `{}` is not an intermediate the end-to-end golden stores",
                        p.output
                    ),
                ))
            }
            None => {}
        }
        let label = p.context.as_deref().unwrap_or("stage");
        if p.gate >= default {
            // An entry the bundle already has (a card's) is left as it is, and said so.
            let now = match &p.context {
                Some(context) => bundle.manifest.parity.threshold(context, &p.output),
                None => bundle.manifest.parity.stage_threshold(&p.output),
            };
            let kept = match now.entry {
                None => format!("stays at the default {default}"),
                Some((key, _)) => format!("keeps {key} {}", now.cosine),
            };
            println!(
                "  {label:<16} {:<16} measured {:.8} over {}: {kept}",
                p.output, p.measured, p.observations
            );
            continue;
        }
        let reason = format!(
            "calibrated: measured minimum cosine {:.8} over {} observations less margin {margin} (bring-up report sha256 {hash})",
            p.measured, p.observations
        );
        let entry = serde_json::json!({ "cosine": p.gate, "reason": reason });
        match &p.context {
            Some(context) => edited["parity"]["contexts"][context][&p.output] = entry,
            None => edited["parity"]["stages"][&p.output] = entry,
        }
        println!(
            "  {label:<16} {:<16} measured {:.8} over {}: gate {}",
            p.output, p.measured, p.observations, p.gate
        );
        written.push(p);
    }
    let out = serde_json::to_vec_pretty(&edited).expect("JSON of plain values");
    let checked = RawManifest::from_json(&out)
        .map_err(|e| Failure::Error(format!("{}: {e}", manifest_path.display())))?;
    checked.validate().map_err(|invalid| {
        refuse(
            report,
            format!(
                "its gates break the bundle's rules: `{}` {}; nothing written",
                invalid.field, invalid.reason
            ),
        )
    })?;
    let tmp = dir.join(".bundle.json.calibrate");
    std::fs::write(&tmp, [out.as_slice(), b"\n"].concat())
        .and_then(|()| std::fs::rename(&tmp, &manifest_path))
        .map_err(|e| Failure::Error(format!("cannot write {}: {e}", manifest_path.display())))?;
    println!(
        "calibrated {}: {} gate(s) from report sha256 {hash}; pack and sign it next",
        manifest_path.display(),
        written.len()
    );
    Ok(())
}
