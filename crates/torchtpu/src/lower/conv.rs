//! Convolutions: `convolution_overrideable` and its backward, PyTorch's hooks
//! for out-of-tree backends, with any number of spatial dimensions, groups,
//! strides, padding, dilation, and transposed convolutions.
//!
//! Both forms are one StableHLO convolution in PyTorch's layouts ([N, C,
//! spatial...] data, [out, in / groups, spatial...] kernel). A transposed
//! convolution is the input gradient of a plain one: a convolution of the
//! lhs-dilated input with the weight spatially reversed and regrouped to a
//! kernel. Gradients are convolutions as well, derived from the IR
//! convolution whatever it computes (as JAX's `_conv_general_dilated_transpose_*`):
//! the input's convolves grad_output with the reversed kernel, the kernel's
//! convolves the input with grad_output, batch and feature roles swapped.
//! Integer tensors convolve in their own type, as on CPU; bool ones raise
//! CPU's error.
use super::elementwise::{finish, not_implemented};
use super::{op, Cx, Entry, UNDEFINED};
use crate::dtype::{opmath, DType};
use crate::error::{Error, Result};
use crate::ir::{dilated, Conv, ReduceKind, V};

pub static ENTRIES: &[Entry] =
    &[op("convolution_overrideable", convolution), op("convolution_backward_overrideable", convolution_backward)];

/// PyTorch's convolution arguments.
struct Params {
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    transposed: bool,
    output_padding: Vec<i64>,
    groups: i64,
}

/// The arguments, each list expanded to one entry per spatial dimension as
/// PyTorch's `expand_param_if_needed` does.
fn params(cx: &Cx, spatial: usize) -> Result<Params> {
    let list = |name: &str| -> Result<Vec<i64>> {
        let v = cx.ints(name)?;
        match v.len() {
            1 => Ok(vec![v[0]; spatial]),
            n if n == spatial => Ok(v),
            n => Err(Error::runtime(format!(
                "expected {name} to be a single integer value or a list of {spatial} values to match the convolution dimensions, but got {name}={v:?} ({n} values)"
            ))),
        }
    };
    Ok(Params {
        stride: list("stride")?,
        padding: list("padding")?,
        dilation: list("dilation")?,
        transposed: cx.bool("transposed")?,
        output_padding: list("output_padding")?,
        groups: cx.int("groups")?,
    })
}

/// The CPU kernel that runs a convolution of these parameters and kernel
/// size, as named in its error for bool tensors (the one dtype CPU has no
/// convolution for).
fn cpu_kernel(p: &Params, kernel: &[i64]) -> &'static str {
    let ones = |v: &[i64]| v.iter().all(|&x| x == 1);
    match (p.transposed, kernel.len()) {
        (true, 3) => "slow_conv_transpose3d_out_cpu",
        (true, _) => "slow_conv_transpose2d_out_cpu",
        _ if !ones(&p.dilation) => "slow_conv_dilated<>",
        // Unless it is a pointwise product, it first gathers columns.
        (false, 3) if !ones(kernel) || !ones(&p.stride) || p.padding.iter().any(|&x| x != 0) => "compute_columns3d",
        (false, 3) => "slow_conv3d_cpu",
        _ => "slow_conv2d_cpu",
    }
}

/// Reads a tensor of a convolution in its compute type.
fn operand(cx: &mut Cx, name: &str, p: &Params) -> Result<V> {
    let dtype = cx.meta(name)?.dtype;
    if dtype == DType::Bool {
        return Err(not_implemented(cpu_kernel(p, &cx.meta("weight")?.sizes[2..]), dtype));
    }
    let v = cx.tensor(name)?;
    Ok(cx.g.convert(v, opmath(dtype)))
}

fn identity(rank: usize) -> Vec<i64> {
    (0..rank as i64).collect()
}

/// The IR convolution of input and kernel computing PyTorch's, given the
/// weight's shape.
fn forward_conv(p: &Params, weight: &[i64]) -> Conv {
    let n = weight.len() - 2;
    let layout = identity(n + 2);
    let base = Conv {
        lhs: layout.clone(),
        rhs: layout.clone(),
        out: layout,
        strides: p.stride.clone(),
        padding: p.padding.iter().map(|&x| (x, x)).collect(),
        lhs_dilation: vec![1; n],
        rhs_dilation: p.dilation.clone(),
        feature_groups: p.groups,
        batch_groups: 1,
    };
    if !p.transposed {
        return base;
    }
    // The input gradient of the convolution with these parameters; the
    // output_padding extends the high side.
    let padding = (0..n)
        .map(|i| {
            let edge = dilated(weight[i + 2], p.dilation[i]) - 1 - p.padding[i];
            (edge, edge + p.output_padding[i])
        })
        .collect();
    Conv { strides: vec![1; n], padding, lhs_dilation: p.stride.clone(), ..base }
}

