//! Connectionist temporal classification (`_ctc_loss` and its backward) as
//! CPU's kernels compute it (Graves et al. 2006, in log space): the forward
//! variables (alpha) in a loop over time, the backward ones (beta) in
//! another, and the gradient gathered per label. Each trip works on every
//! batch item and every state of the extended targets (a blank before,
//! between and after the labels) at once; an item whose input has ended
//! keeps its variables. Both loops run every step of the input, a count
//! known when compiling.
//!
//! The lengths are data ([`Entry::data`](super::Entry::data)), so a batch
//! of new lengths reuses the program. The states are sized by what the
//! shapes bound: a target is no longer than the targets' width (or their
//! total, concatenated), and one longer than the input has no alignment
//! (CPU's loss is then infinite, as here). `log_alpha`, which only the
//! backward reads, is therefore [N, T, 2 S + 1] for that bound S rather than
//! CPU's longest target.
use super::elementwise::not_implemented;
use super::{op, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::dtype::DType;
use crate::ir::{Graph, ReduceKind, V};
use crate::lower::args::Arg;

const LENGTHS: &[&str] = &["input_lengths", "target_lengths"];

pub static ENTRIES: &[Entry] = &[
    op("_ctc_loss", ctc_loss).with_data(LENGTHS).ruled(cpu_accepts),
    op("_ctc_loss_backward", ctc_loss_backward).with_data(LENGTHS),
];

/// The lattice of one call: per item n and state j of its extended target.
struct Lattice {
    /// log_probs [T, N, C].
    lp: V,
    /// The state's log-probability at each time, -inf past the item's
    /// extended target: [T, N, J].
    lpe: V,
    /// Each state's label as a position in [N·C] (n·C + label): [N, J].
    at: V,
    /// Whether state j may be reached from j - 2 (a label unlike the one
    /// two states before): [N, J].
    skip: V,
    input_lengths: V,
    target_lengths: V,
    dtype: DType,
    t: i64,
    n: i64,
    c: i64,
    j: i64,
}

/// The lengths as i64 vectors; the `.Tensor` overloads (device lengths,
/// which no composite passes here) run on the CPU, counted.
fn lengths(cx: &mut Cx) -> Result<(V, V)> {
    if LENGTHS.iter().any(|name| !matches!(cx.arg(name), Ok(Arg::Ints(_)))) {
        return Err(Error::fallback("torchtpu: CTC lengths as tensors run on the CPU"));
    }
    Ok((cx.data_list(LENGTHS[0])?, cx.data_list(LENGTHS[1])?))
}

/// `v` [.., J] shifted by `by` states (towards higher states when `by` is
/// positive), `fill` where nothing shifts in.
fn shift(g: &mut Graph, v: V, by: i64, fill: f64) -> V {
    let ty = g.ty(v).clone();
    let r = ty.rank();
    let j = ty.shape[r - 1];
    if by.abs() >= j {
        return g.full(fill, ty.dtype, &ty.shape);
    }
    let mut edge = ty.shape.clone();
    edge[r - 1] = by.abs();
    let edge = g.full(fill, ty.dtype, &edge);
    if by > 0 {
        let kept = g.slice_dim(v, r - 1, 0, j - by, 1);
        g.concatenate(&[edge, kept], r - 1)
    } else {
        let kept = g.slice_dim(v, r - 1, -by, j, 1);
        g.concatenate(&[kept, edge], r - 1)
    }
}

/// CPU's `log(exp(a - m) + exp(b - m) + exp(c - m)) + m`, with m the largest
/// (0 where all are -inf).
fn log_sum3(g: &mut Graph, a: V, b: V, c: V) -> V {
    let m = g.binary("stablehlo.maximum", a, b);
    let m = g.binary("stablehlo.maximum", m, c);
    let m = finite_or_zero(g, m);
    let terms: Vec<V> = [a, b, c]
        .into_iter()
        .map(|x| {
            let d = g.binary("stablehlo.subtract", x, m);
            g.unary("stablehlo.exponential", d)
        })
        .collect();
    let s = g.binary("stablehlo.add", terms[0], terms[1]);
    let s = g.binary("stablehlo.add", s, terms[2]);
    let l = g.unary("stablehlo.log", s);
    g.binary("stablehlo.add", l, m)
}

/// One step of the recursion over `v` [N, J] towards higher states (`dir`
/// 1: alpha) or lower ones (-1: beta): the log-sum of a state's own value,
/// its neighbour's, and the one two states away where `skip` allows it,
/// plus the states' log-probabilities `here`.
fn recur(g: &mut Graph, v: V, skip: V, here: V, dir: i64) -> V {
    let ty = g.ty(v).clone();
    let ninf = g.full(f64::NEG_INFINITY, ty.dtype, &ty.shape);
    let one = shift(g, v, dir, f64::NEG_INFINITY);
    let two = shift(g, v, 2 * dir, f64::NEG_INFINITY);
    let two = g.select(skip, two, ninf);
    let sum = log_sum3(g, v, one, two);
    g.binary("stablehlo.add", sum, here)
}

/// `all` [N, T, J] with `row` [N, J] written at time `time` (an i32 scalar).
fn write_row(g: &mut Graph, all: V, row: V, time: V) -> V {
    let shape = g.ty(row).shape.clone();
    let row = g.reshape(row, &[shape[0], 1, shape[1]]);
    let zero = g.scalar(0.0, DType::I32);
    g.dynamic_update_slice(all, row, &[zero, time, zero])
}

/// `m`, with -inf replaced by 0 (a log-sum's shift where nothing is summed).
fn finite_or_zero(g: &mut Graph, m: V) -> V {
    let ty = g.ty(m).clone();
    let ninf = g.full(f64::NEG_INFINITY, ty.dtype, &ty.shape);
    let zero = g.full(0.0, ty.dtype, &ty.shape);
    let none = g.compare("EQ", m, ninf);
    g.select(none, zero, m)
}

/// `v` [N] broadcast along the other dimensions of `shape`, at `dim`.
fn along(g: &mut Graph, v: V, shape: &[i64], dim: i64) -> V {
    g.broadcast_in_dim(v, shape, &[dim])
}

/// An i64 array of `shape` counting along `dim`.
fn iota(g: &mut Graph, shape: &[i64], dim: usize) -> V {
    g.iota(DType::I64, shape, dim)
}

fn int(g: &mut Graph, value: i64, shape: &[i64]) -> V {
    g.full(value as f64, DType::I64, shape)
}

impl Lattice {
    fn new(cx: &mut Cx) -> Result<Lattice> {
        let meta = cx.meta("log_probs")?;
        let dtype = meta.dtype;
        if !matches!(dtype, DType::F32 | DType::F64) {
            return Err(not_implemented("ctc_loss_cpu", dtype));
        }
        let (t, n, c) = (meta.sizes[0], meta.sizes[1], meta.sizes[2]);
        let targets = cx.meta("targets")?;
        let blank = cx.int("blank")?;
        let (input_lengths, target_lengths) = lengths(cx)?;
        let lp = cx.tensor("log_probs")?;
        let tg = cx.tensor("targets")?;
        let tg = cx.g.convert(tg, DType::I64);
        let g = &mut cx.g;
        // The labels of each item, [N, S], S the longest target a shape allows.
        let (tg, s) = if targets.sizes.len() == 2 {
            let s = targets.sizes[1].min(t);
            (g.slice_dim(tg, 1, 0, s, 1), s)
        } else {
            // Not the total's bound: a batch's total changes, and the states'
            // count would change with it (a program per batch).
            let total = targets.sizes[0];
            let s = t;
            // Item n's labels start after the labels of the items before it.
            let before = iota(g, &[n, n], 1);
            let item = iota(g, &[n, n], 0);
            let earlier = g.compare("LT", before, item);
            let each = g.broadcast_in_dim(target_lengths, &[n, n], &[1]);
            let zero = int(g, 0, &[n, n]);
            let counted = g.select(earlier, each, zero);
            let start = g.reduce(ReduceKind::Sum, counted, &[1]);
            let start = along(g, start, &[n, s], 0);
            let offset = iota(g, &[n, s], 1);
            let at = g.binary("stablehlo.add", start, offset);
            let last = int(g, (total - 1).max(0), &[n, s]);
            let at = g.binary("stablehlo.minimum", at, last);
            (g.take(tg, at, 0), s)
        };
        let j = 2 * s + 1;
        // State j is a blank when even, else label (j - 1) / 2.
        let state = iota(g, &[n, j], 1);
        let two = int(g, 2, &[n, j]);
        let half = g.binary("stablehlo.divide", state, two);
        let parity = g.binary("stablehlo.remainder", state, two);
        let blanks = int(g, blank, &[n, j]);
        let labels = if s == 0 {
            blanks
        } else {
            let top = int(g, s - 1, &[n, j]);
            let half = g.binary("stablehlo.minimum", half, top);
            let item = iota(g, &[n, j], 0);
            let width = int(g, s, &[n, j]);
            let flat_at = g.binary("stablehlo.multiply", item, width);
            let flat_at = g.binary("stablehlo.add", flat_at, half);
            let flat = g.reshape(tg, &[n * s]);
            let label = g.take(flat, flat_at, 0);
            let zero = int(g, 0, &[n, j]);
            let even = g.compare("EQ", parity, zero);
            g.select(even, blanks, label)
        };
        let before = shift(g, labels, 2, -1.0);
        let differs = g.compare("NE", labels, before);
        let past_two = g.compare("GE", state, two);
        let skip = g.binary("stablehlo.and", differs, past_two);
        // Each state's log-probability, read as log_probs [T, N * C] at n * C + label.
        let item = iota(g, &[n, j], 0);
        let width = int(g, c, &[n, j]);
        let row = g.binary("stablehlo.multiply", item, width);
        let at = g.binary("stablehlo.add", row, labels);
        let flat = g.reshape(lp, &[t, n * c]);
        let lpe = g.take(flat, at, 1);
        // States past an item's extended target (2 L + 1 of them) are never reached.
        let length = along(g, target_lengths, &[n, j], 0);
        let states = g.binary("stablehlo.multiply", length, two);
        let inside = g.compare("LE", state, states);
        let inside = g.broadcast_in_dim(inside, &[t, n, j], &[1, 2]);
        let ninf = g.full(f64::NEG_INFINITY, dtype, &[t, n, j]);
        let lpe = g.select(inside, lpe, ninf);
        Ok(Lattice { lp, lpe, at, skip, input_lengths, target_lengths, dtype, t, n, c, j })
    }

    /// The states' log-probabilities at time `time` (an i32 scalar): [N, J].
    fn at(g: &mut Graph, lpe: V, time: V) -> V {
        let ty = g.ty(lpe).clone();
        let zero = g.scalar(0.0, DType::I32);
        let row = g.dynamic_slice(lpe, &[time, zero, zero], &[1, ty.shape[1], ty.shape[2]]);
        g.reshape(row, &ty.shape[1..])
    }

    /// Whether each item's input reaches past `time` ([N] i64 compared at
    /// `dir` with time), broadcast to [N, J].
    fn input_compare(g: &mut Graph, input_lengths: V, time: V, dir: &'static str, shape: &[i64]) -> V {
        let time = g.convert(time, DType::I64);
        let time = g.broadcast_in_dim(time, shape, &[]);
        let length = g.broadcast_in_dim(input_lengths, shape, &[0]);
        g.compare(dir, time, length)
    }

    /// (alpha [N, T, J], each item's final alpha [N, J]): eq. (6)-(7),
    /// -inf at and past each item's input length.
    fn alpha(&self, g: &mut Graph) -> (V, V) {
        let (t, n, j, dtype) = (self.t, self.n, self.j, self.dtype);
        let zero = g.scalar(0.0, DType::I32);
        let first = Lattice::at(g, self.lpe, zero);
        // At time 0 only the first blank and the first label are reached.
        let state = iota(g, &[n, j], 1);
        let two = int(g, 2, &[n, j]);
        let early = g.compare("LT", state, two);
        let started = Lattice::input_compare(g, self.input_lengths, zero, "LT", &[n, j]);
        let reached = g.binary("stablehlo.and", early, started);
        let ninf = g.full(f64::NEG_INFINITY, dtype, &[n, j]);
        let alpha0 = g.select(reached, first, ninf);
        let all = g.full(f64::NEG_INFINITY, dtype, &[n, t, j]);
        let row0 = g.reshape(alpha0, &[n, 1, j]);
        let all = g.dynamic_update_slice(all, row0, &[zero, zero, zero]);
        // Every step of the input, past the longest item's too (they keep their
        // values): a count known when compiling, which XLA's GPU loops run
        // without reading a predicate back each trip.
        let trips = g.scalar((t - 1) as f64, DType::I32);
        let init = [alpha0, all, self.lpe, self.skip, self.input_lengths];
        let out = g.counted_loop(trips, &init, |g, trip, v| {
            let (alpha, all, lpe, skip, input_lengths) = (v[0], v[1], v[2], v[3], v[4]);
            let one = g.scalar(1.0, DType::I32);
            let time = g.binary("stablehlo.add", trip, one);
            let shape = g.ty(alpha).shape.clone();
            let ninf = g.full(f64::NEG_INFINITY, g.ty(alpha).dtype, &shape);
            let here = Lattice::at(g, lpe, time);
            let next = recur(g, alpha, skip, here, 1);
            let running = Lattice::input_compare(g, input_lengths, time, "LT", &shape);
            let kept = g.select(running, next, alpha);
            let row = g.select(running, next, ninf);
            let all = write_row(g, all, row, time);
            vec![kept, all, lpe, skip, input_lengths]
        });
        (out[1], out[0])
    }

    /// beta [N, T, J]: eq. (10)-(11), from each item's last input step
    /// backwards; -inf at and past its input length.
    fn beta(&self, g: &mut Graph) -> V {
        let (t, n, j, dtype) = (self.t, self.n, self.j, self.dtype);
        let all = g.full(f64::NEG_INFINITY, dtype, &[n, t, j]);
        let ninf = g.full(f64::NEG_INFINITY, dtype, &[n, j]);
        // Reached from j + 2 where state j + 2 may be reached from j.
        let skip_up = shift(g, self.skip, -2, 0.0);
        let state = iota(g, &[n, j], 1);
        let length = along(g, self.target_lengths, &[n, j], 0);
        let two = int(g, 2, &[n, j]);
        let end = g.binary("stablehlo.multiply", length, two);
        let one = int(g, 1, &[n, j]);
        let end_label = g.binary("stablehlo.subtract", end, one);
        let at_end = g.compare("EQ", state, end);
        let at_end_label = g.compare("EQ", state, end_label);
        let last_two = g.binary("stablehlo.or", at_end, at_end_label);
        let trips = g.scalar(t as f64, DType::I32);
        let init = [ninf, all, self.lpe, skip_up, last_two, self.input_lengths];
        let out = g.counted_loop(trips, &init, |g, trip, v| {
            let (beta, all, lpe, skip_up, last_two, input_lengths) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            let one = g.scalar(1.0, DType::I32);
            let top = g.scalar((t - 1) as f64, DType::I32);
            let time = g.binary("stablehlo.subtract", top, trip);
            let shape = g.ty(beta).shape.clone();
            let ninf = g.full(f64::NEG_INFINITY, g.ty(beta).dtype, &shape);
            let here = Lattice::at(g, lpe, time);
            // At an item's last input step only its last blank and label are reached.
            let first = g.select(last_two, here, ninf);
            let next = recur(g, beta, skip_up, here, -1);
            let time_plus = g.binary("stablehlo.add", time, one);
            let last = Lattice::input_compare(g, input_lengths, time_plus, "EQ", &shape);
            let before_last = Lattice::input_compare(g, input_lengths, time_plus, "LT", &shape);
            let next = g.select(before_last, next, ninf);
            let next = g.select(last, first, next);
            let all = write_row(g, all, next, time);
            vec![next, all, lpe, skip_up, last_two, input_lengths]
        });
        out[1]
    }
}

/// (neg_log_likelihood [N], log_alpha [N, T, J]).
fn ctc_loss(cx: &mut Cx) -> Result<Vec<V>> {
    let l = Lattice::new(cx)?;
    let g = &mut cx.g;
    let (n, j) = (l.n, l.j);
    let (log_alpha, last) = l.alpha(g);
    // The likelihood sums the final alphas of the last blank and the last label.
    let item = iota(g, &[n], 0);
    let width = int(g, j, &[n]);
    let row = g.binary("stablehlo.multiply", item, width);
    let two = int(g, 2, &[n]);
    let end = g.binary("stablehlo.multiply", l.target_lengths, two);
    let top = int(g, j - 1, &[n]);
    let end_at = g.binary("stablehlo.minimum", end, top);
    let flat = g.reshape(last, &[n * j]);
    let at = g.binary("stablehlo.add", row, end_at);
    let l1 = g.take(flat, at, 0);
    let one = int(g, 1, &[n]);
    let zero = int(g, 0, &[n]);
    let label_at = g.binary("stablehlo.subtract", at, one);
    let label_at = g.binary("stablehlo.maximum", label_at, zero);
    let l2 = g.take(flat, label_at, 0);
    let ninf = g.full(f64::NEG_INFINITY, l.dtype, &[n]);
    let labelled = g.compare("GT", l.target_lengths, zero);
    let l2 = g.select(labelled, l2, ninf);
    // CPU's two-term log-sum; the third term's exp(-inf) adds an exact 0.
    let likelihood = log_sum3(g, l1, l2, ninf);
    // A target longer than the states (than the input) has no alignment.
    let states = g.full(((j - 1) / 2) as f64, DType::I64, &[n]);
    let fits = g.compare("LE", l.target_lengths, states);
    let likelihood = g.select(fits, likelihood, ninf);
    // An empty input: likelihood 1 of an empty target, else 0.
    let empty = g.compare("EQ", l.input_lengths, zero);
    let nothing = g.compare("EQ", l.target_lengths, zero);
    let zero_f = g.full(0.0, l.dtype, &[n]);
    let of_empty = g.select(nothing, zero_f, ninf);
    let likelihood = g.select(empty, of_empty, likelihood);
    let nll = g.unary("stablehlo.negate", likelihood);
    Ok(vec![nll, log_alpha])
}

/// The gradient of the loss with respect to log_probs, eq. (16):
/// `(exp(lp) - exp(log Σ_{s: label s = c} alpha beta + nll - lp)) grad`,
/// zero at and past an item's input length, and for an infinite loss
/// under `zero_infinity`.
fn ctc_loss_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let l = Lattice::new(cx)?;
    if cx.meta("log_alpha")?.sizes != [l.n, l.t, l.j] {
        return Err(Error::fallback("torchtpu: a log_alpha not computed by tpu's _ctc_loss runs on the CPU"));
    }
    let log_alpha = cx.tensor("log_alpha")?;
    let grad = cx.tensor("grad")?;
    let nll = cx.tensor("neg_log_likelihood")?;
    let zero_infinity = cx.bool("zero_infinity")?;
    let g = &mut cx.g;
    let (t, n, c, dtype) = (l.t, l.n, l.c, l.dtype);
    let beta = l.beta(g);
    let ab = g.binary("stablehlo.add", log_alpha, beta);
    let ab = g.transpose(ab, &[1, 0, 2]);
    // Log-sums per label: each state's alpha beta scattered onto its label,
    // shifted by the label's largest.
    let at = l.at;
    let ninf = g.full(f64::NEG_INFINITY, dtype, &[t, n * c]);
    let largest = g.put(ninf, at, ab, 1, Some(ReduceKind::Max));
    let largest = finite_or_zero(g, largest);
    let shift_by = g.take(largest, at, 1);
    let d = g.binary("stablehlo.subtract", ab, shift_by);
    let e = g.unary("stablehlo.exponential", d);
    let zeros = g.full(0.0, dtype, &[t, n * c]);
    let sums = g.put(zeros, at, e, 1, Some(ReduceKind::Sum));
    let logs = g.unary("stablehlo.log", sums);
    let collected = g.binary("stablehlo.add", logs, largest);
    let collected = g.reshape(collected, &[t, n, c]);
    let shape = [t, n, c];
    let nll_b = along(g, nll, &shape, 1);
    let e = g.binary("stablehlo.add", collected, nll_b);
    let e = g.binary("stablehlo.subtract", e, l.lp);
    let e = g.unary("stablehlo.exponential", e);
    let p = g.unary("stablehlo.exponential", l.lp);
    let d = g.binary("stablehlo.subtract", p, e);
    let grad_b = along(g, grad, &shape, 1);
    let d = g.binary("stablehlo.multiply", d, grad_b);
    let time = iota(g, &shape, 0);
    let length = along(g, l.input_lengths, &shape, 1);
    let mut keep = g.compare("LT", time, length);
    if zero_infinity {
        let inf = g.full(f64::INFINITY, dtype, &[n]);
        let finite = g.compare("NE", nll, inf);
        let finite = along(g, finite, &shape, 1);
        keep = g.binary("stablehlo.and", keep, finite);
    }
    let zero = g.full(0.0, dtype, &shape);
    Ok(vec![g.select(keep, d, zero)])
}

