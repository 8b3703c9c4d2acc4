//! `embedding_bag`: the sum, mean or max of each bag of embedding rows, and
//! its gradients. Bags are segments of `indices` starting at `offsets`;
//! each index's bag is found as CPU's `make_offset2bag` finds it (a one added
//! at each offset, then a running sum), and rows are combined into their bag
//! by a scatter, padding rows into a spare bag past the last. The auxiliary
//! results (offset2bag, bag_size, max_indices) have CPU's values: its
//! backward operators read them.
use super::index::checked_indices;
use super::nn::{div, expect_types, mul};
use super::{op, Cx, Entry};
use crate::ensure;
use crate::error::{Error, Kind, Result};
use crate::ir::dtype::{opmath, DType};
use crate::ir::{ReduceKind, V};
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[
    op("_embedding_bag", |cx| forward(cx, false)),
    op("_embedding_bag_forward_only", |cx| forward(cx, true)),
    op("_embedding_bag_dense_backward", dense_backward),
    op("_embedding_bag_per_sample_weights_backward", per_sample_weights_backward),
];

const SUM: i64 = 0;
const MEAN: i64 = 1;
const MAX: i64 = 2;

fn check_indices(t: &Tensor, arg: &str) -> Result<()> {
    expect_types(t, &format!("#1 '{arg}'"), "Long, Int", matches!(t.dtype, DType::I64 | DType::I32), "embedding_bag")
}

/// `indices` as i64 (checked against the weight's rows) and whether each
/// is a real row, not `padding_idx`.
fn read_indices(cx: &mut Cx, rows: i64) -> Result<(V, V)> {
    let idx = cx.tensor("indices")?;
    let message = "embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {}".to_string();
    let idx = checked_indices(cx, idx, rows, false, Kind::Runtime, message);
    let n = cx.g.ty(idx).shape[0];
    let pad = cx.g.full(cx.int("padding_idx")? as f64, DType::I64, &[n]);
    let real = cx.g.compare("NE", idx, pad);
    Ok((idx, real))
}

/// Each index's bag: the number of offsets at or before it, less one.
fn offset2bag(cx: &mut Cx, offsets: V, n: i64) -> V {
    let offsets = cx.g.convert(offsets, DType::I64);
    let counts = super::index::counted_up_to(cx, offsets, n);
    let one = cx.g.full(1.0, DType::I64, &[n]);
    cx.g.binary("stablehlo.subtract", counts, one)
}

/// The bag each index adds to: its own, or the spare bag `bags` for padding.
fn targets(cx: &mut Cx, bag: V, real: V, bags: i64) -> V {
    let n = cx.g.ty(bag).shape[0];
    let spare = cx.g.full(bags as f64, DType::I64, &[n]);
    cx.g.select(real, bag, spare)
}

/// Rows `updates` ([n, d]) combined into `bags` bags (plus the spare one,
/// then dropped), starting from `init`.
fn into_bags(cx: &mut Cx, target: V, updates: V, bags: i64, init: f64, how: ReduceKind) -> V {
    let ty = cx.g.ty(updates).clone();
    let mut shape = ty.shape.clone();
    shape[0] = bags + 1;
    let start = cx.g.full(init, ty.dtype, &shape);
    let r = cx.g.put(start, target, updates, 0, Some(how));
    cx.g.slice_dim(r, 0, 0, bags, 1)
}

/// `v` ([n]) broadcast along the rows' last dimension `d`.
fn per_row(cx: &mut Cx, v: V, d: i64) -> V {
    let n = cx.g.ty(v).shape[0];
    cx.g.broadcast_in_dim(v, &[n, d], &[0])
}

