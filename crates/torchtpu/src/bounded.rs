//! Bounded dynamic dimensions: a fused program compiled once per bucket of a
//! changing size rather than once per size.
//!
//! Lowerings only ever see real, static shapes. When a flushed trace misses
//! the program cache, its graph is compared with the first trace of the same
//! structure up to integers (sizes, slice bounds, integral constants): its
//! *template*. If every integer that differs is `a*s + b` (a > 0) of one size
//! `s`, the program is built for `s`'s bucket `B` (`TORCHTPU_BUCKETS`, else
//! the next power of two): each such dimension becomes a bounded dynamic
//! dimension of bound `a*B + b` whose real size is computed from `s`, a
//! runtime input (`stablehlo.set_dimension_size`), and XLA masks reductions,
//! products and the rest over the padding; a constant such as a mean's count
//! is computed from `s` too. Programs take and return static buffers of their
//! bounds (bounded parameters do not compile, bounded results cannot feed
//! another program), so outputs stay padded ([`DeviceBuffer::padded`]) and
//! feed the next bucketed program as they are; other readers get the real
//! box, copied through the host (`unpad`, counted), as are inputs that arrive
//! in another shape (`repad`). Ops a dynamic dimension may reach are the ones
//! XLA's padding is known to handle; any other keeps the trace static.
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use crate::dtype::DType;
use crate::error::Result;
use crate::exec::{FxHasher, FxMap};
use crate::ir::{Graph, Op, Ty, V};
use crate::metrics::{bump, METRICS};
use crate::runtime;
use crate::storage::DeviceBuffer;

/// Where an integer of a graph sits.
#[derive(Clone, Copy)]
enum Slot {
    /// Dimension `d` of node `v`'s type.
    Dim(V, usize),
    /// Field `f` (start, limit, stride) of a slice's dimension `d`.
    Slice(V, usize, usize),
    /// An integral constant's value.
    Const(V),
}

/// A graph's integers and a hash of everything else.
struct Scan {
    key: u64,
    ints: Vec<i64>,
    slots: Vec<Slot>,
}

/// A constant's value where it is an integer a size could be (f64 bits for
/// floats, the integer itself for integers; complex and bool excluded).
fn integral(bits: i64, dtype: DType) -> Option<i64> {
    let limit = 1i64 << 31;
    if dtype.is_float() {
        let x = f64::from_bits(bits as u64);
        return (x.fract() == 0.0 && x.abs() < limit as f64).then_some(x as i64);
    }
    (!dtype.is_complex() && dtype != DType::Bool && bits.abs() < limit).then_some(bits)
}

fn scan(g: &Graph) -> Scan {
    let mut h = FxHasher::default();
    let (mut ints, mut slots) = (Vec::new(), Vec::new());
    for (v, node) in g.nodes.iter().enumerate() {
        match &node.op {
            Op::Slice { start, limit, stride } => {
                "slice".hash(&mut h);
                for (f, field) in [start, limit, stride].into_iter().enumerate() {
                    for (d, &x) in field.iter().enumerate() {
                        ints.push(x);
                        slots.push(Slot::Slice(v, f, d));
                    }
                }
            }
            &Op::Const(bits) => match integral(bits, node.ty.dtype) {
                Some(x) => {
                    "const".hash(&mut h);
                    ints.push(x);
                    slots.push(Slot::Const(v));
                }
                None => node.op.hash(&mut h),
            },
            op => op.hash(&mut h),
        }
        node.args.hash(&mut h);
        node.ty.dtype.hash(&mut h);
        node.ty.rank().hash(&mut h);
        for (d, &x) in node.ty.shape.iter().enumerate() {
            ints.push(x);
            slots.push(Slot::Dim(v, d));
        }
    }
    (&g.outputs, &g.donors, g.params.len()).hash(&mut h);
    Scan { key: h.finish(), ints, slots }
}

/// Whether fused programs are bucketed (`TORCHTPU_DYNAMIC=1`; off by
/// default until the conformance sweep runs with sizes below their bucket).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TORCHTPU_DYNAMIC").is_ok_and(|v| v == "1"))
}

