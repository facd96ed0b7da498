//! Fast-WAM's camera frames -> `image` `[1, 3, h, cameras * w]`, as upstream LIBERO eval
//! prepares them: an optional 180-degree turn per camera (LIBERO's cameras are mounted
//! upside down), an aspect-preserving Pillow bilinear resize and a centre crop
//! (`_center_crop_resize`), the cameras side by side, `x * (2/255) - 1`.
//!
//! [`PillowBilinear`] is Pillow's resample, bit-exact on uint8 (checked against Pillow
//! 12.0.0 and 13.0.0 themselves, tests/upstream_fastwam.rs): triangle taps widened by the
//! scale when shrinking (so it antialiases), 22-bit fixed-point weights, two separable
//! passes each rounded to uint8, in the [`PassOrder`] of the Pillow release. Fast-WAM uses
//! Pillow 12.0.0's (upstream pins `pillow==12.0.0`): horizontal first, always. Pillow 13
//! runs some shrinks vertical first, which changes the rounding. Taps are computed once at load; per frame only the cropped
//! output is computed (every output pixel depends only on its taps, so skipping the
//! cropped-away pixels changes no value) into preallocated scratch.

/// Pillow's `PRECISION_BITS` for 8-bit images.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// One axis of Pillow's bilinear resample: per output index, the first source index,
/// the tap count and `ksize` fixed-point weights.
#[derive(Clone, Debug)]
struct Taps {
    first: Vec<usize>,
    count: Vec<usize>,
    ksize: usize,
    weights: Vec<i32>,
}

impl Taps {
    /// Pillow's `precompute_coeffs` + `normalize_coeffs_8bpc` (f64, in its order).
    fn new(n_in: usize, n_out: usize) -> Self {
        let scale = n_in as f64 / n_out as f64;
        let filterscale = scale.max(1.0);
        let support = filterscale; // the bilinear filter's support is 1
        let ksize = support.ceil() as usize * 2 + 1;
        let mut t = Taps {
            first: vec![0; n_out],
            count: vec![0; n_out],
            ksize,
            weights: vec![0; n_out * ksize],
        };
        let mut w = vec![0f64; ksize];
        for o in 0..n_out {
            let center = (o as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C casts truncate toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(n_in as i64) as usize - xmin;
            let mut total = 0.0;
            for (x, wx) in w.iter_mut().enumerate().take(xmax) {
                let d = ((x + xmin) as f64 - center + 0.5) * ss;
                let d = d.abs();
                *wx = if d < 1.0 { 1.0 - d } else { 0.0 };
                total += *wx;
            }
            let row = &mut t.weights[o * ksize..o * ksize + xmax];
            for (k, &wx) in row.iter_mut().zip(&w[..xmax]) {
                let v = if total != 0.0 { wx / total } else { wx };
                let f = v * f64::from(1u32 << PRECISION_BITS);
                *k = if v < 0.0 {
                    (f - 0.5) as i32
                } else {
                    (f + 0.5) as i32
                };
            }
            t.first[o] = xmin;
            t.count[o] = xmax;
        }
        t
    }

    /// One output value from `n` source values `at(i)`, rounded and clipped to uint8.
    #[inline]
    fn apply(&self, o: usize, at: impl Fn(usize) -> u8) -> u8 {
        let mut acc: i32 = 1 << (PRECISION_BITS - 1);
        let k = &self.weights[o * self.ksize..];
        for (j, &w) in k.iter().enumerate().take(self.count[o]) {
            acc += i32::from(at(self.first[o] + j)) * w;
        }
        (acc >> PRECISION_BITS).clamp(0, 255) as u8
    }
}

/// Which of Pillow's two separable passes runs first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassOrder {
    /// Pillow <= 12 (upstream Fast-WAM's pin, 12.0.0): horizontal first, always.
    HorizontalFirst,
    /// Pillow 13: vertical first when the height shrinks by more than twice as many pixels
    /// as the width does, else horizontal first.
    Pillow13,
}

/// Pillow's `Image.resize((out_w, out_h), Image.BILINEAR)` of an RGB8 image, restricted to
/// the window `[top, top + crop_h) x [left, left + crop_w)` of the resized image.
#[derive(Clone, Debug)]
pub struct PillowBilinear {
    src_h: usize,
    src_w: usize,
    top: usize,
    left: usize,
    crop_h: usize,
    crop_w: usize,
    ys: Taps,
    xs: Taps,
    vertical_first: bool,
    /// The first pass's output (uint8, as in Pillow).
    temp: Vec<u8>,
}

