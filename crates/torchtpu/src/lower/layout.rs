//! The memory layouts PyTorch gives results: TensorIterator's rule for
//! elementwise ones, so that a channels-last or transposed operand keeps its
//! order through `relu`, `x + y` or `where`, and the channels-last rules of
//! convolutions, normalizations, pools, resizes and `cat`, as on CPU and CUDA.
use crate::ir::view::{contiguous_strides, View};

/// How an operator lays its results out: PyTorch's rule for it.
#[derive(Clone, Copy)]
pub enum Layout {
    Contiguous,
    /// TensorIterator's, for the elementwise families.
    Elementwise,
    /// Channels-last where one of these operands suggests it
    /// (`suggest_memory_format()`), for results of its rank: convolutions,
    /// batch and group norm, max pooling, 2-d average pooling, resizes.
    Suggested(&'static [&'static str]),
    /// Channels-last where every operand suggests it (`cat`).
    Agreed,
}

/// The strides of a result of `shape` computed elementwise from `operands`
/// (broadcast to it); None where they are contiguous.
fn result_strides(shape: &[i64], operands: &[View]) -> Option<Vec<i64>> {
    let n = shape.len();
    if n < 2 || shape.contains(&0) || operands.iter().any(|o| o.sizes.len() > n) {
        return None;
    }
    let contiguous = contiguous_strides(shape);
    let strides = if operands.iter().all(|o| o.sizes == shape) {
        same_shape(shape, operands).unwrap_or_else(|| permuted(shape, operands))
    } else {
        permuted(shape, operands)
    };
    (strides != contiguous).then_some(strides)
}

/// TensorIterator's fast setups, for operands all of the result's shape:
/// all contiguous, all channels-last, or all of one dense layout, which the
/// result takes as it is.
fn same_shape(shape: &[i64], operands: &[View]) -> Option<Vec<i64>> {
    if operands.iter().all(View::is_contiguous) {
        return Some(contiguous_strides(shape));
    }
    if operands.iter().all(is_channels_last) {
        return Some(channels_last_strides(shape));
    }
    let first = operands.first()?;
    let dense = first.memory_order().is_some();
    (dense && operands.iter().all(|o| o.strides == first.strides)).then(|| first.strides.to_vec())
}

/// TensorIterator's general rule (`reorder_dimensions`): dimensions sorted
/// innermost first by the first operand whose strides tell two apart
/// (broadcast dimensions tell nothing; among equal strides the smaller size
/// goes inside), and the result contiguous in that order.
fn permuted(shape: &[i64], operands: &[View]) -> Vec<i64> {
    let n = shape.len();
    // Each operand's strides over the result's dimensions, 0 where broadcast.
    let strides: Vec<Vec<i64>> = operands
        .iter()
        .map(|o| {
            let lead = n - o.sizes.len();
            (0..n)
                .map(|d| match d.checked_sub(lead) {
                    Some(k) if !(o.sizes[k] == 1 && shape[d] != 1) => o.strides[k],
                    _ => 0,
                })
                .collect()
        })
        .collect();
    let should_swap = |d0: usize, d1: usize| -> i32 {
        for s in &strides {
            let (s0, s1) = (s[d0], s[d1]);
            if s0 == 0 || s1 == 0 {
                continue;
            }
            if s0 != s1 {
                return if s0 < s1 { -1 } else { 1 };
            }
            if shape[d0] > shape[d1] {
                return 1;
            }
        }
        0
    };
    // Innermost first; an insertion sort that stops at the first decided pair.
    let mut perm: Vec<usize> = (0..n).rev().collect();
    for i in 1..n {
        let mut d1 = i;
        for d0 in (0..i).rev() {
            match should_swap(perm[d0], perm[d1]) {
                c if c > 0 => {
                    perm.swap(d0, d1);
                    d1 = d0;
                }
                c if c < 0 => break,
                _ => {}
            }
        }
    }
    let mut out = vec![0; n];
    let mut next = 1;
    for &d in &perm {
        out[d] = next;
        next *= shape[d];
    }
    out
}

