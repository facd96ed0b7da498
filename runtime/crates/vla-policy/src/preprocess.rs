//! Camera frames (RGB8) -> `pixel_values`: resize, normalize, patchify in one pass.
//!
//! The interpolation taps depend only on the frame and crop sizes, so they are computed
//! once at load. Per inference, each source row that an output row needs is converted to
//! f32 and interpolated along x once into a scratch row (consecutive output rows share
//! source rows), one output pixel (its three channels) per step; each output row is then
//! one contiguous lerp along y plus the normalize per value, written straight into the
//! vision context's input buffer in patch order, `P` pixels at a time. The arithmetic is
//! the contract's, operation by operation (x first, then y), so the values are
//! bit-identical to the per-pixel formula. Against PyTorch itself (whose kernel rounds the
//! four taps' sum differently: neither x-then-y nor y-then-x, with or without FMA, matches
//! its last bit) a value whose exact interpolation is a .5 tie can land on the other side:
//! one uint8 level. Measured (tests/upstream.rs, which bounds it): at the real 378 crop 21
//! of 2,571,912 values over six frame sizes (8e-6, about 1 in 120,000); at a 56 crop 11 of
//! 65,856 (1.7e-4, about 1 in 6,000: downscaling hits exact ties more often). As upstream
//! (torchvision `Resize` on the uint8 frame, `antialias=False`), the interpolated value
//! is rounded back to a uint8 (half to even) before it is scaled: the vision tower was
//! trained on those.
//!
//! The output splits into [`Part`]s of whole patch rows, each a contiguous range of the
//! buffer with its own scratch, so two threads can fill one buffer ([`Preprocessor::run_on`]).

use vla_fork::{Fork, HelperFailed};

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
/// (no SSE4.1), it vectorizes, with the clamp, over a row.
///
/// The division is done without dividing (a vector divide was a third of the whole
/// preprocess): for an integer `k` in [0, 255], `a = k * 65793` (`0x010101`, exact:
/// below 2^24) is `k / 255 * 2^24` truncated after three repeats of `k`'s byte, and
/// `a + a * 2^-24` (one rounding) carries the fourth, which decides every rounding of
/// the 24-bit quotient; times 2^-23 (exact) it is `k / 255 * 2`. The test
/// `the_division_free_scale_is_bit_identical_for_every_pixel` checks all 256 pixels
/// against `k / 255.0 * 2.0 - 1.0`.
#[inline]
fn to_unit(v: f32) -> f32 {
    let pixel = (v.clamp(0.0, 255.0) + ROUND_MAGIC) - ROUND_MAGIC;
    let a = pixel * 65_793.0;
    (a + a * (1.0 / 16_777_216.0)) * (1.0 / 8_388_608.0) - 1.0
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

/// The x taps per output pixel: the offset of its left source pixel in a source row of
/// f32 values and the weights `1 - fx`, `fx` of it and its right neighbour. The right
/// tap is always the next pixel: the source row is padded with a copy of its last pixel,
/// which is what the clamped right tap at the edge reads.
#[derive(Clone, Debug)]
struct RowTaps {
    left: Vec<u32>,
    weights: Vec<[f32; 2]>,
}

impl RowTaps {
    fn new(xs: &AxisTaps) -> Self {
        debug_assert!(xs
            .i0
            .iter()
            .zip(&xs.i1)
            .all(|(&l, &r)| r == l || r == l + 1));
        RowTaps {
            left: xs.i0.iter().map(|&i| (i * 3) as u32).collect(),
            weights: xs.frac.iter().map(|&f| [1.0 - f, f]).collect(),
        }
    }
}

/// One thread's scratch: the source row as f32 (plus the padding pixel and one value
/// so each pixel reads four), and two source rows interpolated along x (`crop * 3`
/// values, plus one so each pixel writes four) with which source row each holds.
#[derive(Clone, Debug)]
struct Scratch {
    line: Vec<f32>,
    rows: [Vec<f32>; 2],
    row_ids: [Option<(usize, usize)>; 2],
}

impl Scratch {
    fn new(width: usize, crop: usize) -> Self {
        Self {
            line: vec![0.0; (width + 1) * 3 + 1],
            rows: [vec![0.0; crop * 3 + 1], vec![0.0; crop * 3 + 1]],
            row_ids: [None; 2],
        }
    }
}

/// The geometry and taps every part shares.
#[derive(Clone, Debug)]
struct Taps {
    height: usize,
    width: usize,
    crop: usize,
    patch: usize,
    ys: AxisTaps,
    xs: RowTaps,
}

/// Turns `cameras` frames of `height x width x 3` into `[1, cameras, G*G, P*P*3]`.
#[derive(Clone, Debug)]
pub struct Preprocessor {
    /// Camera frames per observation.
    pub cameras: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Frame width in pixels.
    pub width: usize,
    taps: Taps,
    scratch: [Scratch; 2],
}

/// Whole patch rows `first..first + n` of the output, counted across cameras (camera
/// `c`'s patch row `r` is `c * G + r`), into their contiguous range of the buffer.
pub struct Part<'a> {
    taps: &'a Taps,
    scratch: &'a mut Scratch,
    frames: &'a [u8],
    out: &'a mut [f32],
    first: usize,
}

