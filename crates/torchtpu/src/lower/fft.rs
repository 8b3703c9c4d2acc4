//! Discrete Fourier transforms (`_fft_r2c`, `_fft_c2c`, `_fft_c2r`, behind
//! every `torch.fft` function) and the complex helpers their gradients use.
//!
//! Each transformed dimension is moved last and transformed alone with
//! `stablehlo.fft` (the transform is separable; XLA takes at most three
//! trailing dimensions at once). XLA's inverse transforms divide by n, and
//! PyTorch's `normalization` (0: none, 1: 1/sqrt(n), 2: 1/n) applies to the
//! unnormalized transform, so the result is scaled once at the end.
use super::{op_complex, Cx, Entry};
use crate::error::Result;
use crate::ir::{Graph, V};

pub static ENTRIES: &[Entry] = &[
    op_complex("_fft_r2c", r2c),
    op_complex("_fft_c2c", c2c),
    op_complex("_fft_c2r", c2r),
    op_complex("conj_physical", conj_physical),
];

/// `kind` transform of n points along `dim`.
fn along(g: &mut Graph, x: V, dim: usize, kind: &'static str, n: i64) -> V {
    let rank = g.ty(x).rank();
    let perm: Vec<i64> = (0..rank).filter(|&d| d != dim).chain([dim]).map(|d| d as i64).collect();
    let moved = g.transpose(x, &perm);
    let y = g.fft(moved, kind, n);
    let mut back = vec![0; rank];
    for (i, &p) in perm.iter().enumerate() {
        back[p as usize] = i as i64;
    }
    g.transpose(y, &back)
}

/// The transformed dimensions, normalised.
fn dims(cx: &Cx, rank: usize) -> Result<Vec<usize>> {
    cx.ints("dim")?.iter().map(|&d| super::wrap_dim(d, rank)).collect()
}

/// `x` scaled by PyTorch's normalization of an `n`-point transform; XLA's
/// inverse transforms have already divided by n.
fn normalize(cx: &mut Cx, x: V, n: i64, inverse: bool) -> Result<V> {
    let n = n as f64;
    let scale = match cx.int("normalization")? {
        0 => 1.0,
        1 => 1.0 / n.sqrt(),
        _ => 1.0 / n,
    } * if inverse { n } else { 1.0 };
    if scale == 1.0 {
        return Ok(x);
    }
    let ty = cx.g.ty(x).clone();
    let s = cx.g.full(scale, ty.dtype, &ty.shape);
    Ok(cx.g.binary("stablehlo.multiply", x, s))
}

fn signal_size(sizes: &[i64], dims: &[usize]) -> i64 {
    dims.iter().map(|&d| sizes[d]).product()
}

/// Real to complex: the last dimension of `dim` keeps its n / 2 + 1
/// non-negative frequencies when `onesided`.
fn r2c(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dims = dims(cx, t.sizes.len())?;
    let x = cx.tensor("self")?;
    if t.numel() == 0 || dims.is_empty() {
        let x = cx.g.convert(x, t.dtype.to_complex());
        return Ok(vec![x]);
    }
    let (&last, rest) = dims.split_last().unwrap();
    let mut y = if cx.bool("onesided")? {
        along(&mut cx.g, x, last, "RFFT", t.sizes[last])
    } else {
        let z = cx.g.convert(x, t.dtype.to_complex());
        along(&mut cx.g, z, last, "FFT", t.sizes[last])
    };
    for &d in rest {
        y = along(&mut cx.g, y, d, "FFT", t.sizes[d]);
    }
    Ok(vec![normalize(cx, y, signal_size(t.sizes, &dims), false)?])
}

fn c2c(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dims = dims(cx, t.sizes.len())?;
    let forward = cx.bool("forward")?;
    let mut y = cx.tensor("self")?;
    if t.numel() == 0 {
        return Ok(vec![y]);
    }
    for &d in &dims {
        y = along(&mut cx.g, y, d, if forward { "FFT" } else { "IFFT" }, t.sizes[d]);
    }
    Ok(vec![normalize(cx, y, signal_size(t.sizes, &dims), !forward)?])
}

/// Complex (one-sided in the last dimension of `dim`) to real, of
/// `last_dim_size` points there.
fn c2r(cx: &mut Cx) -> Result<Vec<V>> {
    let t = cx.meta("self")?;
    let dims = dims(cx, t.sizes.len())?;
    let n = cx.int("last_dim_size")?;
    let mut y = cx.tensor("self")?;
    let mut sizes = t.sizes.to_vec();
    let Some((&last, rest)) = dims.split_last() else { return Ok(vec![cx.g.convert(y, t.dtype.to_real())]) };
    sizes[last] = n;
    if sizes.contains(&0) {
        return Ok(vec![cx.g.full(0.0, t.dtype.to_real(), &sizes)]);
    }
    for &d in rest {
        y = along(&mut cx.g, y, d, "IFFT", t.sizes[d]);
    }
    // IRFFT reads exactly n / 2 + 1 frequencies.
    let half = n / 2 + 1;
    y = if t.sizes[last] >= half {
        cx.g.slice_dim(y, last, 0, half, 1)
    } else {
        let zero = cx.g.scalar(0.0, t.dtype);
        let mut high = vec![0; sizes.len()];
        high[last] = half - t.sizes[last];
        let zeros = vec![0; sizes.len()];
        cx.g.pad(y, zero, &zeros, &high, &zeros)
    };
    let y = along(&mut cx.g, y, last, "IRFFT", n);
    Ok(vec![normalize(cx, y, signal_size(&sizes, &dims), true)?])
}

/// The complex conjugate (real tensors: themselves).
fn conj_physical(cx: &mut Cx) -> Result<Vec<V>> {
    let x = cx.tensor("self")?;
    Ok(vec![cx.g.conj(x)])
}