/// Whether CPU's kernel accepts this call's arguments (`ctc_loss_allocate_outputs`
/// and the checks before it). Where it does not, the call runs there and
/// raises CPU's own error (counted as a fallback).
fn cpu_accepts(cx: &Cx) -> Result<()> {
    let ints = |name| match cx.arg(name) {
        Ok(Arg::Ints(v)) => Some(*v),
        _ => None,
    };
    let (Some(input), Some(target)) = (ints(LENGTHS[0]), ints(LENGTHS[1])) else { return Ok(()) };
    let (lp, tg) = (cx.meta("log_probs")?, cx.meta("targets")?);
    let blank = cx.int("blank")?;
    let accepted = lp.sizes.len() == 3 && lp.numel() > 0 && matches!(lp.dtype, DType::F32 | DType::F64) && {
        let (t, n, c) = (lp.sizes[0], lp.sizes[1] as usize, lp.sizes[2]);
        let widths_fit = match tg.sizes {
            [total] => target.iter().sum::<i64>() == *total,
            [rows, width] => *rows as usize == n && target.iter().all(|&l| l <= *width),
            _ => false,
        };
        matches!(tg.dtype, DType::I64 | DType::I32)
            && (0..c).contains(&blank)
            && input.len() == n
            && target.len() == n
            && target.iter().all(|&l| l >= 0)
            && widths_fit
            && input.iter().all(|&l| (0..=t).contains(&l))
    };
    match accepted {
        true => Ok(()),
        false => Err(Error::fallback("torchtpu: _ctc_loss's arguments fail CPU's checks; CPU raises its error")),
    }
}
