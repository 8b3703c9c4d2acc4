//! Rewrites that make a fused program compile the way XLA compiles a
//! whole-step program written directly (JAX's): same values, better code.
//!
//! Storage values live flat (1-D), so an op reading a program parameter
//! reshapes it to the tensor's shape and its result is reshaped back to flat.
//! XLA's fusion then duplicates elementwise producers into each consumer
//! through those bitcasts (an optimizer's new moment is computed again inside
//! the parameter update), reads a donated input after its aliased output is
//! written, and must copy every donated input first. Computing elementwise ops
//! in the flat shape removes the reshapes between them.
use crate::ir::{Graph, Op, Ty, V};

/// Adds `op(args): ty` to `g` like `Graph::push`, rewritten:
/// - a reshape of a reshape reads the original value (or is it, when the
///   shapes agree);
/// - an elementwise op with an operand reshaped from flat is computed flat,
///   then reshaped: its other operands are reshaped to flat too (a bitcast
///   for XLA) and scalar splats are splat flat.
pub fn push(g: &mut Graph, op: Op, args: Vec<V>, ty: Ty) -> V {
    match op {
        Op::Reshape => {
            let a = args[0];
            let source = if g.nodes[a].op == Op::Reshape { g.nodes[a].args[0] } else { a };
            if g.ty(source).shape == ty.shape {
                source
            } else {
                g.push(Op::Reshape, vec![source], ty)
            }
        }
        Op::Elementwise(_) | Op::Compare(_) | Op::Select | Op::Convert if ty.rank() > 1 && reads_flat(g, &args) => {
            let n = ty.numel();
            let flat_args = args.iter().map(|&a| flat(g, a, n)).collect();
            let v = g.push(op, flat_args, Ty::new(ty.dtype, &[n]));
            g.push(Op::Reshape, vec![v], ty)
        }
        _ => g.push(op, args, ty),
    }
}

/// Whether an operand is a flat value reshaped (as reading a storage does).
fn reads_flat(g: &Graph, args: &[V]) -> bool {
    args.iter().any(|&a| g.nodes[a].op == Op::Reshape && g.ty(g.nodes[a].args[0]).rank() == 1)
}

/// Operand `a` (of the op's shape, `n` elements) as a flat value.
fn flat(g: &mut Graph, a: V, n: i64) -> V {
    let node = &g.nodes[a];
    if node.ty.rank() == 0 {
        return a; // a select's scalar predicate
    }
    let dtype = node.ty.dtype;
    match node.op {
        Op::Const(bits) => g.push(Op::Const(bits), vec![], Ty::new(dtype, &[n])),
        Op::BroadcastInDim(_) if g.ty(node.args[0]).rank() == 0 => {
            let scalar = node.args[0];
            g.push(Op::BroadcastInDim(vec![]), vec![scalar], Ty::new(dtype, &[n]))
        }
        _ => push(g, Op::Reshape, vec![a], Ty::new(dtype, &[n])),
    }
}

/// Removes nodes no output depends on (parameters stay: their positions are
/// the program's signature), keeping the order of the rest.
pub fn prune(g: &mut Graph) {
    let mut used = vec![false; g.nodes.len()];
    for &v in &g.outputs {
        used[v] = true;
    }
    for v in (0..g.nodes.len()).rev() {
        if used[v] || matches!(g.nodes[v].op, Op::Param(_)) {
            used[v] = true;
            for a in g.nodes[v].args.clone() {
                used[a] = true;
            }
        }
    }
    let mut map = vec![usize::MAX; g.nodes.len()];
    let mut nodes = Vec::with_capacity(g.nodes.len());
    for (v, mut node) in std::mem::take(&mut g.nodes).into_iter().enumerate() {
        if used[v] {
            node.args.iter_mut().for_each(|a| *a = map[*a]);
            map[v] = nodes.len();
            nodes.push(node);
        }
    }
    g.nodes = nodes;
    g.outputs.iter_mut().for_each(|o| *o = map[*o]);
}
