//! Sorting and order statistics. Everything is one stable `sort` of the
//! values with their positions; NaN sorts above every number, as on CPU.
//! Equal values keep their order: CPU's indices where CPU sorts stably
//! (`stable=True`); its unstable sort orders them arbitrarily. Searches of
//! sorted sequences (`searchsorted`, `bucketize`) run CPU's binary search,
//! unrolled.
use super::elementwise::not_implemented;
use super::index::as_vector;
use super::reduce::scan;
use super::{op, wrap_dim, Cx, Entry};
use crate::ensure;
use crate::error::{Error, Result};
use crate::ir::dtype::DType;
use crate::ir::{ReduceKind, V};

pub static ENTRIES: &[Entry] = &[
    op("sort", sort),
    op("topk", topk),
    op("kthvalue", kthvalue),
    op("median", |cx| median(cx, false)),
    op("nanmedian", |cx| median(cx, true)),
    op("mode", mode),
    op("isin", isin),
    op("searchsorted", searchsorted),
    op("bucketize", bucketize),
];

/// `x` sorted along `dim`, and the i64 positions the values came from.
pub fn sorted(cx: &mut Cx, x: V, dim: usize, descending: bool) -> (V, V) {
    let shape = cx.g.ty(x).shape.clone();
    let iota = cx.g.iota(DType::I64, &shape, dim);
    let r = cx.g.sort(&[x, iota], dim, descending, 1);
    (r[0], r[1])
}

/// `self` read as at least 1-D, and the wrapped `dim`.
fn operand(cx: &mut Cx) -> Result<(V, usize)> {
    let t = cx.meta("self")?;
    let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
    let x = cx.tensor("self")?;
    Ok((cx.g.reshape(x, &as_vector(&t)), dim))
}

/// Values and indices shaped as `self` (a 0-dim self stays 0-dim).
fn shaped(cx: &mut Cx, values: V, indices: V, sizes: &[i64]) -> Vec<V> {
    vec![cx.g.reshape(values, sizes), cx.g.reshape(indices, sizes)]
}

fn sort(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let (x, dim) = operand(cx)?;
    let (v, i) = sorted(cx, x, dim, cx.bool("descending")?);
    Ok(shaped(cx, v, i, t.sizes))
}

fn topk(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let (x, dim) = operand(cx)?;
    let k = cx.int("k")?;
    let n = cx.g.ty(x).shape[dim];
    ensure!(k >= 0 && k <= n, "selected index k out of range");
    if t.dtype == DType::Bool {
        return Err(Error::not_implemented("topk does not support bool dtypes on CPU"));
    }
    let (v, i) = sorted(cx, x, dim, cx.bool("largest")?);
    let (v, i) = (cx.g.slice_dim(v, dim, 0, k, 1), cx.g.slice_dim(i, dim, 0, k, 1));
    let mut sizes = as_vector(&t);
    sizes[dim] = k;
    let sizes = if t.sizes.is_empty() { vec![] } else { sizes };
    Ok(shaped(cx, v, i, &sizes))
}

/// The element at position `k` along `dim` of values and indices; the
/// dimension is kept as size 1 when `keepdim`, else removed.
fn pick(cx: &mut Cx, v: V, i: V, dim: usize, k: i64, sizes: &[i64], keepdim: bool) -> Vec<V> {
    let (v, i) = (cx.g.slice_dim(v, dim, k, k + 1, 1), cx.g.slice_dim(i, dim, k, k + 1, 1));
    shaped(cx, v, i, &reduced(sizes, dim, keepdim))
}

fn kthvalue(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let (x, dim) = operand(cx)?;
    let k = cx.int("k")?;
    let n = cx.g.ty(x).shape[dim];
    ensure!(k >= 1 && k <= n, "kthvalue(): selected number k out of range for dimension {dim}");
    // CPU copies a 0-dim self before looking at its dtype.
    if t.dtype == DType::Bool && !t.sizes.is_empty() {
        return Err(not_implemented("kthvalue_cpu", t.dtype));
    }
    let (v, i) = sorted(cx, x, dim, false);
    Ok(pick(cx, v, i, dim, k - 1, t.sizes, cx.bool("keepdim")?))
}