impl Taps {
    /// Makes the scratch rows hold source rows `i0` (top) and `i1` (bottom) of camera
    /// `cam`, interpolated along x. Moving down the image, the old bottom row is usually
    /// the new top one: it is swapped in rather than recomputed.
    fn prepare_rows(&self, s: &mut Scratch, cam: usize, i0: usize, i1: usize, img: &[u8]) {
        let (top, bottom) = (Some((cam, i0)), Some((cam, i1)));
        if s.row_ids[0] != top && s.row_ids[1] == top {
            s.rows.swap(0, 1);
            s.row_ids.swap(0, 1);
        }
        let n = self.width * 3;
        for (slot, want, src) in [(0, top, i0), (1, bottom, i1)] {
            if s.row_ids[slot] == want {
                continue;
            }
            for (f, &b) in s.line.iter_mut().zip(&img[src * n..(src + 1) * n]) {
                *f = f32::from(b);
            }
            s.line.copy_within(n - 3..n, n);
            // Four values in, four out per pixel (the fourth is the next pixel's first,
            // overwritten by it), so each pixel is one short vector operation. The taps
            // are copied out before the store: the compiler cannot tell the line from the
            // row, and would keep every load after the previous store.
            let (line, row) = (&s.line[..], &mut s.rows[slot][..]);
            for (x, (&l, &[wl, wr])) in self.xs.left.iter().zip(&self.xs.weights).enumerate() {
                let l = l as usize;
                let a: [f32; 4] = line[l..l + 4].try_into().expect("padded line");
                let b: [f32; 4] = line[l + 3..l + 7].try_into().expect("padded line");
                let o: &mut [f32; 4] = (&mut row[x * 3..x * 3 + 4]).try_into().expect("padded row");
                for c in 0..4 {
                    o[c] = a[c] * wl + b[c] * wr;
                }
            }
            s.row_ids[slot] = want;
        }
    }
}

