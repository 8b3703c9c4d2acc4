//! The IR: a typed SSA graph of StableHLO-level operations with static shapes
//! (this file), its element types and PyTorch's promotion rules ([`dtype`]),
//! strided views of flat storages ([`view`]), StableHLO text ([`emit`]), and
//! the external kernels a graph may call ([`kernel`]). The layer at the
//! bottom: it uses only `error` and `metrics`.
//!
//! Lowerings build it through the methods of [`Graph`]; `emit` prints it as
//! StableHLO. Shape rules are checked here, once, so a lowering bug surfaces as
//! an error naming the operation rather than as an XLA compile failure.
use dtype::{opmath, DType};

pub mod dtype;
pub mod emit;
pub mod kernel;
pub mod view;

pub type V = usize;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ty {
    pub dtype: DType,
    pub shape: Vec<i64>,
    /// Bounded dynamic dimensions (a bit per dimension; `shape` holds their
    /// bounds): only in programs compiled for a bucket (`exec/bounded.rs`).
    pub dynamic: u64,
}

impl Ty {
    pub fn new(dtype: DType, shape: &[i64]) -> Ty {
        Ty { dtype, shape: shape.to_vec(), dynamic: 0 }
    }
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }
    /// The same elements as a 1-D array.
    pub fn flat(&self) -> Ty {
        Ty::new(self.dtype, &[self.numel()])
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Prod,
    Max,
    Min,
    And,
    Or,
}

/// A convolution's dimension numbers and window, as StableHLO's. Each
/// layout names an operand's dimensions in the order [batch, feature,
/// spatial...]; the kernel's in the order [output feature, input feature,
/// spatial...]. Window fields have one entry per spatial dimension.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conv {
    pub lhs: Vec<i64>,
    pub rhs: Vec<i64>,
    pub out: Vec<i64>,
    pub strides: Vec<i64>,
    /// (low, high) padding of the (dilated) input; negative crops.
    pub padding: Vec<(i64, i64)>,
    pub lhs_dilation: Vec<i64>,
    pub rhs_dilation: Vec<i64>,
    pub feature_groups: i64,
    pub batch_groups: i64,
}

/// What a float32 (or complex64) dot or convolution may round its operands
/// to, as XLA's operand precision: PyTorch's float32 matmul setting
/// (DESIGN §10). Other dtypes always carry `Default`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// One bfloat16 pass on a TPU, TF32 on a GPU ("medium").
    Default = 0,
    /// TF32 on a GPU, three bfloat16 passes on a TPU ("high").
    High = 1,
    /// Full float32 everywhere ("highest", PyTorch's default).
    Highest = 2,
}

impl Precision {
    pub fn from_code(code: i32) -> Precision {
        match code {
            0 => Precision::Default,
            1 => Precision::High,
            _ => Precision::Highest,
        }
    }

    /// The precision a dot or convolution of `dtype` operands carries.
    fn of(self, dtype: DType) -> Precision {
        if follows_precision(dtype) {
            self
        } else {
            Precision::Default
        }
    }
}

/// Whether dots and convolutions of `dtype` follow the float32 setting.
fn follows_precision(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::C64)
}

