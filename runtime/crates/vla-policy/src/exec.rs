//! Small helpers shared by the pipelines: binding buffers in graph order, the buffers a
//! pipeline's contexts read and write (host memory or regions of registered memory),
//! timings, finiteness.

use std::ops::Range;
use std::time::Duration;
use vla_qnn::{Graph, QnnError, Region};
use vla_tensor::AlignedBuf;

use crate::PolicyError;

/// What turns the QNN binding's `error` into [`PolicyError::Qnn`] for `component` (for
/// `map_err`); the name is copied only on failure.
pub(crate) fn qnn(component: &str) -> impl FnOnce(QnnError) -> PolicyError + '_ {
    move |error| PolicyError::Qnn {
        component: component.to_string(),
        error,
    }
}

/// Puts `items` (in the pipeline's order) at the graph positions `idx` (a permutation,
/// checked at load).
pub(crate) fn permute<T, const N: usize>(idx: [usize; N], items: [T; N]) -> [T; N] {
    let mut out: [Option<T>; N] = [const { None }; N];
    for (k, b) in items.into_iter().enumerate() {
        out[idx[k]] = Some(b);
    }
    out.map(|o| o.expect("graph positions are a permutation"))
}

/// A buffer a context reads or writes: host memory handed to QNN as a client buffer, or a
/// region of the policy's registered memory (read and written in place by the HTP).
pub(crate) enum Buf {
    /// Host memory (QNN copies it to and from its own buffers around each execute).
    Host(AlignedBuf),
    /// A region of an HTP shared buffer.
    Shared(Region),
}

impl Buf {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Buf::Host(b) => b.as_bytes(),
            Buf::Shared(r) => r.as_bytes(),
        }
    }
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Buf::Host(b) => b.as_bytes_mut(),
            Buf::Shared(r) => r.as_bytes_mut(),
        }
    }
    pub fn as_f32(&self) -> &[f32] {
        bytemuck::cast_slice(self.as_bytes())
    }
    pub fn as_f32_mut(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(self.as_bytes_mut())
    }
    /// The whole buffer as a context's input.
    pub fn src(&self) -> Src<'_> {
        self.part(0..self.as_bytes().len())
    }
    /// Bytes `r` as a context's input: a registered graph was bound to that part of the
    /// region at load, so it is handed the whole region (checked to hold the tensor).
    pub fn part(&self, r: Range<usize>) -> Src<'_> {
        match self {
            Buf::Host(b) => Src::Host(&b.as_bytes()[r]),
            Buf::Shared(region) => Src::Shared(region),
        }
    }
    /// The whole buffer as a context's output.
    pub fn dst(&mut self) -> Dst<'_> {
        let n = self.as_bytes().len();
        self.part_mut(0..n)
    }
    /// Bytes `r` as a context's output (see [`Buf::part`]).
    pub fn part_mut(&mut self, r: Range<usize>) -> Dst<'_> {
        match self {
            Buf::Host(b) => Dst::Host(&mut b.as_bytes_mut()[r]),
            Buf::Shared(region) => Dst::Shared(region),
        }
    }
}

/// Moves `old`'s contents into `region` and puts the region in its place (the move onto
/// registered memory, at load).
pub(crate) fn move_buf(old: &mut Buf, mut region: Region) {
    region.as_bytes_mut().copy_from_slice(old.as_bytes());
    *old = Buf::Shared(region);
}

impl crate::guard::Scanned for Buf {
    fn values(&self) -> &[f32] {
        self.as_f32()
    }
}

