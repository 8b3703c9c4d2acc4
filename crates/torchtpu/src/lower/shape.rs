//! Operators that rearrange data: concatenation and friends.
use super::{op, wrap_dim, Cx, Entry};
use crate::error::{Error, Result};
use crate::ir::V;

pub static ENTRIES: &[Entry] = &[op("cat", cat)];

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
        .map(|(t, &v)| super::Operand { v, dtype: t.dtype, priority: crate::dtype::Priority::Dim })
        .collect();
    let dtype = cx.result_type(&ops);
    // Legacy rule: 1-D empty tensors are skipped.
    let parts: Vec<(usize, V)> =
        metas.iter().enumerate().filter(|(_, t)| !(t.sizes.len() == 1 && t.sizes[0] == 0)).map(|(i, _)| (i, values[i])).collect();
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