/// The first graph seen of each structure, by `Scan::key`.
static TEMPLATES: Mutex<Option<FxMap<u64, Vec<i64>>>> = Mutex::new(None);

/// The bucket of a size: the first of `TORCHTPU_BUCKETS` (comma-separated,
/// ascending) that holds it, else the next power of two.
pub fn bucket(s: i64) -> i64 {
    static BUCKETS: OnceLock<Vec<i64>> = OnceLock::new();
    let buckets = BUCKETS.get_or_init(|| {
        let list = std::env::var("TORCHTPU_BUCKETS").unwrap_or_default();
        let mut b: Vec<i64> = list.split(',').filter_map(|x| x.trim().parse().ok()).filter(|&x| x > 0).collect();
        b.sort_unstable();
        b
    });
    buckets.iter().copied().find(|&b| b >= s).unwrap_or_else(|| (s.max(1) as u64).next_power_of_two() as i64)
}

/// A program for a bucket, built from a flushed trace's graph.
pub struct Bucketed {
    /// The graph with bounded dimensions; its last parameter is `s`.
    pub graph: Graph,
    pub s: i64,
    /// Each output's buffer shape where it is padded.
    pub padded: Vec<Option<Vec<i64>>>,
}

/// `a*s + b` for each integer of the graph (a = 0: it does not change).
type Formula = (i64, i64);

/// The program of `g` for its bucket, if `g` differs from its template only
/// in integers of one size that every op reached can take dynamically.
/// `padded` are the shapes of its parameters' buffers that are padded.
pub fn generalize(g: &Graph, padded: &[Option<&[i64]>]) -> Option<Bucketed> {
    let scan = scan(g);
    let mut guard = TEMPLATES.lock().unwrap();
    let templates = guard.get_or_insert_with(FxMap::default);
    let Some(first) = templates.get(&scan.key) else {
        if templates.len() >= 1024 {
            templates.clear();
        }
        templates.insert(scan.key, scan.ints);
        return None;
    };
    // The size: the integer that changed least (others are multiples of it).
    let k0 = (0..first.len()).filter(|&k| scan.ints[k] != first[k]).min_by_key(|&k| (scan.ints[k] - first[k]).abs())?;
    let (s, s0) = (scan.ints[k0], first[k0]);
    if s <= 0 {
        return None;
    }
    let mut formulas: Vec<Formula> = Vec::with_capacity(scan.ints.len());
    for (&x, &x0) in scan.ints.iter().zip(first) {
        let (dx, ds) = (x - x0, s - s0);
        if dx % ds != 0 || dx / ds < 0 {
            return refuse("a size that is not a multiple of one changing size");
        }
        formulas.push((dx / ds, x - dx / ds * s));
    }
    drop(guard);
    Builder::new(g, &scan.slots, &formulas, s).build(padded)
}

fn refuse(why: &str) -> Option<Bucketed> {
    refused(why);
    None
}

/// Counts a trace left static, and why.
pub fn refused(why: &str) {
    if crate::trace::logging() {
        eprintln!("torchtpu: a changing size not bucketed: {why}");
    }
    *METRICS.bucket_refusals.lock().unwrap().entry(why.to_string()).or_insert(0) += 1;
}

struct Builder<'a> {
    g: &'a Graph,
    out: Graph,
    /// Per node: each dimension's formula; a const's value, a slice's fields.
    dims: Vec<Vec<Formula>>,
    value: FxMap<V, Formula>,
    slice: FxMap<(V, usize, usize), Formula>,
    bucket: i64,
    s: V,
    s_value: i64,
    sizes: FxMap<Formula, V>,
}

fn dynamic(forms: &[Formula]) -> u64 {
    forms.iter().enumerate().filter(|(_, f)| f.0 > 0).fold(0, |m, (d, _)| m | 1 << d)
}

