//! ATen operators to IR: the op table and the context lowerings are written
//! against, and the arguments they read ([`args`]). This layer uses only the
//! IR: it never reaches a storage, the runtime or a mode (it sees a tensor's
//! storage through [`args::Backing`]).
//!
//! Only functional operators are lowered. The adapter derives the in-place
//! (`add_`) and `out=` (`add.out`) overloads from the schema: they reach the
//! same lowering by base name, and their result is written into the mutated
//! argument afterwards. Arguments are found by their schema names, which are
//! shared by an operator's overloads.
//!
//! A lowering returns the schema's results in order; an output_mask's
//! unrequested gradient is [`UNDEFINED`]. An operator that also mutates other
//! arguments (`Tensor(a!) running_mean`, or an argument listed in its entry's
//! `writes` because the schema does not mark it) returns their next values
//! after its results, one per defined written argument in schema order
//! ([`Cx::writes`]); the adapter writes them back as it does out= results.
use std::sync::atomic::AtomicBool;
use std::sync::RwLock;

use crate::error::{Error, Kind, Result};
use crate::ir::dtype::{result_type, DType, Priority};
use crate::ir::{view, Graph, Precision, ReduceKind, Ty, V};
use args::{Arg, Tensor};
pub use layout::Layout;

pub mod args;
mod attention;
mod bag;
mod bessel;
mod conv;
mod ctc;
mod distance;
mod elementwise;
mod factor;
mod factory;
mod fft;
mod fold;
mod grid;
mod index;
mod kernel;
mod layout;
mod linalg;
mod loss;
mod lstsq;
mod margin;
mod matrix_exp;
mod nms;
mod nn;
mod norm;
mod optim;
mod pad;
mod pathwise;
mod pool;
mod random;
mod reduce;
mod resize;
mod rnn;
mod roi;
pub mod rules;
mod shape;
mod sort;
mod svd;
mod unpool;

pub type Lowering = fn(&mut Cx) -> Result<Vec<V>>;

/// One table row: the base name of an ATen operator and its lowering.
pub struct Entry {
    pub name: &'static str,
    pub lower: Lowering,
    /// `Scalar`/`float` arguments this lowering needs as compile-time
    /// constants (shape-determining ones); all others are runtime operands.
    pub consts: &'static [&'static str],
    /// `int[]` arguments that are data, not shapes (CTC's lengths): runtime
    /// operands (an i64 vector, [`Cx::data_list`]), keyed by their length
    /// only, so that new values reuse the program.
    pub data: &'static [&'static str],
    /// Arguments the operator mutates though its schema does not mark them.
    pub writes: &'static [&'static str],
    /// For operators whose result shapes depend on values (`nonzero`): a
    /// lowering of the sizes they need, one i64 vector, run and read before
    /// `lower` (which finds them in [`Cx::sizes`]); it may return nothing
    /// when a call needs none.
    pub measure: Option<Lowering>,
    /// Whether the lowering handles complex tensors; calls of others that
    /// read one run on the CPU ([`OpDef::check_complex`]).
    pub complex: bool,
    /// How its results are laid out in memory (the elementwise families'
    /// tables give theirs: [`result_layout`]).
    pub layout: Layout,
    /// CPU's rules on the values of its runtime number arguments.
    pub rules: Option<rules::Rules>,
}

pub const fn op(name: &'static str, lower: Lowering) -> Entry {
    Entry {
        name,
        lower,
        consts: &[],
        data: &[],
        writes: &[],
        measure: None,
        complex: false,
        layout: Layout::Contiguous,
        rules: None,
    }
}

impl Entry {
    /// The entry with PyTorch's layout rule for its results.
    pub const fn laid_out(self, layout: Layout) -> Entry {
        Entry { layout, ..self }
    }
    /// The entry, whose lowering handles complex tensors too.
    pub const fn takes_complex(self) -> Entry {
        Entry { complex: true, ..self }
    }
    /// The entry with CPU's rules on its runtime numbers' values.
    pub const fn ruled(self, rules: rules::Rules) -> Entry {
        Entry { rules: Some(rules), ..self }
    }
    /// The entry, whose `int[]` arguments `data` are runtime operands.
    pub const fn with_data(self, data: &'static [&'static str]) -> Entry {
        Entry { data, ..self }
    }
}

