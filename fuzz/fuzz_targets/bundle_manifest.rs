//! `bundle.json` (`vla_policy::RawManifest::from_json` + `validate`): any bytes end in a
//! manifest that is safe to act on or in a one-line error naming the field.
//!
//! "Safe to act on" is what `Bundle::open` assumes once `validate` passed: every component
//! the policy needs is listed, and every file the manifest names is a relative path inside
//! the bundle directory.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vla_policy::{PolicyError, RawManifest};

fn assert_one_line(error: &PolicyError) {
    let message = error.to_string();
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "multi-line error: {message:?}"
    );
}

fn assert_inside_bundle(what: &str, rel: &str) {
    let escapes = rel.is_empty() || rel.starts_with('/') || rel.split('/').any(|p| p == "..");
    assert!(
        !escapes,
        "validated manifest names {what} `{rel}` outside the bundle"
    );
}

fuzz_target!(|data: &[u8]| {
    let path = Path::new("bundle.json").to_owned();
    let manifest = match RawManifest::from_json(data) {
        Ok(manifest) => manifest,
        Err(e) => {
            let reason = e.to_string();
            assert_one_line(&PolicyError::ManifestSyntax { path, reason });
            return;
        }
    };
    let manifest = match manifest.validate() {
        Ok(manifest) => manifest,
        Err(invalid) => {
            assert!(!invalid.field.is_empty());
            assert_one_line(&PolicyError::ManifestInvalid { path, invalid });
            return;
        }
    };
    for name in manifest.required_components() {
        assert!(
            manifest.components.contains_key(&name),
            "`{name}` not listed"
        );
    }
    for (name, component) in &manifest.components {
        assert_inside_bundle(name, &component.binary);
        assert_inside_bundle(name, &component.golden);
    }
    assert_inside_bundle("end_to_end", &manifest.end_to_end);
    if let Some(m) = manifest.molmoact2() {
        assert_inside_bundle("molmoact2.prompt", &m.prompt);
    }
    if let Some(f) = manifest.fastwam() {
        if let Some(w) = &f.world_model {
            assert_inside_bundle("fastwam.world_model", w);
        }
        if let Some(c) = &f.chain {
            assert_inside_bundle("fastwam.chain.tables", &c.tables);
        }
    }
});