/// The size of `n` elements with `d - 1` holes between neighbours.
pub fn dilated(n: i64, d: i64) -> i64 {
    if n == 0 {
        0
    } else {
        (n - 1) * d + 1
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Runtime input number n.
    Param(usize),
    /// A scalar constant splat to the node's shape: f64 bits for floats, the
    /// integer itself otherwise.
    Const(i64),
    /// A 1-D constant, element by element (bits as for `Const`).
    Dense(Vec<i64>),
    Iota(i64),
    /// Elementwise StableHLO op with the same type in and out ("stablehlo.add").
    Elementwise(&'static str),
    /// Comparison direction (EQ, NE, LT, LE, GT, GE); result is i1.
    Compare(&'static str),
    Select,
    Convert,
    BitcastConvert,
    Reshape,
    Transpose(Vec<i64>),
    BroadcastInDim(Vec<i64>),
    Slice {
        start: Vec<i64>,
        limit: Vec<i64>,
        stride: Vec<i64>,
    },
    Concatenate(i64),
    Pad {
        low: Vec<i64>,
        high: Vec<i64>,
        interior: Vec<i64>,
    },
    Reverse(Vec<i64>),
    /// Reduces `dims` away from each argument (one or several, of one
    /// shape and dtype, in one loop); the node is the first result,
    /// [`Op::Result`] nodes the others.
    Reduce {
        kind: ReduceKind,
        dims: Vec<i64>,
    },
    /// Index of the max (or min) along `dim`, first occurrence, NaN wins.
    ArgReduce {
        max: bool,
        dim: i64,
    },
    DotGeneral {
        lhs_batch: Vec<i64>,
        rhs_batch: Vec<i64>,
        lhs_contract: Vec<i64>,
        rhs_contract: Vec<i64>,
        precision: Precision,
    },
    Convolution(Conv, Precision),
    /// operand[indices] along `axis`: gathers whole slices (index_select).
    Take {
        axis: i64,
    },
    /// Combines (or, with None, overwrites) `updates` into `operand` at
    /// `indices` along `axis`; indices has the updates' leading dimensions'
    /// shape.
    Put {
        axis: i64,
        combine: Option<ReduceKind>,
    },
    /// Sorts all operands (same shape) along `dim` by the first `keys`
    /// lexicographically, stably; the node is sorted operand `result`.
    /// Floats order NaN above everything (NaNs equal), as PyTorch does.
    Sort {
        dim: i64,
        descending: bool,
        keys: usize,
        result: usize,
    },
    /// The lower (or upper) Cholesky factor of each trailing matrix.
    Cholesky {
        lower: bool,
    },
    /// Solves `op(a) x = b` (left) or `x op(a) = b` for triangular `a`.
    TriangularSolve {
        left: bool,
        lower: bool,
        unit_diagonal: bool,
        transpose: bool,
    },
    /// Random bits from a u64[2] key (the node's type is the bits' type).
    RngBits,
    /// A discrete Fourier transform over the trailing `length.len()`
    /// dimensions: "FFT", "IFFT" (scaled by 1/n), "RFFT" or "IRFFT" (1/n).
    Fft {
        kind: &'static str,
        length: Vec<i64>,
    },
    /// An XLA custom call that XLA's compilers expand themselves ("Qr",
    /// "Eigh", ...); the node is its first result, [`Op::Result`] nodes
    /// the others.
    CustomCall {
        target: &'static str,
        config: String,
        results: Vec<Ty>,
    },
    /// A call of an external kernel's entry function (`ir/kernel.rs`); the
    /// node is its first result, [`Op::Result`] nodes the others.
    Call(std::sync::Arc<crate::ir::kernel::Kernel>),
    /// A collective across the replicas of a replicated program
    /// (`distributed/collective.rs`), all `replicas` of them in one group.
    Collective {
        kind: Collective,
        replicas: i64,
    },
    /// Result n of the multi-result node that is its argument.
    Result(usize),
    /// The operand with dimension `0` of real size `args[1]` (an i32 scalar)
    /// within its bound: XLA pads and masks the rest. A constant size equal
    /// to the bound makes the dimension static again.
    SetDimensionSize(i64),
    /// A slice of these sizes at start indices `args[1..]` (i32 scalars),
    /// computed when the program runs.
    DynamicSlice(Vec<i64>),
    /// The operand with `args[1]` written over it at start indices
    /// `args[2..]` (i32 scalars, clamped as a dynamic slice's).
    DynamicUpdateSlice,
    /// `body` run `args[0]` times (an i32 scalar, known when the program
    /// runs) on the loop-carried values (the other args): its parameters are
    /// the trip's number (an i32 scalar, from 0) and the values, its outputs
    /// their next values. The node is the first value after the last trip,
    /// [`Op::Result`] nodes the others. A program's size then no longer grows
    /// with an algorithm's steps (LU's columns), and a count computed from
    /// the data can skip work (a failed Cholesky's first bad minor).
    Loop(std::sync::Arc<Graph>),
}

/// What a collective computes; each replica contributes its operand.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce(ReduceKind),
    /// The operands concatenated along dimension 0, in replica order.
    AllGather,
    /// The reduction's slice of dimension 0 that belongs to this replica.
    ReduceScatter(ReduceKind),
    /// Dimension 0 split in one slice per replica; slice j goes to replica j,
    /// which concatenates what it receives in replica order.
    AllToAll,
    /// Each (source, target) pair sends the source's operand to the target;
    /// a replica that no pair targets gets zeros.
    Permute(Vec<(i64, i64)>),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub op: Op,
    pub args: Vec<V>,
    pub ty: Ty,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub params: Vec<Ty>,
    pub outputs: Vec<V>,
    /// Per parameter (or none at all): the output its buffer is donated to.
    pub donors: Vec<Option<usize>>,
}

/// The broadcast of several shapes, with PyTorch's error message on mismatch.
pub fn broadcast_all(shapes: &[&[i64]]) -> crate::error::Result<Vec<i64>> {
    let n = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1; n];
    for s in shapes {
        for (i, &size) in s.iter().enumerate() {
            let d = n - s.len() + i;
            if out[d] == 1 {
                out[d] = size;
            } else if size != 1 && size != out[d] {
                return Err(crate::error::Error::runtime(format!(
                    "The size of tensor a ({}) must match the size of tensor b ({size}) at non-singleton dimension {d}",
                    out[d]
                )));
            }
        }
    }
    Ok(out)
}

impl Graph {
    pub fn ty(&self, v: V) -> &Ty {
        &self.nodes[v].ty
    }

    pub fn push(&mut self, op: Op, args: Vec<V>, ty: Ty) -> V {
        self.nodes.push(Node { op, args, ty });
        self.nodes.len() - 1
    }

    pub fn param(&mut self, ty: Ty) -> V {
        self.params.push(ty.clone());
        let n = self.params.len() - 1;
        self.push(Op::Param(n), vec![], ty)
    }

    /// A constant of `dtype` splat to `shape`.
    pub fn full(&mut self, value: f64, dtype: DType, shape: &[i64]) -> V {
        let bits = if dtype.has_float_values() { value.to_bits() as i64 } else { value as i64 };
        self.push(Op::Const(bits), vec![], Ty::new(dtype, shape))
    }

    /// The identity of `kind` (a reduction's start value) splat to `shape`.
    pub fn identity(&mut self, kind: ReduceKind, dtype: DType, shape: &[i64]) -> V {
        self.push(Op::Const(crate::ir::emit::reduce_init(kind, dtype)), vec![], Ty::new(dtype, shape))
    }

    /// A 1-D constant of `dtype` holding `values`.
    pub fn constant(&mut self, values: &[f64], dtype: DType) -> V {
        let bits =
            values.iter().map(|&v| if dtype.has_float_values() { v.to_bits() as i64 } else { v as i64 }).collect();
        self.push(Op::Dense(bits), vec![], Ty::new(dtype, &[values.len() as i64]))
    }

    pub fn scalar(&mut self, value: f64, dtype: DType) -> V {
        self.full(value, dtype, &[])
    }

    pub fn iota(&mut self, dtype: DType, shape: &[i64], dim: usize) -> V {
        self.push(Op::Iota(dim as i64), vec![], Ty::new(dtype, shape))
    }

    pub fn unary(&mut self, name: &'static str, a: V) -> V {
        let ty = self.ty(a).clone();
        self.push(Op::Elementwise(name), vec![a], ty)
    }

    /// Elementwise op on same-typed operands (broadcast them first).
    pub fn binary(&mut self, name: &'static str, a: V, b: V) -> V {
        debug_assert_eq!(self.ty(a), self.ty(b), "{name}");
        let ty = self.ty(a).clone();
        self.push(Op::Elementwise(name), vec![a, b], ty)
    }

    pub fn compare(&mut self, dir: &'static str, a: V, b: V) -> V {
        let shape = self.ty(a).shape.clone();
        self.push(Op::Compare(dir), vec![a, b], Ty::new(DType::Bool, &shape))
    }

    pub fn select(&mut self, pred: V, a: V, b: V) -> V {
        let ty = self.ty(a).clone();
        self.push(Op::Select, vec![pred, a, b], ty)
    }

    pub fn convert(&mut self, a: V, dtype: DType) -> V {
        if self.ty(a).dtype == dtype {
            return a;
        }
        if self.ty(a).dtype.is_complex() && !dtype.is_complex() {
            // PyTorch drops the imaginary part (XLA converts no complex to real).
            let re = self.part(a, false);
            return self.convert(re, dtype);
        }
        let shape = self.ty(a).shape.clone();
        self.push(Op::Convert, vec![a], Ty::new(dtype, &shape))
    }

    /// The real (or imaginary) part of a complex value.
    pub fn part(&mut self, a: V, imaginary: bool) -> V {
        let t = self.ty(a);
        let ty = Ty::new(t.dtype.to_real(), &t.shape);
        self.push(Op::Elementwise(if imaginary { "stablehlo.imag" } else { "stablehlo.real" }), vec![a], ty)
    }

    /// The magnitude of a complex value, in its parts' type (XLA's abs,
    /// which scales to avoid overflow as `std::abs` does).
    pub fn magnitude(&mut self, a: V) -> V {
        let t = self.ty(a);
        let ty = Ty::new(t.dtype.to_real(), &t.shape);
        self.push(Op::Elementwise("stablehlo.abs"), vec![a], ty)
    }

    /// The complex conjugate (a real value is its own).
    pub fn conj(&mut self, a: V) -> V {
        if !self.ty(a).dtype.is_complex() {
            return a;
        }
        let re = self.part(a, false);
        let im = self.part(a, true);
        let im = self.unary("stablehlo.negate", im);
        self.complex(re, im)
    }

    /// The complex value with parts `re` and `im` (same type).
    pub fn complex(&mut self, re: V, im: V) -> V {
        let t = self.ty(re);
        let ty = Ty::new(t.dtype.to_complex(), &t.shape);
        self.push(Op::Elementwise("stablehlo.complex"), vec![re, im], ty)
    }

    pub fn bitcast(&mut self, a: V, ty: Ty) -> V {
        self.push(Op::BitcastConvert, vec![a], ty)
    }

    pub fn reshape(&mut self, a: V, shape: &[i64]) -> V {
        if self.ty(a).shape == shape {
            return a;
        }
        let dtype = self.ty(a).dtype;
        self.push(Op::Reshape, vec![a], Ty::new(dtype, shape))
    }

    pub fn transpose(&mut self, a: V, perm: &[i64]) -> V {
        if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
            return a;
        }
        let t = self.ty(a);
        let shape: Vec<i64> = perm.iter().map(|&p| t.shape[p as usize]).collect();
        let dtype = t.dtype;
        self.push(Op::Transpose(perm.to_vec()), vec![a], Ty::new(dtype, &shape))
    }

    pub fn broadcast_in_dim(&mut self, a: V, shape: &[i64], dims: &[i64]) -> V {
        if self.ty(a).shape == shape {
            return a;
        }
        let dtype = self.ty(a).dtype;
        self.push(Op::BroadcastInDim(dims.to_vec()), vec![a], Ty::new(dtype, shape))
    }

    /// NumPy-style broadcast (align trailing dimensions).
    pub fn broadcast_to(&mut self, a: V, shape: &[i64]) -> V {
        let rank = self.ty(a).rank();
        let dims: Vec<i64> = (0..rank).map(|i| (shape.len() - rank + i) as i64).collect();
        self.broadcast_in_dim(a, shape, &dims)
    }

    pub fn slice(&mut self, a: V, start: &[i64], limit: &[i64], stride: &[i64]) -> V {
        let t = self.ty(a);
        if start.iter().all(|&s| s == 0) && limit == t.shape.as_slice() && stride.iter().all(|&s| s == 1) {
            return a;
        }
        let shape: Vec<i64> =
            (0..start.len()).map(|i| ((limit[i] - start[i]).max(0) + stride[i] - 1) / stride[i]).collect();
        let dtype = t.dtype;
        let op = Op::Slice { start: start.to_vec(), limit: limit.to_vec(), stride: stride.to_vec() };
        self.push(op, vec![a], Ty::new(dtype, &shape))
    }

    /// Slice of `a` along one dimension.
    pub fn slice_dim(&mut self, a: V, dim: usize, start: i64, limit: i64, stride: i64) -> V {
        let shape = self.ty(a).shape.clone();
        let mut s = vec![0; shape.len()];
        let mut l = shape.clone();
        let mut st = vec![1; shape.len()];
        s[dim] = start;
        l[dim] = limit;
        st[dim] = stride;
        self.slice(a, &s, &l, &st)
    }

    pub fn concatenate(&mut self, parts: &[V], dim: usize) -> V {
        if parts.len() == 1 {
            return parts[0];
        }
        let mut shape = self.ty(parts[0]).shape.clone();
        shape[dim] = parts.iter().map(|&p| self.ty(p).shape[dim]).sum();
        let dtype = self.ty(parts[0]).dtype;
        self.push(Op::Concatenate(dim as i64), parts.to_vec(), Ty::new(dtype, &shape))
    }

    pub fn pad(&mut self, a: V, value: V, low: &[i64], high: &[i64], interior: &[i64]) -> V {
        let t = self.ty(a);
        let shape: Vec<i64> =
            (0..t.rank()).map(|i| low[i] + high[i] + t.shape[i] + (t.shape[i] - 1).max(0) * interior[i]).collect();
        let dtype = t.dtype;
        let op = Op::Pad { low: low.to_vec(), high: high.to_vec(), interior: interior.to_vec() };
        self.push(op, vec![a, value], Ty::new(dtype, &shape))
    }

    pub fn reverse(&mut self, a: V, dims: &[i64]) -> V {
        let ty = self.ty(a).clone();
        self.push(Op::Reverse(dims.to_vec()), vec![a], ty)
    }

    /// Reduces `dims` away (they are removed from the shape).
    pub fn reduce(&mut self, kind: ReduceKind, a: V, dims: &[usize]) -> V {
        self.reduce_many(kind, &[a], dims)[0]
    }

    /// Reduces `dims` away from operands of one shape and dtype together:
    /// one loop over their elements with an accumulator each, where one
    /// `reduce` each is a loop each (XLA compiles and runs every loop apart).
    pub fn reduce_many(&mut self, kind: ReduceKind, operands: &[V], dims: &[usize]) -> Vec<V> {
        if dims.is_empty() {
            return operands.to_vec();
        }
        let t = self.ty(operands[0]);
        let shape: Vec<i64> = t.shape.iter().enumerate().filter(|(i, _)| !dims.contains(i)).map(|(_, &s)| s).collect();
        let ty = Ty::new(t.dtype, &shape);
        let dims = dims.iter().map(|&d| d as i64).collect();
        self.multi(Op::Reduce { kind, dims }, operands, &vec![ty; operands.len()])
    }

    /// i64 index of the max/min along `dim` (removed from the shape).
    pub fn arg_reduce(&mut self, a: V, dim: usize, max: bool) -> V {
        let mut shape = self.ty(a).shape.clone();
        shape.remove(dim);
        self.push(Op::ArgReduce { max, dim: dim as i64 }, vec![a], Ty::new(DType::I64, &shape))
    }

    /// Batched matmul: lhs [b.., m, k] · rhs [b.., k, n] -> [b.., m, n].
    /// One row times a transposed matrix (`nn.Linear` on one token) is the
    /// matrix times the row, the same sums: XLA:CPU copied the transpose
    /// and looped over scalar reductions, ~3x slower than the matrix-vector
    /// dot it hands to its kernel (bench/RESULTS.md, 2026-11-27).
    pub fn matmul(&mut self, lhs: V, rhs: V, precision: Precision) -> V {
        let nb = self.ty(lhs).rank() - 2;
        if nb == 0 && self.ty(lhs).shape[0] == 1 {
            if let Op::Transpose(_) = self.nodes[rhs].op {
                let (matrix, n) = (self.nodes[rhs].args[0], self.ty(rhs).shape[1]);
                let column = self.dot_general(matrix, lhs, (&[], &[]), (&[1], &[1]), precision);
                return self.reshape(column, &[1, n]);
            }
        }
        let batch: Vec<i64> = (0..nb as i64).collect();
        self.dot_general(lhs, rhs, (&batch, &batch), (&[nb as i64 + 1], &[nb as i64]), precision)
    }

    /// XLA's dot_general: the result's dimensions are the batch ones, then
    /// lhs's free ones, then rhs's free ones.
    pub fn dot_general(
        &mut self,
        lhs: V,
        rhs: V,
        batch: (&[i64], &[i64]),
        contract: (&[i64], &[i64]),
        precision: Precision,
    ) -> V {
        let (l, r) = (self.ty(lhs).clone(), self.ty(rhs).clone());
        let free = |t: &Ty, batch: &[i64], contract: &[i64]| -> Vec<i64> {
            (0..t.rank() as i64)
                .filter(|d| !batch.contains(d) && !contract.contains(d))
                .map(|d| t.shape[d as usize])
                .collect()
        };
        let mut shape: Vec<i64> = batch.0.iter().map(|&d| l.shape[d as usize]).collect();
        shape.extend(free(&l, batch.0, contract.0));
        shape.extend(free(&r, batch.1, contract.1));
        let op = Op::DotGeneral {
            lhs_batch: batch.0.to_vec(),
            rhs_batch: batch.1.to_vec(),
            lhs_contract: contract.0.to_vec(),
            rhs_contract: contract.1.to_vec(),
            precision: precision.of(l.dtype),
        };
        self.push(op, vec![lhs, rhs], Ty::new(l.dtype, &shape))
    }

    /// Whether the graph has a float32 or complex64 dot or convolution: its
    /// program depends on PyTorch's float32 matmul setting.
    pub fn uses_f32_precision(&self) -> bool {
        self.nodes.iter().any(|n| match &n.op {
            Op::DotGeneral { .. } | Op::Convolution(..) => follows_precision(self.ty(n.args[0]).dtype),
            Op::Loop(body) => body.uses_f32_precision(),
            _ => false,
        })
    }

    /// Floating-point operations of its products (dots and convolutions,
    /// two per multiply-add): where they dominate, what sets the device time.
    pub fn product_flops(&self) -> u64 {
        let flops = |n: &Node| match &n.op {
            Op::DotGeneral { lhs_contract, .. } => {
                let lhs = self.ty(n.args[0]);
                2 * n.ty.numel() * lhs_contract.iter().map(|&d| lhs.shape[d as usize]).product::<i64>()
            }
            // Each output element sums a kernel's window over its input features.
            Op::Convolution(c, _) => {
                let kernel = self.ty(n.args[1]);
                2 * n.ty.numel() * (kernel.numel() / kernel.shape[c.rhs[0] as usize].max(1))
            }
            // A count known only when the program runs counts once.
            Op::Loop(body) => {
                let trips = if let Op::Const(trips) = self.nodes[n.args[0]].op { trips } else { 1 };
                trips * body.product_flops() as i64
            }
            _ => 0,
        };
        self.nodes.iter().map(|n| flops(n).max(0) as u64).sum()
    }

    /// Convolution of `lhs` (input) with `rhs` (kernel), same dtype.
    pub fn convolution(&mut self, lhs: V, rhs: V, c: Conv, precision: Precision) -> V {
        let (l, r) = (self.ty(lhs).clone(), self.ty(rhs).clone());
        let mut shape = vec![0; l.rank()];
        shape[c.out[0] as usize] = l.shape[c.lhs[0] as usize] / c.batch_groups;
        shape[c.out[1] as usize] = r.shape[c.rhs[0] as usize];
        for i in 0..c.strides.len() {
            let (lo, hi) = c.padding[i];
            let input = dilated(l.shape[c.lhs[i + 2] as usize], c.lhs_dilation[i]) + lo + hi;
            let window = dilated(r.shape[c.rhs[i + 2] as usize], c.rhs_dilation[i]);
            shape[c.out[i + 2] as usize] = if input < window { 0 } else { (input - window) / c.strides[i] + 1 };
        }
        self.push(Op::Convolution(c, precision.of(l.dtype)), vec![lhs, rhs], Ty::new(l.dtype, &shape))
    }

    /// Slices of `a` along `axis` picked by integer `indices` (any shape):
    /// result shape is a.shape[..axis] + indices.shape + a.shape[axis+1..].
    pub fn take(&mut self, a: V, indices: V, axis: usize) -> V {
        let t = self.ty(a);
        let mut shape = t.shape[..axis].to_vec();
        shape.extend(&self.ty(indices).shape);
        shape.extend(&t.shape[axis + 1..]);
        let dtype = t.dtype;
        if t.shape[axis] == 0 {
            // Nothing to read (XLA rejects a gather's slice of an empty
            // dimension): the result is empty, or every index out of range,
            // which the caller's checks report.
            return self.full(0.0, dtype, &shape);
        }
        self.push(Op::Take { axis: axis as i64 }, vec![a, indices], Ty::new(dtype, &shape))
    }

    /// The inverse of `take`: scatters `updates` (shape as `take` would
    /// produce) into `a` at `indices` along `axis`, combining with `combine`
    /// or overwriting. float16/bfloat16 sums and products accumulate in
    /// float32 and round once: XLA would round after every step, in an
    /// order of its choosing.
    pub fn put(&mut self, a: V, indices: V, updates: V, axis: usize, combine: Option<ReduceKind>) -> V {
        let ty = self.ty(a).clone();
        if ty.shape[axis] == 0 {
            return a; // nowhere to write, as in `take`
        }
        let ct = opmath(ty.dtype);
        if ct != ty.dtype && matches!(combine, Some(ReduceKind::Sum | ReduceKind::Prod)) {
            let (a, updates) = (self.convert(a, ct), self.convert(updates, ct));
            let r = self.put(a, indices, updates, axis, combine);
            return self.convert(r, ty.dtype);
        }
        self.push(Op::Put { axis: axis as i64, combine }, vec![a, indices, updates], ty)
    }

    /// `operands` sorted along `dim` by the first `keys` of them (see
    /// [`Op::Sort`]); one node per operand.
    pub fn sort(&mut self, operands: &[V], dim: usize, descending: bool, keys: usize) -> Vec<V> {
        (0..operands.len())
            .map(|result| {
                let ty = self.ty(operands[result]).clone();
                self.push(Op::Sort { dim: dim as i64, descending, keys, result }, operands.to_vec(), ty)
            })
            .collect()
    }

    pub fn cholesky(&mut self, a: V, lower: bool) -> V {
        let ty = self.ty(a).clone();
        self.push(Op::Cholesky { lower }, vec![a], ty)
    }

    pub fn triangular_solve(&mut self, a: V, b: V, left: bool, lower: bool, unit_diagonal: bool, transpose: bool) -> V {
        let ty = self.ty(b).clone();
        self.push(Op::TriangularSolve { left, lower, unit_diagonal, transpose }, vec![a, b], ty)
    }

    /// A Fourier transform of `kind` along the last dimension, `n` points
    /// (RFFT: real in, n / 2 + 1 complex out; IRFFT: n real out).
    pub fn fft(&mut self, a: V, kind: &'static str, n: i64) -> V {
        let t = self.ty(a).clone();
        let (dtype, last) = match kind {
            "RFFT" => (t.dtype.to_complex(), n / 2 + 1),
            "IRFFT" => (t.dtype.to_real(), n),
            _ => (t.dtype, n),
        };
        let mut shape = t.shape.clone();
        *shape.last_mut().unwrap() = last;
        self.push(Op::Fft { kind, length: vec![n] }, vec![a], Ty::new(dtype, &shape))
    }

    /// The results of custom call `target` (see [`Op::CustomCall`]).
    pub fn custom_call(&mut self, target: &'static str, config: &str, args: &[V], results: &[Ty]) -> Vec<V> {
        let op = Op::CustomCall { target, config: config.into(), results: results.to_vec() };
        self.multi(op, args, results)
    }

    /// The nodes of a multi-result op: the op itself (its first result), then
    /// an [`Op::Result`] per further result.
    fn multi(&mut self, op: Op, args: &[V], results: &[Ty]) -> Vec<V> {
        let first = self.push(op, args.to_vec(), results[0].clone());
        let rest = (1..results.len()).map(|n| self.push(Op::Result(n), vec![first], results[n].clone()));
        std::iter::once(first).chain(rest.collect::<Vec<_>>()).collect()
    }

    /// The results of a call of `kernel` (see [`Op::Call`]).
    pub fn call(&mut self, kernel: &std::sync::Arc<crate::ir::kernel::Kernel>, args: &[V]) -> Vec<V> {
        self.multi(Op::Call(kernel.clone()), args, &kernel.outputs)
    }

    /// A slice of `sizes` of `a` starting at `starts` (i32 scalars, one per
    /// dimension; XLA clamps them so that the slice stays inside).
    pub fn dynamic_slice(&mut self, a: V, starts: &[V], sizes: &[i64]) -> V {
        let dtype = self.ty(a).dtype;
        let args = std::iter::once(a).chain(starts.iter().copied()).collect();
        self.push(Op::DynamicSlice(sizes.to_vec()), args, Ty::new(dtype, sizes))
    }

    /// `a` with `update` written at `starts` (i32 scalars, one per dimension).
    pub fn dynamic_update_slice(&mut self, a: V, update: V, starts: &[V]) -> V {
        let ty = self.ty(a).clone();
        let args = [a, update].into_iter().chain(starts.iter().copied()).collect();
        self.push(Op::DynamicUpdateSlice, args, ty)
    }

    /// The values `init` after `trips` (an i32 scalar) runs of `body` (see
    /// [`Op::Loop`]), which gets a graph of its own, the trip's number and
    /// the values.
    pub fn counted_loop(&mut self, trips: V, init: &[V], body: impl FnOnce(&mut Graph, V, &[V]) -> Vec<V>) -> Vec<V> {
        debug_assert_eq!(*self.ty(trips), Ty::new(DType::I32, &[]));
        let types: Vec<Ty> = init.iter().map(|&v| self.ty(v).clone()).collect();
        let mut g = Graph::default();
        let trip = g.param(Ty::new(DType::I32, &[]));
        let values: Vec<V> = types.iter().map(|t| g.param(t.clone())).collect();
        g.outputs = body(&mut g, trip, &values);
        debug_assert!(g.outputs.iter().map(|&o| g.ty(o)).eq(&types), "a loop's body changes its values' types");
        let args: Vec<V> = std::iter::once(trips).chain(init.iter().copied()).collect();
        self.multi(Op::Loop(std::sync::Arc::new(g)), &args, &types)
    }

    /// Uniformly random bits of `dtype` (u32 or u64 shaped) from a u64[2] key.
    pub fn rng_bits(&mut self, key: V, ty: Ty) -> V {
        self.push(Op::RngBits, vec![key], ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x @ w.t()`'s dot, for `rows` rows of 8 and `w` [16, 8].
    fn linear(rows: i64) -> (Graph, V, V, V) {
        let mut g = Graph::default();
        let (x, w) = (g.param(Ty::new(DType::F32, &[rows, 8])), g.param(Ty::new(DType::F32, &[16, 8])));
        let wt = g.transpose(w, &[1, 0]);
        let y = g.matmul(x, wt, Precision::Highest);
        (g, x, w, y)
    }

    fn dot_of(g: &Graph, v: V) -> &Node {
        let v = if matches!(g.nodes[v].op, Op::Reshape) { g.nodes[v].args[0] } else { v };
        assert!(matches!(g.nodes[v].op, Op::DotGeneral { .. }), "{:?}", g.nodes[v].op);
        &g.nodes[v]
    }

    #[test]
    fn one_row_times_a_transposed_matrix_is_a_matrix_vector_dot() {
        let (g, x, w, y) = linear(1);
        assert_eq!(g.ty(y).shape, [1, 16]);
        let dot = dot_of(&g, y);
        assert_eq!(dot.args, [w, x]);
        assert!(matches!(&dot.op, Op::DotGeneral { lhs_contract, rhs_contract, .. }
            if *lhs_contract == [1] && *rhs_contract == [1]));
        // Several rows keep the transpose, which XLA:CPU runs as fast.
        let (g, x, _, y) = linear(4);
        assert_eq!(g.ty(y).shape, [4, 16]);
        assert_eq!(dot_of(&g, y).args[0], x);
    }

    #[test]
    fn product_flops_count_two_per_multiply_add() {
        let (g, ..) = linear(4);
        assert_eq!(g.product_flops(), 2 * 4 * 16 * 8);
        // A 3x3 convolution of 2 input features into 5, over a 6x6 output map.
        let mut g = Graph::default();
        let (x, k) = (g.param(Ty::new(DType::F32, &[1, 2, 8, 8])), g.param(Ty::new(DType::F32, &[5, 2, 3, 3])));
        let ones = vec![1; 2];
        let c = Conv {
            lhs: vec![0, 1, 2, 3],
            rhs: vec![0, 1, 2, 3],
            out: vec![0, 1, 2, 3],
            strides: ones.clone(),
            padding: vec![(0, 0); 2],
            lhs_dilation: ones.clone(),
            rhs_dilation: ones,
            feature_groups: 1,
            batch_groups: 1,
        };
        let y = g.convolution(x, k, c, Precision::Highest);
        assert_eq!(g.ty(y).shape, [1, 5, 6, 6]);
        let elementwise = g.binary("stablehlo.add", y, y);
        g.outputs = vec![elementwise];
        assert_eq!(g.product_flops(), 2 * (5 * 6 * 6) * (2 * 3 * 3));
    }
}
