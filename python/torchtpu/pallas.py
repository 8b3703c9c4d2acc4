"""Custom kernels written in JAX or Pallas, called on tpu tensors.

    import jax
    import torchtpu.pallas as tp

    @tp.custom_jax_kernel
    def my_kernel(x):
        return jax.nn.relu(x)

    y = my_kernel(torch.randn(8, device="tpu"))

A kernel is lowered by JAX once per input signature (shapes, dtypes, static
arguments) to StableHLO, checked against the StableHLO version the plugin
reads, and registered with the core, which calls it as one operator,
`torchtpu::kernel`: in fused mode it joins the program around it, in strict
and debug modes it runs as its own program, and under `torch.compile` it is one
node of the graph (with a fake implementation and autograd). Gradients come
from `jax.vjp` (so a `jax.custom_vjp` function supplies its own backward);
the residuals are tpu tensors saved by autograd.

`pallas_call` runs in interpret mode when the plugin is the CPU one (the same
source runs on TPU through Mosaic). JAX is only used to lower, on its CPU
platform: it never opens the device torchtpu uses. Helion's Pallas kernels
run on tpu tensors once this module is imported (`_helion.py`).
"""
import functools
import hashlib
import os

import torch

try:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    from jax._src.interpreters import mlir as _jax_mlir
    from jax._src.lib import _jax
    from jaxlib.mlir import ir
except ImportError as e:  # pragma: no cover - exercised without jax installed
    raise ImportError(
        "torchtpu.pallas needs JAX to lower kernels: pip install jax==0.10.2 jaxlib==0.10.2"
    ) from e

from . import _C, _helion

__all__ = ["custom_jax_kernel"]

# The same call twice: `differentiable_kernel` has autograd (a Python
# formula, so every call would pay for it); `kernel` is what calls that need
# no gradient use.
_lib = torch.library.Library("torchtpu", "FRAGMENT")
_lib.define("kernel(int kernel, Tensor[] inputs) -> Tensor[]")
_lib.define("differentiable_kernel(int kernel, Tensor[] inputs) -> Tensor[]")

# MLIR element types and the torch dtypes of the same name.
_DTYPES = {
    "i1": torch.bool, "ui8": torch.uint8, "i8": torch.int8, "i16": torch.int16,
    "i32": torch.int32, "i64": torch.int64, "f16": torch.float16, "bf16": torch.bfloat16,
    "f32": torch.float32, "f64": torch.float64, "ui32": torch.uint32, "ui64": torch.uint64,
    "complex<f32>": torch.complex64, "complex<f64>": torch.complex128,
}


def _jax_dtype(dtype):
    return str(dtype).removeprefix("torch.")  # JAX's name of the same dtype


# Python numbers are traced as JAX traces them: weakly typed 32-bit scalars
# (under torch.compile they may arrive symbolic).
_NUMBERS = {bool: torch.bool, int: torch.int32, float: torch.float32,
            torch.SymBool: torch.bool, torch.SymInt: torch.int32, torch.SymFloat: torch.float32}
_SYMBOLIC = {torch.SymBool: bool, torch.SymInt: int, torch.SymFloat: float}

# Custom calls that can never run inside a torchtpu program, and why.
_HOST_CALLBACKS = ("xla_python_cpu_callback", "xla_python_gpu_callback", "xla_ffi_python_cpu_callback",
                   "xla_ffi_python_gpu_callback", "xla_ffi_partitioned_python_cpu_callback")


class _Lowered:
    """One kernel at one input signature, registered with the core."""

    def __init__(self, name, kernel_id, outputs, out_tree, backward=None):
        self.name = name
        self.id = kernel_id
        self.outputs = outputs  # [(torch dtype, shape)]
        self.out_tree = out_tree
        self.single = out_tree is not None and out_tree == jax.tree_util.tree_structure(0)
        # For a forward that also returns residuals: (outputs it returns to
        # the user, the backward kernel, which inputs get gradients).
        self.backward = backward


_BY_ID: dict[int, _Lowered] = {}


def _platform():
    platform, version = _C.platform()
    return platform, version or "1.0.0"  # a plugin that does not say: StableHLO's first stable release


