//! Camera frames (RGB8) -> `pixel_values`: resize, normalize, patchify in one pass.
//!
//! The interpolation taps depend only on the frame and crop sizes, so they are computed
//! once at load, along x flattened to one tap pair and weight pair per output value. Per
//! inference, each source row that an output row needs is interpolated along x once into
//! a scratch row (consecutive output rows share source rows), and each
//! output row is then one contiguous lerp along y plus the normalize per value, written
//! straight into the vision context's input buffer in patch order, `P` pixels at a time.
//! The arithmetic is the contract's, operation by operation (x first, then y), so the
//! values are bit-identical to the per-pixel formula. Against PyTorch itself (whose AVX
//! kernels sum the four taps in another order) about one value in 10^5 lands at an
//! exact .5 tie on the other side: one uint8 level (tests/upstream.rs bounds it). As upstream (torchvision `Resize`
//! on the uint8 frame, `antialias=False`), the interpolated value is rounded back to a
//! uint8 (half to even) before it is scaled: the vision tower was trained on those.

/// 2^23: adding it to an f32 in [0, 2^23) leaves no fraction bits, so the hardware's
/// round-to-nearest-even rounds the value to an integer, and subtracting it is exact.
const ROUND_MAGIC: f32 = 8_388_608.0;

/// An interpolated value -> the resized uint8 pixel -> `x / 255 * 2 - 1` (SigLIP's
/// mean = std = 0.5), in upstream's order of f32 operations.
///
/// Upstream rounds half to even, then clamps to [0, 255]. Clamping first gives the same
/// pixel (rounding is monotonic and both bounds are integers; the interpolated value is
/// never negative anyway), and in [0, 255] the add/subtract of [`ROUND_MAGIC`] is exactly
/// round-half-even. Unlike `round_ties_even`, which is a libm call on baseline x86_64
/// (no SSE4.1), it vectorizes, with the clamp and the division, over a row.
#[inline]
fn to_unit(v: f32) -> f32 {
    let pixel = (v.clamp(0.0, 255.0) + ROUND_MAGIC) - ROUND_MAGIC;
    pixel / 255.0 * 2.0 - 1.0
}

/// One axis of a half-pixel bilinear resize: source taps and weights per output index.
#[derive(Clone, Debug)]
struct AxisTaps {
    i0: Vec<usize>,
    i1: Vec<usize>,
    frac: Vec<f32>,
}

impl AxisTaps {
    /// PyTorch's `upsample_bilinear2d` taps (`align_corners=False`): the source index
    /// `scale * (dst + 0.5) - 0.5` with one rounding, as its FMA-compiled CPU kernels
    /// compute it (`mul_add`), floored at 0; the right tap stays on the last pixel there.
    fn new(n_in: usize, n_out: usize) -> Self {
        let scale = n_in as f32 / n_out as f32;
        let mut t = AxisTaps {
            i0: vec![0; n_out],
            i1: vec![0; n_out],
            frac: vec![0.0; n_out],
        };
        for o in 0..n_out {
            let src = if n_in == n_out {
                o as f32
            } else {
                (o as f32 + 0.5).mul_add(scale, -0.5).max(0.0)
            };
            let i0 = (src.floor() as usize).min(n_in - 1);
            t.i0[o] = i0;
            t.i1[o] = (i0 + 1).min(n_in - 1);
            t.frac[o] = (src - i0 as f32).clamp(0.0, 1.0);
        }
        t
    }
}

/// The x taps per output value (`crop * 3` of them): the byte offsets in a source row
/// of the left and right pixel's channel and their weights `1 - fx` and `fx`, so the
/// interpolation of a row is one flat loop with no per-pixel index arithmetic.
#[derive(Clone, Debug)]
struct RowTaps {
    left: Vec<u32>,
    right: Vec<u32>,
    w_left: Vec<f32>,
    w_right: Vec<f32>,
}

impl RowTaps {
    fn new(xs: &AxisTaps) -> Self {
        let n = xs.i0.len() * 3;
        let mut t = RowTaps {
            left: Vec::with_capacity(n),
            right: Vec::with_capacity(n),
            w_left: Vec::with_capacity(n),
            w_right: Vec::with_capacity(n),
        };
        for x in 0..xs.i0.len() {
            for c in 0..3 {
                t.left.push((xs.i0[x] * 3 + c) as u32);
                t.right.push((xs.i1[x] * 3 + c) as u32);
                t.w_left.push(1.0 - xs.frac[x]);
                t.w_right.push(xs.frac[x]);
            }
        }
        t
    }
}