/// median/nanmedian, over everything (value only) or along `dim`. The
/// lower median; `median` gives the first NaN if any, `nanmedian` the median
/// of the numbers (NaN when there are none).
fn median(cx: &mut Cx, ignore_nan: bool) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let all = !cx.has("dim");
    if t.dtype == DType::Bool {
        return Err(not_implemented(if all { "median_cpu" } else { "median_out" }, t.dtype));
    }
    let x = cx.tensor("self")?;
    let (x, dim, sizes) = if all {
        (cx.g.reshape(x, &[t.numel()]), 0, vec![])
    } else {
        let dim = wrap_dim(cx.int("dim")?, t.sizes.len())?;
        (cx.g.reshape(x, &as_vector(&t)), dim, t.sizes.to_vec())
    };
    let shape = cx.g.ty(x).shape.clone();
    let n = shape[dim];
    ensure!(n > 0 || all, "median() cannot compute median for a dimension of size zero");
    if n == 0 {
        return Ok(vec![cx.g.full(f64::NAN, t.dtype, &[])]);
    }
    // Move `dim` last so each row's pick is a flat position.
    let rank = shape.len();
    let perm: Vec<i64> = (0..rank).filter(|&d| d != dim).chain([dim]).map(|d| d as i64).collect();
    let x = cx.g.transpose(x, &perm);
    let (v, i) = sorted(cx, x, rank - 1, false);
    let numbers = cx.g.compare("EQ", x, x);
    let numbers = cx.g.convert(numbers, DType::I64);
    let m = cx.g.reduce(ReduceKind::Sum, numbers, &[rank - 1]);
    let rows = cx.g.ty(m).shape.clone();
    let c = |cx: &mut Cx, value: i64| cx.g.full(value as f64, DType::I64, &rows);
    let (one, two) = (c(cx, 1), c(cx, 2));
    let pos = if ignore_nan {
        let zero = c(cx, 0);
        let some = cx.g.compare("GT", m, zero);
        let last = cx.g.binary("stablehlo.subtract", m, one);
        let mid = cx.g.binary("stablehlo.divide", last, two);
        cx.g.select(some, mid, zero)
    } else {
        let all_numbers = c(cx, n);
        let nan = cx.g.compare("LT", m, all_numbers);
        let mid = c(cx, (n - 1).max(0) / 2);
        cx.g.select(nan, m, mid)
    };
    let (v, i) = at_positions(cx, v, i, pos);
    if all {
        return Ok(vec![cx.g.reshape(v, &[])]);
    }
    let out = reduced(&sizes, dim, cx.bool("keepdim")?);
    Ok(shaped(cx, v, i, &out))
}

/// The sorted values and positions (rows along the last dimension) at one
/// position `pos` per row, flat.
fn at_positions(cx: &mut Cx, v: V, i: V, pos: V) -> (V, V) {
    let rows = cx.g.ty(pos).shape.clone();
    let n = *cx.g.ty(v).shape.last().unwrap();
    let total: i64 = rows.iter().product();
    let width = cx.g.full(n as f64, DType::I64, &rows);
    let base = flat_rows(cx, &rows);
    let base = cx.g.binary("stablehlo.multiply", base, width);
    let at = cx.g.binary("stablehlo.add", base, pos);
    let at = cx.g.reshape(at, &[total]);
    let (vf, iflat) = (cx.g.reshape(v, &[total * n]), cx.g.reshape(i, &[total * n]));
    (cx.g.take(vf, at, 0), cx.g.take(iflat, at, 0))
}

