//! Operators that rearrange data: concatenation and friends, rolls, triangles.
use super::reduce::dim_list;
use super::{op, op_complex, wrap_dim, Cx, Entry, Layout};
use crate::error::{Error, Result};
use crate::ir::dtype::DType;
use crate::ir::{Graph, ReduceKind, V};
use crate::lower::args::Tensor;

pub static ENTRIES: &[Entry] = &[
    op_complex("cat", cat).laid_out(Layout::Agreed),
    op_complex("flip", flip),
    op_complex("roll", roll),
    op_complex("tril", |cx| triangle(cx, true)),
    op_complex("triu", |cx| triangle(cx, false)),
    op("unfold_backward", unfold_backward),
    op("channel_shuffle", channel_shuffle),
];

/// Channels [g, C/g] transposed to [C/g, g] (ShuffleNet's shuffle).
fn channel_shuffle(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let groups = cx.int("groups")?;
    if groups <= 0 {
        return Err(Error::runtime(format!(
            "Number of groups to divide channels in must be positive. Value of groups:{groups}"
        )));
    }
    if t.sizes.len() <= 2 {
        return Err(Error::runtime(format!(
            "channel_shuffle expects input with > 2 dims, but got input with sizes {:?}",
            t.sizes
        )));
    }
    let c = t.sizes[1];
    if c % groups != 0 {
        return Err(Error::runtime(format!(
            "Number of channels must be divisible by groups. Got {c} channels and {groups} groups."
        )));
    }
    let x = cx.tensor("self")?;
    let mut split = vec![t.sizes[0], groups, c / groups];
    split.extend(&t.sizes[2..]);
    let x = cx.g.reshape(x, &split);
    let mut perm: Vec<i64> = (0..split.len() as i64).collect();
    perm.swap(1, 2);
    let x = cx.g.transpose(x, &perm);
    Ok(vec![cx.g.reshape(x, t.sizes)])
}

/// PyTorch's checks that `t` expands to `target` (`Tensor.expand`).
pub fn expand_check(t: &Tensor, target: &[i64]) -> Result<()> {
    let sizes = t.sizes;
    if target.len() < sizes.len() {
        // The legacy type name CPU prints for the tensor.
        let ty = match t.dtype {
            DType::BF16 | DType::U32 | DType::U64 => format!("CPU{}Type", t.dtype.torch_name()),
            other => format!("torch.{}Tensor", other.torch_name()),
        };
        return Err(Error::runtime(format!(
            "expand({ty}{{{sizes:?}}}, size={target:?}): the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({})",
            target.len(),
            sizes.len()
        )));
    }
    let lead = target.len() - sizes.len();
    for (i, &size) in sizes.iter().enumerate() {
        if size != 1 && size != target[lead + i] {
            return Err(Error::runtime(format!(
                "The expanded size of the tensor ({}) must match the existing size ({size}) at non-singleton dimension {}.  Target sizes: {target:?}.  Tensor sizes: {sizes:?}",
                target[lead + i],
                lead + i
            )));
        }
    }
    Ok(())
}

fn flip(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dims: Vec<i64> = dim_list(&cx.ints("dims")?, t.sizes.len())?.into_iter().map(|d| d as i64).collect();
    let x = cx.tensor("self")?;
    Ok(vec![if dims.is_empty() { x } else { cx.g.reverse(x, &dims) }])
}

/// `torch.roll`: the checks and order of CPU's `roll_common` (without dims,
/// the flattened tensor rolls), each dim one slice pair put back in turn.
fn roll(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let (shifts, dims) = (cx.ints("shifts")?, cx.ints("dims")?);
    if shifts.is_empty() {
        return Err(Error::runtime("`shifts` required".to_string()));
    }
    let flat = dims.is_empty() && shifts.len() == 1;
    if !flat && shifts.len() != dims.len() {
        return Err(Error::runtime(format!(
            "shifts and dimensions must align. shifts: {}, dims:{}",
            shifts.len(),
            dims.len()
        )));
    }
    let x = cx.tensor("self")?;
    if t.numel() == 0 {
        return Ok(vec![x]);
    }
    if flat {
        let flattened = cx.g.reshape(x, &[t.numel()]);
        let rolled = roll_dim(&mut cx.g, flattened, 0, t.numel(), shifts[0]);
        return Ok(vec![cx.g.reshape(rolled, t.sizes)]);
    }
    if t.sizes.is_empty() {
        return Err(Error::index(format!("Dimension specified as {} but tensor has no dimensions", dims[0])));
    }
    let mut y = x;
    for (&shift, &dim) in shifts.iter().zip(&dims) {
        let d = wrap_dim(dim, t.sizes.len())?;
        y = roll_dim(&mut cx.g, y, d, t.sizes[d], shift);
    }
    Ok(vec![y])
}

/// `x` rolled by `shift` along `dim` of `size`: its last `shift` (mod size)
/// elements first.
fn roll_dim(g: &mut Graph, x: V, dim: usize, size: i64, shift: i64) -> V {
    let start = (size - shift).rem_euclid(size);
    if start == 0 {
        return x;
    }
    let tail = g.slice_dim(x, dim, start, size, 1);
    let head = g.slice_dim(x, dim, 0, start, 1);
    g.concatenate(&[tail, head], dim)
}