/// Turns `cameras` frames of `height x width x 3` into `[1, cameras, G*G, P*P*3]`.
#[derive(Clone, Debug)]
pub struct Preprocessor {
    pub cameras: usize,
    pub height: usize,
    pub width: usize,
    crop: usize,
    patch: usize,
    ys: AxisTaps,
    row_taps: RowTaps,
    /// Source rows interpolated along x (`crop * 3` values each) and which source row of
    /// which camera each holds.
    rows: [Vec<f32>; 2],
    row_ids: [Option<(usize, usize)>; 2],
}

impl Preprocessor {
    pub fn new(cameras: usize, height: usize, width: usize, crop: usize, patch: usize) -> Self {
        Self {
            cameras,
            height,
            width,
            crop,
            patch,
            ys: AxisTaps::new(height, crop),
            row_taps: RowTaps::new(&AxisTaps::new(width, crop)),
            rows: [vec![0.0; crop * 3], vec![0.0; crop * 3]],
            row_ids: [None; 2],
        }
    }

    /// Makes the scratch rows hold source rows `i0` (top) and `i1` (bottom) of camera
    /// `cam`, interpolated along x. Moving down the image, the old bottom row is usually
    /// the new top one: it is swapped in rather than recomputed.
    fn prepare_rows(&mut self, cam: usize, i0: usize, i1: usize, img: &[u8]) {
        let (top, bottom) = (Some((cam, i0)), Some((cam, i1)));
        if self.row_ids[0] != top && self.row_ids[1] == top {
            self.rows.swap(0, 1);
            self.row_ids.swap(0, 1);
        }
        for (slot, want, src) in [(0, top, i0), (1, bottom, i1)] {
            if self.row_ids[slot] == want {
                continue;
            }
            let line = &img[src * self.width * 3..(src + 1) * self.width * 3];
            let t = &self.row_taps;
            for ((((out, &l), &r), &wl), &wr) in self.rows[slot]
                .iter_mut()
                .zip(&t.left)
                .zip(&t.right)
                .zip(&t.w_left)
                .zip(&t.w_right)
            {
                *out = line[l as usize] as f32 * wl + line[r as usize] as f32 * wr;
            }
            self.row_ids[slot] = want;
        }
    }

    /// Bytes of one observation's frames.
    pub fn frames_len(&self) -> usize {
        self.cameras * self.height * self.width * 3
    }

    /// Values of `pixel_values`.
    pub fn output_len(&self) -> usize {
        self.cameras * self.crop * self.crop * 3
    }

