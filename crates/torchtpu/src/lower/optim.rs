//! Optimizer kernels: fused Adam, AdamW, SGD and Adagrad (`fused=True`, the default
//! optimizer of Hugging Face's Trainer) and the gradient scaler's unscale and
//! scale update (`torch.amp.GradScaler`), with the arithmetic of CPU's
//! kernels. They update lists of tensors in place: a lowering returns the
//! next value of every element of each written list, in schema order
//! ([`Cx::writes`]), or [`UNDEFINED`] for one left as it is (a gradient
//! without a scale to divide by).
//!
//! Hyperparameters are runtime operands, so a schedule never recompiles;
//! CPU's branches on them (`weight_decay != 0`, the lerp's form) are selects.
//! A step with `found_inf` set changes nothing, as on CPU.
use super::{op, Cx, Entry, UNDEFINED};
use crate::error::Result;
use crate::ir::dtype::{opmath, DType};
use crate::ir::{Graph, ReduceKind, V};

pub static ENTRIES: &[Entry] = &[
    op("_fused_adam", |cx| adam(cx, false)),
    op("_fused_adamw", |cx| adam(cx, true)),
    op("_fused_sgd", sgd),
    op("_fused_adagrad", adagrad),
    op("_amp_foreach_non_finite_check_and_unscale", unscale),
    op("_amp_update_scale", update_scale),
];

/// `a <op> b`, a 0-d operand broadcast to the other's shape.
fn bin(g: &mut Graph, name: &'static str, a: V, b: V) -> V {
    let (sa, sb) = (g.ty(a).shape.clone(), g.ty(b).shape.clone());
    let a = if sa.is_empty() && !sb.is_empty() { g.broadcast_in_dim(a, &sb, &[]) } else { a };
    let b = if sb.is_empty() && !sa.is_empty() { g.broadcast_in_dim(b, &sa, &[]) } else { b };
    g.binary(name, a, b)
}

fn add(g: &mut Graph, a: V, b: V) -> V {
    bin(g, "stablehlo.add", a, b)
}

fn sub(g: &mut Graph, a: V, b: V) -> V {
    bin(g, "stablehlo.subtract", a, b)
}

fn mul(g: &mut Graph, a: V, b: V) -> V {
    bin(g, "stablehlo.multiply", a, b)
}

fn div(g: &mut Graph, a: V, b: V) -> V {
    bin(g, "stablehlo.divide", a, b)
}

/// `pred ? a : b`, a 0-d predicate broadcast to the values' shape.
fn choose(g: &mut Graph, pred: V, a: V, b: V) -> V {
    let shape = g.ty(a).shape.clone();
    let pred = if g.ty(pred).shape.is_empty() { g.broadcast_in_dim(pred, &shape, &[]) } else { pred };
    g.select(pred, a, b)
}

/// A `float` argument, or a `tensor_lr` overload's one-element tensor, as a
/// 0-d value of `dtype`.
fn number(cx: &mut Cx, name: &str, dtype: DType) -> Result<V> {
    let v = cx.scalar(name, dtype)?.expect("a number argument");
    Ok(cx.g.reshape(v, &[]))
}

/// The type a call's updates compute in (None for no parameters): one per
/// call, as optimizers group their tensors by device and dtype.
fn compute_type(cx: &Cx) -> Result<Option<DType>> {
    Ok(cx.metas("self")?.iter().flatten().next().map(|t| opmath(t.dtype)))
}

/// Whether the step is skipped: `found_inf` given and 1 (None when absent).
fn skipped(cx: &mut Cx) -> Result<Option<V>> {
    if cx.is_none("found_inf") {
        return Ok(None);
    }
    let found = number(cx, "found_inf", DType::F32)?;
    let one = cx.g.scalar(1.0, DType::F32);
    Ok(Some(cx.g.compare("EQ", found, one)))
}

/// The written lists' next values in schema order: `next[k]` holds list
/// `lists[k]`'s, each kept as it was where the step is skipped.
fn written(cx: &mut Cx, lists: &[&str], next: Vec<Vec<V>>, skip: Option<V>) -> Result<Vec<V>> {
    let mut out = Vec::new();
    for (name, values) in lists.iter().zip(next) {
        if !cx.writes(name) {
            continue;
        }
        let old = cx.tensors(name)?;
        for (v, old) in values.into_iter().zip(old) {
            let dtype = cx.g.ty(old.expect("a defined tensor")).dtype;
            out.push(match (v, skip) {
                (UNDEFINED, _) => UNDEFINED,
                (v, None) => cx.g.convert(v, dtype),
                (v, Some(skip)) => {
                    let v = cx.g.convert(v, dtype);
                    choose(&mut cx.g, skip, old.unwrap(), v)
                }
            });
        }
    }
    Ok(out)
}