/// `mode`: the most frequent value along `dim` (the smallest of several;
/// each NaN counts alone, as on CPU) and the position of its last
/// occurrence, found from the runs of equal values of the sorted rows.
fn mode(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let (x, dim) = operand(cx)?;
    let shape = cx.g.ty(x).shape.clone();
    let n = shape[dim];
    if n == 0 {
        return Err(Error::index(format!("mode(): Expected reduction dim {dim} to have non-zero size.")));
    }
    let out = reduced(t.sizes, dim, cx.bool("keepdim")?);
    if t.numel() == 0 {
        return Ok(vec![cx.g.full(0.0, t.dtype, &out), cx.g.full(0.0, DType::I64, &out)]);
    }
    let rank = shape.len();
    let last = rank - 1;
    let perm: Vec<i64> = (0..rank).filter(|&d| d != dim).chain([dim]).map(|d| d as i64).collect();
    let x = cx.g.transpose(x, &perm);
    let (v, i) = sorted(cx, x, last, false);
    let rows_shape = cx.g.ty(v).shape.clone();
    let mut edge_shape = rows_shape.clone();
    edge_shape[last] = 1;
    // Where a run starts and ends along each row.
    let later = cx.g.slice_dim(v, last, 1, n, 1);
    let earlier = cx.g.slice_dim(v, last, 0, n - 1, 1);
    let changed = cx.g.compare("NE", later, earlier);
    let edge = cx.g.full(1.0, DType::Bool, &edge_shape);
    let starts = cx.g.concatenate(&[edge, changed], last);
    let ends = cx.g.concatenate(&[changed, edge], last);
    // Each run's length, at its end: the position less the run's start.
    let j = cx.g.iota(DType::I64, &rows_shape, last);
    let zeros = cx.g.full(0.0, DType::I64, &rows_shape);
    let start = cx.g.select(starts, j, zeros);
    let max = |cx: &mut Cx, earlier: &[V], later: &[V]| vec![cx.g.binary("stablehlo.maximum", later[0], earlier[0])];
    let start = scan(cx, &[start], last, &[ReduceKind::Max], max)[0];
    let ones = cx.g.full(1.0, DType::I64, &rows_shape);
    let length = cx.g.binary("stablehlo.subtract", j, start);
    let length = cx.g.binary("stablehlo.add", length, ones);
    let length = cx.g.select(ends, length, zeros);
    // The first longest run: the smallest value among the most frequent.
    let longest = cx.g.reduce(ReduceKind::Max, length, &[last]);
    let longest = cx.g.reshape(longest, &edge_shape);
    let longest = cx.g.broadcast_to(longest, &rows_shape);
    let is_longest = cx.g.compare("EQ", length, longest);
    let beyond = cx.g.full(n as f64, DType::I64, &rows_shape);
    let candidates = cx.g.select(is_longest, j, beyond);
    let pos = cx.g.reduce(ReduceKind::Min, candidates, &[last]);
    let (v, i) = at_positions(cx, v, i, pos);
    Ok(shaped(cx, v, i, &out))
}

/// `sizes` without `dim`, or with it as 1 when `keepdim` (0-dim stays 0-dim).
fn reduced(sizes: &[i64], dim: usize, keepdim: bool) -> Vec<i64> {
    let mut out = sizes.to_vec();
    if keepdim {
        if let Some(s) = out.get_mut(dim) {
            *s = 1;
        }
    } else if !out.is_empty() {
        out.remove(dim);
    }
    out
}

/// Row numbers 0, 1, ... of an array of shape `rows`, in row-major order.
fn flat_rows(cx: &mut Cx, rows: &[i64]) -> V {
    let total: i64 = rows.iter().product();
    let flat = cx.g.iota(DType::I64, &[total], 0);
    cx.g.reshape(flat, rows)
}