fn spatial_dims(rank: usize) -> Vec<i64> {
    (2..rank as i64).collect()
}

/// [g a, b, k...] -> [g b, a, k...]: exchanges the feature dimensions
/// within each of the g groups (its own inverse, on the result's shape).
fn regroup(cx: &mut Cx, w: V, groups: i64) -> V {
    let shape = cx.g.ty(w).shape.clone();
    let (a, b) = (shape[0] / groups, shape[1]);
    let split: Vec<i64> = [groups, a, b].iter().chain(&shape[2..]).copied().collect();
    let w = cx.g.reshape(w, &split);
    let perm: Vec<i64> = [0, 2, 1].into_iter().chain(3..split.len() as i64).collect();
    let w = cx.g.transpose(w, &perm);
    let merged: Vec<i64> = [groups * b, a].iter().chain(&shape[2..]).copied().collect();
    cx.g.reshape(w, &merged)
}

/// The kernel of `forward_conv`: the weight itself, or for a transposed
/// convolution ([in, out / g, k...]) reversed and regrouped to [out, in / g, k...].
fn kernel(cx: &mut Cx, w: V, p: &Params) -> V {
    if !p.transposed {
        return w;
    }
    let rank = cx.g.ty(w).rank();
    let w = cx.g.reverse(w, &spatial_dims(rank));
    regroup(cx, w, p.groups)
}

/// The weight's gradient from the kernel's (the inverse of `kernel`).
fn weight_grad(cx: &mut Cx, k: V, p: &Params) -> V {
    if !p.transposed {
        return k;
    }
    let rank = cx.g.ty(k).rank();
    let k = regroup(cx, k, p.groups);
    cx.g.reverse(k, &spatial_dims(rank))
}

fn swapped(layout: &[i64]) -> Vec<i64> {
    let mut l = layout.to_vec();
    l.swap(0, 1);
    l
}

/// Sizes of `shape`'s spatial dimensions in `layout`.
fn spatial(shape: &[i64], layout: &[i64]) -> Vec<i64> {
    layout[2..].iter().map(|&d| shape[d as usize]).collect()
}

/// The gradient of `c`'s input (of shape `lhs`) from the output's `g`:
/// grad_output convolved with the reversed kernel, strides and input
/// dilation exchanged. The kernel must be in [out, in, spatial...] order.
fn input_grad(cx: &mut Cx, g: V, kernel: V, c: &Conv, lhs: &[i64]) -> V {
    let (gs, ks) = (cx.g.ty(g).shape.clone(), cx.g.ty(kernel).shape.clone());
    let (ls, ks_sp, os) = (spatial(lhs, &c.lhs), spatial(&ks, &c.rhs), spatial(&gs, &c.out));
    let n = ls.len();
    // Groups move from the kernel's output features to its input features:
    // [g o, i, k...] -> [o, g i, k...].
    let mut kernel = kernel;
    if c.feature_groups > 1 {
        let groups = c.feature_groups;
        let split: Vec<i64> = [groups, ks[0] / groups].iter().chain(&ks[1..]).copied().collect();
        kernel = cx.g.reshape(kernel, &split);
        let perm: Vec<i64> = [1, 0].into_iter().chain(2..split.len() as i64).collect();
        kernel = cx.g.transpose(kernel, &perm);
        let merged: Vec<i64> = [ks[0] / groups, groups * ks[1]].iter().chain(&ks[2..]).copied().collect();
        kernel = cx.g.reshape(kernel, &merged);
    }
    let kernel = cx.g.reverse(kernel, &c.rhs[2..]);
    let padding = (0..n)
        .map(|i| {
            let window = dilated(ks_sp[i], c.rhs_dilation[i]);
            let lo = window - c.padding[i].0 - 1;
            let hi = dilated(ls[i], c.lhs_dilation[i]) + window - 1 - dilated(os[i], c.strides[i]) - lo;
            (lo, hi)
        })
        .collect();
    let t = Conv {
        lhs: c.out.clone(),
        rhs: swapped(&c.rhs),
        out: c.lhs.clone(),
        strides: c.lhs_dilation.clone(),
        padding,
        lhs_dilation: c.strides.clone(),
        rhs_dilation: c.rhs_dilation.clone(),
        feature_groups: c.feature_groups,
        batch_groups: 1,
    };
    cx.g.convolution(g, kernel, t)
}

