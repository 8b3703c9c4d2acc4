//! The multi-class margin loss (`nn.MultiMarginLoss`, `multi_margin_loss`)
//! and its backward, with CPU's formulas: per frame, the sum over the other
//! classes d of max(0, margin - x[y] + x[d])^p, times the target's weight,
//! over the class count. `p` and `margin` are runtime numbers (the power is
//! a select). Half types compute in float32, as CUDA's kernel (CPU's has
//! none).
use super::elementwise::{full_like, not_implemented};
use super::nn::{reduction, Reduction};
use super::rules::number;
use super::{op, Cx, Entry};
use crate::error::{Error, Kind, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};

pub static ENTRIES: &[Entry] =
    &[op("multi_margin_loss", forward).ruled(power_rule), op("multi_margin_loss_backward", backward).ruled(power_rule)];

fn power_rule(cx: &Cx) -> Result<()> {
    match number(cx, "p") {
        Some(p) if p != 1.0 && p != 2.0 => Err(Error::runtime("only p == 1 and p == 2 supported")),
        _ => Ok(()),
    }
}

/// What both directions read: the input as [frames, classes] in the
/// compute type, the target's one-hot mask, z = margin - x[y] + x[d] and
/// where it counts (positive, d not the target), the power's choice, and
/// the target's weight per frame.
struct Margins {
    frames: i64,
    classes: i64,
    dtype: DType,
    z: V,
    counts: V,
    target: V,
    squared: V,
    weight: Option<V>,
}

fn margins(cx: &mut Cx) -> Result<Margins> {
    let (t, tt) = (cx.meta("self")?, cx.meta("target")?);
    if !matches!(t.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(not_implemented("multi_margin_loss_cpu_kernel", t.dtype));
    }
    let rank = t.sizes.len();
    let non_empty = match rank {
        0 => true,
        1 => t.sizes[0] != 0,
        2 => t.sizes[1] != 0,
        _ => false,
    };
    if !non_empty {
        return Err(Error::runtime(format!(
            "Expected non-empty vector or matrix with optional 0-dim batch size, but got: {:?}",
            t.sizes
        )));
    }
    let (frames, classes) = match rank {
        0 => (1, 1),
        1 => (1, t.sizes[0]),
        _ => (t.sizes[0], t.sizes[1]),
    };
    if tt.sizes.len() > 1 || tt.numel() != frames {
        return Err(Error::runtime(format!(
            "multi_margin_loss: target tensor should be 1-D with size equal to the number of input samples (batch size). Expected target size [{frames}], but got {:?}. Input has shape {:?}.",
            tt.sizes, t.sizes
        )));
    }
    let weight = cx.meta("weight").ok();
    if let Some(w) = weight {
        if w.sizes.len() > 1 || w.numel() != classes {
            return Err(Error::runtime(format!("inconsistent weight size, expected {classes} but got {:?}", w.sizes)));
        }
    }
    for (dtype, expected) in [(Some(tt.dtype), DType::I64), (weight.map(|w| w.dtype), t.dtype)] {
        if let Some(d) = dtype.filter(|&d| d != expected) {
            return Err(Error::runtime(format!(
                "expected scalar type {} but found {}",
                expected.torch_name(),
                d.torch_name()
            )));
        }
    }
    let ct = opmath(t.dtype);
    let shape = [frames, classes];
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &shape);
    let x = cx.g.convert(x, ct);
    let y = cx.tensor("target")?;
    let y = cx.g.reshape(y, &[frames]);
    let zero = cx.g.full(0.0, DType::I64, &[frames]);
    let n = cx.g.full(classes as f64, DType::I64, &[frames]);
    let low = cx.g.compare("LT", y, zero);
    let high = cx.g.compare("GE", y, n);
    let out = cx.g.binary("stablehlo.or", low, high);
    cx.check_any(out, Kind::Runtime, "target out of range");
    let y = cx.g.broadcast_in_dim(y, &shape, &[0]);
    let class = cx.g.iota(DType::I64, &shape, 1);
    let target = cx.g.compare("EQ", class, y);
    let x_target = pick(cx, x, target);
    let margin = cx.scalar_like("margin", ct, &shape)?.expect("margin");
    let x_target = cx.g.broadcast_in_dim(x_target, &shape, &[0]);
    let z = cx.g.binary("stablehlo.subtract", margin, x_target);
    let z = cx.g.binary("stablehlo.add", z, x);
    let zeros = full_like(cx, 0.0, z);
    let positive = cx.g.compare("GT", z, zeros);
    let other = cx.g.unary("stablehlo.not", target);
    let counts = cx.g.binary("stablehlo.and", positive, other);
    let p = cx.scalar_like("p", ct, &shape)?.expect("p");
    let two = full_like(cx, 2.0, z);
    let squared = cx.g.compare("EQ", p, two);
    let weight = match cx.opt_tensor("weight")? {
        None => None,
        Some(w) => {
            let w = cx.g.convert(w, ct);
            let w = cx.g.reshape(w, &[classes]);
            let w = cx.g.broadcast_in_dim(w, &shape, &[1]);
            let w = pick(cx, w, target);
            Some(cx.g.broadcast_in_dim(w, &shape, &[0]))
        }
    };
    Ok(Margins { frames, classes, dtype: t.dtype, z, counts, target, squared, weight })
}

