//! Neural-network operators: activations and their backward.
use super::elementwise::opmath;
use super::{op, Cx, Entry};
use crate::error::Result;
use crate::ir::V;

pub static ENTRIES: &[Entry] = &[op("relu", relu), op("threshold_backward", threshold_backward)];

fn relu(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let x = cx.tensor("self")?;
    let zero = cx.g.full(0.0, t.dtype, t.sizes);
    Ok(vec![cx.g.binary("stablehlo.maximum", x, zero)])
}

/// `grad_output` where `self > threshold`, else 0.
fn threshold_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let ct = opmath(t.dtype);
    let g = cx.tensor("grad_output")?;
    let x = cx.tensor("self")?;
    let x = cx.g.convert(x, ct);
    let th = cx.scalar_like("threshold", ct, t.sizes)?.expect("threshold");
    let zero = cx.g.full(0.0, t.dtype, t.sizes);
    let keep = cx.g.compare("GT", x, th);
    Ok(vec![cx.g.select(keep, g, zero)])
}