/// `forward_only`: `_embedding_bag_forward_only`, which differs from
/// `_embedding_bag` in one respect: its unused bag_size and max_indices of
/// sums have one element per offset, not per bag.
fn forward(cx: &mut Cx, forward_only: bool) -> Result<Vec<V>> {
    let (wt, it, ot) = (cx.meta("weight")?, cx.meta("indices")?, cx.meta("offsets")?);
    check_indices(&it, "indices")?;
    check_indices(&ot, "offsets")?;
    let float = matches!(wt.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
    expect_types(&wt, "#1 'weight'", "Half, BFloat16, Float, Double", float, "embedding_bag")?;
    ensure!(it.sizes.len() == 1, "input has to be a 1D Tensor, but got Tensor of dimension {}", it.sizes.len());
    ensure!(ot.sizes.len() == 1, "offsets has to be a 1D Tensor, but got Tensor of dimension {}", ot.sizes.len());
    let mode = cx.int("mode")?;
    ensure!((SUM..=MAX).contains(&mode), "`mode` must be sum, mean, or max.");
    let psw = if cx.is_none("per_sample_weights") { None } else { Some(cx.meta("per_sample_weights")?) };
    if let Some(p) = &psw {
        ensure!(mode == SUM, "embedding_bag: per_sample_weights only supported with mode='sum'");
        ensure!(
            p.dtype == wt.dtype,
            "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 'per_sample_weights'; but type torch.{}Tensor does not equal torch.{}Tensor (while checking arguments for embedding_bag)",
            wt.dtype.torch_name(),
            p.dtype.torch_name()
        );
        ensure!(
            p.numel() == it.numel(),
            "Expected per_sample_weights.value().numel() == indices.numel() to be true, but got false.  (Could this error message be improved?  If so, please report an enhancement request to PyTorch.)"
        );
    }
    let include_last = cx.bool("include_last_offset")?;
    let (n, k) = (it.sizes[0], ot.sizes[0]);
    if include_last {
        ensure!(k >= 1, "include_last_offset: number of offset should be at least 1");
    }
    let bags = if include_last { k - 1 } else { k };
    let unused = if forward_only { k } else { bags };
    let (rows, d) = (wt.sizes[0], wt.sizes[1]);
    let idx_dtype = ot.dtype; // CPU makes them like offsets

    let offsets = cx.tensor("offsets")?;
    let offsets = cx.g.convert(offsets, DType::I64);
    if k > 0 {
        let first = cx.g.slice_dim(offsets, 0, 0, 1, 1);
        let first = cx.g.reshape(first, &[]);
        let zero = cx.g.full(0.0, DType::I64, &[]);
        let bad = cx.g.compare("NE", first, zero);
        // CPU prints offsets[0] as a 0-dim tensor: its value, then its type.
        let message = format!(
            "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. However, got {{}}\n[ torch.{}Tensor{{}} ]",
            ot.dtype.torch_name()
        );
        cx.check(bad, Some(first), Kind::Runtime, message);
        let last = cx.g.slice_dim(offsets, 0, k - 1, k, 1);
        let last = cx.g.reshape(last, &[]);
        let len = cx.g.full(n as f64, DType::I64, &[]);
        let bad = cx.g.compare("GT", last, len);
        let message = format!("offsets[-1] can not be greater than input's length {n} but got offsets[-1] of {{}}");
        cx.check(bad, Some(last), Kind::Runtime, message);
    }
    let (idx, real) = read_indices(cx, rows)?;
    let bag = offset2bag(cx, offsets, n);
    let target = targets(cx, bag, real, bags);

    let ct = opmath(wt.dtype);
    let w = cx.tensor("weight")?;
    let w = cx.g.convert(w, ct);
    let mut vals = cx.g.take(w, idx, 0);
    if psw.is_some() {
        let p = cx.tensor("per_sample_weights")?;
        let p = cx.g.convert(p, ct);
        let p = per_row(cx, p, d);
        vals = mul(cx, vals, p);
    }
    let ones = cx.g.full(1.0, DType::I64, &[n]);
    let sizes = into_bags(cx, target, ones, bags, 0.0, ReduceKind::Sum);
    let empty = cx.g.full(0.0, DType::I64, &[bags]);
    let empty = cx.g.compare("EQ", sizes, empty);
    let empty = cx.g.broadcast_in_dim(empty, &[bags, d], &[0]);
    let zeros = cx.g.full(0.0, ct, &[bags, d]);
    let (out, max_indices) = match mode {
        MAX => {
            if wt.dtype == DType::F64 {
                vals = skip_late_nans(cx, vals, bag, target, bags);
            }
            let m = into_bags(cx, target, vals, bags, f64::NEG_INFINITY, ReduceKind::Max);
            let m = cx.g.select(empty, zeros, m);
            // The first index in its bag holding the max (or the first NaN).
            let at = cx.g.take(m, bag, 0);
            let same = cx.g.compare("EQ", vals, at);
            let nan = cx.g.compare("NE", vals, vals);
            let same = cx.g.binary("stablehlo.or", same, nan);
            let pos = cx.g.iota(DType::I64, &[n, d], 0);
            let none = cx.g.full(n as f64, DType::I64, &[n, d]);
            let pos = cx.g.select(same, pos, none);
            let first = into_bags(cx, target, pos, bags, n as f64, ReduceKind::Min);
            let last = cx.g.full((n - 1).max(0) as f64, DType::I64, &[bags, d]);
            let first = cx.g.binary("stablehlo.minimum", first, last);
            let which = cx.g.take(idx, first, 0);
            let zero = cx.g.full(0.0, DType::I64, &[bags, d]);
            (m, cx.g.select(empty, zero, which))
        }
        _ => {
            let s = into_bags(cx, target, vals, bags, 0.0, ReduceKind::Sum);
            if mode == MEAN {
                let count = cx.g.convert(sizes, ct);
                let one = cx.g.full(1.0, ct, &[bags]);
                let count = cx.g.binary("stablehlo.maximum", count, one);
                let count = cx.g.broadcast_in_dim(count, &[bags, d], &[0]);
                (div(cx, s, count), sizes)
            } else {
                (s, cx.g.full(0.0, DType::I64, &[unused]))
            }
        }
    };
    let out = cx.g.convert(out, wt.dtype);
    // CPU's fast path for sums fills in neither offset2bag nor bag_size.
    let fast = mode == SUM && cx.int("padding_idx")? < 0 && wt.dtype != DType::F64 && (wt.strides[1] == 1 || d == 1);
    let bag_out = if fast { cx.g.full(0.0, idx_dtype, &[0]) } else { cx.g.convert(bag, idx_dtype) };
    let sizes = if mode == SUM { cx.g.full(0.0, idx_dtype, &[unused]) } else { cx.g.convert(sizes, idx_dtype) };
    let max_indices = cx.g.convert(max_indices, idx_dtype);
    Ok(vec![out, bag_out, sizes, max_indices])
}

/// CPU's float64 max kernel keeps a row's value if it is the bag's first or
/// `>` the max so far, so a NaN counts only as a bag's first row; later
/// ones become -inf here. (Its float32 kernel propagates every NaN.)
fn skip_late_nans(cx: &mut Cx, vals: V, bag: V, target: V, bags: i64) -> V {
    let ty = cx.g.ty(vals).clone();
    let (n, d) = (ty.shape[0], ty.shape[1]);
    let pos = cx.g.iota(DType::I64, &[n], 0);
    let first = into_bags(cx, target, pos, bags, n as f64, ReduceKind::Min);
    let first = cx.g.take(first, bag, 0);
    let late = cx.g.compare("NE", pos, first);
    let late = per_row(cx, late, d);
    let nan = cx.g.compare("NE", vals, vals);
    let skip = cx.g.binary("stablehlo.and", nan, late);
    let low = cx.g.full(f64::NEG_INFINITY, ty.dtype, &ty.shape);
    cx.g.select(skip, low, vals)
}

/// The backward operators' offset2bag; CPU's fast path for sums leaves it
/// empty (`given` false), and then it is found from the offsets.
fn bags_of(cx: &mut Cx, given: bool, n: i64) -> Result<V> {
    let bag = if given {
        cx.tensor("offset2bag")?
    } else if cx.has("offsets") {
        let offsets = cx.tensor("offsets")?;
        offset2bag(cx, offsets, n)
    } else {
        return Err(Error::runtime(format!("torchtpu: {}: offset2bag must have one element per index", cx.op.name)));
    };
    Ok(cx.g.convert(bag, DType::I64))
}

/// The weight gradient: each index's row gets its bag's gradient (scaled by
/// its per-sample weight, divided by the bag's size for means and by the
/// index's frequency with `scale_grad_by_freq`); for max, each bag's
/// gradient goes to the rows that held its maxima.
fn dense_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (gt, it, bt) = (cx.meta("grad")?, cx.meta("indices")?, cx.meta("offset2bag")?);
    let rows = cx.int("num_weights")?;
    let mode = cx.int("mode")?;
    let (n, bags, d) = (it.numel(), gt.sizes[0], gt.sizes[1]);
    let ct = opmath(gt.dtype);
    let g = cx.tensor("grad")?;
    let g = cx.g.convert(g, ct);
    if mode == MAX {
        let sizes = cx.tensor("bag_size")?;
        let sizes = cx.g.convert(sizes, DType::I64);
        let zero = cx.g.full(0.0, DType::I64, &[bags]);
        let filled = cx.g.compare("GT", sizes, zero);
        let filled = cx.g.broadcast_in_dim(filled, &[bags, d], &[0]);
        let at = cx.tensor("maximum_indices")?;
        let at = cx.g.convert(at, DType::I64);
        // Flat positions in the [rows, d] gradient; empty bags to a spare one.
        let width = cx.g.full(d as f64, DType::I64, &[bags, d]);
        let col = cx.g.iota(DType::I64, &[bags, d], 1);
        let flat = mul(cx, at, width);
        let flat = cx.g.binary("stablehlo.add", flat, col);
        let spare = cx.g.full((rows * d) as f64, DType::I64, &[bags, d]);
        let flat = cx.g.select(filled, flat, spare);
        let flat = cx.g.reshape(flat, &[bags * d]);
        let g = cx.g.reshape(g, &[bags * d]);
        let r = into_bags(cx, flat, g, rows * d, 0.0, ReduceKind::Sum);
        let r = cx.g.reshape(r, &[rows, d]);
        return Ok(vec![cx.g.convert(r, gt.dtype)]);
    }
    let (idx, real) = read_indices(cx, rows)?;
    let bag = bags_of(cx, bt.numel() == n, n)?;
    let mut vals = cx.g.take(g, bag, 0);
    if !cx.is_none("per_sample_weights") {
        let p = cx.tensor("per_sample_weights")?;
        let p = cx.g.convert(p, ct);
        let p = per_row(cx, p, d);
        vals = mul(cx, vals, p);
    }
    if mode == MEAN {
        let sizes = cx.tensor("bag_size")?;
        let sizes = cx.g.convert(sizes, ct);
        let size = cx.g.take(sizes, bag, 0);
        let size = per_row(cx, size, d);
        vals = div(cx, vals, size);
    }
    if cx.bool("scale_grad_by_freq")? {
        let zeros = cx.g.full(0.0, ct, &[rows]);
        let ones = cx.g.full(1.0, ct, &[n]);
        let counts = cx.g.put(zeros, idx, ones, 0, Some(ReduceKind::Sum));
        let count = cx.g.take(counts, idx, 0);
        let count = per_row(cx, count, d);
        vals = div(cx, vals, count);
    }
    let target = targets(cx, idx, real, rows);
    let r = into_bags(cx, target, vals, rows, 0.0, ReduceKind::Sum);
    Ok(vec![cx.g.convert(r, gt.dtype)])
}

/// d/d(per_sample_weights): the dot product of each index's row with its
/// bag's gradient; zero for padding.
fn per_sample_weights_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let (gt, wt, it, bt) = (cx.meta("grad")?, cx.meta("weight")?, cx.meta("indices")?, cx.meta("offset2bag")?);
    ensure!(cx.int("mode")? == SUM, "embedding_bag_backward: per_sample_weights only supported for mode='sum'");
    let n = it.numel();
    let ct = opmath(gt.dtype);
    let (idx, real) = read_indices(cx, wt.sizes[0])?;
    let bag = bags_of(cx, bt.numel() == n, n)?;
    let g = cx.tensor("grad")?;
    let g = cx.g.convert(g, ct);
    let g = cx.g.take(g, bag, 0);
    let w = cx.tensor("weight")?;
    let w = cx.g.convert(w, ct);
    let w = cx.g.take(w, idx, 0);
    let prod = mul(cx, g, w);
    let dot = cx.g.reduce(ReduceKind::Sum, prod, &[1]);
    let zero = cx.g.full(0.0, ct, &[n]);
    let r = cx.g.select(real, dot, zero);
    Ok(vec![cx.g.convert(r, gt.dtype)])
}