/// Per frame ([frames, classes] -> [frames]), the element where `mask` is set.
fn pick(cx: &mut Cx, x: V, mask: V) -> V {
    let zeros = full_like(cx, 0.0, x);
    let picked = cx.g.select(mask, x, zeros);
    cx.g.reduce(ReduceKind::Sum, picked, &[1])
}

fn forward(cx: &mut Cx) -> Result<Vec<V>> {
    let m = margins(cx)?;
    let zz = cx.g.binary("stablehlo.multiply", m.z, m.z);
    let mut h = cx.g.select(m.squared, zz, m.z);
    if let Some(w) = m.weight {
        h = cx.g.binary("stablehlo.multiply", h, w);
    }
    let zeros = full_like(cx, 0.0, h);
    let h = cx.g.select(m.counts, h, zeros);
    let sum = cx.g.reduce(ReduceKind::Sum, h, &[1]);
    let classes = full_like(cx, m.classes as f64, sum);
    let per_frame = cx.g.binary("stablehlo.divide", sum, classes);
    let batched = cx.meta("target")?.sizes.len() > 0;
    let r = match reduction(cx)? {
        Reduction::None if batched => per_frame,
        Reduction::None => cx.g.reshape(per_frame, &[]),
        kind => {
            let total = cx.g.reduce(ReduceKind::Sum, per_frame, &[0]);
            match kind {
                Reduction::Mean => {
                    let frames = full_like(cx, m.frames as f64, total);
                    cx.g.binary("stablehlo.divide", total, frames)
                }
                _ => total,
            }
        }
    };
    Ok(vec![cx.g.convert(r, m.dtype)])
}

fn backward(cx: &mut Cx) -> Result<Vec<V>> {
    let m = margins(cx)?;
    let shape = [m.frames, m.classes];
    let per = if reduction(cx)? == Reduction::Mean { m.frames * m.classes } else { m.classes };
    // CPU's g, in the input's type.
    let g = cx.g.full(1.0 / per as f64, m.dtype, &shape);
    let g = cx.g.convert(g, cx.g.ty(m.z).dtype);
    let two_g = full_like(cx, 2.0, g);
    let two_g = cx.g.binary("stablehlo.multiply", two_g, g);
    let two_gz = cx.g.binary("stablehlo.multiply", two_g, m.z);
    let mut h = cx.g.select(m.squared, two_gz, g);
    if let Some(w) = m.weight {
        h = cx.g.binary("stablehlo.multiply", h, w);
    }
    let zeros = full_like(cx, 0.0, h);
    let h = cx.g.select(m.counts, h, zeros);
    let total = cx.g.reduce(ReduceKind::Sum, h, &[1]);
    let total = cx.g.unary("stablehlo.negate", total);
    let total = cx.g.broadcast_in_dim(total, &shape, &[0]);
    let grad = cx.g.select(m.target, total, h);
    let go = cx.meta("grad_output")?;
    let go_v = cx.tensor("grad_output")?;
    let go_v = cx.g.convert(go_v, cx.g.ty(grad).dtype);
    let go_v = match go.sizes.len() {
        0 => cx.g.broadcast_in_dim(go_v, &shape, &[]),
        _ => {
            let v = cx.g.reshape(go_v, &[m.frames]);
            cx.g.broadcast_in_dim(v, &shape, &[0])
        }
    };
    let grad = cx.g.binary("stablehlo.multiply", grad, go_v);
    let grad = cx.g.convert(grad, m.dtype);
    Ok(vec![cx.g.reshape(grad, cx.meta("self")?.sizes)])
}