impl<'a> Builder<'a> {
    fn new(g: &'a Graph, slots: &[Slot], formulas: &[Formula], s: i64) -> Builder<'a> {
        let mut dims: Vec<Vec<Formula>> = g.nodes.iter().map(|n| vec![(0, 0); n.ty.rank()]).collect();
        let (mut value, mut slice) = (FxMap::default(), FxMap::default());
        for (slot, &f) in slots.iter().zip(formulas) {
            match *slot {
                Slot::Dim(v, d) => dims[v][d] = f,
                Slot::Const(v) => drop(value.insert(v, f)),
                Slot::Slice(v, field, d) => drop(slice.insert((v, field, d), f)),
            }
        }
        let mut out = Graph::default();
        for ty in &g.params {
            out.param(Ty::new(ty.dtype, &ty.shape)); // shapes fixed in `build`
        }
        let s_param = out.param(Ty::new(DType::I32, &[]));
        let bucket = bucket(s);
        Builder { g, out, dims, value, slice, bucket, s: s_param, s_value: s, sizes: FxMap::default() }
    }

    fn bound(&self, (a, b): Formula) -> i64 {
        a * self.bucket + b
    }

    /// Node `v`'s type with its bounds; `dynamic` marks which dimensions are.
    fn ty(&self, v: V, dynamic: u64) -> Ty {
        let ty = &self.g.nodes[v].ty;
        let shape: Vec<i64> = self.dims[v].iter().map(|&f| self.bound(f)).collect();
        Ty { dtype: ty.dtype, shape, dynamic }
    }

    /// An i32 scalar constant.
    fn int(&mut self, x: i64) -> V {
        self.out.push(Op::Const(x), vec![], Ty::new(DType::I32, &[]))
    }

    /// `a*s + b` as an i32 scalar.
    fn size(&mut self, f: Formula) -> V {
        if let Some(&v) = self.sizes.get(&f) {
            return v;
        }
        let i32 = Ty::new(DType::I32, &[]);
        let v = match f {
            (0, b) => self.int(b),
            (a, b) => {
                let mut v = self.s;
                if a != 1 {
                    let a = self.int(a);
                    v = self.out.push(Op::Elementwise("stablehlo.multiply"), vec![v, a], i32.clone());
                }
                if b != 0 {
                    let b = self.int(b);
                    v = self.out.push(Op::Elementwise("stablehlo.add"), vec![v, b], i32);
                }
                v
            }
        };
        self.sizes.insert(f, v);
        v
    }

    /// `x` (node `v`'s value) with its dimensions in `mask` set to their real sizes.
    fn set_sizes(&mut self, mut x: V, v: V, mask: u64) -> V {
        for d in 0..self.dims[v].len() {
            if mask >> d & 1 == 1 {
                let size = self.size(self.dims[v][d]);
                let mut ty = self.out.ty(x).clone();
                ty.dynamic |= 1 << d;
                x = self.out.push(Op::SetDimensionSize(d as i64), vec![x, size], ty);
            }
        }
        x
    }

    /// A slice of node `v`'s operand: static where its bounds stay put, else
    /// of the bound of its size at an end that moves no faster than the
    /// operand's, or at a start computed from `s` (only real elements read).
    fn slice(&mut self, v: V, start: &[i64], limit: &[i64], stride: &[i64], mut args: Vec<V>) -> Option<V> {
        let operand = self.g.nodes[v].args[0];
        args[0] = self.static_(args[0]);
        let (mut limit, mut starts, mut moving) = (limit.to_vec(), Vec::new(), false);
        for d in 0..limit.len() {
            let [fs, fl, ft] = [0, 1, 2].map(|f| self.slice[&(v, f, d)]);
            let (od, size) = (self.dims[operand][d], self.dims[v][d]);
            if ft.0 != 0 || (stride[d] != 1 && (fs.0 != 0 || fl.0 != 0)) {
                return None;
            }
            if fs.0 != 0 {
                moving = true;
                if self.bound(fs) + self.bound(size) > self.bound(od) {
                    return None; // XLA would clamp the start
                }
            } else if fl.0 != 0 && (fl.0 > od.0 || self.bound(fl) > self.bound(od)) {
                return None;
            }
            limit[d] = self.bound(fl);
            starts.push(fs);
        }
        if !moving {
            let op = Op::Slice { start: start.to_vec(), limit, stride: stride.to_vec() };
            return Some(self.out.push(op, args, self.ty(v, 0)));
        }
        let mut operands = args;
        for f in starts {
            operands.push(self.size(f));
        }
        let sizes = self.dims[v].iter().map(|&f| self.bound(f)).collect();
        Some(self.out.push(Op::DynamicSlice(sizes), operands, self.ty(v, 0)))
    }

    /// Node `v`, a reshape of `x` (typed static: StableHLO's reshape takes
    /// one bounded dimension at most; the caller sets the sizes). XLA merges
    /// dimensions around a changing one, and splits a changing dimension as
    /// the major one of its group, but not both at once; where that is what
    /// the reshape does, the reshape is XLA's. Otherwise (a flat storage
    /// viewed as rows of a changing length) the real elements, flattened by
    /// XLA, are gathered at indices computed from the real sizes.
    fn reshape(&mut self, v: V, x: V) -> Option<V> {
        let operand = self.g.nodes[v].args[0];
        let (fd, td) = (self.dims[operand].clone(), self.dims[v].clone());
        let bounds = self.ty(v, 0);
        if self.native(operand, v) {
            return Some(self.out.push(Op::Reshape, vec![x], bounds));
        }
        let [d] = (0..fd.len()).filter(|&d| fd[d].0 != 0).collect::<Vec<_>>()[..] else { return None };
        let rest: i64 = (0..fd.len()).filter(|&e| e != d).map(|e| fd[e].1).product();
        let flat = (fd[d].0 * rest, fd[d].1 * rest);
        let mut ty = Ty::new(bounds.dtype, &[self.bound(flat)]);
        let x = self.out.push(Op::Reshape, vec![x], ty.clone());
        let size = self.size(flat);
        ty.dynamic = 1;
        let x = self.out.push(Op::SetDimensionSize(0), vec![x, size], ty.clone());
        // Gathered from as a static array (XLA's gather from a bounded one
        // wrote out of bounds): the real elements are at its front.
        let bound = self.int(ty.shape[0]);
        let x = self.out.push(Op::SetDimensionSize(0), vec![x, bound], Ty { dynamic: 0, ..ty });
        let index_ty = Ty::new(DType::I32, &bounds.shape);
        let mut index: Option<V> = None;
        let mut stride: Option<V> = None; // product of the real sizes of the later dimensions
        for e in (0..td.len()).rev() {
            let iota = self.out.push(Op::Iota(e as i64), vec![], index_ty.clone());
            let term = match stride {
                Some(s) => {
                    let s = self.out.push(Op::BroadcastInDim(vec![]), vec![s], index_ty.clone());
                    self.out.push(Op::Elementwise("stablehlo.multiply"), vec![iota, s], index_ty.clone())
                }
                None => iota,
            };
            index = Some(match index {
                Some(i) => self.out.push(Op::Elementwise("stablehlo.add"), vec![i, term], index_ty.clone()),
                None => term,
            });
            let size = self.size(td[e]);
            stride = Some(match stride {
                Some(s) => {
                    self.out.push(Op::Elementwise("stablehlo.multiply"), vec![s, size], Ty::new(DType::I32, &[]))
                }
                None => size,
            });
        }
        Some(self.out.push(Op::Take { axis: 0 }, vec![x, index?], bounds))
    }

    /// Whether XLA reshapes `operand` into `v` in PyTorch's order: each
    /// group of dimensions (equal products, ignoring dimensions of size 1)
    /// holding a changing one is that dimension alone on both sides, a merge
    /// into one dimension, or a split whose major dimension takes it.
    fn native(&self, operand: V, v: V) -> bool {
        let sized = |u: V| -> Vec<(i64, Formula)> {
            let dims = &self.dims[u];
            let shape = &self.g.nodes[u].ty.shape;
            (0..shape.len()).filter(|&d| shape[d] != 1 || dims[d].0 != 0).map(|d| (shape[d], dims[d])).collect()
        };
        let (from, to) = (sized(operand), sized(v));
        let (mut i, mut j) = (0, 0);
        while i < from.len() && j < to.len() {
            let (i0, j0) = (i, j);
            let (mut pf, mut pt) = (from[i].0, to[j].0);
            while pf != pt {
                if pf < pt {
                    i += 1;
                    pf *= from.get(i).map_or(0, |f| f.0);
                } else {
                    j += 1;
                    pt *= to.get(j).map_or(0, |t| t.0);
                }
                if i >= from.len() || j >= to.len() {
                    return false;
                }
            }
            let changing = |side: &[(i64, Formula)], a: usize, b: usize| (a..=b).filter(|&k| side[k].1 .0 != 0).count();
            let (cf, ct) = (changing(&from, i0, i), changing(&to, j0, j));
            // A merge (one result dimension) compacts its real elements; a
            // split takes the changing size as its major dimension's.
            let ok = match (i == i0, j == j0) {
                _ if cf + ct == 0 => true,
                (true, true) => from[i0].1 == to[j0].1,
                (_, true) => cf == 1,
                (true, false) => ct == 1 && to[j0].1 .0 != 0,
                (false, false) => false,
            };
            if !ok {
                return false;
            }
            i += 1;
            j += 1;
        }
        i == from.len() && j == to.len()
    }

    /// `x` with its bounded dimensions static again (a constant size equal to
    /// the bound; the padding read as it is): a program's outputs, and what
    /// slices and gathers take, which read real elements only. XLA would carry
    /// a bounded operand's size into their results, past a result's bound
    /// where they cut the dimension (a heap overrun).
    fn static_(&mut self, mut x: V) -> V {
        let ty = self.out.ty(x).clone();
        for d in (0..ty.rank()).filter(|d| ty.dynamic >> d & 1 == 1) {
            let bound = self.int(ty.shape[d]);
            let mut t = self.out.ty(x).clone();
            t.dynamic &= !(1 << d);
            x = self.out.push(Op::SetDimensionSize(d as i64), vec![x, bound], t);
        }
        x
    }

    /// A concatenation's operands, each with a bounded type if any is: the
    /// StableHLO verifier aborts the process on a static first operand
    /// followed by a bounded one. A static operand gets its own size.
    fn bounded_operands(&mut self, args: Vec<V>, axis: usize) -> Vec<V> {
        if args.iter().all(|&a| self.out.ty(a).dynamic == 0) {
            return args;
        }
        args.into_iter()
            .map(|a| {
                let ty = self.out.ty(a).clone();
                if ty.dynamic != 0 {
                    return a;
                }
                let size = self.int(ty.shape[axis]);
                let bounded = Ty { dynamic: 1 << axis, ..ty };
                self.out.push(Op::SetDimensionSize(axis as i64), vec![a, size], bounded)
            })
            .collect()
    }

    fn build(mut self, padded: &[Option<&[i64]>]) -> Option<Bucketed> {
        let g = self.g;
        let mut map: Vec<V> = Vec::with_capacity(g.nodes.len());
        for (v, node) in g.nodes.iter().enumerate() {
            let want = dynamic(&self.dims[v]);
            let args: Vec<V> = node.args.iter().map(|&a| map[a]).collect();
            let any = want != 0 || node.args.iter().any(|&a| dynamic(&self.dims[a]) != 0);
            let x = match &node.op {
                &Op::Param(n) => {
                    // A padded buffer at least as large as the bounds is taken
                    // as it is and cut. Others are copied into the bounds of a
                    // size one larger: what a value that grows by one each
                    // step (a KV cache) leaves its bucketed program, so that
                    // its first and later steps share one program.
                    let bounds = self.ty(v, 0);
                    let shape = padded[n].unwrap_or_default();
                    let larger = shape.len() == bounds.rank() && shape.iter().zip(&bounds.shape).all(|(a, b)| a >= b);
                    let grown: Vec<i64> = self.dims[v].iter().map(|&(a, b)| a * (self.bucket + 1) + b).collect();
                    let ty = Ty::new(bounds.dtype, if larger { shape } else { &grown });
                    let cut = ty.shape != bounds.shape;
                    self.out.params[n] = ty.clone();
                    self.out.nodes[n].ty = ty;
                    let mut x = n;
                    if cut {
                        let (start, stride) = (vec![0; bounds.rank()], vec![1; bounds.rank()]);
                        let op = Op::Slice { start, limit: bounds.shape.clone(), stride };
                        x = self.out.push(op, vec![n], bounds);
                    }
                    self.set_sizes(x, v, want)
                }
                &Op::Const(bits) => {
                    let c = match self.value.get(&v).copied().filter(|f| f.0 > 0) {
                        // A count (a mean's, a loss's): computed from `s`.
                        Some(f) => {
                            let n = self.size(f);
                            let scalar = Ty::new(node.ty.dtype, &[]);
                            let n = self.out.push(Op::Convert, vec![n], scalar);
                            self.out.push(Op::BroadcastInDim(vec![]), vec![n], self.ty(v, 0))
                        }
                        None => self.out.push(Op::Const(bits), vec![], self.ty(v, 0)),
                    };
                    self.set_sizes(c, v, want)
                }
                Op::Iota(_) | Op::Dense(_) => {
                    let x = self.out.push(node.op.clone(), vec![], self.ty(v, 0));
                    self.set_sizes(x, v, want)
                }
                Op::BroadcastInDim(map_dims) => {
                    let from = dynamic(&self.dims[node.args[0]]);
                    let inherited = map_dims
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| from >> i & 1 == 1)
                        .fold(0, |m, (_, &d)| m | 1 << d);
                    let x = self.out.push(node.op.clone(), args, self.ty(v, inherited));
                    self.set_sizes(x, v, want & !inherited)
                }
                Op::Slice { start, limit, stride } => match self.slice(v, start, limit, stride, args) {
                    Some(x) => self.set_sizes(x, v, want),
                    None => return refuse("a slice at an offset that changes"),
                },
                Op::Reshape => match self.reshape(v, args[0]) {
                    Some(x) => self.set_sizes(x, v, want),
                    None => return refuse("a reshape of several changing sizes"),
                },
                Op::Elementwise(_)
                | Op::Compare(_)
                | Op::Select
                | Op::Convert
                | Op::Transpose(_)
                | Op::Reduce { .. }
                | Op::DotGeneral { .. } => self.out.push(node.op.clone(), args, self.ty(v, want)),
                Op::BitcastConvert if node.ty.rank() == g.ty(node.args[0]).rank() => {
                    self.out.push(node.op.clone(), args, self.ty(v, want))
                }
                &Op::Concatenate(axis) => {
                    let args = self.bounded_operands(args, axis as usize);
                    self.out.push(node.op.clone(), args, self.ty(v, want))
                }
                // Padding goes right after the real elements (checked).
                Op::Pad { low, high, interior }
                    if (0..low.len())
                        .all(|d| self.dims[v][d].0 == 0 || (low[d] >= 0 && high[d] >= 0 && interior[d] == 0)) =>
                {
                    self.out.push(node.op.clone(), args, self.ty(v, want))
                }
                Op::ArgReduce { .. } => self.out.push(node.op.clone(), args, self.ty(v, want)),
                // Indices within the real size are the lowerings' to check
                // (against a count computed from `s`), as without padding.
                Op::Take { .. } => {
                    let args = vec![self.static_(args[0]), args[1]];
                    let x = self.out.push(node.op.clone(), args, self.ty(v, 0));
                    self.set_sizes(x, v, want)
                }
                // XLA drops the padding's updates (checked); the target
                // itself must not change along the axis.
                &Op::Put { axis, .. } if self.dims[node.args[0]][axis as usize].0 == 0 => {
                    self.out.push(node.op.clone(), args, self.ty(v, want))
                }
                op if !any => self.out.push(op.clone(), args, node.ty.clone()),
                op => return refuse(op_name(op)),
            };
            map.push(x);
        }
        // Outputs leave static, padded.
        let mut padded = Vec::with_capacity(g.outputs.len());
        for &o in &g.outputs {
            let x = self.static_(map[o]);
            padded.push((dynamic(&self.dims[o]) != 0).then(|| self.out.ty(x).shape.clone()));
            self.out.outputs.push(x);
        }
        let types_match = |out: &Graph, k: usize, o: usize| out.params[k] == *out.ty(out.outputs[o]);
        self.out.donors =
            g.donors.iter().enumerate().map(|(k, d)| d.filter(|&o| types_match(&self.out, k, o))).collect();
        self.out.donors.push(None);
        Some(Bucketed { graph: self.out, s: self.s_value, padded })
    }
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Put { .. } => "a scatter along a changing size",
        Op::Sort { .. } => "a sort along a changing size",
        Op::Pad { .. } => "a pad of a changing size",
        Op::Reverse(_) => "a reverse along a changing size",
        Op::Convolution(_) => "a convolution over a changing size",
        _ => "an op without bounded dimensions",
    }
}