/// Whether each element is among the test elements (CPU's comparison in
/// their common type; NaN is in no set): every element against every test
/// element, reduced. Overloads name a scalar side `element`/`test_element`.
fn isin(cx: &mut Cx) -> Result<Vec<V>> {
    let pick = |cx: &Cx, a: &'static str, b: &'static str| if cx.has(a) { a } else { b };
    let (en, tn) = (pick(cx, "elements", "element"), pick(cx, "test_elements", "test_element"));
    let (e, t) = (cx.operand(en)?, cx.operand(tn)?);
    let ct = cx.result_type(&[e, t]);
    let (ev, tv) = (cx.g.convert(e.v, ct), cx.g.convert(t.v, ct));
    let shape = cx.g.ty(ev).shape.clone();
    let m = cx.g.ty(tv).numel();
    let tv = cx.g.reshape(tv, &[m]);
    let rank = shape.len();
    let grid: Vec<i64> = shape.iter().copied().chain([m]).collect();
    let keep: Vec<i64> = (0..rank as i64).collect();
    let ev = cx.g.broadcast_in_dim(ev, &grid, &keep);
    let tv = cx.g.broadcast_in_dim(tv, &grid, &[rank as i64]);
    let eq = cx.g.compare("EQ", ev, tv);
    let found = cx.g.reduce(ReduceKind::Or, eq, &[rank]);
    Ok(vec![if cx.bool("invert")? { cx.g.unary("stablehlo.not", found) } else { found }])
}

/// `torch.searchsorted`: where each value would go in the sorted rows of
/// `sorted_sequence` (a 1-D sequence serves every value; otherwise the rows
/// match the values' leading dims), optionally read through `sorter`.
fn searchsorted(cx: &mut Cx) -> Result<Vec<V>> {
    let seq = cx.meta("sorted_sequence")?;
    let right = cx.bool("right")?;
    let side = if cx.is_none("side") { None } else { Some(cx.str("side")?) };
    match side {
        Some("left") if right => {
            return Err(Error::runtime(
                "torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True",
            ))
        }
        Some("left") | Some("right") | None => {}
        Some(other) => {
            return Err(Error::runtime(format!(
                "torch.searchsorted(): side can only be 'left' or 'right' but got {other}"
            )))
        }
    }
    let right = right || side == Some("right");
    let values = value_shape(cx)?;
    let rank = seq.sizes.len();
    if rank == 0 || (rank > 1 && (values.len() != rank || values[..rank - 1] != seq.sizes[..rank - 1])) {
        if values.is_empty() && rank != 1 {
            return Err(Error::runtime(format!(
                "torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension is 1, but we got boundaries tensor dim({rank}) and input value's dim(0) numel(1)"
            )));
        }
        return Err(Error::runtime(format!(
            "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries tensor and input value tensor must match, but we got boundaries tensor {:?} and input value tensor {values:?}",
            seq.sizes
        )));
    }
    let sorter = if cx.is_none("sorter") {
        None
    } else {
        let st = cx.meta("sorter")?;
        ensure!(
            st.dtype == DType::I64,
            "torch.searchsorted(): sorter must be a tensor of long dtype but got {}",
            st.dtype.torch_name()
        );
        ensure!(
            st.sizes == seq.sizes,
            "torch.searchsorted(): boundary and sorter must have the same size, but got boundary tensor {:?}and got sorter tensor {:?}",
            seq.sizes,
            st.sizes
        );
        Some(cx.tensor("sorter")?)
    };
    let out_int32 = cx.bool("out_int32")?;
    search(cx, "sorted_sequence", "self", sorter, right, out_int32, &values)
}

/// The shape of the searched values: a tensor's, or [] for a number.
fn value_shape(cx: &Cx) -> Result<Vec<i64>> {
    Ok(match cx.arg("self")? {
        crate::lower::args::Arg::Tensor(_) => cx.meta("self")?.sizes.to_vec(),
        _ => vec![],
    })
}

