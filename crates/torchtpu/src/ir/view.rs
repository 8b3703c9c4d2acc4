//! Strided views of flat storages, in the IR: reading a view is a
//! slice/reshape/transpose/broadcast of the storage (a gather in general),
//! writing one produces the storage's next value (DESIGN §3).
use crate::ir::dtype::DType;
use crate::ir::{Graph, Ty, V};

/// Where a tensor's elements lie in its storage, in elements of `dtype`.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub sizes: &'a [i64],
    pub strides: &'a [i64],
    pub offset: i64,
    pub dtype: DType,
}

pub fn contiguous_strides(sizes: &[i64]) -> Vec<i64> {
    let mut strides = vec![1; sizes.len()];
    for d in (0..sizes.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * sizes[d + 1].max(1);
    }
    strides
}

impl View<'_> {
    pub fn numel(&self) -> i64 {
        self.sizes.iter().product()
    }

    /// Row-major without gaps (strides of size-1 dimensions do not matter).
    pub fn is_contiguous(&self) -> bool {
        self.has_strides(&contiguous_strides(self.sizes))
    }

    /// The view has these strides, but where a dimension's size is 1.
    pub fn has_strides(&self, strides: &[i64]) -> bool {
        (0..self.sizes.len()).all(|d| self.sizes[d] == 1 || self.strides[d] == strides[d])
    }

    /// The view is the whole storage of `n` elements, in order.
    pub fn is_whole(&self, n: i64) -> bool {
        self.offset == 0 && self.numel() == n && self.is_contiguous()
    }

    /// When the view's elements tile `numel` consecutive storage elements
    /// (a permutation of a contiguous layout: transposes, permutes): its
    /// dimensions in memory order, outermost first.
    pub fn memory_order(&self) -> Option<Vec<i64>> {
        let rank = self.sizes.len() as i64;
        if self.is_contiguous() {
            return Some((0..rank).collect());
        }
        let mut order: Vec<i64> = (0..rank).collect();
        order.sort_by_key(|&d| std::cmp::Reverse(self.strides[d as usize]));
        let mut expected = 1;
        for &d in order.iter().rev().filter(|&&d| self.sizes[d as usize] > 1) {
            if self.strides[d as usize] != expected {
                return None;
            }
            expected *= self.sizes[d as usize];
        }
        Some(order)
    }
}

/// The storage value `v` (any shape) as a 1-D array of `dtype` elements.
pub fn flat(g: &mut Graph, v: V, dtype: DType) -> V {
    let t = g.ty(v).clone();
    let v = g.reshape(v, &[t.numel()]);
    let (from, to) = (t.dtype.size() as i64, dtype.size() as i64);
    // XLA bitcasts no complex values: a complex value's bytes are its real
    // and imaginary parts interleaved.
    if t.dtype.is_complex() && t.dtype != dtype {
        let parts = [false, true].map(|imaginary| {
            let p = g.part(v, imaginary);
            g.reshape(p, &[t.numel(), 1])
        });
        let pairs = g.concatenate(&parts, 1);
        let real = g.reshape(pairs, &[t.numel() * 2]);
        return flat(g, real, dtype);
    }
    if dtype.is_complex() && t.dtype != dtype {
        let real = flat(g, v, dtype.to_real());
        let n = t.numel() * from / to;
        let pairs = g.reshape(real, &[n, 2]);
        let [re, im] = [0, 1].map(|i| {
            let p = g.slice_dim(pairs, 1, i, i + 1, 1);
            g.reshape(p, &[n])
        });
        return g.complex(re, im);
    }
    if t.dtype == dtype {
        v
    } else if from == to {
        g.bitcast(v, Ty::new(dtype, &[t.numel()]))
    } else if from > to {
        let wide = g.bitcast(v, Ty::new(dtype, &[t.numel(), from / to]));
        g.reshape(wide, &[t.numel() * from / to])
    } else {
        let narrow = g.reshape(v, &[t.numel() * from / to, to / from]);
        g.bitcast(narrow, Ty::new(dtype, &[t.numel() * from / to]))
    }
}

/// Linear storage index of every element of the view (i64, the view's shape).
fn linear_indices(g: &mut Graph, view: &View) -> V {
    let mut idx = g.full(view.offset as f64, DType::I64, view.sizes);
    for d in 0..view.sizes.len() {
        if view.strides[d] != 0 && view.sizes[d] > 1 {
            let i = g.iota(DType::I64, view.sizes, d);
            let s = g.full(view.strides[d] as f64, DType::I64, view.sizes);
            let term = g.binary("stablehlo.multiply", i, s);
            idx = g.binary("stablehlo.add", idx, term);
        }
    }
    idx
}

