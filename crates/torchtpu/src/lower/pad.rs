//! Reflection and replication padding of the last 1-3 dimensions, and their
//! backward operators: a resampling (see `resize`) whose one tap per output
//! position reads the reflected or clamped input position. (Constant padding
//! is `constant_pad_nd`, a composite of `pad` and copies; circular padding a
//! composite of slices and `cat`.)
use super::elementwise::{finish, not_implemented};
use super::resize::{resample, resample_backward, Resample, Tap};
use super::{op, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::V;

pub static ENTRIES: &[Entry] = &[
    op("reflection_pad1d", |cx| pad(cx, true)),
    op("reflection_pad2d", |cx| pad(cx, true)),
    op("reflection_pad3d", |cx| pad(cx, true)),
    op("replication_pad1d", |cx| pad(cx, false)),
    op("replication_pad2d", |cx| pad(cx, false)),
    op("replication_pad3d", |cx| pad(cx, false)),
    op("reflection_pad1d_backward", |cx| pad_backward(cx, true)),
    op("reflection_pad2d_backward", |cx| pad_backward(cx, true)),
    op("reflection_pad3d_backward", |cx| pad_backward(cx, true)),
    op("replication_pad1d_backward", |cx| pad_backward(cx, false)),
    op("replication_pad2d_backward", |cx| pad_backward(cx, false)),
    op("replication_pad3d_backward", |cx| pad_backward(cx, false)),
];

/// The source position of each output position of one padded dimension.
fn tap(reflect: bool, input: i64, low: i64, high: i64) -> Tap {
    let index = (0..input + low + high)
        .map(|o| {
            let src = o - low;
            if reflect {
                let r = src.abs();
                (input - 1) - ((input - 1) - r).abs()
            } else {
                src.clamp(0, input - 1)
            }
        })
        .collect();
    Tap { index, weight: None }
}

/// The padded dimensions of `sizes`: `padding` pairs (low, high) start with
/// the last dimension, as in `F.pad`.
fn plan(cx: &Cx, reflect: bool, sizes: &[i64]) -> Result<Vec<Resample>> {
    let padding = cx.ints("padding")?;
    let d = padding.len() / 2;
    let rank = sizes.len();
    (0..d)
        .map(|k| {
            let dim = rank - 1 - k;
            let (low, high, input) = (padding[2 * k], padding[2 * k + 1], sizes[dim]);
            if reflect && (low >= input || high >= input) {
                return Err(Error::runtime(format!(
                    "Argument #{}: Padding size should be less than the corresponding input dimension, but got: padding ({low}, {high}) at dimension {dim} of input {sizes:?}",
                    4 + 2 * k
                )));
            }
            Ok(Resample { dim, input, taps: vec![tap(reflect, input, low, high)] })
        })
        .collect()
}

fn pad(cx: &mut Cx, reflect: bool) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let plan = plan(cx, reflect, t.sizes)?;
    if t.dtype == DType::Bool {
        // CPU's kernels take every type but bool (its name is the op's).
        return Err(not_implemented(cx.op.entry.name, t.dtype));
    }
    let x = cx.tensor("self")?;
    Ok(vec![resample(cx, x, &plan)])
}

fn pad_backward(cx: &mut Cx, reflect: bool) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let plan = plan(cx, reflect, t.sizes)?;
    let g = cx.tensor("grad_output")?;
    let dtype = cx.meta("grad_output")?.dtype;
    let g = cx.g.convert(g, opmath(dtype));
    let r = resample_backward(cx, g, &plan);
    finish(cx, r, dtype)
}