/// The gradient as the update reads it (in `ct`), and its next value: divided
/// by `grad_scale` when one is given (else left as it is).
fn scaled_grad(cx: &mut Cx, grad: V, ct: DType) -> Result<(V, V)> {
    let g = cx.g.convert(grad, ct);
    if cx.is_none("grad_scale") {
        return Ok((g, UNDEFINED));
    }
    let scale = number(cx, "grad_scale", ct)?;
    let g = div(&mut cx.g, g, scale);
    Ok((g, g))
}

/// The gradient an update follows: negated when maximizing, plus
/// `weight_decay * p` where the decay is nonzero.
fn followed(g: &mut Graph, grad: V, p: V, wd: V, maximize: bool) -> V {
    let grad = if maximize { g.unary("stablehlo.negate", grad) } else { grad };
    let zero = g.scalar(0.0, g.ty(grad).dtype);
    let decays = g.compare("NE", wd, zero);
    let pw = mul(g, p, wd);
    let decayed = add(g, grad, pw);
    choose(g, decays, decayed, grad)
}

/// `torch.optim.Adam`/`AdamW(fused=True)`: CPU's `adam_math` per tensor, its
/// step's bias corrections computed from the step tensor on the device.
fn adam(cx: &mut Cx, decoupled: bool) -> Result<Vec<V>> {
    const LISTS: [&str; 5] = ["self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"];
    let params = cx.tensors("self")?;
    let (grads, avgs, sqs) = (cx.tensors("grads")?, cx.tensors("exp_avgs")?, cx.tensors("exp_avg_sqs")?);
    let (maxes, steps) = (cx.tensors("max_exp_avg_sqs")?, cx.tensors("state_steps")?);
    let (amsgrad, maximize) = (cx.bool("amsgrad")?, cx.bool("maximize")?);
    let skip = skipped(cx)?;
    let Some(ct) = compute_type(cx)? else { return Ok(Vec::new()) };
    let [lr, beta1, beta2, wd, eps] = ["lr", "beta1", "beta2", "weight_decay", "eps"].map(|n| number(cx, n, ct));
    let (lr, beta1, beta2, wd, eps) = (lr?, beta1?, beta2?, wd?, eps?);
    let mut next: Vec<Vec<V>> = vec![Vec::new(); LISTS.len()];
    if !amsgrad {
        next[4] = vec![UNDEFINED; maxes.len()];
    }
    for i in 0..params.len() {
        let p0 = params[i].expect("a parameter");
        let g = &mut cx.g;
        let one = g.scalar(1.0, ct);
        let step = g.reshape(steps[i].expect("a step"), &[]);
        let step = g.convert(step, ct);
        let pow1 = g.binary("stablehlo.power", beta1, step);
        let pow2 = g.binary("stablehlo.power", beta2, step);
        let correction1 = sub(g, one, pow1);
        let correction2 = sub(g, one, pow2);
        let correction2_sqrt = g.unary("stablehlo.sqrt", correction2);
        let step_size = div(g, lr, correction1);
        let (avg_weight, sq_weight) = (sub(g, one, beta1), sub(g, one, beta2));
        let zero = g.scalar(0.0, ct);
        let decays = g.compare("NE", wd, zero);

        let (mut grad, grad_next) = scaled_grad(cx, grads[i].expect("a gradient"), ct)?;
        let g = &mut cx.g;
        let mut p = g.convert(p0, ct);
        if maximize {
            grad = g.unary("stablehlo.negate", grad);
        }
        if decoupled {
            let lr_wd = mul(g, lr, wd);
            let keep = sub(g, one, lr_wd);
            let decayed = mul(g, p, keep);
            p = choose(g, decays, decayed, p);
        } else {
            let pw = mul(g, p, wd);
            let decayed = add(g, grad, pw);
            grad = choose(g, decays, decayed, grad);
        }
        // exp_avg.lerp_(grad, 1 - beta1), in the form CPU picks by the weight.
        let avg = g.convert(avgs[i].expect("exp_avg"), ct);
        let diff = sub(g, grad, avg);
        let near = mul(g, avg_weight, diff);
        let near = add(g, avg, near);
        let rest = sub(g, one, avg_weight);
        let far = mul(g, diff, rest);
        let far = sub(g, grad, far);
        let abs_weight = g.unary("stablehlo.abs", avg_weight);
        let half = g.scalar(0.5, ct);
        let small = g.compare("LT", abs_weight, half);
        let avg = choose(g, small, near, far);
        let sq = g.convert(sqs[i].expect("exp_avg_sq"), ct);
        let sq = mul(g, sq, beta2);
        let gg = mul(g, sq_weight, grad);
        let gg = mul(g, gg, grad);
        let sq = add(g, sq, gg);
        let denom_of = if amsgrad {
            let old = g.convert(maxes[i].expect("max_exp_avg_sq"), ct);
            let max = g.binary("stablehlo.maximum", old, sq);
            next[4].push(max);
            max
        } else {
            sq
        };
        let root = g.unary("stablehlo.sqrt", denom_of);
        let denom = div(g, root, correction2_sqrt);
        let denom = add(g, denom, eps);
        let minus_size = g.unary("stablehlo.negate", step_size);
        let update = mul(g, minus_size, avg);
        let update = div(g, update, denom);
        let p = add(g, p, update);
        next[0].push(p);
        next[1].push(grad_next);
        next[2].push(avg);
        next[3].push(sq);
    }
    written(cx, &LISTS, next, skip)
}

