//! Prints an IR graph as a StableHLO module (MLIR text, generic op syntax).
use std::fmt::Write;

use crate::ir::dtype::DType;
use crate::ir::{Collective, Graph, Op, Precision, ReduceKind, Ty, V};

fn tensor(t: &Ty) -> String {
    let dynamic = |i: usize| t.dynamic >> i & 1 == 1;
    let mut s = String::from("tensor<");
    for (i, d) in t.shape.iter().enumerate() {
        let _ = if dynamic(i) { write!(s, "?x") } else { write!(s, "{d}x") };
    }
    s.push_str(t.dtype.mlir());
    if t.dynamic != 0 {
        let bounds: Vec<String> =
            t.shape.iter().enumerate().map(|(i, d)| if dynamic(i) { d.to_string() } else { "?".into() }).collect();
        let _ = write!(s, ", #stablehlo.bounds<{}>", bounds.join(", "));
    }
    s.push('>');
    s
}

fn scalar(dtype: DType) -> String {
    tensor(&Ty::new(dtype, &[]))
}

fn ints(v: &[i64]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

fn array(v: &[i64]) -> String {
    if v.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", ints(v))
    }
}

/// A dot's or convolution's `precision_config` attribute, after a comma;
/// none for XLA's default.
fn precision_config(precision: Precision) -> String {
    let name = match precision {
        Precision::Default => return String::new(),
        Precision::High => "HIGH",
        Precision::Highest => "HIGHEST",
    };
    format!(", precision_config = [#stablehlo<precision {name}>, #stablehlo<precision {name}>]")
}

/// A literal for `dense<...>`: floats by bit pattern, so inf and NaN survive.
fn literal(bits: i64, dtype: DType) -> String {
    match dtype {
        DType::Bool => (if bits != 0 { "true" } else { "false" }).into(),
        DType::F64 => format!("0x{:016X}", bits as u64),
        DType::F32 => format!("0x{:08X}", (f64::from_bits(bits as u64) as f32).to_bits()),
        // A real value: (re, im) with decimal parts (MLIR takes no hex there).
        DType::C64 | DType::C128 => format!("({:.17e}, 0.0)", f64::from_bits(bits as u64)),
        DType::U64 => (bits as u64).to_string(),
        _ => bits.to_string(),
    }
}

fn compare_type(dtype: DType) -> &'static str {
    match dtype {
        d if d.has_float_values() => "FLOAT",
        DType::Bool | DType::U8 | DType::U32 | DType::U64 => "UNSIGNED",
        _ => "SIGNED",
    }
}

/// Init value of a reduction, as f64 (floats) or integer bits.
pub fn reduce_init(kind: ReduceKind, dtype: DType) -> i64 {
    let float = |x: f64| x.to_bits() as i64;
    // Integers as their 64 bits (u64's largest is -1).
    let (lo, hi) = match dtype.int_range() {
        Some((lo, hi)) => (lo as i64, hi as i64),
        None => (float(f64::NEG_INFINITY), float(f64::INFINITY)),
    };
    match kind {
        ReduceKind::Sum | ReduceKind::Or => {
            if dtype.has_float_values() {
                float(0.0)
            } else {
                0
            }
        }
        ReduceKind::Prod | ReduceKind::And => {
            if dtype.has_float_values() {
                float(1.0)
            } else {
                1
            }
        }
        ReduceKind::Max => lo,
        ReduceKind::Min => hi,
    }
}

fn reduce_op(kind: ReduceKind) -> &'static str {
    match kind {
        ReduceKind::Sum => "stablehlo.add",
        ReduceKind::Prod => "stablehlo.multiply",
        ReduceKind::Max => "stablehlo.maximum",
        ReduceKind::Min => "stablehlo.minimum",
        ReduceKind::And => "stablehlo.and",
        ReduceKind::Or => "stablehlo.or",
    }
}

/// A comparison line inside a region: `%{name}{v} = compare(%{a}{v}, %{b}{v})`.
fn region_compare(v: V, name: &str, dir: &str, a: &str, b: &str, ty: &str, ct: &str) -> String {
    format!(
        "      %{name}{v} = \"stablehlo.compare\"(%{a}{v}, %{b}{v}) {{comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {ct}>}} : ({ty}, {ty}) -> tensor<i1>\n"
    )
}

