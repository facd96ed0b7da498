//! The per-context parity gate: golden inputs in, outputs compared to golden outputs.
//!
//! A golden `*_io.npz` holds a context's inputs and reference outputs under the tensor
//! names of the context. Inputs are matched by name and checked for shape and dtype
//! before anything runs; outputs are decoded to f32 and compared with the cosine gate
//! (>= 0.9999 in the seeds), max abs diff and a within-tolerance ratio.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};
use vla_npz::{DType, Npz};
use vla_qnn::{Graph, IoBuffers, QnnError, TensorInfo};
use vla_tensor::{compare, decode_f32, encode_f32, Comparison, ElementType};

/// Thresholds of the gate.
#[derive(Clone, Copy, Debug)]
pub struct GateOptions {
    /// An output passes when its cosine similarity to the golden is at least this (default
    /// 0.9999) and it holds no NaN or infinity.
    pub min_cosine: f64,
    /// Tolerance of the informational within-tolerance ratio: `|a-e| <= atol + rtol*|e|`.
    pub atol: f64,
    /// Relative tolerance of the within-tolerance ratio (see `atol`); informational only.
    pub rtol: f64,
}

impl Default for GateOptions {
    fn default() -> Self {
        Self {
            min_cosine: 0.9999,
            atol: 1e-3,
            rtol: 1e-2,
        }
    }
}

/// Why golden data could not be fed to or compared with a graph.
#[derive(Debug)]
#[non_exhaustive]
pub enum ParityError {
    /// The archive has no array named like a context input or output.
    MissingTensor {
        /// Label of the golden archive (its path).
        npz: String,
        /// The context tensor (and npz array) name.
        tensor: String,
        /// The array names the archive does hold.
        available: Vec<String>,
    },
    /// The golden array's shape differs from the context tensor's.
    Shape {
        /// Label of the golden archive (its path).
        npz: String,
        /// The context tensor (and npz array) name.
        tensor: String,
        /// The context tensor's shape.
        expected: Vec<usize>,
        /// The golden array's shape.
        found: Vec<usize>,
    },
    /// The golden input's dtype cannot be copied or encoded into the context tensor's element
    /// type (e.g. an integer array for a float tensor).
    DType {
        /// Label of the golden archive (its path).
        npz: String,
        /// The context tensor (and npz array) name.
        tensor: String,
        /// The context tensor's element type, as printed.
        context_type: String,
        /// The golden array's dtype.
        found: DType,
    },
    /// Reading the golden archive failed.
    Npz(vla_npz::NpzError),
    /// Executing the graph failed.
    Qnn(QnnError),
}

impl core::fmt::Display for ParityError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ParityError::MissingTensor {
                npz,
                tensor,
                available,
            } => {
                write!(
                    f,
                    "{npz}: no array for tensor `{tensor}` (has: {})",
                    available.join(", ")
                )
            }
            ParityError::Shape {
                npz,
                tensor,
                expected,
                found,
            } => write!(
                f,
                "{npz}: tensor `{tensor}` has shape {found:?}, the context needs {expected:?}"
            ),
            ParityError::DType {
                npz,
                tensor,
                context_type,
                found,
            } => write!(
                f,
                "{npz}: tensor `{tensor}` is {found}, which cannot feed a {context_type} tensor"
            ),
            ParityError::Npz(e) => e.fmt(f),
            ParityError::Qnn(e) => e.fmt(f),
        }
    }
}

// `Npz` and `Qnn` are the carried error's own message, so its causes are theirs.
impl std::error::Error for ParityError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ParityError::Npz(e) => e.source(),
            ParityError::Qnn(e) => e.source(),
            _ => None,
        }
    }
}

impl From<QnnError> for ParityError {
    fn from(e: QnnError) -> Self {
        ParityError::Qnn(e)
    }
}
impl From<vla_npz::NpzError> for ParityError {
    fn from(e: vla_npz::NpzError) -> Self {
        ParityError::Npz(e)
    }
}

/// One output's verdict.
#[derive(Clone, Debug)]
pub struct OutputParity {
    /// The output tensor's name.
    pub name: String,
    /// The output tensor's shape.
    pub shape: Vec<usize>,
    /// Cosine, max abs diff and within-tolerance ratio against the golden.
    pub comparison: Comparison,
    /// The cosine this output was held to.
    pub min_cosine: f64,
    /// True when the cosine reaches `min_cosine` and no value is NaN or infinite.
    pub passed: bool,
}

/// A whole context's verdict.
#[derive(Clone, Debug)]
pub struct ContextParity {
    /// The graph's label, as printed in reports.
    pub label: String,
    /// One verdict per graph output, in the graph's output order.
    pub outputs: Vec<OutputParity>,
    /// Wall time of the one graph execution (not the input encoding or the comparison).
    pub execute_time: Duration,
}