/// `torch.bucketize`: searchsorted in 1-D `boundaries`.
fn bucketize(cx: &mut Cx) -> Result<Vec<V>> {
    let b = cx.meta("boundaries")?;
    ensure!(b.sizes.len() == 1, "boundaries tensor must be 1 dimension, but got dim({})", b.sizes.len());
    let values = value_shape(cx)?;
    let (right, out_int32) = (cx.bool("right")?, cx.bool("out_int32")?);
    search(cx, "boundaries", "self", None, right, out_int32, &values)
}

/// CPU's binary search of each value in its row of `seq` ([rows, m] with
/// one row per value row, or one shared row), unrolled: lower bound
/// (`!(mid >= v)` moves right) or upper bound (`!(mid > v)`), NaNs
/// included, as CPU compares them.
fn search(
    cx: &mut Cx,
    seq: &str,
    value: &str,
    sorter: Option<V>,
    right: bool,
    out_int32: bool,
    shape: &[i64],
) -> Result<Vec<V>> {
    let st = cx.meta(seq)?;
    let index = if out_int32 { DType::I32 } else { DType::I64 };
    let m = *st.sizes.last().expect("a 1-D or wider sequence");
    let n: i64 = shape.iter().product();
    if n == 0 || m == 0 {
        return Ok(vec![cx.g.full(0.0, index, shape)]);
    }
    let ops = [cx.operand(seq)?, cx.operand(value)?];
    let dtype = cx.result_type(&ops);
    if dtype == DType::Bool {
        return Err(not_implemented("searchsorted_out_cpu", dtype));
    }
    let seq_v = cx.g.convert(ops[0].v, dtype);
    let vals = cx.g.convert(ops[1].v, dtype);
    let rows = st.numel() / m;
    let per_row = n / rows;
    let flat_seq = cx.g.reshape(seq_v, &[rows * m]);
    let vals = cx.g.reshape(vals, &[rows, per_row]);
    let sorter = sorter.map(|s| cx.g.reshape(s, &[rows * m]));
    let base = cx.g.iota(DType::I64, &[rows, per_row], 0);
    let width = cx.g.full(m as f64, DType::I64, &[rows, per_row]);
    let base = cx.g.binary("stablehlo.multiply", base, width);
    let mut start = cx.g.full(0.0, DType::I64, &[rows, per_row]);
    let mut end = width;
    let (one, two) = (cx.g.full(1.0, DType::I64, &[rows, per_row]), cx.g.full(2.0, DType::I64, &[rows, per_row]));
    let last = cx.g.full((m - 1) as f64, DType::I64, &[rows, per_row]);
    let steps = 64 - (m as u64).leading_zeros();
    for _ in 0..=steps {
        let active = cx.g.compare("LT", start, end);
        let span = cx.g.binary("stablehlo.subtract", end, start);
        let half = cx.g.binary("stablehlo.divide", span, two);
        let mid = cx.g.binary("stablehlo.add", start, half);
        let at = cx.g.binary("stablehlo.minimum", mid, last);
        let at = cx.g.binary("stablehlo.add", base, at);
        let at = match sorter {
            Some(s) => {
                let picked = cx.g.take(s, at, 0);
                cx.g.binary("stablehlo.add", base, picked)
            }
            None => at,
        };
        let mid_val = cx.g.take(flat_seq, at, 0);
        let stop = cx.g.compare(if right { "GT" } else { "GE" }, mid_val, vals);
        let moves = cx.g.unary("stablehlo.not", stop);
        let go_right = cx.g.binary("stablehlo.and", active, moves);
        let go_left = cx.g.binary("stablehlo.and", active, stop);
        let next = cx.g.binary("stablehlo.add", mid, one);
        start = cx.g.select(go_right, next, start);
        end = cx.g.select(go_left, mid, end);
    }
    let r = cx.g.reshape(start, shape);
    Ok(vec![cx.g.convert(r, index)])
}