/// The gradient of `Tensor.unfold(dim, size, step)` (a view): window `i`'s
/// element `k` adds into the input at `i * step + k` along `dim`, where
/// windows overlap when `step < size`.
fn unfold_backward(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("grad_in")?;
    let input = cx.ints("input_sizes")?;
    let (size, step) = (cx.int("size")?, cx.int("step")?);
    let grad = cx.tensor("grad_in")?;
    if input.is_empty() {
        return Ok(vec![cx.g.reshape(grad, &[])]); // a 0-dim input's one window
    }
    let dim = wrap_dim(cx.int("dim")?, input.len())?;
    let windows = t.sizes[dim];
    let zeros = cx.g.full(0.0, t.dtype, &input);
    if windows * size == 0 {
        return Ok(vec![zeros]);
    }
    // [.., windows, .., size] -> [.., windows * size, ..], window-major.
    let mut perm: Vec<i64> = (0..input.len() as i64).collect();
    perm.insert(dim + 1, input.len() as i64);
    let grad = cx.g.transpose(grad, &perm);
    let mut flat = input.clone();
    flat[dim] = windows * size;
    let updates = cx.g.reshape(grad, &flat);
    let window = cx.g.iota(DType::I64, &[windows, size], 0);
    let strides = cx.g.full(step as f64, DType::I64, &[windows, size]);
    let start = cx.g.binary("stablehlo.multiply", window, strides);
    let offset = cx.g.iota(DType::I64, &[windows, size], 1);
    let at = cx.g.binary("stablehlo.add", start, offset);
    let at = cx.g.reshape(at, &[windows * size]);
    Ok(vec![cx.g.put(zeros, at, updates, dim, Some(ReduceKind::Sum))])
}

/// The lower (`tril`) or upper triangle of the last two dimensions from
/// `diagonal` on: elements with `column - row <= diagonal` (lower) or
/// `>= diagonal` (upper) are kept, the others zeroed.
fn triangle(cx: &mut Cx, lower: bool) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let rank = t.sizes.len();
    if rank < 2 {
        let name = if lower { "tril" } else { "triu" };
        return Err(Error::runtime(format!("{name}: input tensor must have at least 2 dimensions")));
    }
    let x = cx.tensor("self")?;
    let diagonal = cx.int("diagonal")?;
    Ok(vec![keep_triangle(&mut cx.g, x, lower, diagonal)])
}

/// The lower (or upper) triangle of each trailing matrix of `x`, from
/// `diagonal` (0 is the main one) down (or up); zeros elsewhere.
pub fn keep_triangle(g: &mut Graph, x: V, lower: bool, diagonal: i64) -> V {
    let ty = g.ty(x).clone();
    let rank = ty.rank();
    let rows = g.iota(DType::I64, &ty.shape, rank - 2);
    let cols = g.iota(DType::I64, &ty.shape, rank - 1);
    let offset = g.binary("stablehlo.subtract", cols, rows);
    let diagonal = g.full(diagonal as f64, DType::I64, &ty.shape);
    let keep = g.compare(if lower { "LE" } else { "GE" }, offset, diagonal);
    let zero = g.full(0.0, ty.dtype, &ty.shape);
    g.select(keep, x, zero)
}

fn cat(cx: &mut Cx) -> Result<Vec<V>> {
    let metas = cx.metas("tensors")?;
    let metas: Vec<_> = metas.into_iter().flatten().collect();
    if metas.is_empty() {
        return Err(Error::runtime("torch.cat(): expected a non-empty list of Tensors"));
    }
    let values: Vec<V> = cx.tensors("tensors")?.into_iter().flatten().collect();
    let ops: Vec<super::Operand> = metas
        .iter()
        .zip(&values)
        .map(|(t, &v)| super::Operand { v, dtype: t.dtype, priority: crate::ir::dtype::Priority::Dim })
        .collect();
    let dtype = cx.result_type(&ops);
    // Legacy rule: 1-D empty tensors are skipped.
    let parts: Vec<(usize, V)> = metas
        .iter()
        .enumerate()
        .filter(|(_, t)| !(t.sizes.len() == 1 && t.sizes[0] == 0))
        .map(|(i, _)| (i, values[i]))
        .collect();
    let Some(&(first, _)) = parts.first() else {
        return Ok(vec![cx.g.full(0.0, dtype, &[0])]);
    };
    let rank = metas[first].sizes.len();
    let dim = wrap_dim(cx.int("dim")?, rank)?;
    for &(i, _) in &parts {
        let s = metas[i].sizes;
        if s.len() != rank {
            return Err(Error::runtime(format!(
                "Tensors must have same number of dimensions: got {rank} and {}",
                s.len()
            )));
        }
        for d in (0..rank).filter(|&d| d != dim) {
            if s[d] != metas[first].sizes[d] {
                return Err(Error::runtime(format!(
                    "Sizes of tensors must match except in dimension {dim}. Expected size {} but got size {} for tensor number {i} in the list.",
                    metas[first].sizes[d], s[d]
                )));
            }
        }
    }
    let converted: Vec<V> = parts.iter().map(|&(_, v)| cx.g.convert(v, dtype)).collect();
    Ok(vec![cx.g.concatenate(&converted, dim)])
}
