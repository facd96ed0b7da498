//! The state a Fast-WAM chain normalizes, built from what the robot writes on the ring
//! (`fastwam.chain.state_input`): either that state itself, or upstream LIBERO's raw robot
//! state, `eef_pos (3) + eef_quat (4, x y z w) + gripper_qpos (2)`, turned into
//! `eef_pos + quat2axisangle(eef_quat) + gripper_qpos` as upstream's eval does
//! (`_extract_sim_state`, which calls robosuite's `transform_utils.quat2axisangle`).
//!
//! [`quat2axisangle`] follows robosuite 1.4.0 step for step, in f64 from the ring's f32
//! values, and is checked against robosuite's own outputs (golden/robosuite/). What that
//! means for odd quaternions is robosuite's behaviour, kept on purpose because the policy
//! was trained on it: `q` and `-q` (the same rotation) give different vectors (angle `a`
//! about the axis, or `2*pi - a` about the opposite one); `w` is clipped to [-1, 1] and the
//! quaternion is never normalized, so an unnormalized one scales the vector, and one with
//! `|w| >= 1` gives zeros. A non-finite quaternion is refused before conversion, and so is
//! one whose vector overflows f32: the policy then fails the observation (the loop holds).

use crate::error::PolicyError;
use crate::manifest::StateInput;

/// robosuite's `quat2axisangle` on an `(x, y, z, w)` quaternion, cast to f32 as upstream's
/// state is: `w` clipped to [-1, 1], `den = sqrt(1 - w*w)`, zeros if `den == 0` (robosuite's
/// `math.isclose(den, 0.0)` with its default tolerances holds only for exactly 0), else
/// `xyz * 2 * acos(w) / den`, evaluated in that order.
pub fn quat2axisangle(q: [f32; 4]) -> [f32; 3] {
    let w = f64::from(q[3]).clamp(-1.0, 1.0);
    let den = (1.0 - w * w).sqrt();
    if den == 0.0 {
        return [0.0; 3];
    }
    let angle = w.acos();
    [q[0], q[1], q[2]].map(|x| (f64::from(x) * 2.0 * angle / den) as f32)
}

