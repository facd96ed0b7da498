//! Camera frames (RGB8) -> `pixel_values`: resize, normalize, patchify in one pass.
//!
//! The interpolation taps depend only on the frame and crop sizes, so they are computed
//! once at load; per inference each output value is two lerps and a normalize, written
//! straight into the vision context's input buffer in patch order.

/// One axis of a half-pixel bilinear resize: source taps and weights per output index.
#[derive(Clone, Debug)]
struct AxisTaps {
    i0: Vec<usize>,
    i1: Vec<usize>,
    frac: Vec<f32>,
}

impl AxisTaps {
    fn new(n_in: usize, n_out: usize) -> Self {
        let scale = n_in as f32 / n_out as f32;
        let mut t = AxisTaps {
            i0: vec![0; n_out],
            i1: vec![0; n_out],
            frac: vec![0.0; n_out],
        };
        for o in 0..n_out {
            let src = ((o as f32 + 0.5) * scale - 0.5).clamp(0.0, (n_in - 1) as f32);
            let i0 = src.floor() as usize;
            t.i0[o] = i0;
            t.i1[o] = (i0 + 1).min(n_in - 1);
            t.frac[o] = src - i0 as f32;
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
    xs: AxisTaps,
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
            xs: AxisTaps::new(width, crop),
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
    pub fn run(&self, frames: &[u8], out: &mut [f32]) {
        let (h, w, crop, p) = (self.height, self.width, self.crop, self.patch);
        let grid = crop / p;
        let patch_len = p * p * 3;
        for cam in 0..self.cameras {
            let img = &frames[cam * h * w * 3..(cam + 1) * h * w * 3];
            let dst = &mut out[cam * crop * crop * 3..(cam + 1) * crop * crop * 3];
            for y in 0..crop {
                let (r0, r1, fy) = (
                    self.ys.i0[y] * w * 3,
                    self.ys.i1[y] * w * 3,
                    self.ys.frac[y],
                );
                let (py, dy) = (y / p, y % p);
                for x in 0..crop {
                    let (c0, c1, fx) = (self.xs.i0[x] * 3, self.xs.i1[x] * 3, self.xs.frac[x]);
                    let (px, dx) = (x / p, x % p);
                    let base = (py * grid + px) * patch_len + (dy * p + dx) * 3;
                    for c in 0..3 {
                        let v00 = img[r0 + c0 + c] as f32;
                        let v01 = img[r0 + c1 + c] as f32;
                        let v10 = img[r1 + c0 + c] as f32;
                        let v11 = img[r1 + c1 + c] as f32;
                        let top = v00 * (1.0 - fx) + v01 * fx;
                        let bottom = v10 * (1.0 - fx) + v11 * fx;
                        let v = top * (1.0 - fy) + bottom * fy;
                        dst[base + c] = v / 255.0 * 2.0 - 1.0;
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
        let pre = Preprocessor::new(1, s, s, s, p);
        let mut out = vec![0f32; pre.output_len()];
        pre.run(&frame, &mut out);
        let at = |y: usize, x: usize, c: usize| {
            out[((y / p) * 2 + x / p) * p * p * 3 + ((y % p) * p + x % p) * 3 + c]
        };
        assert_eq!(at(20, 3, 0), (20.0 * 9.0) / 255.0 * 2.0 - 1.0);
        assert_eq!(at(20, 3, 1), 21.0 / 255.0 * 2.0 - 1.0);
        assert_eq!(at(27, 27, 2), 1.0);
    }

    #[test]
    fn downscale_by_two_averages_pixel_pairs() {
        // 2x4 -> 2x2 along x: half-pixel centres at 0.5 and 2.5 average neighbours.
        let frame: Vec<u8> = [0u8, 100, 200, 250]
            .iter()
            .flat_map(|v| [*v, *v, *v])
            .collect::<Vec<_>>()
            .repeat(2);
        let pre = Preprocessor::new(1, 2, 4, 2, 1);
        let mut out = vec![0f32; pre.output_len()];
        pre.run(&frame, &mut out);
        let back = |v: f32| (v + 1.0) / 2.0 * 255.0;
        assert!((back(out[0]) - 50.0).abs() < 1e-3);
        assert!((back(out[3]) - 225.0).abs() < 1e-3);
    }
}