/// Reads `view` out of the 1-D storage array `base`.
pub fn read(g: &mut Graph, base: V, view: &View) -> V {
    let n = g.ty(base).shape[0];
    if view.numel() == 0 {
        return g.full(0.0, view.dtype, view.sizes);
    }
    if view.is_whole(n) {
        return g.reshape(base, view.sizes);
    }
    // Dimensions that move through memory, outermost first.
    let mut dims: Vec<usize> = (0..view.sizes.len()).filter(|&d| view.sizes[d] > 1 && view.strides[d] != 0).collect();
    dims.sort_by_key(|&d| std::cmp::Reverse(view.strides[d]));
    let boxed = dims.windows(2).all(|w| {
        let (outer, inner) = (view.strides[w[0]], view.strides[w[1]]);
        outer % inner == 0 && outer >= inner * view.sizes[w[1]]
    });
    if !boxed {
        let idx = linear_indices(g, view);
        return g.take(base, idx, 0);
    }
    // A strided box: cut the chunk it spans, fold it into a box shape, and
    // slice the box down to the view.
    let Some(&outer) = dims.first() else {
        let one = g.slice(base, &[view.offset], &[view.offset + 1], &[1]);
        let one = g.reshape(one, &[]);
        return g.broadcast_in_dim(one, view.sizes, &[]);
    };
    let len = view.sizes[outer] * view.strides[outer];
    let avail = (n - view.offset).min(len);
    let mut chunk = g.slice(base, &[view.offset], &[view.offset + avail], &[1]);
    if avail < len {
        let zero = g.scalar(0.0, view.dtype);
        chunk = g.pad(chunk, zero, &[0], &[len - avail], &[0]);
    }
    let mut shape = vec![view.sizes[outer]];
    for w in dims.windows(2) {
        shape.push(view.strides[w[0]] / view.strides[w[1]]);
    }
    shape.push(view.strides[*dims.last().unwrap()]);
    let folded = g.reshape(chunk, &shape);
    let mut limit: Vec<i64> = dims.iter().map(|&d| view.sizes[d]).collect();
    limit.push(1);
    let ones = vec![1; limit.len()];
    let cut = g.slice(folded, &vec![0; limit.len()], &limit, &ones);
    limit.pop();
    let cut = g.reshape(cut, &limit);
    // Back to the view's dimension order, then broadcast over the rest.
    let mut order: Vec<usize> = dims.clone();
    order.sort();
    let perm: Vec<i64> = order.iter().map(|d| dims.iter().position(|x| x == d).unwrap() as i64).collect();
    let t = g.transpose(cut, &perm);
    let bdims: Vec<i64> = order.iter().map(|&d| d as i64).collect();
    g.broadcast_in_dim(t, view.sizes, &bdims)
}

/// The next value of the 1-D storage array `old` after writing `src` (the
/// view's shape and dtype) into `view`.
pub fn write(g: &mut Graph, old: V, view: &View, src: V) -> V {
    let n = g.ty(old).shape[0];
    let numel = view.numel();
    if numel == 0 {
        return old;
    }
    let Some(order) = view.memory_order() else {
        let idx = linear_indices(g, view);
        return g.put(old, idx, src, 0, None);
    };
    // A consecutive range: the source laid out in memory order replaces it.
    let src = g.transpose(src, &order);
    let src_flat = g.reshape(src, &[numel]);
    if view.offset == 0 && numel == n {
        return src_flat;
    }
    let mut parts = Vec::new();
    if view.offset > 0 {
        parts.push(g.slice(old, &[0], &[view.offset], &[1]));
    }
    parts.push(src_flat);
    if view.offset + numel < n {
        parts.push(g.slice(old, &[view.offset + numel], &[n], &[1]));
    }
    g.concatenate(&parts, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguity() {
        let v = View { sizes: &[2, 3], strides: &[3, 1], offset: 0, dtype: DType::F32 };
        assert!(v.is_whole(6));
        let t = View { sizes: &[3, 2], strides: &[1, 3], offset: 0, dtype: DType::F32 };
        assert!(!t.is_contiguous());
        let s = View { sizes: &[1, 3], strides: &[99, 1], offset: 3, dtype: DType::F32 };
        assert!(s.is_contiguous() && !s.is_whole(6));
    }

    #[test]
    fn memory_order() {
        let t = View { sizes: &[3, 2], strides: &[1, 3], offset: 0, dtype: DType::F32 };
        assert_eq!(t.memory_order(), Some(vec![1, 0]));
        let heads = View { sizes: &[8, 4, 64, 128], strides: &[32768, 64, 1, 256], offset: 0, dtype: DType::F32 };
        assert_eq!(heads.memory_order(), Some(vec![0, 3, 1, 2]));
        let column = View { sizes: &[3], strides: &[2], offset: 1, dtype: DType::F32 };
        assert_eq!(column.memory_order(), None);
        let expanded = View { sizes: &[3, 2], strides: &[0, 1], offset: 0, dtype: DType::F32 };
        assert_eq!(expanded.memory_order(), None);
    }
}