/// The elements of the box `real` of a row-major array shaped `from`, laid
/// out in an array shaped `to` (zeros elsewhere); `size` bytes per element.
fn copy_box(src: &[u8], from: &[i64], to: &[i64], real: &[i64], size: usize) -> Vec<u8> {
    let mut out = vec![0u8; to.iter().product::<i64>() as usize * size];
    let strides = |shape: &[i64]| {
        let mut s = vec![size; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * shape[d + 1] as usize;
        }
        s
    };
    let (sf, st) = (strides(from), strides(to));
    let rank = real.len();
    if rank == 0 || real.contains(&0) {
        out[..src.len().min(size)].copy_from_slice(&src[..src.len().min(size)]);
        return out;
    }
    let row = real[rank - 1] as usize * size;
    let mut index = vec![0i64; rank - 1];
    loop {
        let (a, b) =
            index.iter().enumerate().fold((0, 0), |(a, b), (d, &i)| (a + i as usize * sf[d], b + i as usize * st[d]));
        out[b..b + row].copy_from_slice(&src[a..a + row]);
        let Some(d) = (0..rank - 1).rev().find(|&d| index[d] + 1 < real[d]) else { break };
        index[d] += 1;
        index[d + 1..].iter_mut().for_each(|i| *i = 0);
    }
    out
}