/// A boolean `and`/`or` line inside a region.
fn region_bool(v: V, name: &str, op: &str, a: &str, b: &str) -> String {
    format!("      %{name}{v} = \"stablehlo.{op}\"(%{a}{v}, %{b}{v}) : (tensor<i1>, tensor<i1>) -> tensor<i1>\n")
}

/// The functions of a module besides `@main`: loops' bodies and external
/// kernels' functions, the latter each once.
#[derive(Default)]
struct Functions {
    kernels: Vec<String>,
    loops: usize,
    text: String,
}

struct Emitter<'g, 'f> {
    g: &'g Graph,
    out: String,
    functions: &'f mut Functions,
}

impl Emitter<'_, '_> {
    fn name(&self, v: V) -> String {
        match &self.g.nodes[v].op {
            Op::Param(n) => format!("%arg{n}"),
            Op::ArgReduce { .. } | Op::RngBits => format!("%v{v}#1"),
            // A loop's first two results are its trip's number and count.
            Op::Loop(_) => format!("%v{v}#2"),
            Op::Result(n) if matches!(self.g.nodes[self.g.nodes[v].args[0]].op, Op::Loop(_)) => {
                format!("%v{}#{}", self.g.nodes[v].args[0], n + 2)
            }
            Op::Reduce { .. } if self.g.nodes[v].args.len() > 1 => format!("%v{v}#0"),
            Op::Sort { result, .. } => format!("%v{v}#{result}"),
            Op::CustomCall { results, .. } if results.len() > 1 => format!("%v{v}#0"),
            Op::Call(k) if k.outputs.len() > 1 => format!("%v{v}#0"),
            Op::Result(n) => format!("%v{}#{n}", self.g.nodes[v].args[0]),
            _ => format!("%v{v}"),
        }
    }

    fn ty(&self, v: V) -> String {
        tensor(self.g.ty(v))
    }

    /// `%vN = "op"(args) {attrs} : (arg types) -> result type`
    fn line(&mut self, v: V, op: &str, attrs: &str) {
        let node = &self.g.nodes[v];
        let args: Vec<String> = node.args.iter().map(|&a| self.name(a)).collect();
        let types: Vec<String> = node.args.iter().map(|&a| self.ty(a)).collect();
        let attrs = if attrs.is_empty() { String::new() } else { format!(" {{{attrs}}}") };
        let _ = writeln!(
            self.out,
            "    %v{v} = \"{op}\"({}){attrs} : ({}) -> {}",
            args.join(", "),
            types.join(", "),
            tensor(&node.ty)
        );
    }

    /// `%vN:k = "op"(args) {attrs} : (arg types) -> (result types)`: an op
    /// with several results (its later ones are `Op::Result` nodes).
    fn multi_line(&mut self, v: V, op: &str, attrs: &str, results: &[Ty]) {
        let node = &self.g.nodes[v];
        let args: Vec<String> = node.args.iter().map(|&a| self.name(a)).collect();
        let types: Vec<String> = node.args.iter().map(|&a| self.ty(a)).collect();
        let outs: Vec<String> = results.iter().map(tensor).collect();
        let count = if results.len() > 1 { format!(":{}", results.len()) } else { String::new() };
        let _ = writeln!(
            self.out,
            "    %v{v}{count} = \"{op}\"({}) {{{attrs}}} : ({}) -> ({})",
            args.join(", "),
            types.join(", "),
            outs.join(", ")
        );
    }

    /// A splat (one element in `bits`) or a 1-D constant.
    fn constant(&mut self, name: &str, bits: &[i64], ty: &Ty) {
        // f16/bf16 literals are written as f32 and converted, exactly.
        if matches!(ty.dtype, DType::F16 | DType::BF16) {
            let wide = Ty::new(DType::F32, &ty.shape);
            self.constant(&format!("{name}_f32"), bits, &wide);
            let _ = writeln!(
                self.out,
                "    {name} = \"stablehlo.convert\"({name}_f32) : ({}) -> {}",
                tensor(&wide),
                tensor(ty)
            );
            return;
        }
        let values: Vec<String> = bits.iter().map(|&b| literal(b, ty.dtype)).collect();
        let values = if let [one] = values.as_slice() { one.clone() } else { format!("[{}]", values.join(", ")) };
        let _ = writeln!(self.out, "    {name} = stablehlo.constant dense<{values}> : {}", tensor(ty));
    }

    /// A two-argument region `^bb0(x, y): return op(x, y)`.
    fn binary_region(&mut self, v: V, op: Option<&str>, dtype: DType) -> String {
        self.region_of(v, op, dtype, 1)
    }

