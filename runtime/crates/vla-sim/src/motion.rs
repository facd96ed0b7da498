//! The point arm `vlad simulate` moves: its pose is the integral of the `ok` actions it
//! applies, and it measures the smoothness of what it applied (the jump between
//! consecutive actions at a chunk seam and inside a chunk).

/// The moving arm and the smoothness of what it applied.
#[derive(Default)]
pub(super) struct Motion {
    /// The arm's pose: the integral of the applied actions, gripper excluded.
    pub(super) pose: Vec<f64>,
    last_applied: Option<(u64, Vec<f32>)>,
    seams: u64,
    seam_jump_max: f64,
    seam_jump_sum: f64,
    inside_steps: u64,
    inside_jump_max: f64,
    inside_jump_sum: f64,
    distance: f64,
}

impl Motion {
    /// Applies one `ok` action: integrates the pose and measures the jump from the last.
    pub(super) fn apply(&mut self, chunk_id: u64, values: &[f32]) {
        let moving = values.len().saturating_sub(1);
        if self.pose.len() != moving {
            self.pose = vec![0.0; moving];
        }
        for (p, &v) in self.pose.iter_mut().zip(values) {
            *p += f64::from(v);
        }
        self.distance += values[..moving]
            .iter()
            .map(|&v| f64::from(v).powi(2))
            .sum::<f64>()
            .sqrt();
        if let Some((last_chunk, last)) = &self.last_applied {
            let jump = values[..moving]
                .iter()
                .zip(last)
                .map(|(&a, &b)| f64::from(a - b).powi(2))
                .sum::<f64>()
                .sqrt();
            if *last_chunk != chunk_id {
                self.seams += 1;
                self.seam_jump_max = self.seam_jump_max.max(jump);
                self.seam_jump_sum += jump;
            } else {
                self.inside_steps += 1;
                self.inside_jump_max = self.inside_jump_max.max(jump);
                self.inside_jump_sum += jump;
            }
        }
        match &mut self.last_applied {
            Some((c, v)) => {
                *c = chunk_id;
                v.clear();
                v.extend_from_slice(values);
            }
            None => self.last_applied = Some((chunk_id, values.to_vec())),
        }
    }

    /// The mean jump at a seam and inside a chunk (0 with none).
    fn means(&self) -> (f64, f64) {
        let mean = |sum: f64, n: u64| if n == 0 { 0.0 } else { sum / n as f64 };
        (
            mean(self.seam_jump_sum, self.seams),
            mean(self.inside_jump_sum, self.inside_steps),
        )
    }

    /// The report's smoothness and arm path lines.
    pub(super) fn print_report(&self) {
        let (seam_mean, inside_mean) = self.means();
        println!(
            "  smoothness      seam jump max {:.4} mean {:.4} ({} seams); inside chunks max {:.4} mean {:.4}",
            self.seam_jump_max, seam_mean, self.seams, self.inside_jump_max, inside_mean
        );
        println!(
            "  arm path        {:.3} (sum of applied step lengths)",
            self.distance
        );
    }

    pub(super) fn json(&self) -> serde_json::Value {
        let (seam_mean, inside_mean) = self.means();
        serde_json::json!({
            "seams": self.seams,
            "seam_jump_max": self.seam_jump_max,
            "seam_jump_mean": seam_mean,
            "inside_jump_max": self.inside_jump_max,
            "inside_jump_mean": inside_mean,
            "path_length": self.distance,
            "pose": self.pose,
        })
    }
}