impl Part<'_> {
    /// Fills the part's patch rows.
    pub fn run(self) {
        let t = self.taps;
        let (h, w, crop, p) = (t.height, t.width, t.crop, t.patch);
        let grid = crop / p;
        let (patch_len, seg) = (p * p * 3, p * 3);
        let block = grid * patch_len;
        // Frames change every call: never trust rows cached from the previous one.
        self.scratch.row_ids = [None; 2];
        for (k, dst) in self.out.chunks_exact_mut(block).enumerate() {
            let (cam, py) = ((self.first + k) / grid, (self.first + k) % grid);
            let img = &self.frames[cam * h * w * 3..(cam + 1) * h * w * 3];
            for dy in 0..p {
                let y = py * p + dy;
                let (i0, i1, fy) = (t.ys.i0[y], t.ys.i1[y], t.ys.frac[y]);
                t.prepare_rows(self.scratch, cam, i0, i1, img);
                let (top, bottom) = (&self.scratch.rows[0], &self.scratch.rows[1]);
                for px in 0..grid {
                    let at = px * patch_len + dy * seg;
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

impl Preprocessor {
    /// `crop` must be a whole number of patches (the manifest checks it for bundles).
    pub fn new(cameras: usize, height: usize, width: usize, crop: usize, patch: usize) -> Self {
        assert!(
            patch > 0 && crop % patch == 0,
            "crop {crop} is not a whole number of {patch}-pixel patches"
        );
        Self {
            cameras,
            height,
            width,
            taps: Taps {
                height,
                width,
                crop,
                patch,
                ys: AxisTaps::new(height, crop),
                xs: RowTaps::new(&AxisTaps::new(width, crop)),
            },
            scratch: [Scratch::new(width, crop), Scratch::new(width, crop)],
        }
    }

    /// Bytes of one observation's frames.
    pub fn frames_len(&self) -> usize {
        self.cameras * self.height * self.width * 3
    }

    /// Values of `pixel_values`.
    pub fn output_len(&self) -> usize {
        self.cameras * self.taps.crop * self.taps.crop * 3
    }

    /// `frames` must be `frames_len()` bytes and `out` `output_len()` values (checked by
    /// the caller, which reports the geometry error).
    pub fn run(&mut self, frames: &[u8], out: &mut [f32]) {
        let (a, b) = self.halves(frames, out);
        a.run();
        b.run();
    }

    /// [`Self::run`] with the second half on `fork`'s helper.
    pub fn run_on(
        &mut self,
        fork: &mut Fork,
        frames: &[u8],
        out: &mut [f32],
    ) -> Result<(), HelperFailed> {
        let (a, b) = self.halves(frames, out);
        fork.join(|| a.run(), || b.run()).map(|((), ())| ())
    }

    /// The output in two parts of whole patch rows (half each, the second one larger
    /// when the count is odd), to run on two threads. Same contract as [`Self::run`].
    pub fn halves<'a>(&'a mut self, frames: &'a [u8], out: &'a mut [f32]) -> (Part<'a>, Part<'a>) {
        let t = &self.taps;
        let grid = t.crop / t.patch;
        let first = self.cameras * grid / 2;
        let (lo, hi) = out.split_at_mut(first * grid * t.patch * t.patch * 3);
        let [s0, s1] = &mut self.scratch;
        let part = |scratch, out, first| Part {
            taps: t,
            scratch,
            frames,
            out,
            first,
        };
        (part(s0, lo, 0), part(s1, hi, first))
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

    #[test]
    fn the_division_free_scale_is_bit_identical_for_every_pixel() {
        for k in 0..=255u8 {
            let v = f32::from(k);
            assert_eq!(
                to_unit(v).to_bits(),
                (v / 255.0 * 2.0 - 1.0).to_bits(),
                "pixel {k}"
            );
        }
    }

    #[test]
    fn halves_on_two_threads_fill_what_one_run_fills() {
        // Odd patch-row counts too: one camera of 3 patch rows splits 1 + 2.
        for (cams, h, w, crop, p) in [(2, 256, 256, 378, 14), (1, 40, 30, 21, 7), (3, 9, 9, 4, 2)] {
            let mut pre = Preprocessor::new(cams, h, w, crop, p);
            let frames: Vec<u8> = (0..pre.frames_len() as u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
                .collect();
            let mut once = vec![0f32; pre.output_len()];
            pre.run(&frames, &mut once);
            let mut split = vec![f32::NAN; pre.output_len()];
            let (a, b) = pre.halves(&frames, &mut split);
            std::thread::scope(|s| {
                s.spawn(|| b.run());
                a.run();
            });
            assert!(
                once.iter()
                    .zip(&split)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{cams} x {h}x{w} -> {crop}"
            );
        }
    }

    /// The contract's formula, one output value at a time.
    fn per_pixel(pre: &Preprocessor, frames: &[u8]) -> Vec<f32> {
        let (h, w, crop, p) = (pre.height, pre.width, pre.taps.crop, pre.taps.patch);
        let xs = AxisTaps::new(w, crop);
        let grid = crop / p;
        let mut out = vec![0f32; pre.output_len()];
        for cam in 0..pre.cameras {
            let img = &frames[cam * h * w * 3..];
            for y in 0..crop {
                let (r0, r1, fy) = (
                    pre.taps.ys.i0[y] * w * 3,
                    pre.taps.ys.i1[y] * w * 3,
                    pre.taps.ys.frac[y],
                );
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
        for (h, w, crop, p) in [
            (48, 64, 56, 14),
            (256, 256, 378, 14),
            (30, 20, 14, 7),
            (480, 640, 378, 14),
            (2, 4, 2, 1),
        ] {
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