/// Fills `out` (the policy's `state_dims` values) from the ring's `raw` state, both of the
/// lengths `input` implies (checked by the caller), `raw` finite (checked by the caller).
pub(crate) fn build_state(
    input: StateInput,
    raw: &[f32],
    out: &mut [f32],
) -> Result<(), PolicyError> {
    match input {
        StateInput::State => out.copy_from_slice(raw),
        StateInput::EefPosQuatGripper => {
            let q = [raw[3], raw[4], raw[5], raw[6]];
            let axis_angle = quat2axisangle(q);
            if axis_angle.iter().any(|x| !x.is_finite()) {
                return Err(PolicyError::Observation {
                    field: "state",
                    expected: "an eef quaternion (values 3..7) whose axis-angle fits f32".into(),
                    found: format!("{q:?} -> {axis_angle:?}"),
                });
            }
            out[..3].copy_from_slice(&raw[..3]);
            out[3..6].copy_from_slice(&axis_angle);
            out[6..8].copy_from_slice(&raw[7..9]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vla_test_support::repo_root;

    struct Golden {
        cases: Vec<String>,
        quat: Vec<[f32; 4]>,
        axisangle: Vec<[f32; 3]>,
    }

    /// robosuite 1.4.0's own outputs (tools/goldens/vla_goldens/robosuite_quat_goldens.py).
    fn golden() -> Golden {
        let dir = repo_root().join("golden/robosuite");
        let npz = vla_npz::Npz::open(dir.join("quat2axisangle.npz")).unwrap();
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("quat2axisangle.json")).unwrap())
                .unwrap();
        assert_eq!(meta["robosuite"], "1.4.0");
        let cases: Vec<String> = meta["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect();
        let n = cases.len();
        let f32s = |name, cols| {
            npz.expect(name, vla_npz::DType::F32, &[n, cols])
                .unwrap()
                .to_f32()
                .unwrap()
        };
        let q = f32s("quat", 4);
        let a = f32s("axisangle", 3);
        Golden {
            quat: q.chunks_exact(4).map(|c| c.try_into().unwrap()).collect(),
            axisangle: a.chunks_exact(3).map(|c| c.try_into().unwrap()).collect(),
            cases,
        }
    }

    fn ulps(a: f32, b: f32) -> u32 {
        if a == b {
            return 0;
        }
        let key = |x: f32| {
            let i = x.to_bits() as i32;
            if i < 0 {
                i32::MIN - i
            } else {
                i
            }
        };
        key(a).abs_diff(key(b))
    }

    #[test]
    fn quat2axisangle_equals_robosuites_own_outputs() {
        let g = golden();
        assert!(g.cases.len() >= 40, "{} cases", g.cases.len());
        let mut worst = (0u32, String::new());
        for ((name, &q), expected) in g.cases.iter().zip(&g.quat).zip(&g.axisangle) {
            let got = quat2axisangle(q);
            for d in 0..3 {
                if !expected[d].is_finite() {
                    // robosuite's f64 result past f32's range: inf after upstream's cast.
                    assert_eq!(got[d], expected[d], "{name}[{d}]");
                    continue;
                }
                // Same f64 operations in the same order; only libm's acos could differ
                // between machines, by an f64 ulp: allow one f32 ulp after the cast.
                let u = ulps(got[d], expected[d]);
                assert!(
                    u <= 1,
                    "{name}[{d}]: {} vs robosuite {}, {u} ulps",
                    got[d],
                    expected[d]
                );
                if u > worst.0 {
                    worst = (u, format!("{name}[{d}]"));
                }
            }
        }
        eprintln!(
            "quat2axisangle vs robosuite: worst {} f32 ulps {}",
            worst.0, worst.1
        );
    }

    #[test]
    fn odd_quaternions_behave_as_robosuite_says() {
        let g = golden();
        let case = |name: &str| {
            let i = g.cases.iter().position(|c| c == name).unwrap();
            (g.quat[i], g.axisangle[i])
        };
        let norm = |v: [f32; 3]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        // q and -q: the same rotation, angle a about the axis vs 2*pi - a about its opposite.
        let (q, a) = case("generic");
        let (nq, na) = case("generic_negated");
        assert_eq!(nq, q.map(|x| -x));
        assert_eq!(quat2axisangle(q), a);
        assert_eq!(quat2axisangle(nq), na);
        assert!(
            (norm(a) - 1.2).abs() < 1e-5 && (norm(na) - (std::f32::consts::TAU - 1.2)).abs() < 1e-5
        );
        // |w| >= 1 after clipping (slightly above 1, an unnormalized w of 1.3): zeros.
        for name in [
            "w_slightly_above_1",
            "w_slightly_below_minus_1",
            "unnormalized_w_above_1",
            "identity",
        ] {
            assert_eq!(quat2axisangle(case(name).0), [0.0; 3], "{name}");
        }
        // Unnormalized with |w| < 1: not normalized, the vector scales with the input.
        let (q, a) = case("unnormalized_short");
        assert_eq!(quat2axisangle(q), a);
        assert!(
            (norm(a)
                - 2.0 * f64::from(q[3]).acos() as f32 * norm([q[0], q[1], q[2]])
                    / (1.0 - q[3] * q[3]).sqrt())
            .abs()
                < 1e-5
        );
        // Near zero angle, w just below 1 is not the zero branch (robosuite's isclose is exact).
        assert_ne!(quat2axisangle(case("w_just_below_1").0), [0.0; 3]);
    }

    #[test]
    fn build_state_orders_position_axis_angle_gripper_and_refuses_overflow() {
        let raw = [0.1, -0.2, 1.0, 0.0, 0.6, 0.8, 0.0, 0.03, -0.02];
        let mut out = [0f32; 8];
        build_state(StateInput::EefPosQuatGripper, &raw, &mut out).unwrap();
        let pi = std::f32::consts::PI;
        // Hand-checked: w = 0 is a half turn: (0, 0.6, 0.8) * 2 * (pi/2) / 1.
        let expected = [0.1, -0.2, 1.0, 0.0, 0.6 * pi, 0.8 * pi, 0.03, -0.02];
        for (o, e) in out.iter().zip(expected) {
            assert!((o - e).abs() < 1e-6, "{out:?}");
        }
        let mut same = [0f32; 8];
        build_state(StateInput::State, &expected, &mut same).unwrap();
        assert_eq!(same, expected);
        let big = [0.1, -0.2, 1.0, 3e38, 0.0, 0.0, 0.5, 0.03, -0.02];
        let before = out;
        let msg = build_state(StateInput::EefPosQuatGripper, &big, &mut out)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("observation state") && msg.contains("quaternion"),
            "{msg}"
        );
        assert_eq!(out, before, "nothing converted is left behind on refusal");
    }
}