    /// A region combining `n` accumulators with `n` values pairwise by `op`
    /// (None: keeps the value), as a variadic reduce's.
    fn region_of(&mut self, v: V, op: Option<&str>, dtype: DType, n: usize) -> String {
        let s = scalar(dtype);
        let at = |name: &str, i: usize| if n == 1 { format!("%{name}{v}") } else { format!("%{name}{v}_{i}") };
        let mut body = String::new();
        let mut results = Vec::new();
        for i in 0..n {
            let (x, y) = (at("x", i), at("y", i));
            match op {
                Some(op) => {
                    let r = at("r", i);
                    body += &format!("      {r} = \"{op}\"({x}, {y}) : ({s}, {s}) -> {s}\n");
                    results.push(r);
                }
                None => results.push(y),
            }
        }
        let types = vec![s.clone(); n].join(", ");
        body += &format!("      \"stablehlo.return\"({}) : ({types}) -> ()\n", results.join(", "));
        let params: Vec<String> = ["x", "y"]
            .iter()
            .flat_map(|name| (0..n).map(move |i| (name, i)))
            .map(|(name, i)| format!("{}: {s}", at(name, i)))
            .collect();
        format!("({{\n    ^bb0({}):\n{body}    }})", params.join(", "))
    }

    fn node(&mut self, v: V) {
        let node = &self.g.nodes[v];
        match &node.op {
            Op::Param(_) => {}
            Op::Const(bits) => {
                let ty = node.ty.clone();
                self.constant(&format!("%v{v}"), &[*bits], &ty)
            }
            Op::Dense(bits) => {
                let (bits, ty) = (bits.clone(), node.ty.clone());
                self.constant(&format!("%v{v}"), &bits, &ty)
            }
            Op::Iota(d) => self.line(v, "stablehlo.iota", &format!("iota_dimension = {d} : i64")),
            Op::Elementwise(op) => self.line(v, op, ""),
            Op::Compare(dir) => {
                let ct = compare_type(self.g.ty(node.args[0]).dtype);
                let attrs = format!(
                    "comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {ct}>"
                );
                self.line(v, "stablehlo.compare", &attrs)
            }
            Op::Select => self.line(v, "stablehlo.select", ""),
            Op::Convert => self.line(v, "stablehlo.convert", ""),
            Op::BitcastConvert => self.line(v, "stablehlo.bitcast_convert", ""),
            Op::Reshape => self.line(v, "stablehlo.reshape", ""),
            Op::Transpose(p) => self.line(v, "stablehlo.transpose", &format!("permutation = {}", array(p))),
            Op::BroadcastInDim(d) => {
                self.line(v, "stablehlo.broadcast_in_dim", &format!("broadcast_dimensions = {}", array(d)))
            }
            Op::Slice { start, limit, stride } => {
                let attrs = format!(
                    "start_indices = {}, limit_indices = {}, strides = {}",
                    array(start),
                    array(limit),
                    array(stride)
                );
                self.line(v, "stablehlo.slice", &attrs)
            }
            Op::Concatenate(d) => self.line(v, "stablehlo.concatenate", &format!("dimension = {d} : i64")),
            Op::DynamicSlice(sizes) => {
                self.line(v, "stablehlo.dynamic_slice", &format!("slice_sizes = {}", array(sizes)))
            }
            Op::DynamicUpdateSlice => self.line(v, "stablehlo.dynamic_update_slice", ""),
            Op::SetDimensionSize(d) => self.line(v, "stablehlo.set_dimension_size", &format!("dimension = {d} : i64")),
            Op::Pad { low, high, interior } => {
                let attrs = format!(
                    "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
                    array(low),
                    array(high),
                    array(interior)
                );
                self.line(v, "stablehlo.pad", &attrs)
            }
            Op::Reverse(d) => self.line(v, "stablehlo.reverse", &format!("dimensions = {}", array(d))),
            Op::Reduce { kind, dims } => self.reduce(v, *kind, dims),
            Op::ArgReduce { max, dim } => self.arg_reduce(v, *max, *dim),
            Op::DotGeneral { lhs_batch, rhs_batch, lhs_contract, rhs_contract, precision } => {
                let mut fields = Vec::new();
                if !lhs_batch.is_empty() {
                    fields.push(format!("lhs_batching_dimensions = [{}]", ints(lhs_batch)));
                    fields.push(format!("rhs_batching_dimensions = [{}]", ints(rhs_batch)));
                }
                fields.push(format!("lhs_contracting_dimensions = [{}]", ints(lhs_contract)));
                fields.push(format!("rhs_contracting_dimensions = [{}]", ints(rhs_contract)));
                let dims = format!("dot_dimension_numbers = #stablehlo.dot<{}>", fields.join(", "));
                self.line(v, "stablehlo.dot_general", &(dims + &precision_config(*precision)))
            }
            Op::Convolution(c, precision) => {
                let pads: Vec<String> = c.padding.iter().map(|(lo, hi)| format!("[{lo}, {hi}]")).collect();
                let attrs = format!(
                    "batch_group_count = {} : i64, dimension_numbers = #stablehlo.conv<raw input_batch_dimension = {}, input_feature_dimension = {}, input_spatial_dimensions = [{}], kernel_input_feature_dimension = {}, kernel_output_feature_dimension = {}, kernel_spatial_dimensions = [{}], output_batch_dimension = {}, output_feature_dimension = {}, output_spatial_dimensions = [{}]>, feature_group_count = {} : i64, lhs_dilation = {}, padding = dense<[{}]> : tensor<{}x2xi64>, rhs_dilation = {}, window_strides = {}",
                    c.batch_groups,
                    c.lhs[0],
                    c.lhs[1],
                    ints(&c.lhs[2..]),
                    c.rhs[1],
                    c.rhs[0],
                    ints(&c.rhs[2..]),
                    c.out[0],
                    c.out[1],
                    ints(&c.out[2..]),
                    c.feature_groups,
                    array(&c.lhs_dilation),
                    pads.join(", "),
                    pads.len(),
                    array(&c.rhs_dilation),
                    array(&c.strides)
                );
                self.line(v, "stablehlo.convolution", &(attrs + &precision_config(*precision)))
            }
            Op::Take { axis } => self.take(v, *axis),
            Op::Put { axis, combine } => self.put(v, *axis, *combine),
            Op::Sort { dim, descending, keys, .. } => self.sort(v, *dim, *descending, *keys),
            Op::Cholesky { lower } => self.line(v, "stablehlo.cholesky", &format!("lower = {lower}")),
            Op::TriangularSolve { left, lower, unit_diagonal, transpose } => {
                let t = if *transpose { "TRANSPOSE" } else { "NO_TRANSPOSE" };
                let attrs = format!(
                    "left_side = {left}, lower = {lower}, unit_diagonal = {unit_diagonal}, transpose_a = #stablehlo<transpose {t}>"
                );
                self.line(v, "stablehlo.triangular_solve", &attrs)
            }
            Op::Result(_) => {}
            Op::Fft { kind, length } => self.line(
                v,
                "stablehlo.fft",
                &format!("fft_type = #stablehlo<fft_type {kind}>, fft_length = {}", array(length)),
            ),
            Op::CustomCall { target, config, results } => self.multi_line(
                v,
                "stablehlo.custom_call",
                &format!("call_target_name = \"{target}\", backend_config = \"{config}\""),
                results,
            ),
            Op::Collective { kind, replicas } => self.collective(v, kind, *replicas),
            Op::Call(kernel) => {
                self.multi_line(v, "func.call", &format!("callee = @{}", kernel.entry), &kernel.outputs)
            }
            Op::Loop(body) => self.counted_loop(v, body),
            Op::RngBits => {
                let key = self.name(node.args[0]);
                let kt = self.ty(node.args[0]);
                let _ = writeln!(
                    self.out,
                    "    %v{v}:2 = \"stablehlo.rng_bit_generator\"({key}) {{rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>}} : ({kt}) -> ({kt}, {})",
                    tensor(&node.ty)
                );
            }
        }
    }