    /// `frames` must be `frames_len()` bytes and `out` `output_len()` values (checked by
    /// the caller, which reports the geometry error).
    pub fn run(&mut self, frames: &[u8], out: &mut [f32]) {
        let (h, w, crop, p) = (self.height, self.width, self.crop, self.patch);
        let grid = crop / p;
        let (patch_len, seg) = (p * p * 3, p * 3);
        // Frames change every call: never trust rows cached from the previous one.
        self.row_ids = [None; 2];
        for cam in 0..self.cameras {
            let img = &frames[cam * h * w * 3..(cam + 1) * h * w * 3];
            let dst = &mut out[cam * crop * crop * 3..(cam + 1) * crop * crop * 3];
            for y in 0..crop {
                let (i0, i1, fy) = (self.ys.i0[y], self.ys.i1[y], self.ys.frac[y]);
                self.prepare_rows(cam, i0, i1, img);
                let (top, bottom) = (&self.rows[0], &self.rows[1]);
                let (py, dy) = (y / p, y % p);
                for px in 0..grid {
                    let at = (py * grid + px) * patch_len + dy * seg;
                    let src = px * seg..(px + 1) * seg;
                    for ((d, t), b) in dst[at..at + seg]
                        .iter_mut()
                        .zip(&top[src.clone()])
                        .zip(&bottom[src])
                    {
                        *d = to_unit(t * (1.0 - fy) + b * fy);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_identity_and_patch_order_is_row_major() {
        // One 28x28 camera, patch 14: pixel (y, x) lands in patch (y/14, x/14).
        let (s, p) = (28, 14);
        let mut frame = vec![0u8; s * s * 3];
        for y in 0..s {
            for x in 0..s {
                frame[(y * s + x) * 3] = (y * 9 % 256) as u8;
                frame[(y * s + x) * 3 + 1] = (x * 7 % 256) as u8;
                frame[(y * s + x) * 3 + 2] = 255;
            }
        }
        let mut pre = Preprocessor::new(1, s, s, s, p);
        let mut out = vec![0f32; pre.output_len()];
        pre.run(&frame, &mut out);
        let at = |y: usize, x: usize, c: usize| {
            out[((y / p) * 2 + x / p) * p * p * 3 + ((y % p) * p + x % p) * 3 + c]
        };
        assert_eq!(at(20, 3, 0), (20.0 * 9.0) / 255.0 * 2.0 - 1.0);
        assert_eq!(at(20, 3, 1), 21.0 / 255.0 * 2.0 - 1.0);
        assert_eq!(at(27, 27, 2), 1.0);
    }

    /// Upstream's order of operations: round half to even, clamp, scale.
    fn to_unit_upstream(v: f32) -> f32 {
        v.round_ties_even().clamp(0.0, 255.0) / 255.0 * 2.0 - 1.0
    }

    #[test]
    fn magic_number_rounding_is_upstreams_round_then_clamp() {
        let same = |v: f32| to_unit(v).to_bits() == to_unit_upstream(v).to_bits();
        // Every tie k + 0.5 and every integer with 64 neighbours on each side, where a
        // rounding method can differ, then a sweep over the bit patterns of [0, 300].
        for k in -2..=300 {
            for centre in [k as f32, k as f32 + 0.5] {
                let mut up = centre;
                let mut down = centre;
                for _ in 0..64 {
                    assert!(same(up) && same(down), "{up} / {down}");
                    up = up.next_up();
                    down = down.next_down();
                }
            }
        }
        let (lo, hi) = (0f32.to_bits(), 300f32.to_bits());
        for bits in (lo..=hi).step_by(97) {
            let v = f32::from_bits(bits);
            assert!(same(v), "{v}");
        }
    }

    /// The contract's formula, one output value at a time.
    fn per_pixel(pre: &Preprocessor, frames: &[u8]) -> Vec<f32> {
        let (h, w, crop, p) = (pre.height, pre.width, pre.crop, pre.patch);
        let xs = AxisTaps::new(w, crop);
        let grid = crop / p;
        let mut out = vec![0f32; pre.output_len()];
        for cam in 0..pre.cameras {
            let img = &frames[cam * h * w * 3..];
            for y in 0..crop {
                let (r0, r1, fy) = (pre.ys.i0[y] * w * 3, pre.ys.i1[y] * w * 3, pre.ys.frac[y]);
                for x in 0..crop {
                    let (c0, c1, fx) = (xs.i0[x] * 3, xs.i1[x] * 3, xs.frac[x]);
                    let at = cam * crop * crop * 3
                        + ((y / p) * grid + x / p) * p * p * 3
                        + ((y % p) * p + x % p) * 3;
                    for c in 0..3 {
                        let v = |i: usize| img[i + c] as f32;
                        let top = v(r0 + c0) * (1.0 - fx) + v(r0 + c1) * fx;
                        let bottom = v(r1 + c0) * (1.0 - fx) + v(r1 + c1) * fx;
                        out[at + c] = to_unit_upstream(top * (1.0 - fy) + bottom * fy);
                    }
                }
            }
        }
        out
    }

    #[test]
    fn row_cached_resize_is_bit_identical_to_the_per_pixel_formula() {
        // Up- and down-scaling, two cameras, reused across calls with new frames.
        for (h, w, crop, p) in [(48, 64, 56, 14), (256, 256, 378, 14), (30, 20, 14, 7)] {
            let mut pre = Preprocessor::new(2, h, w, crop, p);
            for seed in [1u32, 2] {
                let frames: Vec<u8> = (0..pre.frames_len() as u32)
                    .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
                    .collect();
                let mut out = vec![0f32; pre.output_len()];
                pre.run(&frames, &mut out);
                let want = per_pixel(&pre, &frames);
                assert!(
                    out.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{h}x{w} -> {crop}, seed {seed}"
                );
            }
        }
    }

    #[test]
    fn downscale_by_two_averages_pixel_pairs() {
        // 2x4 -> 2x2 along x: half-pixel centres at 0.5 and 2.5 average neighbours.
        let frame: Vec<u8> = [0u8, 100, 200, 250]
            .iter()
            .flat_map(|v| [*v, *v, *v])
            .collect::<Vec<_>>()
            .repeat(2);
        let mut pre = Preprocessor::new(1, 2, 4, 2, 1);
        let mut out = vec![0f32; pre.output_len()];
        pre.run(&frame, &mut out);
        let back = |v: f32| (v + 1.0) / 2.0 * 255.0;
        assert!((back(out[0]) - 50.0).abs() < 1e-3);
        assert!((back(out[3]) - 225.0).abs() < 1e-3);
    }

    #[test]
    fn resized_values_are_rounded_to_uint8_half_to_even() {
        // 1x4 -> 1x2: (1 + 2) / 2 = 1.5 -> 2 and (4 + 5) / 2 = 4.5 -> 4 (ties to even).
        let frame: Vec<u8> = [1u8, 2, 4, 5].iter().flat_map(|v| [*v, *v, *v]).collect();
        let mut pre = Preprocessor::new(1, 1, 4, 2, 1);
        let mut out = vec![0f32; pre.output_len()];
        pre.run(&frame, &mut out);
        assert_eq!(out[0], 2.0 / 255.0 * 2.0 - 1.0);
        assert_eq!(out[3], 4.0 / 255.0 * 2.0 - 1.0);
    }
}
