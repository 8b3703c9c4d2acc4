//! Max unpooling: each value written back at the flat position within its
//! plane that max pooling's indices recorded, zeros elsewhere.
use super::elementwise::not_implemented;
use super::index::checked_indices;
use super::layout::suggests_channels_last;
use super::{op, Cx, Entry};
use crate::ensure;
use crate::error::{Kind, Result};
use crate::ir::dtype::DType;
use crate::ir::V;

pub static ENTRIES: &[Entry] =
    &[op("max_unpool2d", |cx| max_unpool(cx, 2)), op("max_unpool3d", |cx| max_unpool(cx, 3))];

/// max_unpool{2,3}d's checks, in CPU's order.
fn checks(cx: &Cx, nd: usize) -> Result<Vec<i64>> {
    let (t, it) = (cx.meta("self")?, cx.meta("indices")?);
    let out = cx.ints("output_size")?;
    let (names, rank_lo) = if nd == 2 { ("(height, width)", 3) } else { ("(depth, height, width)", 4) };
    let count = if nd == 2 { "two" } else { "three" };
    ensure!(it.dtype == DType::I64, "elements in indices should be type int64 but got: {}", it.dtype.torch_name());
    let got = if nd == 2 { "" } else { ":" };
    ensure!(
        out.len() == nd,
        "There should be exactly {count} elements {names} in output_size, but got{got} {} elements.",
        out.len()
    );
    if nd == 3 {
        for name in ["stride", "padding"] {
            let v = cx.ints(name)?;
            ensure!(
                v.len() == 3,
                "There should be exactly three elements {names} in {name}, but got: {} elements.",
                v.len()
            );
        }
        let stride = cx.ints("stride")?;
        ensure!(stride.iter().all(|&s| s > 0), "strides should be greater than zero, but got stride: {stride:?}");
    }
    let rank = t.sizes.len();
    ensure!(
        rank == rank_lo || rank == rank_lo + 1,
        "Input to max_unpooling{nd}d should be a {}d or {}d Tensor, but got a tensor with {rank} dimensions.",
        rank_lo,
        rank_lo + 1
    );
    ensure!(
        it.sizes == t.sizes,
        "Expected shape of indices to be same as that of the input tensor ({:?}) but got indices tensor with shape: {:?}",
        t.sizes,
        it.sizes
    );
    for d in (rank - nd - 1).max(1)..rank {
        ensure!(
            t.sizes[d] > 0,
            "max_unpooling{nd}d(): Expected input to have non-zero size for non-batch dimensions, but got {:?} with dimension {d} being empty.",
            t.sizes
        );
    }
    Ok(out)
}

fn max_unpool(cx: &mut Cx, nd: usize) -> Result<Vec<V>> {
    let out = checks(cx, nd)?;
    let t = cx.meta("self")?;
    if !t.dtype.is_float() {
        let channels_last = nd == 2 && t.sizes.len() == 4 && suggests_channels_last(&t.view());
        let kernel = if channels_last { "max_unpool2d_channels_last".to_string() } else { format!("max_unpool{nd}d") };
        return Err(not_implemented(&kernel, t.dtype));
    }
    let rank = t.sizes.len();
    let lead = &t.sizes[..rank - nd];
    let planes: i64 = lead.iter().product();
    let (inner, volume): (i64, i64) = (t.sizes[rank - nd..].iter().product(), out.iter().product());
    let mut shape = lead.to_vec();
    shape.extend(&out);
    if planes * inner == 0 || volume == 0 {
        return Ok(vec![cx.g.full(0.0, t.dtype, &shape)]);
    }
    let sizes = out.iter().map(|s| s.to_string()).collect::<Vec<_>>().join("x");
    let message = format!("Found an invalid max index: {{}} (output volumes are of size {sizes})");
    let idx = cx.tensor("indices")?;
    let idx = cx.g.reshape(idx, &[planes, inner]);
    let idx = checked_indices(cx, idx, volume, false, Kind::Runtime, message);
    // Flat positions in the whole output: each plane's base added.
    let base = cx.g.iota(DType::I64, &[planes, inner], 0);
    let width = cx.g.full(volume as f64, DType::I64, &[planes, inner]);
    let base = cx.g.binary("stablehlo.multiply", base, width);
    let at = cx.g.binary("stablehlo.add", base, idx);
    let at = cx.g.reshape(at, &[planes * inner]);
    let x = cx.tensor("self")?;
    let x = cx.g.reshape(x, &[planes * inner]);
    let zeros = cx.g.full(0.0, t.dtype, &[planes * volume]);
    let r = cx.g.put(zeros, at, x, 0, None);
    Ok(vec![cx.g.reshape(r, &shape)])
}