    /// A reduction of one operand, or of several at once (one loop, one
    /// accumulator each; its later results are `Op::Result` nodes).
    fn reduce(&mut self, v: V, kind: ReduceKind, dims: &[i64]) {
        let node = &self.g.nodes[v];
        let (n, dtype) = (node.args.len(), node.ty.dtype);
        let init = format!("%i{v}");
        self.constant(&init, &[reduce_init(kind, dtype)], &Ty::new(dtype, &[]));
        let region = self.region_of(v, Some(reduce_op(kind)), dtype, n);
        let node = &self.g.nodes[v];
        let operands: Vec<String> = node.args.iter().map(|&a| self.name(a)).collect();
        let types: Vec<String> = node.args.iter().map(|&a| self.ty(a)).collect();
        let (count, results) = match n {
            1 => (String::new(), tensor(&node.ty)),
            _ => (format!(":{n}"), format!("({})", vec![tensor(&node.ty); n].join(", "))),
        };
        let _ = writeln!(
            self.out,
            "    %v{v}{count} = \"stablehlo.reduce\"({}, {}) {region} {{dimensions = {}}} : ({}, {}) -> {results}",
            operands.join(", "),
            vec![init; n].join(", "),
            array(dims),
            types.join(", "),
            vec![scalar(dtype); n].join(", "),
        );
    }