impl PillowBilinear {
    /// `src_h x src_w` resized to `out_h x out_w`, cropped at (`top`, `left`) to
    /// `crop_h x crop_w` (the window must lie inside the resized image), passes in `order`.
    pub fn new(
        src_h: usize,
        src_w: usize,
        out_h: usize,
        out_w: usize,
        (top, left, crop_h, crop_w): (usize, usize, usize, usize),
        order: PassOrder,
    ) -> Self {
        assert!(top + crop_h <= out_h && left + crop_w <= out_w);
        let (dh, dw) = (src_h as i64 - out_h as i64, src_w as i64 - out_w as i64);
        let vertical_first = order == PassOrder::Pillow13 && dh > 0 && dh > dw * 2;
        let temp = if vertical_first {
            vec![0; crop_h * src_w * 3]
        } else {
            vec![0; src_h * crop_w * 3]
        };
        Self {
            src_h,
            src_w,
            top,
            left,
            crop_h,
            crop_w,
            ys: Taps::new(src_h, out_h),
            xs: Taps::new(src_w, out_w),
            vertical_first,
            temp,
        }
    }

    /// Whether the vertical pass runs first for this geometry.
    pub fn vertical_first(&self) -> bool {
        self.vertical_first
    }

    /// Resizes `src` (`src_h x src_w x 3`) and calls `put(y, x, rgb)` for every pixel of
    /// the crop window.
    pub fn run(&mut self, src: &[u8], mut put: impl FnMut(usize, usize, [u8; 3])) {
        let (sw, cw, ch) = (self.src_w, self.crop_w, self.crop_h);
        let px = |img: &[u8], row_len: usize, y: usize, x: usize, c: usize| {
            img[(y * row_len + x) * 3 + c]
        };
        if self.vertical_first {
            for y in 0..ch {
                for x in 0..sw {
                    for c in 0..3 {
                        self.temp[(y * sw + x) * 3 + c] =
                            self.ys.apply(self.top + y, |i| px(src, sw, i, x, c));
                    }
                }
            }
            for y in 0..ch {
                for x in 0..cw {
                    let mut rgb = [0u8; 3];
                    for (c, v) in rgb.iter_mut().enumerate() {
                        *v = self
                            .xs
                            .apply(self.left + x, |i| px(&self.temp, sw, y, i, c));
                    }
                    put(y, x, rgb);
                }
            }
        } else {
            for y in 0..self.src_h {
                for x in 0..cw {
                    for c in 0..3 {
                        self.temp[(y * cw + x) * 3 + c] =
                            self.xs.apply(self.left + x, |i| px(src, sw, y, i, c));
                    }
                }
            }
            for y in 0..ch {
                for x in 0..cw {
                    let mut rgb = [0u8; 3];
                    for (c, v) in rgb.iter_mut().enumerate() {
                        *v = self.ys.apply(self.top + y, |i| px(&self.temp, cw, i, x, c));
                    }
                    put(y, x, rgb);
                }
            }
        }
    }
}

/// Upstream's `_center_crop_resize` geometry: the resized size `round(src * scale)` with
/// `scale = max(w / src_w, h / src_h)` (Python's round: half to even) and the crop origin.
pub fn center_crop_geometry(
    src_h: usize,
    src_w: usize,
    h: usize,
    w: usize,
) -> (usize, usize, usize, usize) {
    let scale = (w as f64 / src_w as f64).max(h as f64 / src_h as f64);
    let rw = (src_w as f64 * scale).round_ties_even() as usize;
    let rh = (src_h as f64 * scale).round_ties_even() as usize;
    let left = rw.saturating_sub(w) / 2;
    let top = rh.saturating_sub(h) / 2;
    (rh, rw, top, left)
}

/// All cameras of one observation -> the `image` input of `wm_vae_enc`.
#[derive(Clone, Debug)]
pub struct FastWamImage {
    pub cameras: usize,
    pub frame_h: usize,
    pub frame_w: usize,
    pub cam_h: usize,
    pub cam_w: usize,
    rotate: Vec<bool>,
    resize: PillowBilinear,
    /// One camera frame turned by 180 degrees.
    turned: Vec<u8>,
}

