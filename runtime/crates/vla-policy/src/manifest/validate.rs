//! The manifest's rules that need no file: every dimension positive and addressable,
//! the policy's own constraints, and every named path inside the bundle.

use super::*;

fn positive(field: &str, v: usize) -> Result<(), Invalid> {
    if v == 0 {
        return Err(invalid(field, "must be at least 1"));
    }
    Ok(())
}

/// The pipelines size f32 buffers by products of manifest dims: each product must be
/// addressable, so that no size overflows or wraps before the contexts are checked.
fn addressable(field: &str, factors: &[usize]) -> Result<(), Invalid> {
    let bytes = factors
        .iter()
        .try_fold(4usize, |acc, &factor| acc.checked_mul(factor))
        .filter(|&bytes| bytes <= isize::MAX as usize);
    if bytes.is_none() {
        return Err(invalid(
            field,
            format!("with {factors:?} makes a tensor too large to address"),
        ));
    }
    Ok(())
}

impl Normalization {
    fn validate(&self, field: &str, dims: usize) -> Result<(), Invalid> {
        let need = |key: &str, v: &Option<Vec<f32>>| -> Result<(), Invalid> {
            match v {
                None => Err(invalid(
                    format!("{field}.{key}"),
                    format!("required for mode {:?}", self.mode),
                )),
                Some(v) if v.len() != dims => Err(invalid(
                    format!("{field}.{key}"),
                    format!("has {} values, expected {dims}", v.len()),
                )),
                Some(v) if v.iter().any(|x| !x.is_finite()) => Err(invalid(
                    format!("{field}.{key}"),
                    "holds a non-finite value",
                )),
                Some(_) => Ok(()),
            }
        };
        if let Some(eps) = self.eps {
            if self.follows != NormFollows::LerobotPipeline {
                return Err(invalid(
                    format!("{field}.eps"),
                    "is LeRobot's normalizer setting: set `follows` to `lerobot_pipeline` or drop it",
                ));
            }
            if !(eps.is_finite() && eps > 0.0) {
                return Err(invalid(
                    format!("{field}.eps"),
                    format!("{eps} is not a positive finite value"),
                ));
            }
        }
        if self.follows == NormFollows::LerobotPipeline {
            if let Some(i) = self.constant.iter().flatten().position(|&c| c) {
                return Err(invalid(
                    format!("{field}.constant[{i}]"),
                    "is true, but LeRobot's pipeline has no zero mask (it divides by its eps)",
                ));
            }
        }
        match self.mode {
            NormMode::Quantile | NormMode::MinMax => {
                need("low", &self.low)?;
                need("high", &self.high)?;
                let (lo, hi) = (self.low.as_ref().unwrap(), self.high.as_ref().unwrap());
                let passthrough = self.passthrough.as_deref();
                for i in 0..dims {
                    let passes = passthrough.is_some_and(|p| p.get(i) == Some(&true));
                    // Equal is a constant dim (the range is floored); below is a mistake.
                    if !passes && hi[i] < lo[i] {
                        return Err(invalid(
                            format!("{field}.high[{i}]"),
                            format!("{} is below low {}", hi[i], lo[i]),
                        ));
                    }
                }
            }
            NormMode::MeanStd => {
                need("mean", &self.mean)?;
                need("std", &self.std)?;
                if let Some(i) = self.std.as_ref().unwrap().iter().position(|s| *s < 0.0) {
                    return Err(invalid(format!("{field}.std[{i}]"), "is negative"));
                }
            }
            NormMode::Identity => {}
        }
        for (key, mask) in [
            ("passthrough", &self.passthrough),
            ("constant", &self.constant),
        ] {
            if let Some(p) = mask {
                if p.len() != dims {
                    return Err(invalid(
                        format!("{field}.{key}"),
                        format!("has {} values, expected {dims}", p.len()),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl RawManifest {
    /// Checks every rule that does not need the files and makes the [`Manifest`]: the one
    /// place the policy named by `policy` is paired with its settings.
    pub fn validate(self) -> Result<Manifest, Invalid> {
        if self.format != 1 {
            return Err(invalid(
                "format",
                format!(
                    "{} is not supported (this runtime reads format 1)",
                    self.format
                ),
            ));
        }
        // The defaults obey the floor too: else a bundle could pass a wrong binary with no
        // entry at all, by lowering the default the entries are held against.
        for (field, v) in [
            ("parity.context_cosine", self.parity.context_cosine),
            ("parity.end_to_end_cosine", self.parity.end_to_end_cosine),
        ] {
            self.gate_in_range(field, v)?;
        }
        self.output_gates()?;
        let policy = match (self.policy, self.molmoact2, self.fastwam) {
            (PolicyKind::Molmoact2, None, _) => {
                return Err(invalid("molmoact2", "required for policy molmoact2"))
            }
            (PolicyKind::Molmoact2, Some(_), Some(_)) => {
                return Err(invalid("fastwam", "not allowed for policy molmoact2"))
            }
            (PolicyKind::Molmoact2, Some(m), None) => {
                molmoact2(&m)?;
                PolicySettings::Molmoact2(Box::new(m))
            }
            (PolicyKind::Fastwam, _, None) => {
                return Err(invalid("fastwam", "required for policy fastwam"))
            }
            (PolicyKind::Fastwam, Some(_), Some(_)) => {
                return Err(invalid("molmoact2", "not allowed for policy fastwam"))
            }
            (PolicyKind::Fastwam, None, Some(f)) => {
                fastwam(&f)?;
                PolicySettings::Fastwam(Box::new(f))
            }
        };
        let manifest = Manifest {
            format: self.format,
            name: self.name,
            version: self.version,
            policy,
            variant: self.variant,
            soc_model: self.soc_model,
            htp_arch: self.htp_arch,
            min_runtime_version: self.min_runtime_version,
            components: self.components,
            parity: self.parity,
            end_to_end: self.end_to_end,
        };
        manifest.components_present()?;
        manifest.paths_inside_bundle()?;
        Ok(manifest)
    }

    /// Every per-output (and per-stage) threshold names a listed context, is a number in (floor, 1] (the
    /// floor: [`GATE_FLOOR`], or 0 with `allow_low_gate`) and gives a reason. Output names
    /// are checked against the graphs when the bundle is gated (they live in the binaries).
    fn output_gates(&self) -> Result<(), Invalid> {
        for (context, outputs) in &self.parity.contexts {
            if !self.components.contains_key(context) {
                return Err(invalid(
                    format!("parity.contexts.{context}"),
                    format!(
                        "names no component of the bundle (components: {})",
                        self.components
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            if outputs.is_empty() {
                return Err(invalid(
                    format!("parity.contexts.{context}"),
                    "holds no output",
                ));
            }
            for (output, gate) in outputs {
                self.output_gate(&format!("parity.contexts.{context}.{output}"), gate)?;
            }
        }
        for (stage, gate) in &self.parity.stages {
            self.output_gate(&format!("parity.stages.{stage}"), gate)?;
        }
        Ok(())
    }

    /// A gate `v` of `field` lies in (floor, 1]: the floor is [`GATE_FLOOR`], or 0 with
    /// `allow_low_gate`.
    fn gate_in_range(&self, field: &str, v: f64) -> Result<(), Invalid> {
        let floor = if self.parity.allow_low_gate {
            0.0
        } else {
            GATE_FLOOR
        };
        if v > floor && v <= 1.0 {
            return Ok(());
        }
        let why = if self.parity.allow_low_gate {
            format!("{v} is not in (0, 1]")
        } else {
            format!(
                "{v} is not in ({GATE_FLOOR}, 1] (a lower gate needs parity.allow_low_gate, the importer's --allow-low-gate)"
            )
        };
        Err(invalid(field, why))
    }

    /// One entry: a number in (floor, 1] with a reason.
    fn output_gate(&self, field: &str, gate: &OutputGate) -> Result<(), Invalid> {
        let Some(v) = gate.cosine.as_f64() else {
            return Err(invalid(
                format!("{field}.cosine"),
                format!("{} is not a number", gate.cosine),
            ));
        };
        self.gate_in_range(&format!("{field}.cosine"), v)?;
        if gate.reason.trim().is_empty() {
            return Err(invalid(
                format!("{field}.reason"),
                "is empty: say why this has its own gate",
            ));
        }
        Ok(())
    }
}

impl Manifest {
    /// Every context the policy needs is listed.
    fn components_present(&self) -> Result<(), Invalid> {
        for name in self.required_components() {
            if !self.components.contains_key(&name) {
                return Err(invalid(
                    format!("components.{name}"),
                    "missing: the policy needs this context",
                ));
            }
        }
        Ok(())
    }

    /// Every file the manifest names stays inside the bundle.
    fn paths_inside_bundle(&self) -> Result<(), Invalid> {
        for (name, c) in &self.components {
            inside_bundle(|| format!("components.{name}.binary"), &c.binary)?;
            inside_bundle(|| format!("components.{name}.golden"), &c.golden)?;
        }
        inside_bundle(|| "end_to_end".into(), &self.end_to_end)?;
        match &self.policy {
            PolicySettings::Molmoact2(m) => inside_bundle(|| "molmoact2.prompt".into(), &m.prompt)?,
            PolicySettings::Fastwam(f) => {
                if let Some(w) = &f.world_model {
                    inside_bundle(|| "fastwam.world_model".into(), w)?;
                }
                if let Some(c) = &f.chain {
                    inside_bundle(|| "fastwam.chain.tables".into(), &c.tables)?;
                }
            }
        }
        Ok(())
    }
}

/// MolmoAct2's settings, in the order they were always checked.
fn molmoact2(m: &MolmoAct2Settings) -> Result<(), Invalid> {
    molmoact2_dims(m)?;
    molmoact2_rules(m)?;
    if let Some(k) = &m.keystone {
        keystone(k, m.action_horizon)?;
    }
    m.state_norm
        .validate("molmoact2.state_norm", m.state_dims)?;
    m.action_norm
        .validate("molmoact2.action_norm", m.action_dims)?;
    if m.state_norm.follows != m.action_norm.follows {
        return Err(invalid(
            "molmoact2.action_norm.follows",
            format!(
                "is {} while state_norm follows {}: one checkpoint is run by one normalizer",
                m.action_norm.follows.as_str(),
                m.state_norm.follows.as_str()
            ),
        ));
    }
    Ok(())
}

/// Every dimension at least 1, the split limit, and every buffer they size addressable.
fn molmoact2_dims(m: &MolmoAct2Settings) -> Result<(), Invalid> {
    for (f, v) in [
        ("molmoact2.cameras", m.cameras),
        ("molmoact2.frame_height", m.frame_height),
        ("molmoact2.frame_width", m.frame_width),
        ("molmoact2.crop_size", m.crop_size),
        ("molmoact2.patch_size", m.patch_size),
        ("molmoact2.image_tokens", m.image_tokens),
        ("molmoact2.seq_len", m.seq_len),
        ("molmoact2.hidden", m.hidden),
        ("molmoact2.llm_splits", m.llm_splits),
        ("molmoact2.layers_per_split", m.layers_per_split),
        ("molmoact2.kv_width", m.kv_width),
        ("molmoact2.action_context_width", m.action_context_width),
        ("molmoact2.action_horizon", m.action_horizon),
        ("molmoact2.action_width", m.action_width),
        ("molmoact2.action_dims", m.action_dims),
        ("molmoact2.flow_steps", m.flow_steps),
        ("molmoact2.state_dims", m.state_dims),
    ] {
        positive(f, v)?;
    }
    if m.llm_splits > MAX_LLM_SPLITS {
        return Err(invalid(
            "molmoact2.llm_splits",
            format!("{} is above the limit of {MAX_LLM_SPLITS}", m.llm_splits),
        ));
    }
    let k_max = 64;
    for (field, factors) in [
        (
            "molmoact2.layers_per_split",
            &[m.llm_splits, m.layers_per_split, m.seq_len, m.kv_width][..],
        ),
        (
            "molmoact2.crop_size",
            &[m.cameras, m.crop_size, m.crop_size, 3],
        ),
        (
            "molmoact2.frame_width",
            &[m.cameras, m.frame_height, m.frame_width, 3],
        ),
        (
            "molmoact2.hidden",
            &[m.seq_len.max(m.image_tokens), m.hidden],
        ),
        ("molmoact2.seq_len", &[m.seq_len, m.seq_len]),
        (
            "molmoact2.action_width",
            &[k_max, m.action_horizon, m.action_width],
        ),
    ] {
        addressable(field, factors)?;
    }
    Ok(())
}

/// How MolmoAct2's dimensions relate, and its instruction and attention settings.
fn molmoact2_rules(m: &MolmoAct2Settings) -> Result<(), Invalid> {
    if m.crop_size % m.patch_size != 0 {
        return Err(invalid(
            "molmoact2.crop_size",
            format!(
                "{} is not a multiple of patch_size {}",
                m.crop_size, m.patch_size
            ),
        ));
    }
    if m.action_dims > m.action_width {
        return Err(invalid(
            "molmoact2.action_dims",
            format!("{} exceeds action_width {}", m.action_dims, m.action_width),
        ));
    }
    if m.image_tokens > m.seq_len || m.state_dims > m.seq_len {
        return Err(invalid(
            "molmoact2.seq_len",
            "shorter than the image or state tokens",
        ));
    }
    if m.instructions.is_empty() {
        return Err(invalid("molmoact2.instructions", "lists no instruction"));
    }
    if m.rope_left_pad.is_some_and(|p| p >= m.seq_len) {
        return Err(invalid(
            "molmoact2.rope_left_pad",
            format!("must be below seq_len {}", m.seq_len),
        ));
    }
    if !m.attention_blocked_value.is_finite() || m.attention_blocked_value >= 0.0 {
        return Err(invalid(
            "molmoact2.attention_blocked_value",
            "must be a finite negative value",
        ));
    }
    Ok(())
}

/// Drift-KeyStone's settings, for a chunk of `horizon` steps.
fn keystone(k: &KeyStone, horizon: usize) -> Result<(), Invalid> {
    if k.k == 0 {
        return Err(invalid(
            "molmoact2.keystone.k",
            "must be at least 1 (K = 0 selects nothing)",
        ));
    }
    if k.k > 64 {
        return Err(invalid(
            "molmoact2.keystone.k",
            format!("{} is above the limit of 64", k.k),
        ));
    }
    if let Some(e) = k.executed_steps {
        if e == 0 || e > horizon {
            return Err(invalid(
                "molmoact2.keystone.executed_steps",
                format!("{e} is not in 1..={}", horizon),
            ));
        }
    }
    if k.num_clusters == 0 || k.num_clusters > 64 {
        return Err(invalid(
            "molmoact2.keystone.num_clusters",
            format!("{} is not in 1..=64", k.num_clusters),
        ));
    }
    if !(k.spread_threshold.is_finite() && k.spread_threshold >= 0.0) {
        return Err(invalid(
            "molmoact2.keystone.spread_threshold",
            "must be a finite value >= 0",
        ));
    }
    Ok(())
}

/// Fast-WAM's settings: the action expert's dims, its normalizer, and exactly one of a
/// constant world model or the chain that computes it.
fn fastwam(f: &FastWamSettings) -> Result<(), Invalid> {
    positive("fastwam.action_horizon", f.action_horizon)?;
    positive("fastwam.action_dims", f.action_dims)?;
    positive("fastwam.flow_steps", f.flow_steps)?;
    addressable("fastwam.action_dims", &[f.action_horizon, f.action_dims])?;
    if !(f.shift.is_finite() && f.shift > 0.0) {
        return Err(invalid(
            "fastwam.shift",
            format!("{} must be a finite positive value", f.shift),
        ));
    }
    f.action_norm
        .validate("fastwam.action_norm", f.action_dims)?;
    hf_only(&f.action_norm, "fastwam.action_norm")?;
    match (&f.world_model, &f.chain) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "fastwam.world_model",
                "not allowed with fastwam.chain (the chain computes it)",
            ))
        }
        (None, None) => {
            return Err(invalid(
                "fastwam",
                "needs either `world_model` (constant inputs) or `chain`",
            ))
        }
        _ => {}
    }
    if let Some(c) = &f.chain {
        validate_chain(c)?;
    }
    Ok(())
}

/// Fast-WAM has its own normalizer: the MolmoAct2 conventions do not apply to it.
fn hf_only(n: &Normalization, field: &str) -> Result<(), Invalid> {
    if n.follows != NormFollows::HfFeatureNormalizer || n.eps.is_some() {
        return Err(invalid(
            format!("{field}.follows"),
            "is MolmoAct2's setting; Fast-WAM's normalizer is its own (drop `follows` and `eps`)",
        ));
    }
    Ok(())
}

fn validate_chain(c: &FastWamChain) -> Result<(), Invalid> {
    for (f, v) in [
        ("fastwam.chain.cameras", c.cameras),
        ("fastwam.chain.frame_height", c.frame_height),
        ("fastwam.chain.frame_width", c.frame_width),
        ("fastwam.chain.camera_height", c.camera_height),
        ("fastwam.chain.camera_width", c.camera_width),
        ("fastwam.chain.latent_channels", c.latent_channels),
        ("fastwam.chain.latent_height", c.latent_height),
        ("fastwam.chain.latent_width", c.latent_width),
        ("fastwam.chain.video_tokens", c.video_tokens),
        ("fastwam.chain.video_width", c.video_width),
        ("fastwam.chain.text_tokens", c.text_tokens),
        ("fastwam.chain.context_width", c.context_width),
        ("fastwam.chain.state_dims", c.state_dims),
    ] {
        positive(f, v)?;
    }
    if c.rotate_180.len() != c.cameras {
        return Err(invalid(
            "fastwam.chain.rotate_180",
            format!(
                "has {} values, expected {} (one per camera)",
                c.rotate_180.len(),
                c.cameras
            ),
        ));
    }
    if c.prefill_layers.is_empty() || c.prefill_layers.len() > MAX_PREFILL_SPLITS {
        return Err(invalid(
            "fastwam.chain.prefill_layers",
            format!(
                "lists {} splits, expected 1..={MAX_PREFILL_SPLITS}",
                c.prefill_layers.len()
            ),
        ));
    }
    if let Some(i) = c.prefill_layers.iter().position(|&l| l == 0) {
        return Err(invalid(
            format!("fastwam.chain.prefill_layers[{i}]"),
            "must be at least 1",
        ));
    }
    let layers = c
        .prefill_layers
        .iter()
        .try_fold(0usize, |a, &l| a.checked_add(l));
    for (field, factors) in [
        (
            "fastwam.chain.prefill_layers",
            &[layers.unwrap_or(usize::MAX), c.video_tokens, c.video_width][..],
        ),
        (
            "fastwam.chain.frame_width",
            &[c.cameras, c.frame_height, c.frame_width, 3],
        ),
        (
            "fastwam.chain.camera_width",
            &[c.cameras, c.camera_height, c.camera_width, 3],
        ),
        (
            "fastwam.chain.latent_width",
            &[c.latent_channels, c.latent_height, c.latent_width],
        ),
        (
            "fastwam.chain.context_width",
            &[c.text_tokens + 1, c.context_width.max(c.video_width)],
        ),
    ] {
        addressable(field, factors)?;
    }
    if c.instructions.is_empty() {
        return Err(invalid(
            "fastwam.chain.instructions",
            "lists no instruction",
        ));
    }
    if c.state_input == StateInput::EefPosQuatGripper
        && c.state_dims != EEF_POS_AXISANGLE_GRIPPER_DIMS
    {
        return Err(invalid(
            "fastwam.chain.state_input",
            format!(
                "`eef_pos_quat_gripper` builds {EEF_POS_AXISANGLE_GRIPPER_DIMS} state values \
                 (position 3, axis-angle 3, gripper 2), but fastwam.chain.state_dims is {}",
                c.state_dims
            ),
        ));
    }
    hf_only(&c.state_norm, "fastwam.chain.state_norm")?;
    c.state_norm
        .validate("fastwam.chain.state_norm", c.state_dims)
}

/// Every file a manifest names is opened relative to the bundle directory and must stay
/// inside it.
fn inside_bundle(field: impl FnOnce() -> String, path: &str) -> Result<(), Invalid> {
    if path.is_empty() || path.starts_with('/') || path.split('/').any(|p| p == "..") {
        return Err(invalid(
            field(),
            format!("`{path}` must be a relative path inside the bundle"),
        ));
    }
    Ok(())
}