pub const fn op_consts(name: &'static str, lower: Lowering, consts: &'static [&'static str]) -> Entry {
    Entry { consts, ..op(name, lower) }
}

pub const fn op_writes(name: &'static str, lower: Lowering, writes: &'static [&'static str]) -> Entry {
    Entry { writes, ..op(name, lower) }
}

pub const fn op_measured(name: &'static str, lower: Lowering, measure: Lowering) -> Entry {
    Entry { measure: Some(measure), ..op(name, lower) }
}

/// An entry whose lowering handles complex tensors too.
pub const fn op_complex(name: &'static str, lower: Lowering) -> Entry {
    op(name, lower).takes_complex()
}

/// A lowering's result that is an undefined tensor.
pub const UNDEFINED: V = V::MAX;

fn table() -> impl Iterator<Item = &'static Entry> {
    [
        attention::ENTRIES,
        bag::ENTRIES,
        conv::ENTRIES,
        ctc::ENTRIES,
        distance::ENTRIES,
        elementwise::ENTRIES,
        factor::ENTRIES,
        factory::ENTRIES,
        fft::ENTRIES,
        fold::ENTRIES,
        grid::ENTRIES,
        index::ENTRIES,
        kernel::ENTRIES,
        linalg::ENTRIES,
        loss::ENTRIES,
        lstsq::ENTRIES,
        margin::ENTRIES,
        matrix_exp::ENTRIES,
        nms::ENTRIES,
        nn::ACTIVATIONS,
        nn::ENTRIES,
        norm::ENTRIES,
        optim::ENTRIES,
        pad::ENTRIES,
        pathwise::ENTRIES,
        pool::ENTRIES,
        random::ENTRIES,
        reduce::ENTRIES,
        resize::ENTRIES,
        rnn::ENTRIES,
        roi::ENTRIES,
        shape::ENTRIES,
        sort::ENTRIES,
        svd::ENTRIES,
        unpool::ENTRIES,
        COPY_ENTRIES,
    ]
    .into_iter()
    .flatten()
}

/// Base names of the lowered ATen operators (no namespace, no trailing `_`),
/// for the coverage report.
pub fn lowered_names() -> Vec<&'static str> {
    table().map(|e| e.name).filter(|n| !n.contains("::")).collect()
}

/// Whether the operator's lowering checks what PyTorch's meta function
/// checks (shapes, ranks, broadcasting, type promotion, the operator's own
/// argument rules): the families whose lowerings raise every error
/// PyTorch's OpInfo error inputs meet. The adapter sends their structured
/// functional and in-place forms to the core directly, not through the meta
/// function and an out= call. (Scatters and pools do not yet: some of their
/// argument checks live only in their meta functions.) The products' and
/// reductions' in-place forms (`addmm_`, `cumsum_`) keep it too: their meta
/// function's "Bad in-place call" is the message where `self` would change
/// shape or dtype, not TensorIterator's that the adapter gives.
pub fn checks_meta(op: &OpDef) -> bool {
    op.within(&[elementwise::ENTRIES, nn::ACTIVATIONS, nn::ENTRIES, shape::ENTRIES])
        || (op.within(&[linalg::ENTRIES, reduce::ENTRIES]) && !op.inplace)
}