impl FastWamImage {
    pub fn new(
        cameras: usize,
        frame: (usize, usize),
        cam: (usize, usize),
        rotate: &[bool],
    ) -> Self {
        let ((fh, fw), (ch, cw)) = (frame, cam);
        let (rh, rw, top, left) = center_crop_geometry(fh, fw, ch, cw);
        Self {
            cameras,
            frame_h: fh,
            frame_w: fw,
            cam_h: ch,
            cam_w: cw,
            rotate: rotate.to_vec(),
            resize: PillowBilinear::new(
                fh,
                fw,
                rh,
                rw,
                (top, left, ch, cw),
                PassOrder::HorizontalFirst,
            ),
            turned: vec![0; fh * fw * 3],
        }
    }

    pub fn frames_len(&self) -> usize {
        self.cameras * self.frame_h * self.frame_w * 3
    }

    pub fn output_len(&self) -> usize {
        3 * self.cam_h * self.cameras * self.cam_w
    }

    /// `frames` (`frames_len()` bytes, checked by the caller) -> `out` (`output_len()`).
    pub fn run(&mut self, frames: &[u8], out: &mut [f32]) {
        let n = self.frame_h * self.frame_w * 3;
        let (ch, width) = (self.cam_h, self.cameras * self.cam_w);
        let scale = (2.0f64 / 255.0) as f32;
        for cam in 0..self.cameras {
            let mut src = &frames[cam * n..(cam + 1) * n];
            if self.rotate[cam] {
                // img[::-1, ::-1]: pixel order reversed, each pixel's RGB kept.
                for (dst, px) in self
                    .turned
                    .chunks_exact_mut(3)
                    .zip(src.chunks_exact(3).rev())
                {
                    dst.copy_from_slice(px);
                }
                src = &self.turned;
            }
            let x0 = cam * self.cam_w;
            self.resize.run(src, |y, x, rgb| {
                for (c, v) in rgb.into_iter().enumerate() {
                    out[(c * ch + y) * width + x0 + x] = f32::from(v) * scale - 1.0;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_geometry_of_libero_and_the_fixture() {
        // 256x256 -> 224x224: scale 0.875, no crop.
        assert_eq!(center_crop_geometry(256, 256, 224, 224), (224, 224, 0, 0));
        // 40x48 -> 32x32: scale 0.8 -> 32x38 (38.4 rounds to 38), crop left 3.
        assert_eq!(center_crop_geometry(40, 48, 32, 32), (32, 38, 0, 3));
    }

    #[test]
    fn same_size_is_identity_and_halving_averages_with_antialiasing() {
        let img: Vec<u8> = (0..4 * 4 * 3).map(|i| (i * 7 % 256) as u8).collect();
        let mut r = PillowBilinear::new(4, 4, 4, 4, (0, 0, 4, 4), PassOrder::HorizontalFirst);
        let mut out = vec![0u8; 48];
        r.run(&img, |y, x, rgb| {
            out[(y * 4 + x) * 3..][..3].copy_from_slice(&rgb)
        });
        assert_eq!(out, img);
        // 1x4 -> 1x2 (shrink by 2): support 2, taps at distance 0.5 and 1.5 weigh
        // 0.75 and 0.25: out[0] = (0.25*0 + 0.75*100 + 0.75*... ) hand-checked below.
        let row: Vec<u8> = [0u8, 100, 200, 40].iter().flat_map(|v| [*v; 3]).collect();
        let mut r = PillowBilinear::new(1, 4, 1, 2, (0, 0, 1, 2), PassOrder::HorizontalFirst);
        let mut got = [0u8; 2];
        r.run(&row, |_, x, rgb| got[x] = rgb[0]);
        // centre 1.0: taps x=0 (d 0.25 -> 0.75), x=1 (0.25 -> 0.75), x=2 (0.75 -> 0.25):
        // (0*.75 + 100*.75 + 200*.25) / 1.75 = 71.43 -> 71.
        // centre 3.0: x=1 (0.75 -> 0.25), x=2 (0.25 -> .75), x=3 (.25 -> .75):
        // (25 + 150 + 30) / 1.75 = 117.1 -> 117.
        assert_eq!(got, [71, 117]);
    }

    #[test]
    fn turned_cameras_are_rotated_before_the_crop() {
        // 1 camera 2x2 -> 2x2: the 180-degree turn swaps opposite corners.
        let frame: Vec<u8> = [10u8, 20, 30, 40].iter().flat_map(|v| [*v; 3]).collect();
        let mut im = FastWamImage::new(1, (2, 2), (2, 2), &[true]);
        let mut out = vec![0f32; im.output_len()];
        im.run(&frame, &mut out);
        let back: Vec<u8> = out[..4]
            .iter()
            .map(|v| ((v + 1.0) * 127.5).round() as u8)
            .collect();
        assert_eq!(back, [40, 30, 20, 10]);
    }
}