@functools.cache
def _interpret_pallas_on_cpu():
    """`pallas_call` has no compiled lowering on CPU: lower it in interpret
    mode there (plain `stablehlo.while` loops), so one source runs on every
    plugin. Other platforms keep their Mosaic/Triton lowerings."""
    from jax._src.pallas import pallas_call as pc

    def rule(ctx, *args, interpret, **params):
        return pc._pallas_call_lowering(ctx, *args, interpret=interpret or True, **params)

    _jax_mlir.register_lowering(pc.pallas_call_p, rule, platform="cpu")


def _lower_module(name, fn, avals, platform, version):
    """JAX's StableHLO for `fn` at `avals`: (private functions, entry symbol,
    input types, output types, output tree)."""
    _interpret_pallas_on_cpu()
    wide = any(jax.numpy.dtype(a.dtype).itemsize == 8 for a in avals)
    try:
        with jax.enable_x64(wide):
            lowered = jax.jit(fn, keep_unused=True).trace(*avals).lower(lowering_platforms=(platform,))
    except Exception as e:
        raise RuntimeError(f"kernel {name}: JAX could not lower it for the {platform} plugin: {e}") from e
    # Through StableHLO's portable artifact at the plugin's version: that
    # rejects what the plugin could not read and expands CHLO (erf, ...).
    module = lowered.compiler_ir("stablehlo")
    with module.context:
        try:
            artifact = _jax.mlir.serialize_portable_artifact(module, version)
        except Exception as e:
            raise RuntimeError(
                f"kernel {name} uses StableHLO that the plugin (version {version}) cannot read: {e}"
            ) from e
        module = _jax.mlir.deserialize_portable_artifact(artifact, module.context)
    prefix = "k" + hashlib.sha256(name.encode() + b"\n" + artifact).hexdigest()[:16] + "_"
    with module.context:
        _check_custom_calls(name, module, platform)
        funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
        for f in funcs:
            old = ir.StringAttr(f.attributes["sym_name"]).value
            ir.SymbolTable.replace_all_symbol_uses(old, prefix + old, module.operation)
            f.attributes["sym_name"] = ir.StringAttr.get(prefix + old)
            f.attributes["sym_visibility"] = ir.StringAttr.get("private")
            for attr in ("arg_attrs", "res_attrs"):  # shardings, layouts, result names
                if attr in f.attributes:
                    del f.attributes[attr]
        main = next(f for f in funcs if ir.StringAttr(f.attributes["sym_name"]).value == prefix + "main")
        ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        functions = "\n".join(f.operation.get_asm(print_generic_op_form=True) for f in funcs)
        inputs = [_aval(t) for t in ftype.inputs]
        outputs = [_aval(t) for t in ftype.results]
    return functions, prefix + "main", inputs, outputs, lowered.out_tree


def _aval(t):
    t = ir.RankedTensorType(t)
    return str(t.element_type), list(t.shape)


def _check_custom_calls(name, module, platform):
    def visit(op):
        if op.name == "stablehlo.custom_call":
            target = ir.StringAttr(op.attributes["call_target_name"]).value
            if target in _HOST_CALLBACKS:
                raise RuntimeError(
                    f"kernel {name} calls back into Python ({target}: jax.debug.print, pure_callback or "
                    "io_callback); a kernel must run entirely on the device"
                )
            if platform == "cpu" or (target == "tpu_custom_call" and platform != "tpu"):
                raise RuntimeError(
                    f"kernel {name} needs the custom call '{target}', which the {platform} plugin does "
                    "not provide (on CPU, jax.numpy.linalg and jax.scipy lower to jaxlib's own LAPACK calls)"
                )
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


def _register(name, fn, avals):
    platform, version = _platform()
    functions, entry, inputs, outputs, out_tree = _lower_module(name, fn, avals, platform, version)
    kernel_id = _C.kernel_register(name, entry, functions, inputs, outputs)
    return kernel_id, [(_DTYPES[d], s) for d, s in outputs], out_tree