/// The strides PyTorch gives an operator's result of `shape`: by its entry's
/// [`Layout`], TensorIterator's for the elementwise families; None where
/// contiguous.
pub fn result_layout(op: &OpDef, args: &[Arg], shape: &[i64]) -> Option<Vec<i64>> {
    let rule = if op.within(&[elementwise::ENTRIES, nn::ACTIVATIONS]) { Layout::Elementwise } else { op.entry.layout };
    if matches!(rule, Layout::Contiguous) {
        return None;
    }
    let read = |name: &str| match rule {
        Layout::Contiguous => false,
        Layout::Suggested(names) => names.contains(&name),
        Layout::Elementwise | Layout::Agreed => true,
    };
    let operands: Vec<view::View> = (args.iter().zip(&op.args))
        .filter(|(_, def)| !def.is_out && read(&def.name))
        .flat_map(|(a, _)| match a {
            Arg::Tensor(t) => vec![t.view()],
            Arg::Tensors(ts) => ts.iter().flatten().map(Tensor::view).collect(),
            _ => vec![],
        })
        .collect();
    layout::rule_strides(rule, shape, &operands)
}

pub struct ArgDef {
    pub name: String,
    pub ty: String,
    pub is_out: bool,
    /// Mutated, but neither out= nor an in-place self.
    pub is_written: bool,
}

/// A registered operator overload.
pub struct OpDef {
    pub id: i32,
    /// `aten::add.out`
    pub name: String,
    pub entry: &'static Entry,
    pub args: Vec<ArgDef>,
    /// An in-place form (`add_`): its first argument is written.
    pub inplace: bool,
    /// Set once a lowering of this overload built a float32 dot or
    /// convolution: its calls' plans then depend on the matmul setting.
    pub follows_precision: AtomicBool,
}

impl OpDef {
    /// Whether its entry is one of these families' rows.
    fn within(&self, families: &[&[Entry]]) -> bool {
        families.iter().any(|f| f.iter().any(|e| std::ptr::eq(e, self.entry)))
    }

    /// A call that reads a complex tensor its lowering does not handle runs
    /// on the CPU (counted), before the lowering checks anything: its checks
    /// and messages are written for real dtypes. (A complex out= is the
    /// lowering's to convert into.)
    pub fn check_complex(&self, args: &[Arg]) -> Result<()> {
        self.check_complex_numbers(args)?;
        if self.entry.complex {
            return Ok(());
        }
        let complex = |t: &Tensor| t.dtype.is_complex();
        let mut read = args.iter().zip(&self.args).filter(|(_, d)| !d.is_out).map(|(a, _)| a);
        let any = read.any(|a| match a {
            Arg::Tensor(t) => complex(t),
            Arg::Tensors(ts) => ts.iter().flatten().any(complex),
            _ => false,
        });
        if any {
            return Err(Error::fallback(format!("torchtpu: {} has no complex lowering", self.name)));
        }
        Ok(())
    }

    /// A complex number argument stays on the device only as a runtime
    /// operand of a complex entry whose first tensor is complex (a fill of
    /// a complex tensor, a complex `alpha`): elsewhere CPU's conversion of
    /// it (its error for a real tensor, a constant's use) decides (counted).
    fn check_complex_numbers(&self, args: &[Arg]) -> Result<()> {
        let numbers: Vec<usize> = (0..args.len()).filter(|&i| matches!(args[i], Arg::Complex(..))).collect();
        if numbers.is_empty() {
            return Ok(());
        }
        let first_tensor_complex = args.iter().find_map(|a| match a {
            Arg::Tensor(t) => Some(t.dtype.is_complex()),
            _ => None,
        });
        let kept = self.entry.complex && first_tensor_complex == Some(true);
        if !kept || !numbers.iter().all(|&i| self.is_runtime(i)) {
            return Err(Error::fallback(format!("torchtpu: {} takes no complex number here", self.name)));
        }
        Ok(())
    }

    /// Whether argument `i` is a runtime operand (its value is not part of
    /// the compiled program).
    pub fn is_runtime(&self, i: usize) -> bool {
        let a = &self.args[i];
        let number = matches!(a.ty.as_str(), "Scalar" | "Scalar?" | "float" | "float?");
        (number && !self.entry.consts.contains(&a.name.as_str())) || self.entry.data.contains(&a.name.as_str())
    }
}

static OPS: RwLock<Vec<&'static OpDef>> = RwLock::new(Vec::new());

