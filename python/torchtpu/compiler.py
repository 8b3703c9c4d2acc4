"""torch.compile on tpu: the Dynamo backend "tpu".

AOTAutograd turns Dynamo's graph into forward, backward or inference graphs
of ATen operators. Each becomes a `Graph`, which the core lowers through the
same op table as eager ops into one program per input signature: the first
call with a signature captures the graph (its ops run once on placeholders,
recorded, never executed; `exec/compiled.rs`), later calls run the program. A
graph that cannot be one program (it reads values on the host, or an op runs
on the CPU) runs op by op in the current eager mode, as code after a graph
break does.

Found through the `torch_dynamo_backends` entry point, so that nothing here
is imported until something is compiled.
"""
import functools
import itertools
import operator
import weakref

import torch

from . import _C

_ids = itertools.count()


def _optimizer_state_on_device():
    """Dynamo traces optimizers as capturable, so that their step counters
    live on the device, but creates fresh state on the device only for CUDA
    and XPU parameters: a tpu optimizer compiled before its first step would
    keep CPU step counters, which the step's graph writes (it could then not
    be one program). Parameters on tpu get what CUDA ones get."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    def fresh_on_tpu(self, group):
        params = group.get("params", [])
        on_tpu = bool(params) and all(p.device.type == "tpu" and p not in self.value.state for p in params)
        return "capturable" in group and on_tpu

    if hasattr(OptimizerVariable, "_safe_to_set_capturable"):
        generic = OptimizerVariable._safe_to_set_capturable

        def _safe_to_set_capturable(self, group):
            return generic(self, group) or fresh_on_tpu(self, group)

        OptimizerVariable._safe_to_set_capturable = _safe_to_set_capturable
    else:
        # Older Dynamo (torch 2.11) decides inside _set_capturable, where it
        # sets the flag on the live groups of CUDA and XPU parameters.
        generic_set = OptimizerVariable._set_capturable

        def _set_capturable(self, tx):
            for group in self.value.param_groups:
                if fresh_on_tpu(self, group):
                    group["capturable"] = True
            generic_set(self, tx)

        OptimizerVariable._set_capturable = _set_capturable


_optimizer_state_on_device()
# Kept in graphs although it returns nothing: it marks where a step ends.
torch.fx.node.has_side_effect(torch.ops.torchtpu.step_end.default)


def backend(gm, example_inputs, mode=None, options=None):
    """`torch.compile(model, backend="tpu")`; also what plain `torch.compile`
    uses for graphs on tpu. `mode` and `options` are accepted for
    Inductor's sake: every mode gets one XLA program per graph, which is
    what "reduce-overhead" asks for, and XLA tunes what "max-autotune" would."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    n = next(_ids)
    return aot_autograd(
        fw_compiler=functools.partial(_compile, name=f"forward_{n}"),
        bw_compiler=functools.partial(_compile, name=f"backward_{n}"),
        inference_compiler=functools.partial(_compile, name=f"inference_{n}"),
        # BatchNorm's running statistics and a compiled optimizer's updates
        # stay in the graph, done in place by donation.
        keep_inference_input_mutations=True,
        # The partitioner never recomputes random ops (dropout masks).
        partition_fn=min_cut_rematerialization_partition,
        decompositions=_decompositions(),
    )(gm, example_inputs)


@functools.cache
def _decompositions():
    """PyTorch's core decompositions, for the operators the op table does
    not lower (the others reach their lowering whole)."""
    lowered = set(_C.lowered_ops())

    def base(op):
        name = op.name().split("::")[-1].split(".")[0]
        return name[:-1] if name.endswith("_") and not name.endswith("__") else name

    table = torch._decomp.core_aten_decompositions()
    return {op: fn for op, fn in table.items() if base(op) not in lowered}


def _compile(gm, example_inputs, name):
    return Graph(gm, example_inputs, name)