class _Kernel:
    def __init__(self, fn, static_argnums, input_output_aliases, name):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.static = frozenset(static_argnums)
        self.aliases = dict(input_output_aliases)
        self.name = name or getattr(fn, "__name__", "kernel")
        self._cache: dict = {}
        # Signatures already lowered, looked up in C++ on later calls (tpu
        # tensors only, one output: the common case, as cheap as a native op).
        self._table = None if self.static or self.aliases else _C.kernel_table()
        # Under torch.compile the call is one opaque graph node: Dynamo must not
        # trace JAX; AOTAutograd runs it on fake tensors and records the op.
        # Symbolic sizes are made concrete (a guard): a kernel is lowered per shape.
        self._in_graph = torch._dynamo.allow_in_graph(lambda *args: self._run(*self._concrete(args), concrete=True))

    def _concrete(self, args):
        """`args` with symbolic static arguments made Python values (a guard)."""
        return tuple(_SYMBOLIC[type(a)](a) if i in self.static and type(a) in _SYMBOLIC else a
                     for i, a in enumerate(args))

    def _lower(self, args, grad):
        """Lowers and registers the kernel for the signature of `args`."""
        avals, layout = [], []
        for i, a in enumerate(args):
            if i in self.static or a is None:
                layout.append(("static", a))
            else:
                layout.append(("dynamic", None))
                if isinstance(a, torch.Tensor):
                    avals.append(jax.ShapeDtypeStruct(tuple(map(int, a.shape)), _jax_dtype(a.dtype)))
                else:  # a Python number
                    avals.append(jax.ShapeDtypeStruct((), _jax_dtype(_NUMBERS[type(a)]), weak_type=True))

        def call(*dynamic):
            it = iter(dynamic)
            return self.fn(*(value if kind == "static" else next(it) for kind, value in layout))

        if not grad:
            kernel_id, outputs, out_tree = _register(self.name, call, avals)
            lowered = _Lowered(self.name, kernel_id, outputs, out_tree)
        else:
            lowered = self._lower_with_backward(call, avals)
        _BY_ID[lowered.id] = lowered
        return lowered

    def _lower_with_backward(self, call, avals):
        """A forward that also returns jax.vjp's residuals, and the backward
        kernel that takes (residuals, output cotangents) to input gradients."""
        differentiable = [jax.numpy.issubdtype(a.dtype, jax.numpy.inexact) for a in avals]
        if not any(differentiable):
            raise RuntimeError(f"kernel {self.name}: no floating input to differentiate")
        trees = {}

        def forward(*dynamic):
            out, vjp = jax.vjp(call, *dynamic)
            leaves, trees["out"] = jax.tree_util.tree_flatten(out)
            residuals, trees["vjp"] = jax.tree_util.tree_flatten(vjp)
            trees["outputs"] = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
            return leaves + residuals

        try:
            fwd_id, fwd_outputs, _ = _register(self.name, forward, avals)
        except RuntimeError as e:
            raise RuntimeError(
                f"kernel {self.name} is called with inputs that require grad, and JAX cannot differentiate "
                f"it ({e.__cause__ or e}); give it a backward with jax.custom_vjp"
            ) from e
        n_out = len(trees["outputs"])

        def backward(*args):
            residuals, cts = args[: len(args) - n_out], args[len(args) - n_out:]
            cts = [c if jax.numpy.issubdtype(o.dtype, jax.numpy.inexact)
                   else jax.numpy.zeros(o.shape, jax.dtypes.float0) for c, o in zip(cts, trees["outputs"])]
            vjp = jax.tree_util.tree_unflatten(trees["vjp"], residuals)
            grads = vjp(jax.tree_util.tree_unflatten(trees["out"], cts))
            return [g for g, d in zip(grads, differentiable) if d]

        residual_avals = [jax.ShapeDtypeStruct(s, _jax_dtype(d)) for d, s in fwd_outputs[n_out:]]
        bwd_id, bwd_outputs, _ = _register(f"{self.name} (backward)", backward, residual_avals + trees["outputs"])
        _BY_ID[bwd_id] = _Lowered(f"{self.name} (backward)", bwd_id, bwd_outputs, None)
        return _Lowered(self.name, fwd_id, fwd_outputs, trees["out"], backward=(n_out, bwd_id, differentiable))

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self._in_graph(*args)
        if self._table is not None:
            out = _C.kernel_call(self._table, args)
            if out is not None:
                return out
        return self._run(*args)

    def _run(self, *args, concrete=False):
        tensors, key, grad, numbers = [], [], False, False
        static = self.static
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and (not static or i not in static):
                if a.device.type != "tpu":
                    raise ValueError(f"kernel {self.name}: argument {i} is on {a.device}; pass tpu tensors")
                tensors.append(a)
                key.append((a.dtype, tuple(map(int, a.shape)) if concrete else a.shape))
                grad = grad or a.requires_grad
            elif i in static or a is None:
                key.append(("static", a))
            elif type(a) in _NUMBERS:
                tensors.append(a)  # a runtime operand: a 0-dim tensor below
                key.append(_NUMBERS[type(a)])
                numbers = True
            else:
                raise TypeError(
                    f"kernel {self.name}: argument {i} is a {type(a).__name__}; pass tpu tensors, "
                    "Python numbers, None, or mark it static with static_argnums"
                )
        grad = grad and torch.is_grad_enabled()
        key = (tuple(key), grad)
        lowered = self._cache.get(key)
        if lowered is None:
            lowered = self._cache[key] = self._lower(args, grad)
            if self._table is not None and lowered.backward is None and lowered.single and not numbers:
                _C.kernel_table_put(self._table, args, lowered.id)
        if numbers:
            device = next((t.device for t in tensors if isinstance(t, torch.Tensor)), torch.device("tpu"))
            tensors = [t if isinstance(t, torch.Tensor) else torch.scalar_tensor(t, dtype=_NUMBERS[type(t)], device=device)
                       for t in tensors]
        if lowered.backward is None:
            outputs = _KERNEL(lowered.id, tensors)
        else:
            outputs = _DIFFERENTIABLE_KERNEL(lowered.id, tensors)[: lowered.backward[0]]
        for i, k in self.aliases.items():  # in-place kernels: the output becomes the input's value
            args[i].copy_(outputs[k])
            outputs[k] = args[i]
        return outputs[0] if lowered.single else jax.tree_util.tree_unflatten(lowered.out_tree, outputs)