    /// A `while` over a trip's number from 0 to the count (both carried
    /// first), its body a call of the loop's own function (XLA inlines it).
    fn counted_loop(&mut self, v: V, body: &Graph) {
        let name = format!("loop{}", self.functions.loops);
        self.functions.loops += 1;
        let text = function(body, &format!("private @{name}"), self.functions);
        self.functions.text.push_str(&text);
        let node = &self.g.nodes[v];
        let (trips, values) = (node.args[0], &node.args[1..]);
        let n = values.len();
        let i32 = scalar(DType::I32);
        let value_types: Vec<String> = values.iter().map(|&a| self.ty(a)).collect();
        let types = [i32.clone(), i32.clone()].into_iter().chain(value_types.iter().cloned()).collect::<Vec<_>>();
        let types = types.join(", ");
        let block = |p: &str| {
            let values: String = value_types.iter().enumerate().map(|(k, t)| format!(", %{p}{v}_{k}: {t}")).collect();
            format!("^bb0(%{p}{v}: {i32}, %{p}t{v}: {i32}{values})")
        };
        let values_of = |p: &str| (0..n).map(|k| format!(", %{p}{v}_{k}")).collect::<String>();
        let results: Vec<String> =
            (0..n).map(|k| if n == 1 { format!("%r{v}") } else { format!("%r{v}#{k}") }).collect();
        let count = if n == 1 { String::new() } else { format!(":{n}") };
        let init: Vec<String> = values.iter().map(|&a| self.name(a)).collect();
        let _ = writeln!(
            self.out,
            "    %z{v} = stablehlo.constant dense<0> : {i32}
    %v{v}:{} = \"stablehlo.while\"(%z{v}, {}, {}) ({{
    {}:
{}      \"stablehlo.return\"(%l{v}) : (tensor<i1>) -> ()
    }}, {{
    {}:
      %r{v}{count} = \"func.call\"(%b{v}{}) {{callee = @{name}}} : ({i32}, {}) -> ({})
      %o{v} = stablehlo.constant dense<1> : {i32}
      %n{v} = \"stablehlo.add\"(%b{v}, %o{v}) : ({i32}, {i32}) -> {i32}
      \"stablehlo.return\"(%n{v}, %bt{v}, {}) : ({types}) -> ()
    }}) : ({types}) -> ({types})",
            n + 2,
            self.name(trips),
            init.join(", "),
            block("c"),
            region_compare(v, "l", "LT", "c", "ct", &i32, "SIGNED"),
            block("b"),
            values_of("b"),
            value_types.join(", "),
            value_types.join(", "),
            results.join(", "),
        );
    }

    /// ` ({region})`: a collective's reduction.
    fn region(&mut self, v: V, kind: ReduceKind, dtype: DType) -> String {
        format!(" {}", self.binary_region(v, Some(reduce_op(kind)), dtype))
    }

    fn collective(&mut self, v: V, kind: &Collective, replicas: i64) {
        let node = &self.g.nodes[v];
        let (input, dtype) = (node.args[0], node.ty.dtype);
        let group = format!(
            "replica_groups = dense<[[{}]]> : tensor<1x{replicas}xi64>",
            ints(&(0..replicas).collect::<Vec<_>>())
        );
        let (op, region, attrs) = match kind {
            Collective::AllReduce(k) => ("all_reduce", self.region(v, *k, dtype), group),
            Collective::ReduceScatter(k) => {
                ("reduce_scatter", self.region(v, *k, dtype), format!("scatter_dimension = 0 : i64, {group}"))
            }
            Collective::AllGather => ("all_gather", String::new(), format!("all_gather_dim = 0 : i64, {group}")),
            Collective::AllToAll => (
                "all_to_all",
                String::new(),
                format!(
                    "split_dimension = 0 : i64, concat_dimension = 0 : i64, split_count = {replicas} : i64, {group}"
                ),
            ),
            Collective::Permute(pairs) => {
                let list: Vec<String> = pairs.iter().map(|(s, t)| format!("[{s}, {t}]")).collect();
                let pairs = format!("dense<[{}]> : tensor<{}x2xi64>", list.join(", "), list.len());
                ("collective_permute", String::new(), format!("source_target_pairs = {pairs}"))
            }
        };
        let _ = writeln!(
            self.out,
            "    %v{v} = \"stablehlo.{op}\"({}){region} {{{attrs}}} : ({}) -> {}",
            self.name(input),
            self.ty(input),
            tensor(&node.ty)
        );
    }

    fn arg_reduce(&mut self, v: V, max: bool, dim: i64) {
        let node = &self.g.nodes[v];
        let input = node.args[0];
        let it = self.g.ty(input).clone();
        let (dt, s, si) = (it.dtype, scalar(it.dtype), scalar(DType::I64));
        let mut idx_ty = Ty::new(DType::I64, &it.shape);
        let _ = writeln!(
            self.out,
            "    %n{v} = \"stablehlo.iota\"() {{iota_dimension = {dim} : i64}} : () -> {}",
            tensor(&idx_ty)
        );
        // The indices take the input's bounded dimensions' real sizes.
        let mut idx = format!("%n{v}");
        for d in (0..it.rank()).filter(|d| it.dynamic >> d & 1 == 1) {
            let (from, input) = (tensor(&idx_ty), self.name(input));
            idx_ty.dynamic |= 1 << d;
            let _ = writeln!(
                self.out,
                "    %d{v}_{d} = \"stablehlo.get_dimension_size\"({input}) {{dimension = {d} : i64}} : ({}) -> tensor<i32>\n    %n{v}_{d} = \"stablehlo.set_dimension_size\"({idx}, %d{v}_{d}) {{dimension = {d} : i64}} : ({from}, tensor<i32>) -> {}",
                tensor(&it),
                tensor(&idx_ty)
            );
            idx = format!("%n{v}_{d}");
        }
        let kind = if max { ReduceKind::Max } else { ReduceKind::Min };
        self.constant(&format!("%iv{v}"), &[reduce_init(kind, dt)], &Ty::new(dt, &[]));
        self.constant(&format!("%ii{v}"), &[0], &Ty::new(DType::I64, &[]));
        let (better, ct) = (if max { "GT" } else { "LT" }, compare_type(dt));
        let cmp =
            |name: &str, dir: &str, a: &str, b: &str, ty: &str, ct: &str| region_compare(v, name, dir, a, b, ty, ct);
        let bool2 = |name: &str, op: &str, a: &str, b: &str| region_bool(v, name, op, a, b);
        let mut body = String::new();
        body += &cmp("gt", better, "av", "bv", &s, ct);
        body += &cmp("an", "NE", "av", "av", &s, ct);
        body += &cmp("bn", "NE", "bv", "bv", &s, ct);
        body += &cmp("eq", "EQ", "av", "bv", &s, ct);
        body += &cmp("lt", "LT", "ai", "bi", &si, "SIGNED");
        body += &format!("      %nb{v} = \"stablehlo.not\"(%bn{v}) : (tensor<i1>) -> tensor<i1>\n");
        body += &bool2("p1", "and", "an", "nb");
        body += &bool2("bb", "and", "an", "bn");
        body += &bool2("ti", "or", "eq", "bb");
        body += &bool2("p2", "and", "ti", "lt");
        body += &bool2("p3", "or", "gt", "p1");
        body += &bool2("pa", "or", "p3", "p2");
        body +=
            &format!("      %rv{v} = \"stablehlo.select\"(%pa{v}, %av{v}, %bv{v}) : (tensor<i1>, {s}, {s}) -> {s}\n");
        body += &format!(
            "      %ri{v} = \"stablehlo.select\"(%pa{v}, %ai{v}, %bi{v}) : (tensor<i1>, {si}, {si}) -> {si}\n"
        );
        body += &format!("      \"stablehlo.return\"(%rv{v}, %ri{v}) : ({s}, {si}) -> ()\n");
        let out = &node.ty;
        let (ov, oi) = (tensor(&Ty { dtype: dt, ..out.clone() }), tensor(&Ty { dtype: DType::I64, ..out.clone() }));
        let _ = writeln!(
            self.out,
            "    %v{v}:2 = \"stablehlo.reduce\"({}, {idx}, %iv{v}, %ii{v}) ({{\n    ^bb0(%av{v}: {s}, %ai{v}: {si}, %bv{v}: {s}, %bi{v}: {si}):\n{body}    }}) {{dimensions = array<i64: {dim}>}} : ({}, {}, {s}, {si}) -> ({ov}, {oi})",
            self.name(input),
            tensor(&it),
            tensor(&idx_ty)
        );
    }

    /// Window dimensions shared by `take` (gather) and `put` (scatter).
    fn windows(rank: usize, axis: i64, k: usize) -> Vec<i64> {
        let axis = axis as usize;
        (0..axis).chain(axis + k..rank - 1 + k).map(|d| d as i64).collect()
    }

    fn take(&mut self, v: V, axis: i64) {
        let node = &self.g.nodes[v];
        let (a, idx) = (self.g.ty(node.args[0]).clone(), self.g.ty(node.args[1]).clone());
        let offset = Self::windows(a.rank(), axis, idx.rank());
        let mut sizes = a.shape.clone();
        sizes[axis as usize] = 1;
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<offset_dims = [{}], collapsed_slice_dims = [{axis}], start_index_map = [{axis}], index_vector_dim = {}>, slice_sizes = {}, indices_are_sorted = false",
            ints(&offset),
            idx.rank(),
            array(&sizes)
        );
        self.line(v, "stablehlo.gather", &attrs)
    }

    /// A sort whose comparator orders by the first operand: `<` (or `>`),
    /// with NaN above every number.
    fn sort(&mut self, v: V, dim: i64, descending: bool, keys: usize) {
        let node = &self.g.nodes[v];
        let bool2 = |name: &str, op: &str, a: &str, b: &str| region_bool(v, name, op, a, b);
        let mut body = String::new();
        // Per key: whether p goes before q, and (but the last) whether they tie.
        let (mut before, mut tie) = (Vec::new(), Vec::new());
        for k in 0..keys {
            let dtype = self.g.ty(node.args[k]).dtype;
            let (s, ct) = (scalar(dtype), compare_type(dtype));
            let cmp = |name: &str, dir: &str, a: &str, b: &str| region_compare(v, name, dir, a, b, &s, ct);
            let (p, q, n) = (format!("p{k}_"), format!("q{k}_"), |x: &str| format!("{x}{k}_"));
            body += &cmp(&n("c"), if descending { "GT" } else { "LT" }, &p, &q);
            let mut first = n("c");
            if dtype.is_float() {
                // Ascending: a < b or (b is NaN and a is not); descending: a > b or (a is NaN and b is not).
                body += &cmp(&n("pn"), "NE", &p, &p);
                body += &cmp(&n("qn"), "NE", &q, &q);
                let (nan, number) = if descending { (n("pn"), n("qn")) } else { (n("qn"), n("pn")) };
                body +=
                    &format!("      %{}{v} = \"stablehlo.not\"(%{number}{v}) : (tensor<i1>) -> tensor<i1>\n", n("nn"));
                body += &bool2(&n("un"), "and", &nan, &n("nn"));
                body += &bool2(&n("r"), "or", &n("c"), &n("un"));
                first = n("r");
            }
            before.push(first);
            if k + 1 < keys {
                body += &cmp(&n("e"), "EQ", &p, &q);
                let mut same = n("e");
                if dtype.is_float() {
                    body += &bool2(&n("bn"), "and", &n("pn"), &n("qn"));
                    body += &bool2(&n("s"), "or", &n("e"), &n("bn"));
                    same = n("s");
                }
                tie.push(same);
            }
        }
        // before(0) or (tie(0) and (before(1) or (tie(1) and ...))).
        let mut result = before[keys - 1].clone();
        for k in (0..keys - 1).rev() {
            body += &bool2(&format!("a{k}_"), "and", &tie[k], &result);
            body += &bool2(&format!("o{k}_"), "or", &before[k], &format!("a{k}_"));
            result = format!("o{k}_");
        }
        body += &format!("      \"stablehlo.return\"(%{result}{v}) : (tensor<i1>) -> ()\n");
        let block: Vec<String> = node
            .args
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let s = scalar(self.g.ty(a).dtype);
                format!("%p{i}_{v}: {s}, %q{i}_{v}: {s}")
            })
            .collect();
        let args: Vec<String> = node.args.iter().map(|&a| self.name(a)).collect();
        let types: Vec<String> = node.args.iter().map(|&a| self.ty(a)).collect();
        let _ = writeln!(
            self.out,
            "    %v{v}:{} = \"stablehlo.sort\"({}) ({{\n    ^bb0({}):\n{body}    }}) {{dimension = {dim} : i64, is_stable = true}} : ({}) -> ({})",
            args.len(),
            args.join(", "),
            block.join(", "),
            types.join(", "),
            types.join(", ")
        );
    }

    fn put(&mut self, v: V, axis: i64, combine: Option<ReduceKind>) {
        let node = &self.g.nodes[v];
        let (a, idx) = (self.g.ty(node.args[0]).clone(), self.g.ty(node.args[1]).clone());
        let window = Self::windows(a.rank(), axis, idx.rank());
        let args: Vec<String> = node.args.iter().map(|&x| self.name(x)).collect();
        let types: Vec<String> = node.args.iter().map(|&x| self.ty(x)).collect();
        let region = self.binary_region(v, combine.map(reduce_op), a.dtype);
        let _ = writeln!(
            self.out,
            "    %v{v} = \"stablehlo.scatter\"({}) {region} {{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [{}], inserted_window_dims = [{axis}], scatter_dims_to_operand_dims = [{axis}], index_vector_dim = {}>, indices_are_sorted = false, unique_indices = false}} : ({}) -> {}",
            args.join(", "),
            ints(&window),
            idx.rank(),
            types.join(", "),
            tensor(&a)
        );
    }
}