/// `torch.optim.SGD(fused=True)`: CPU's `sgd_math` per tensor.
fn sgd(cx: &mut Cx) -> Result<Vec<V>> {
    const LISTS: [&str; 3] = ["self", "grads", "momentum_buffer_list"];
    let (params, grads, bufs) = (cx.tensors("self")?, cx.tensors("grads")?, cx.tensors("momentum_buffer_list")?);
    let (nesterov, maximize, first) = (cx.bool("nesterov")?, cx.bool("maximize")?, cx.bool("is_first_step")?);
    let skip = skipped(cx)?;
    let Some(ct) = compute_type(cx)? else { return Ok(Vec::new()) };
    let [lr, wd, momentum, dampening] = ["lr", "weight_decay", "momentum", "dampening"].map(|n| number(cx, n, ct));
    let (lr, wd, momentum, dampening) = (lr?, wd?, momentum?, dampening?);
    let mut next: Vec<Vec<V>> = vec![Vec::new(); LISTS.len()];
    for i in 0..params.len() {
        let p0 = params[i].expect("a parameter");
        let (mut grad, grad_next) = scaled_grad(cx, grads[i].expect("a gradient"), ct)?;
        let g = &mut cx.g;
        let p = g.convert(p0, ct);
        grad = followed(g, grad, p, wd, maximize);
        let zero = g.scalar(0.0, ct);
        // The buffers (given when momentum was nonzero at the first step)
        // take part only while it is.
        if let Some(old) = bufs.get(i).copied().flatten() {
            let old = g.convert(old, ct);
            let moving = g.compare("NE", momentum, zero);
            let buf = if first {
                grad
            } else {
                let one = g.scalar(1.0, ct);
                let kept = mul(g, old, momentum);
                let weight = sub(g, one, dampening);
                let moved = mul(g, grad, weight);
                add(g, kept, moved)
            };
            let along = if nesterov {
                let ahead = mul(g, buf, momentum);
                add(g, grad, ahead)
            } else {
                buf
            };
            next[2].push(choose(g, moving, buf, old));
            grad = choose(g, moving, along, grad);
        }
        let step = mul(g, grad, lr);
        next[0].push(sub(g, p, step));
        next[1].push(grad_next);
    }
    written(cx, &LISTS, next, skip)
}

/// `torch.optim.Adagrad(fused=True)`: CPU's `adagrad_math` per tensor. The
/// learning rate decays by the step CPU reads on the host (truncated to an
/// integer), here on the device: lr / (1 + (step - 1) * lr_decay), in double.
fn adagrad(cx: &mut Cx) -> Result<Vec<V>> {
    // Its schema marks the steps written; the kernel only reads them.
    const LISTS: [&str; 4] = ["self", "grads", "state_sums", "state_steps"];
    let (params, grads, sums) = (cx.tensors("self")?, cx.tensors("grads")?, cx.tensors("state_sums")?);
    let steps = cx.tensors("state_steps")?;
    let maximize = cx.bool("maximize")?;
    let skip = skipped(cx)?;
    let Some(ct) = compute_type(cx)? else { return Ok(Vec::new()) };
    let [lr, decay] = ["lr", "lr_decay"].map(|n| number(cx, n, DType::F64));
    let (lr, decay) = (lr?, decay?);
    let [wd, eps] = ["weight_decay", "eps"].map(|n| number(cx, n, ct));
    let (wd, eps) = (wd?, eps?);
    let mut next: Vec<Vec<V>> = vec![Vec::new(); LISTS.len()];
    next[3] = vec![UNDEFINED; steps.len()];
    for i in 0..params.len() {
        let p0 = params[i].expect("a parameter");
        let (mut grad, grad_next) = scaled_grad(cx, grads[i].expect("a gradient"), ct)?;
        let g = &mut cx.g;
        let step = g.reshape(steps[i].expect("a step"), &[]);
        let step = g.convert(step, DType::F32);
        // float -> int64 truncates toward zero.
        let step = g.convert(step, DType::I64);
        let step = g.convert(step, DType::F64);
        let one = g.scalar(1.0, DType::F64);
        let past = sub(g, step, one);
        let decayed = mul(g, past, decay);
        let denom = add(g, one, decayed);
        let clr = div(g, lr, denom);
        let clr = g.convert(clr, ct);
        let p = g.convert(p0, ct);
        grad = followed(g, grad, p, wd, maximize);
        // state_sum += grad², kept in its own dtype, then read back.
        let sum0 = sums[i].expect("a state sum");
        let sum_dtype = g.ty(sum0).dtype;
        let sum = g.convert(sum0, ct);
        let gg = mul(g, grad, grad);
        let sum = add(g, sum, gg);
        let sum = g.convert(sum, sum_dtype);
        let read = g.convert(sum, ct);
        let root = g.unary("stablehlo.sqrt", read);
        let std = add(g, root, eps);
        let update = mul(g, clr, grad);
        let update = div(g, update, std);
        next[0].push(sub(g, p, update));
        next[1].push(grad_next);
        next[2].push(sum);
    }
    written(cx, &LISTS, next, skip)
}