class Graph:
    """One AOTAutograd graph, called with boxed arguments (a list it may
    empty, so that inputs are freed as early as possible)."""

    def __init__(self, gm, example_inputs, name):
        # An instance attribute: AOTAutograd's wrappers copy `__dict__`.
        self._boxed_call = True
        _views_as_reshapes(gm)
        _effects_in_order(gm)
        self.gm = gm
        self.name = name
        self.id = _C.graph_new(name)
        weakref.finalize(self, _C.graph_free, self.id)
        # Inputs the graph no longer reads (effect tokens) are not passed.
        used = [bool(p.users) for p in gm.graph.find_nodes(op="placeholder")]
        self.n_inputs = len(example_inputs)
        self.tensors = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and used[i]]
        self.numbers = [i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)]
        outputs = gm.graph.output_node().args[0]
        self.n_outputs = len(outputs)
        self.outputs = [i for i, o in enumerate(outputs) if isinstance(_value(o), torch.Tensor)]
        # Sizes the graph returns (saved for a dynamic-shape backward): read
        # from the inputs at each call, as (output position, getter).
        inputs = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
        self.sizes = []
        # Why this graph runs op by op (None: it is one program).
        self.eager = None
        for i, o in enumerate(outputs):
            if o is None or i in self.outputs:
                continue
            getter = _size_getter(o, inputs)
            if getter is None:
                self.eager = f"it returns a {type(_value(o)).__name__} computed from sizes"
            self.sizes.append((i, getter))
        # A program's values are dense arrays; sparse tensors' ops run eagerly.
        if any(getattr(_value(n), "layout", torch.strided) != torch.strided for n in gm.graph.nodes):
            self.eager = "it computes sparse tensors"
        if self.eager:
            _C.graph_eager(name, self.eager)

    def __call__(self, args):
        if self.eager:
            return self.gm(*args)
        tensors = [args[i] for i in self.tensors]
        numbers = [args[i] for i in self.numbers]
        sizes = [(i, getter(args)) for i, getter in self.sizes]
        args.clear()
        try:
            outs = torch.ops.torchtpu.graph_call(self.id, tensors, numbers)
        except NotImplementedError:
            outs = self._capture(tensors, numbers)
            if outs is None:
                return self.gm(*self._arguments(tensors, numbers))
        if len(self.outputs) == self.n_outputs:
            return outs
        result = [None] * self.n_outputs
        for i, t in zip(self.outputs, outs):
            result[i] = t
        for i, size in sizes:
            result[i] = size
        return result

    def _arguments(self, tensors, numbers):
        args = [None] * self.n_inputs
        for i, t in zip(self.tensors, tensors):
            args[i] = t
        for i, x in zip(self.numbers, numbers):
            args[i] = x
        return args

    def _capture(self, tensors, numbers):
        """Lowers the graph for this signature; None if it cannot be one
        program (it then runs op by op from now on)."""
        placeholders = torch.ops.torchtpu.capture_begin(self.id, tensors, numbers)
        try:
            with torch.no_grad():
                outs = self.gm(*self._arguments(placeholders, numbers))
            torch.ops.torchtpu.capture_end([outs[i] for i in self.outputs])
        except Exception as e:  # noqa: BLE001 - any failure means: run it op by op
            _C.capture_abort()
            self.eager = str(e)
            _C.graph_eager(self.name, self.eager)
            return None
        except BaseException:  # an interrupt: the next call captures again
            _C.capture_abort()
            raise
        return torch.ops.torchtpu.graph_call(self.id, tensors, numbers)


def _views_as_reshapes(gm):
    """The graph was traced with CPU's stride rules, where an elementwise
    result keeps its input's dimension order; tpu's results are contiguous,
    so a view the trace found valid (`(x.transpose(1, 2) * 2).transpose(1,
    2).view(..)`) may not be at run time. Views become reshapes: the same
    view where the strides allow it, a copy where they do not (the graph is
    functional: nothing writes through them)."""
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default):
        node.target = torch.ops.aten.reshape.default
    gm.recompile()


def _effects_in_order(gm):
    """AOTAutograd threads a token through side-effectful ops
    (`with_effects`: the checks of `linalg.inv`, `solve`, `cholesky`) to keep
    their order, and passes None for it at run time, discarding the tokens
    returned. A graph here runs its ops in order anyway: each becomes its
    plain call, and each token None."""
    g = gm.graph
    for node in list(g.find_nodes(op="call_function", target=torch.ops.higher_order.with_effects)):
        _token, op, *args = node.args
        with g.inserting_before(node):
            call = g.call_function(op, tuple(args), node.kwargs)
        for user in list(node.users):
            i = user.args[1]
            if i == 0:
                user.replace_all_uses_with(None)
            elif len(node.meta.get("val", ())) == 2:
                user.replace_all_uses_with(call)
            else:
                with g.inserting_before(user):
                    user.replace_all_uses_with(g.call_function(operator.getitem, (call, i - 1)))
            g.erase_node(user)
        g.erase_node(node)
    gm.recompile()


def _value(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def _size_getter(node, inputs):
    """How to read an integer output from the call's inputs: an input
    itself, or a size of an input tensor (None: another expression)."""
    if not isinstance(node, torch.fx.Node):
        return lambda args: node
    if node in inputs:
        i = inputs[node]
        return lambda args: args[i]
    if node.target is torch.ops.aten.sym_size.int and node.args[0] in inputs:
        i, dim = inputs[node.args[0]], node.args[1]
        return lambda args: args[i].size(dim)
    return None