impl ContextParity {
    /// True when every output passed.
    pub fn passed(&self) -> bool {
        self.outputs.iter().all(|o| o.passed)
    }
    /// Lowest cosine over the outputs.
    pub fn min_cosine(&self) -> f64 {
        self.outputs
            .iter()
            .map(|o| o.comparison.cosine)
            .fold(
                f64::INFINITY,
                |a, c| if c.is_nan() { f64::NAN } else { a.min(c) },
            )
    }
}

fn array_for(npz: &Npz, t: &TensorInfo) -> Result<vla_npz::Array, ParityError> {
    if !npz.contains(&t.name) {
        return Err(ParityError::MissingTensor {
            npz: npz.label().to_string(),
            tensor: t.name.clone(),
            available: npz.names().map(str::to_owned).collect(),
        });
    }
    let a = npz.array(&t.name)?;
    let expected = t.shape();
    if a.shape() != expected.as_slice() {
        return Err(ParityError::Shape {
            npz: npz.label().to_string(),
            tensor: t.name.clone(),
            expected,
            found: a.shape().to_vec(),
        });
    }
    Ok(a)
}

/// Raw storage of an npz dtype equal to the context's element type (copied as is).
fn same_storage(d: DType, e: ElementType) -> bool {
    matches!(
        (d, e),
        (DType::F32, ElementType::F32)
            | (DType::F16, ElementType::F16)
            | (DType::I32, ElementType::I32)
            | (DType::U8, ElementType::U8 | ElementType::UFixed8(_))
            | (DType::I8, ElementType::SFixed8(_))
            | (DType::U16, ElementType::UFixed16(_))
            | (DType::I16, ElementType::SFixed16(_))
            | (DType::Bool, ElementType::Bool)
    )
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::F64)
}

/// Writes the golden inputs of `npz` into `io` (buffers from `graph.allocate_io()`).
pub fn fill_inputs(graph: &Graph, npz: &Npz, io: &mut IoBuffers) -> Result<(), ParityError> {
    for (t, buf) in graph.inputs().iter().zip(io.inputs.iter_mut()) {
        let a = array_for(npz, t)?;
        let e = t
            .element
            .expect("graph tensors are checked for support at retrieval");
        let dtype_err = || ParityError::DType {
            npz: npz.label().to_string(),
            tensor: t.name.clone(),
            context_type: e.to_string(),
            found: a.dtype(),
        };
        if same_storage(a.dtype(), e) {
            buf.as_bytes_mut().copy_from_slice(a.bytes());
        } else if is_float(a.dtype())
            && (e.quantization().is_some() || matches!(e, ElementType::F32 | ElementType::F16))
        {
            let values = a.to_f32()?;
            encode_f32(&values, e, buf.as_bytes_mut()).map_err(|_| dtype_err())?;
        } else {
            return Err(dtype_err());
        }
    }
    Ok(())
}

/// Golden value of output `t` as f32 (fixed-point goldens are dequantized with the
/// tensor's own parameters).
fn expected_f32(npz: &Npz, t: &TensorInfo) -> Result<Vec<f32>, ParityError> {
    let a = array_for(npz, t)?;
    let e = t
        .element
        .expect("graph tensors are checked for support at retrieval");
    if e.quantization().is_some() && same_storage(a.dtype(), e) {
        let mut out = vec![0f32; a.len()];
        decode_f32(a.bytes(), e, &mut out).expect("shape checked above");
        return Ok(out);
    }
    Ok(a.to_f32()?)
}

/// Runs `graph` once on the golden inputs and compares every output against
/// [`GateOptions::min_cosine`].
pub fn check_context(
    graph: &mut Graph,
    npz: &Npz,
    gate: &GateOptions,
) -> Result<ContextParity, ParityError> {
    check_context_with(graph, npz, gate, |_| gate.min_cosine)
}

/// As [`check_context`], each output held to `min_cosine(output name)` instead.
pub fn check_context_with(
    graph: &mut Graph,
    npz: &Npz,
    gate: &GateOptions,
    min_cosine: impl Fn(&str) -> f64,
) -> Result<ContextParity, ParityError> {
    let mut io = graph.allocate_io();
    fill_inputs(graph, npz, &mut io)?;
    // Read every expected output before running, so a bad golden fails fast.
    let expected: Vec<Vec<f32>> = graph
        .outputs()
        .iter()
        .map(|t| expected_f32(npz, t))
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    graph.execute_io(&mut io)?;
    let execute_time = start.elapsed();
    let mut outputs = Vec::new();
    for ((t, buf), exp) in graph.outputs().iter().zip(&io.outputs).zip(&expected) {
        let mut actual = vec![0f32; t.elements()];
        decode_f32(buf.as_bytes(), t.element.expect("checked"), &mut actual)
            .expect("buffer sized from metadata");
        let comparison = compare(&actual, exp, gate.atol, gate.rtol);
        let threshold = min_cosine(&t.name);
        let passed = comparison.non_finite == 0 && comparison.cosine >= threshold;
        outputs.push(OutputParity {
            name: t.name.clone(),
            shape: t.shape(),
            comparison,
            min_cosine: threshold,
            passed,
        });
    }
    Ok(ContextParity {
        label: graph.label().to_string(),
        outputs,
        execute_time,
    })
}