/// Registers an overload; None when nothing lowers it (CPU fallback).
pub fn register(name: &str, overload: &str, args: Vec<ArgDef>, inplace: bool) -> Option<i32> {
    // aten operators by base name; torchtpu's own (`torchtpu::kernel`) and
    // torchvision's by full name.
    let full_name = name.starts_with("torchtpu::") || name.starts_with("torchvision::");
    let base = name.strip_prefix("aten::").or(full_name.then_some(name))?;
    let base = if inplace { base.strip_suffix('_').unwrap_or(base) } else { base };
    let entry = table().find(|e| e.name == base)?;
    let mut args = args;
    for a in args.iter_mut().filter(|a| entry.writes.contains(&a.name.as_str())) {
        a.is_written = true;
    }
    let mut ops = OPS.write().unwrap();
    let id = ops.len() as i32;
    let full = if overload.is_empty() { name.to_string() } else { format!("{name}.{overload}") };
    let follows_precision = AtomicBool::new(false);
    ops.push(Box::leak(Box::new(OpDef { id, name: full, entry, args, inplace, follows_precision })));
    Some(id)
}

pub fn get(id: i32) -> Result<&'static OpDef> {
    OPS.read().unwrap().get(id as usize).copied().ok_or_else(|| Error::runtime(format!("unknown op id {id}")))
}

/// Internal operators of the runtime itself (copies between views).
pub static COPY_ENTRIES: &[Entry] =
    &[op_complex("torchtpu::copy", copy_into), op_complex("torchtpu::contiguous", contiguous)];

/// Writes `src` (converted and broadcast) into the view `dst`; the result is
/// the next value of dst's storage.
fn copy_into(cx: &mut Cx) -> Result<Vec<V>> {
    let dst = cx.meta("dst")?;
    let src = cx.tensor("src")?;
    let shape = crate::ir::broadcast_all(&[dst.sizes, &cx.g.ty(src).shape])?;
    if shape != dst.sizes {
        return Err(Error::runtime(format!(
            "output with shape {:?} doesn't match the broadcast shape {shape:?}",
            dst.sizes
        )));
    }
    let from = cx.g.ty(src).dtype;
    if from != dst.dtype && (from.is_storage_only() || dst.dtype.is_storage_only()) {
        return Err(Error::runtime(format!(
            "torchtpu: {} to {} converts on the CPU; this copy should not reach the core",
            from.torch_name(),
            dst.dtype.torch_name()
        )));
    }
    let src = cx.g.convert(src, dst.dtype);
    let src = cx.g.broadcast_to(src, dst.sizes);
    Ok(vec![cx.write_view("dst", src)?])
}

fn contiguous(cx: &mut Cx) -> Result<Vec<V>> {
    Ok(vec![cx.tensor("src")?])
}

pub fn internal(name: &str, id: i32) -> OpDef {
    let arg = |n: &str| ArgDef { name: n.into(), ty: "Tensor".into(), is_out: false, is_written: false };
    let entry = COPY_ENTRIES.iter().find(|e| e.name == name).expect("internal op");
    OpDef {
        id,
        name: name.into(),
        entry,
        args: vec![arg("src"), arg("dst")],
        inplace: false,
        follows_precision: AtomicBool::new(false),
    }
}

/// Where a compiled program's runtime input comes from.
#[derive(Clone, Debug)]
pub enum Input {
    /// The value of a tensor argument's storage (`item` indexes tensor lists).
    Storage { arg: usize, item: usize },
    /// A CPU tensor's value (0-dim ones: numbers; or index tensors).
    Host { arg: usize, item: usize },
    /// A `Scalar`/`float` argument, carried as `dtype` (i64, f64 or bool).
    Scalar { arg: usize, dtype: DType },
    /// An `int[]` argument that is data ([`Entry::data`]), as an i64 vector.
    Ints { arg: usize },
    /// A u64[2] random key: drawn from the `Generator?` argument, or from
    /// the default generator when `arg` is None.
    Seed { arg: Option<usize> },
    /// A buffer the plan holds (a compiled graph's constant tensors).
    Constant(usize),
}