/// The StableHLO module of a graph: `@main(params...) -> outputs`.
pub fn emit(g: &Graph) -> String {
    let mut functions = Functions::default();
    let main = function(g, "public @main", &mut functions);
    format!("module @torchtpu {{\n{main}{}}}\n", functions.text)
}

/// `func.func {header}(params...) -> outputs` of a graph; the functions it
/// calls go to `functions`.
fn function(g: &Graph, header: &str, functions: &mut Functions) -> String {
    let mut e = Emitter { g, out: String::new(), functions };
    let params: Vec<String> = g
        .params
        .iter()
        .enumerate()
        .map(|(i, t)| match g.donors.get(i).copied().flatten() {
            Some(o) => format!("%arg{i}: {} {{tf.aliasing_output = {o} : i32}}", tensor(t)),
            None => format!("%arg{i}: {}", tensor(t)),
        })
        .collect();
    let results: Vec<String> = g.outputs.iter().map(|&v| e.ty(v)).collect();
    let _ = writeln!(e.out, "  func.func {header}({}) -> ({}) {{", params.join(", "), results.join(", "));
    // Only nodes that reach an output are printed.
    let mut live = vec![false; g.nodes.len()];
    for &o in &g.outputs {
        live[o] = true;
    }
    for v in (0..g.nodes.len()).rev() {
        if live[v] {
            for &a in &g.nodes[v].args {
                live[a] = true;
            }
        }
    }
    for v in 0..g.nodes.len() {
        if live[v] {
            e.node(v);
        }
    }
    let names: Vec<String> = g.outputs.iter().map(|&v| e.name(v)).collect();
    let _ = writeln!(e.out, "    \"func.return\"({}) : ({}) -> ()\n  }}", names.join(", "), results.join(", "));
    // The functions of the external kernels called, each once.
    for (v, node) in g.nodes.iter().enumerate() {
        if let (true, Op::Call(k)) = (live[v], &node.op) {
            if !e.functions.kernels.contains(&k.entry) {
                e.functions.kernels.push(k.entry.clone());
                e.functions.text.push_str(&k.functions);
                e.functions.text.push('\n');
            }
        }
    }
    e.out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The program of one matmul of two [4, 4] `dtype` parameters.
    fn matmul(dtype: DType, precision: Precision) -> String {
        let mut g = Graph::default();
        let (a, b) = (g.param(Ty::new(dtype, &[4, 4])), g.param(Ty::new(dtype, &[4, 4])));
        let c = g.matmul(a, b, precision);
        g.outputs = vec![c];
        emit(&g)
    }

    #[test]
    fn float32_dots_carry_their_precision() {
        let highest = "precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";
        assert!(matmul(DType::F32, Precision::Highest).contains(highest));
        assert!(matmul(DType::F32, Precision::High).contains("#stablehlo<precision HIGH>"));
        assert!(!matmul(DType::F32, Precision::Default).contains("precision_config"));
        // Other dtypes never depend on the setting.
        assert!(!matmul(DType::BF16, Precision::Highest).contains("precision_config"));
        assert_eq!(matmul(DType::F64, Precision::Highest), matmul(DType::F64, Precision::Default));
    }
}