/// `buf`'s contents in a buffer shaped `shape` (None: exactly its type's).
fn reshaped(buf: &Arc<DeviceBuffer>, shape: Option<&[i64]>) -> Result<Arc<DeviceBuffer>> {
    let size = buf.ty.dtype.size();
    let mut bytes = vec![0u8; buf.shape().iter().product::<i64>() as usize * size];
    buf.buf.to_host(&mut bytes)?;
    bump(&METRICS.transfers_to_host);
    let to = shape.unwrap_or(&buf.ty.shape);
    let bytes = copy_box(&bytes, buf.shape(), to, &buf.ty.shape, size);
    let rt = runtime::get()?;
    let raw = rt.client.buffer_from_host(&bytes, buf.ty.dtype.element_type(), to, rt.device(buf.device)?)?;
    bump(&METRICS.transfers_to_device);
    let padded = (to != buf.ty.shape.as_slice()).then(|| to.to_vec());
    Ok(DeviceBuffer::with_shape(raw, buf.ty.clone(), padded, buf.device))
}

/// `buf` holding exactly its type's elements: a padded buffer's box,
/// copied through the host, for readers other than bucketed programs.
pub fn unpad(buf: &Arc<DeviceBuffer>) -> Result<Arc<DeviceBuffer>> {
    if buf.padded.is_none() {
        return Ok(buf.clone());
    }
    bump(&METRICS.unpads);
    reshaped(buf, None)
}

/// `buf` in a buffer shaped `shape`, as a bucketed program's parameter.
pub fn repad(buf: &Arc<DeviceBuffer>, shape: &[i64]) -> Result<Arc<DeviceBuffer>> {
    if buf.shape() == shape {
        return Ok(buf.clone());
    }
    bump(&METRICS.repads);
    reshaped(buf, Some(shape))
}