/// The strides of a result of `shape` under `rule`, given the operands the
/// rule reads; None where contiguous.
pub fn rule_strides(rule: Layout, shape: &[i64], operands: &[View]) -> Option<Vec<i64>> {
    let suggests = |o: &View| o.sizes.len() == shape.len() && suggests_channels_last(o);
    let channels_last = match rule {
        Layout::Contiguous => false,
        Layout::Elementwise => return result_strides(shape, operands),
        Layout::Suggested(_) => operands.iter().any(suggests),
        Layout::Agreed => !operands.is_empty() && operands.iter().all(suggests),
    };
    let strides = channels_last.then(|| channels_last_strides(shape))?;
    (strides != contiguous_strides(shape)).then_some(strides)
}

/// `is_contiguous(memory_format=channels_last{,_3d})` of a 4-d or 5-d view
/// (size-1 dimensions take any stride, as in c10).
pub fn is_channels_last(v: &View) -> bool {
    matches!(v.sizes.len(), 4 | 5) && v.has_strides(&channels_last_strides(v.sizes))
}

/// PyTorch's `suggest_memory_format()` is channels-last (2d or 3d): the
/// channel dimension innermost in stride order, c10's reading of ambiguous
/// strides (size-1 dimensions) as contiguous included.
pub fn suggests_channels_last(v: &View) -> bool {
    let (sizes, strides) = (v.sizes, v.strides);
    let order: &[usize] = match sizes.len() {
        4 => &[1, 3, 2, 0],
        5 => &[1, 4, 3, 2, 0],
        _ => return false,
    };
    if strides[1] == 0 {
        return false;
    }
    let mut min = 0;
    for &d in order {
        if sizes[d] == 0 || strides[d] < min || (d == 0 && min == strides[1]) {
            return false;
        }
        min = strides[d] * sizes[d].max(1);
    }
    true
}

/// Channels innermost, then the spatial dimensions, then the batch.
fn channels_last_strides(shape: &[i64]) -> Vec<i64> {
    let n = shape.len();
    let mut strides = vec![0; n];
    let mut next = 1;
    for d in std::iter::once(1).chain((2..n).rev()).chain(std::iter::once(0)) {
        strides[d] = next;
        next *= shape[d].max(1);
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::dtype::DType;

    fn view<'a>(sizes: &'a [i64], strides: &'a [i64]) -> View<'a> {
        View { sizes, strides, offset: 0, dtype: DType::F32 }
    }

    #[test]
    fn a_result_keeps_its_operands_layout() {
        let shape = [2, 3, 4, 5];
        let cl = [60, 1, 15, 3];
        assert_eq!(result_strides(&shape, &[view(&shape, &cl)]), Some(cl.to_vec()));
        // A broadcast operand tells nothing; the permuted one decides.
        let row = [5];
        assert_eq!(result_strides(&shape, &[view(&row, &[1]), view(&shape, &cl)]), Some(cl.to_vec()));
        // A transposed matrix and a contiguous one: the first decides.
        let (t, c) = ([1, 6], [5, 1]);
        assert_eq!(result_strides(&[6, 5], &[view(&[6, 5], &t), view(&[6, 5], &c)]), Some(t.to_vec()));
        assert_eq!(result_strides(&[6, 5], &[view(&[6, 5], &c), view(&[6, 5], &t)]), None);
        assert_eq!(result_strides(&shape, &[view(&shape, &contiguous_strides(&shape))]), None);
    }

    #[test]
    fn channels_last_rules() {
        let (x, cl) = ([2, 3, 4, 5], [60, 1, 15, 3]);
        let c = contiguous_strides(&x);
        // A convolution's result takes channels-last from either operand.
        let out = [2, 8, 4, 5];
        let rule = Layout::Suggested(&["input", "weight"]);
        assert_eq!(rule_strides(rule, &out, &[view(&x, &c), view(&x, &cl)]), Some(vec![160, 1, 40, 8]));
        assert_eq!(rule_strides(rule, &out, &[view(&x, &c), view(&x, &c)]), None);
        // `cat` only where all agree.
        assert_eq!(rule_strides(Layout::Agreed, &out, &[view(&x, &cl), view(&x, &c)]), None);
        assert_eq!(rule_strides(Layout::Agreed, &out, &[view(&x, &cl), view(&x, &cl)]), Some(vec![160, 1, 40, 8]));
        // c10 reads [N, 1, 1, 1] and an [N, C, 1, 1] contiguous view as contiguous.
        assert!(!suggests_channels_last(&view(&[4, 1, 1, 1], &[1, 1, 1, 1])));
        assert!(!suggests_channels_last(&view(&[4, 8, 1, 1], &[8, 1, 1, 1])));
        assert!(suggests_channels_last(&view(&x, &cl)));
    }
}