/// A data-dependent error: see [`Cx::check`].
pub struct Check {
    pub flag: V,
    pub value: Option<V>,
    pub kind: Kind,
    pub message: String,
}

/// A value taking part in type promotion.
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    pub v: V,
    pub dtype: DType,
    pub priority: Priority,
}

/// The lowering context of one operator call.
pub struct Cx<'a> {
    pub g: Graph,
    pub op: &'a OpDef,
    args: &'a [Arg<'a>],
    pub inputs: Vec<Input>,
    pub device: usize,
    /// Errors raised after execution from flags the program computes.
    pub checks: Vec<Check>,
    /// The values the entry's `measure` computed for this call.
    pub sizes: Vec<i64>,
    /// What this call's float32 dots and convolutions carry: PyTorch's
    /// float32 matmul setting when the call was made.
    pub precision: Precision,
    /// The storages read so far (by address) and their values in the graph.
    storages: Vec<(*const (), V)>,
}

impl<'a> Cx<'a> {
    pub fn new(op: &'a OpDef, args: &'a [Arg<'a>], device: usize, sizes: Vec<i64>, precision: Precision) -> Cx<'a> {
        Cx {
            g: Graph::default(),
            op,
            args,
            inputs: Vec::new(),
            device,
            checks: Vec::new(),
            sizes,
            precision,
            storages: Vec::new(),
        }
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.op
            .args
            .iter()
            .position(|a| a.name == name)
            .ok_or_else(|| Error::runtime(format!("torchtpu: {} has no argument '{name}'", self.op.name)))
    }

    pub fn has(&self, name: &str) -> bool {
        self.index(name).is_ok()
    }

    pub fn arg(&self, name: &str) -> Result<&'a Arg<'a>> {
        Ok(&self.args[self.index(name)?])
    }

    pub fn is_none(&self, name: &str) -> bool {
        self.arg(name).map_or(true, |a| matches!(a, Arg::None))
    }

    /// Whether this overload mutates tensor argument `name` and it is
    /// defined: the lowering then returns its next value (see the module's
    /// comment).
    pub fn writes(&self, name: &str) -> bool {
        self.index(name).is_ok_and(|i| self.op.args[i].is_written) && !self.is_none(name)
    }

    fn bad(&self, name: &str, what: &str) -> Error {
        Error::runtime(format!("torchtpu: {}: argument '{name}' is not {what}", self.op.name))
    }

    /// Metadata of a tensor argument, without reading it.
    pub fn meta(&self, name: &str) -> Result<Tensor<'a>> {
        match self.arg(name)? {
            Arg::Tensor(t) => Ok(*t),
            _ => Err(self.bad(name, "a tensor")),
        }
    }

    pub fn int(&self, name: &str) -> Result<i64> {
        match self.arg(name)? {
            Arg::Int(i) => Ok(*i),
            Arg::Bool(b) => Ok(*b as i64),
            _ => Err(self.bad(name, "an int")),
        }
    }

    pub fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        if self.is_none(name) {
            Ok(None)
        } else {
            self.int(name).map(Some)
        }
    }

    pub fn bool(&self, name: &str) -> Result<bool> {
        Ok(self.int(name)? != 0)
    }

    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>> {
        if self.is_none(name) {
            Ok(None)
        } else {
            self.bool(name).map(Some)
        }
    }

    /// An int list (a single int reads as a one-element list).
    pub fn ints(&self, name: &str) -> Result<Vec<i64>> {
        if self.op.is_runtime(self.index(name)?) {
            return Err(Error::runtime(format!("torchtpu: {}: '{name}' is a runtime operand", self.op.name)));
        }
        match self.arg(name)? {
            Arg::Ints(v) => Ok(v.to_vec()),
            Arg::Int(i) => Ok(vec![*i]),
            _ => Err(self.bad(name, "an int list")),
        }
    }

    pub fn bools(&self, name: &str) -> Result<Vec<bool>> {
        match self.arg(name)? {
            Arg::Bools(v) => Ok(v.clone()),
            _ => Err(self.bad(name, "a bool list")),
        }
    }