/// A context input: host bytes or a registered region.
#[derive(Clone, Copy)]
pub(crate) enum Src<'a> {
    Host(&'a [u8]),
    Shared(&'a Region),
}

/// A context output: host bytes or a registered region.
pub(crate) enum Dst<'a> {
    Host(&'a mut [u8]),
    Shared(&'a mut Region),
}

/// Where a graph takes its inputs and puts its outputs: `inputs[k]` is the graph position
/// of the pipeline's k-th input (the pipeline's order is the caller's), `outputs[k]` of
/// its k-th output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GraphIo<const N: usize, const M: usize> {
    /// Graph input positions, in the pipeline's order.
    pub(crate) inputs: [usize; N],
    /// Graph output positions, in the pipeline's order.
    pub(crate) outputs: [usize; M],
}

/// Executes `graph` on `ins` and `outs` (in the pipeline's order, put at the graph
/// positions `io`). A graph bound to registered memory takes regions only, read and
/// written in place; otherwise every buffer goes to QNN as a client buffer.
pub(crate) fn execute<const N: usize, const M: usize>(
    graph: &mut Graph,
    io: GraphIo<N, M>,
    ins: [Src<'_>; N],
    outs: [Dst<'_>; M],
) -> Result<(), QnnError> {
    let (ins, outs) = (permute(io.inputs, ins), permute(io.outputs, outs));
    if graph.is_shared() {
        let ins = ins.map(|s| match s {
            Src::Shared(r) => Some(r),
            Src::Host(_) => None,
        });
        let mut outs = outs.map(|d| match d {
            Dst::Shared(r) => Some(r),
            Dst::Host(_) => None,
        });
        if ins.iter().any(Option::is_none) || outs.iter().any(Option::is_none) {
            return Err(QnnError::SharedRegion {
                graph: graph.label().to_owned(),
                tensor: String::new(),
                reason: "host memory given to a graph bound to registered memory".into(),
            });
        }
        let ins = ins.map(|r| r.expect("checked above"));
        let mut outs = core::array::from_fn::<_, M, _>(|k| outs[k].take().expect("checked above"));
        return graph.execute_regions(&ins, &mut outs);
    }
    let ins = ins.map(|s| match s {
        Src::Host(b) => b,
        Src::Shared(r) => r.as_bytes(),
    });
    let mut outs = outs.map(|d| match d {
        Dst::Host(b) => b,
        Dst::Shared(r) => r.as_bytes_mut(),
    });
    graph.execute(&ins, &mut outs)
}

/// 1 when `x` is NaN or Inf, else 0. Their exponent bits are all ones, so with the sign
/// masked off their bit pattern exceeds `f32::MAX`'s: an integer compare that vectorizes,
/// where `is_finite` per value does not, so counting over a large output runs at memory
/// speed.
#[inline]
pub(crate) fn non_finite(x: f32) -> u32 {
    const MAX_FINITE: u32 = 0x7f7f_ffff;
    u32::from(x.to_bits() & 0x7fff_ffff > MAX_FINITE)
}

/// NaN and Inf values in `v` (see [`non_finite`]).
pub fn count_non_finite(v: &[f32]) -> usize {
    v.chunks(1 << 20)
        .map(|c| c.iter().map(|&x| non_finite(x)).sum::<u32>() as usize)
        .sum()
}

/// Wall time per component of the last inference; entries are allocated at load and only
/// overwritten afterwards.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Per component, in the order given to [`Timings::new`], its wall time in the last
    /// inference.
    pub components: Vec<(String, Duration)>,
    /// Wall time of the whole last inference.
    pub total: Duration,
}

impl Timings {
    /// Zeroed timings for these component names (allocates; call at load).
    pub fn new(names: &[String]) -> Self {
        Self {
            components: names.iter().map(|n| (n.clone(), Duration::ZERO)).collect(),
            total: Duration::ZERO,
        }
    }

    /// Zeroes every entry before an inference, without allocating.
    pub fn reset(&mut self) {
        self.components
            .iter_mut()
            .for_each(|c| c.1 = Duration::ZERO);
        self.total = Duration::ZERO;
    }

    /// Adds `d` to the component at `index` (its position in the names given to
    /// [`Timings::new`]).
    pub fn add(&mut self, index: usize, d: Duration) {
        self.components[index].1 += d;
    }

    /// Time spent outside the contexts (host glue).
    pub fn host(&self) -> Duration {
        self.total
            .saturating_sub(self.components.iter().map(|c| c.1).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::count_non_finite;

    #[test]
    fn counts_nan_and_both_infinities_only() {
        let mut v = vec![
            0.0f32,
            -0.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
        ];
        assert_eq!(count_non_finite(&v), 0);
        v.extend([f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        v.push(f32::from_bits(0x7f80_0001)); // signalling NaN
        assert_eq!(count_non_finite(&v), 5);
        assert_eq!(count_non_finite(&[]), 0);
    }
}