def custom_jax_kernel(fn=None, *, static_argnums=(), input_output_aliases=None, name=None):
    """Decorates a JAX function (it may call `pallas_call`) so that it takes
    and returns tpu tensors. `static_argnums`: arguments that are Python
    values fixed at lowering (one lowering per value). `input_output_aliases`:
    {input index: output index} of an in-place kernel; the output is written
    into that input tensor, which is returned in its place."""
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if fn is None:
        return functools.partial(custom_jax_kernel, static_argnums=static_argnums,
                                 input_output_aliases=input_output_aliases, name=name)
    return _Kernel(fn, static_argnums, input_output_aliases or {}, name)


@torch.library.register_fake("torchtpu::kernel")
@torch.library.register_fake("torchtpu::differentiable_kernel")
def _fake(kernel, inputs):
    lowered = _BY_ID[kernel]
    device = inputs[0].device if inputs else torch.device("tpu")
    return [torch.empty(shape, dtype=dtype, device=device) for dtype, shape in lowered.outputs]


def _setup_context(ctx, inputs, output):
    ctx.lowered = _BY_ID[inputs[0]]
    ctx.device = output[0].device
    ctx.save_for_backward(*output[ctx.lowered.backward[0]:])  # the residuals


def _backward(ctx, grads):
    n_out, bwd_id, differentiable = ctx.lowered.backward
    cts = [g if g is not None else torch.zeros(shape, dtype=dtype, device=ctx.device)
           for g, (dtype, shape) in zip(grads[:n_out], ctx.lowered.outputs[:n_out])]
    computed = iter(_KERNEL(bwd_id, [*ctx.saved_tensors, *cts]))
    return None, [next(computed) if d else None for d in differentiable]


torch.library.register_autograd("torchtpu::differentiable_kernel", _backward, setup_context=_setup_context)
_KERNEL = torch.ops.torchtpu.kernel.default
_DIFFERENTIABLE_KERNEL = torch.ops.torchtpu.differentiable_kernel.default

_helion.install(custom_jax_kernel, _C.platform()[0])