    pub fn opt_ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        if self.is_none(name) {
            Ok(None)
        } else {
            self.ints(name).map(Some)
        }
    }

    pub fn str(&self, name: &str) -> Result<&'a str> {
        match self.arg(name)? {
            Arg::Str(s) => Ok(s),
            _ => Err(self.bad(name, "a string")),
        }
    }

    /// A `ScalarType?` argument.
    pub fn dtype(&self, name: &str) -> Result<Option<DType>> {
        if !self.has(name) || self.is_none(name) {
            return Ok(None);
        }
        DType::from_c10(self.int(name)? as i32).map(Some)
    }

    /// A `Scalar` argument declared in the entry's `consts`, as f64.
    pub fn const_f64(&self, name: &str) -> Result<f64> {
        let i = self.index(name)?;
        if self.op.is_runtime(i) {
            return Err(Error::runtime(format!("torchtpu: {}: '{name}' is a runtime operand", self.op.name)));
        }
        match &self.args[i] {
            Arg::Int(v) => Ok(*v as f64),
            Arg::Float(f) => Ok(*f),
            Arg::Bool(b) => Ok(*b as i64 as f64),
            _ => Err(self.bad(name, "a number")),
        }
    }

    fn param(&mut self, ty: Ty, input: Input) -> V {
        self.inputs.push(input);
        self.g.param(ty)
    }

    /// The value of a tensor's storage as a 1-D array of `dtype`: a program
    /// input, or zeros when it was never written.
    fn storage_flat(&mut self, arg: usize, item: usize, t: &Tensor) -> Result<V> {
        let Some(storage) = t.storage else {
            return Ok(self.g.full(0.0, t.dtype, &[0]));
        };
        let n = storage.nbytes() / t.dtype.size() as i64;
        let key = storage as *const dyn args::Backing as *const ();
        let v = match self.storages.iter().find(|(s, _)| *s == key) {
            Some(&(_, v)) => v,
            None => {
                let v = match storage.value_ty() {
                    Some(ty) => self.param(ty, Input::Storage { arg, item }),
                    None => self.g.full(0.0, t.dtype, &[n]),
                };
                self.storages.push((key, v));
                v
            }
        };
        Ok(view::flat(&mut self.g, v, t.dtype))
    }

    fn read(&mut self, arg: usize, item: usize, t: &Tensor) -> Result<V> {
        match t.device {
            None if t.sizes.is_empty() => Ok(self.param(t.ty(), Input::Host { arg, item })),
            None => Err(Error::runtime(format!(
                "Expected all tensors to be on the same device, but found at least two devices, tpu:{} and cpu!",
                self.device
            ))),
            Some(_) if t.numel() == 0 => Ok(self.g.full(0.0, t.dtype, t.sizes)),
            Some(_) => {
                let base = self.storage_flat(arg, item, t)?;
                Ok(view::read(&mut self.g, base, &t.view()))
            }
        }
    }

    /// Reads a tensor argument into the graph.
    pub fn tensor(&mut self, name: &str) -> Result<V> {
        let i = self.index(name)?;
        let t = self.meta(name)?;
        self.read(i, 0, &t)
    }

    pub fn opt_tensor(&mut self, name: &str) -> Result<Option<V>> {
        if self.is_none(name) {
            Ok(None)
        } else {
            self.tensor(name).map(Some)
        }
    }

    /// Metadata of a tensor list's elements (None for undefined ones).
    pub fn metas(&self, name: &str) -> Result<Vec<Option<Tensor<'a>>>> {
        match self.arg(name)? {
            Arg::Tensors(ts) => Ok(ts.clone()),
            _ => Err(self.bad(name, "a tensor list")),
        }
    }

    /// Reads every defined tensor of a list.
    pub fn tensors(&mut self, name: &str) -> Result<Vec<Option<V>>> {
        let i = self.index(name)?;
        let metas = self.metas(name)?;
        metas.iter().enumerate().map(|(k, t)| t.as_ref().map(|t| self.read(i, k, t)).transpose()).collect()
    }

    /// Reads every defined tensor of an index list, CPU tensors too: PyTorch
    /// moves CPU indices to the indexed tensor's device.
    pub fn index_tensors(&mut self, name: &str) -> Result<Vec<Option<V>>> {
        let i = self.index(name)?;
        let metas = self.metas(name)?;
        let mut out = Vec::with_capacity(metas.len());
        for (k, t) in metas.iter().enumerate() {
            out.push(match t {
                None => None,
                Some(t) if t.device.is_none() && t.numel() > 0 => {
                    Some(self.param(t.ty(), Input::Host { arg: i, item: k }))
                }
                Some(t) if t.device.is_none() => Some(self.g.full(0.0, t.dtype, t.sizes)),
                Some(t) => Some(self.read(i, k, t)?),
            });
        }
        Ok(out)
    }

    /// A tensor or number argument as a promotion operand.
    pub fn operand(&mut self, name: &str) -> Result<Operand> {
        let i = self.index(name)?;
        match *self.arg(name)? {
            Arg::Tensor(t) => {
                let priority = match (t.wrapped, t.sizes.is_empty()) {
                    (true, _) => Priority::Wrapped,
                    (false, true) => Priority::ZeroDim,
                    (false, false) => Priority::Dim,
                };
                Ok(Operand { v: self.read(i, 0, &t)?, dtype: t.dtype, priority })
            }
            Arg::Int(_) | Arg::Float(_) | Arg::Complex(..) | Arg::Bool(_) => {
                let dtype = match self.args[i] {
                    Arg::Int(_) => DType::I64,
                    Arg::Float(_) => DType::F64,
                    Arg::Complex(..) => DType::C128,
                    _ => DType::Bool,
                };
                let v = if self.op.is_runtime(i) {
                    self.param(Ty::new(dtype, &[]), Input::Scalar { arg: i, dtype })
                } else {
                    let value = self.const_f64(name)?;
                    self.g.scalar(value, dtype)
                };
                Ok(Operand { v, dtype, priority: Priority::Wrapped })
            }
            _ => Err(self.bad(name, "a tensor or a number")),
        }
    }

    /// An `int[]` argument of the entry's `data` as a runtime i64 vector.
    pub fn data_list(&mut self, name: &str) -> Result<V> {
        let arg = self.index(name)?;
        match self.args[arg] {
            Arg::Ints(v) if self.op.is_runtime(arg) => {
                Ok(self.param(Ty::new(DType::I64, &[v.len() as i64]), Input::Ints { arg }))
            }
            _ => Err(self.bad(name, "a data int list")),
        }
    }

    /// A number argument as a runtime scalar of `dtype` (None if absent).
    pub fn scalar(&mut self, name: &str, dtype: DType) -> Result<Option<V>> {
        if self.is_none(name) {
            return Ok(None);
        }
        let o = self.operand(name)?;
        Ok(Some(self.g.convert(o.v, dtype)))
    }

    /// `scalar` broadcast to `shape`.
    pub fn scalar_like(&mut self, name: &str, dtype: DType, shape: &[i64]) -> Result<Option<V>> {
        Ok(self.scalar(name, dtype)?.map(|s| self.g.broadcast_in_dim(s, shape, &[])))
    }

    /// The dtype `at::result_type` gives these operands.
    pub fn result_type(&self, ops: &[Operand]) -> DType {
        let pairs: Vec<(DType, Priority)> = ops.iter().map(|o| (o.dtype, o.priority)).collect();
        result_type(&pairs)
    }

    /// Operands converted to `dtype` and broadcast to their common shape.
    pub fn promote_to(&mut self, ops: &[Operand], dtype: DType) -> Result<Vec<V>> {
        let shapes: Vec<Vec<i64>> = ops.iter().map(|o| self.g.ty(o.v).shape.clone()).collect();
        let refs: Vec<&[i64]> = shapes.iter().map(|s| s.as_slice()).collect();
        let shape = crate::ir::broadcast_all(&refs)?;
        Ok(ops
            .iter()
            .map(|o| {
                let v = self.g.convert(o.v, dtype);
                self.g.broadcast_to(v, &shape)
            })
            .collect())
    }

    /// A u64[2] random key for this call, from the `Generator?` argument
    /// `name` or the default generator.
    pub fn seed(&mut self, name: Option<&str>) -> Result<V> {
        let arg = match name {
            Some(n) if self.has(n) => Some(self.index(n)?),
            _ => None,
        };
        Ok(self.param(Ty::new(DType::U64, &[2]), Input::Seed { arg }))
    }

    /// Raises `kind`(`message`) after execution if `flag` (a bool scalar) is
    /// true; the `{}`s in the message become the numbers of `value` (an
    /// integer scalar or vector), so that errors name the offending element
    /// as PyTorch's CPU kernels do.
    pub fn check(&mut self, flag: V, value: Option<V>, kind: Kind, message: impl Into<String>) {
        let value = value.map(|v| {
            let n = self.g.ty(v).numel();
            let v = self.g.convert(v, DType::I64);
            self.g.reshape(v, &[n])
        });
        self.checks.push(Check { flag, value, kind, message: message.into() });
    }

    /// `check`, naming float values: each `{f}` in the message becomes the
    /// next element of `values` as CPU's messages print floats.
    pub fn check_floats(&mut self, flag: V, values: V, kind: Kind, message: impl Into<String>) {
        let n = self.g.ty(values).numel();
        let v = self.g.convert(values, DType::F64);
        let v = self.g.bitcast(v, Ty::new(DType::I64, &self.g.ty(v).shape.clone()));
        let value = Some(self.g.reshape(v, &[n]));
        self.checks.push(Check { flag, value, kind, message: message.into() });
    }

    /// Raises `kind`(`message`) after execution if any element of `bad` (a
    /// bool array) is true.
    pub fn check_any(&mut self, bad: V, kind: Kind, message: impl Into<String>) {
        let dims: Vec<usize> = (0..self.g.ty(bad).rank()).collect();
        let any = self.g.reduce(ReduceKind::Or, bad, &dims);
        self.check(any, None, kind, message);
    }

    /// Raises RuntimeError(`message`) after execution unless `0 <= x <= 1`
    /// everywhere (NaN is outside).
    pub fn check_unit_interval(&mut self, x: V, message: impl Into<String>) {
        let ty = self.g.ty(x).clone();
        let (zero, one) = (self.g.full(0.0, ty.dtype, &ty.shape), self.g.full(1.0, ty.dtype, &ty.shape));
        let above = self.g.compare("GE", x, zero);
        let below = self.g.compare("LE", x, one);
        let inside = self.g.binary("stablehlo.and", above, below);
        let outside = self.g.unary("stablehlo.not", inside);
        self.check_any(outside, Kind::Runtime, message);
    }

    /// The next value of tensor `name`'s storage once `src` (its view's
    /// shape and dtype) is written into the view.
    pub fn write_view(&mut self, name: &str, src: V) -> Result<V> {
        let i = self.index(name)?;
        let t = self.meta(name)?;
        let storage = t.storage.ok_or_else(|| Error::runtime("torchtpu: writing a tensor without storage"))?;
        let n = storage.nbytes() / t.dtype.size() as i64;
        let view = t.view();
        if view.is_whole(n) {
            return Ok(self.g.reshape(src, &[n]));
        }
        let old = self.storage_flat(i, 0, &t)?;
        Ok(view::write(&mut self.g, old, &view, src))
    }
}

/// Normalises a possibly negative dimension, with PyTorch's error.
pub fn wrap_dim(dim: i64, rank: usize) -> Result<usize> {
    let r = rank.max(1) as i64;
    if dim < -r || dim >= r {
        return Err(Error::index(format!(
            "Dimension out of range (expected to be in range of [{}, {}], but got {dim})",
            -r,
            r - 1
        )));
    }
    Ok(if dim < 0 { dim + r } else { dim } as usize)
}