/// `GradScaler.unscale_`: every tensor times `inv_scale` (unchanged where it
/// is 1), and `found_inf` set to 1 where any element is not finite.
fn unscale(cx: &mut Cx) -> Result<Vec<V>> {
    let tensors = cx.tensors("self")?;
    let found = cx.tensor("found_inf")?;
    let inv_scale = number(cx, "inv_scale", DType::F32)?;
    let mut any_bad = None;
    let mut out = Vec::new();
    for t in tensors.into_iter().flatten() {
        let g = &mut cx.g;
        let (dtype, shape) = (g.ty(t).dtype, g.ty(t).shape.clone());
        let ct = opmath(dtype);
        let inv = g.convert(inv_scale, ct);
        let x = g.convert(t, ct);
        let magnitude = g.unary("stablehlo.abs", x);
        let inf = g.full(f64::INFINITY, ct, &shape);
        let finite = g.compare("LT", magnitude, inf);
        let all = g.reduce(ReduceKind::And, finite, &(0..shape.len()).collect::<Vec<_>>());
        let bad = g.unary("stablehlo.not", all);
        any_bad = Some(match any_bad {
            None => bad,
            Some(b) => g.binary("stablehlo.or", b, bad),
        });
        let one = g.scalar(1.0, ct);
        let is_one = g.compare("EQ", inv, one);
        let scaled = mul(g, x, inv);
        let next = choose(g, is_one, x, scaled);
        out.push(g.convert(next, dtype));
    }
    let g = &mut cx.g;
    let shape = g.ty(found).shape.clone();
    let dtype = g.ty(found).dtype;
    let next_found = match any_bad {
        None => found,
        Some(bad) => {
            let one = g.full(1.0, dtype, &shape);
            choose(g, bad, one, found)
        }
    };
    out.push(next_found);
    Ok(out)
}

/// `GradScaler.update`: the scale backs off after a step with infs or NaNs,
/// grows after `growth_interval` good steps in a row (if the grown scale is
/// finite); the tracker counts them.
fn update_scale(cx: &mut Cx) -> Result<Vec<V>> {
    let interval = cx.int("growth_interval")?;
    let scale = cx.tensor("self")?;
    let tracker = cx.tensor("growth_tracker")?;
    let (sdt, tdt) = (cx.g.ty(scale).dtype, cx.g.ty(tracker).dtype);
    let found = number(cx, "found_inf", DType::F32)?;
    let growth = number(cx, "scale_growth_factor", sdt)?;
    let backoff = number(cx, "scale_backoff_factor", sdt)?;
    let g = &mut cx.g;
    let shape = g.ty(scale).shape.clone();
    let zero = g.scalar(0.0, DType::F32);
    let bad = g.compare("NE", found, zero);
    let successful = {
        let one = g.full(1.0, tdt, &shape);
        add(g, tracker, one)
    };
    let limit = g.full(interval as f64, tdt, &shape);
    let due = g.compare("EQ", successful, limit);
    let grown = mul(g, scale, growth);
    let magnitude = g.unary("stablehlo.abs", grown);
    let inf = g.full(f64::INFINITY, sdt, &shape);
    let finite = g.compare("LT", magnitude, inf);
    let kept_or_grown = g.select(finite, grown, scale);
    let good_scale = g.select(due, kept_or_grown, scale);
    let reset = g.full(0.0, tdt, &shape);
    let good_tracker = g.select(due, reset, successful);
    let backed_off = mul(g, scale, backoff);
    let next_scale = choose(g, bad, backed_off, good_scale);
    let next_tracker = choose(g, bad, reset, good_tracker);
    Ok(vec![next_scale, next_tracker])
}