/// The gradient of `c`'s kernel (of shape `rhs`) from the output's `g`: the
/// input convolved with grad_output, batch and feature roles exchanged
/// (feature groups become batch groups), strides and kernel dilation
/// exchanged.
fn kernel_grad(cx: &mut Cx, g: V, input: V, c: &Conv, rhs: &[i64]) -> V {
    let (gs, xs) = (cx.g.ty(g).shape.clone(), cx.g.ty(input).shape.clone());
    let (ls, ks, os) = (spatial(&xs, &c.lhs), spatial(rhs, &c.rhs), spatial(&gs, &c.out));
    let padding = (0..ls.len())
        .map(|i| {
            let lo = c.padding[i].0;
            let hi = dilated(os[i], c.strides[i]) - dilated(ls[i], c.lhs_dilation[i])
                + dilated(ks[i], c.rhs_dilation[i])
                - lo
                - 1;
            (lo, hi)
        })
        .collect();
    let t = Conv {
        lhs: swapped(&c.lhs),
        rhs: swapped(&c.out),
        out: swapped(&c.rhs),
        strides: c.rhs_dilation.clone(),
        padding,
        lhs_dilation: c.lhs_dilation.clone(),
        rhs_dilation: c.strides.clone(),
        feature_groups: 1,
        batch_groups: c.feature_groups,
    };
    cx.g.convolution(input, g, t)
}

fn convolution(cx: &mut Cx) -> Result<Vec<V>> {
    let (xt, wt) = (cx.meta("input")?, cx.meta("weight")?);
    let p = params(cx, wt.sizes.len().saturating_sub(2))?;
    let x = operand(cx, "input", &p)?;
    let w = operand(cx, "weight", &p)?;
    let rhs = kernel(cx, w, &p);
    let mut y = cx.g.convolution(x, rhs, forward_conv(&p, wt.sizes));
    if let Some(b) = cx.opt_tensor("bias")? {
        let b = cx.g.convert(b, opmath(xt.dtype));
        let shape = cx.g.ty(y).shape.clone();
        let b = cx.g.broadcast_in_dim(b, &shape, &[1]);
        y = cx.g.binary("stablehlo.add", y, b);
    }
    finish(cx, y, xt.dtype)
}

/// (grad_input, grad_weight, grad_bias), each computed only if output_mask
/// asks for it.
fn convolution_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (xt, wt) = (cx.meta("input")?, cx.meta("weight")?);
    let p = params(cx, wt.sizes.len().saturating_sub(2))?;
    let mask = cx.bools("output_mask")?;
    let g = operand(cx, "grad_output", &p)?;
    let c = forward_conv(&p, wt.sizes);
    let mut out = vec![UNDEFINED; 3];
    if mask[0] {
        let w = operand(cx, "weight", &p)?;
        let k = kernel(cx, w, &p);
        let gi = input_grad(cx, g, k, &c, xt.sizes);
        out[0] = cx.g.convert(gi, xt.dtype);
    }
    if mask[1] {
        let x = operand(cx, "input", &p)?;
        let mut kernel_shape = wt.sizes.to_vec();
        if p.transposed {
            kernel_shape[0] = wt.sizes[1] * p.groups;
            kernel_shape[1] = wt.sizes[0] / p.groups;
        }
        let gk = kernel_grad(cx, g, x, &c, &kernel_shape);
        let gw = weight_grad(cx, gk, &p);
        out[1] = cx.g.convert(gw, wt.dtype);
    }
    if mask[2] {
        let rank = cx.g.ty(g).rank();
        let dims: Vec<usize> = (0..rank).filter(|&d| d != 1).collect();
        let gb = cx.g.reduce(ReduceKind::Sum, g, &dims);
        out[2] = cx.g.convert(gb, cx.meta("grad_output")?.dtype);
    }
    Ok(out)
}
