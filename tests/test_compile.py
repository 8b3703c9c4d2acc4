"""torch.compile on tpu: Dynamo graphs lowered by the op table into one
program per graph, against CPU eager."""
import os
import re
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo.testing
from torch.testing._internal.common_methods_invocations import op_db

import torchtpu
from test_fused import run_script

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))
from workloads import GPT, train  # noqa: E402

LEARNING_RATES = {"mlp": 1e-4, "transformer": 1e-4, "cnn": 0.005}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torchtpu.reset_metrics()
    yield
    assert torchtpu.metrics()["fallbacks"] == {}


def compiled_metrics():
    m = torchtpu.metrics()
    return {k: m[k] for k in ("compiled_graphs", "compiled_graph_captures", "compiled_graph_calls", "eager_graphs")}


@pytest.mark.parametrize("workload,mode", [("mlp", "fused"), ("mlp", "strict"), ("transformer", "fused"),
                                           ("cnn", "fused")])
def test_compiled_training_matches_cpu(workload, mode):
    """Model and optimizer step compiled (plain torch.compile, no backend
    named): forward, backward and the optimizer's graph each become one
    program, captured once; losses, parameters and BatchNorm statistics are
    CPU eager's."""
    steps, lr = 4, LEARNING_RATES[workload]
    options = dict(dropout=0.0) if workload == "transformer" else {}
    kept = {}

    def keep(device):
        def on_step(step, net, opt, batch):
            kept[device] = {k: v.detach().cpu() for k, v in net.state_dict().items()}
        return on_step

    cpu = train(workload, "cpu", steps, lr, on_step=keep("cpu"), **options)
    with torchtpu.mode(mode):
        tpu = train(workload, "tpu", steps, lr, compile=True, on_step=keep("tpu"), **options)
    torch.testing.assert_close(torch.tensor(tpu), torch.tensor(cpu), rtol=1e-4, atol=0)
    # A ReLU whose input is within float32 rounding of zero (-6e-8 on CPU,
    # +4e-8 on XLA:CPU, met at the MLP's third step) passes one gradient
    # that CPU's does not, and AdamW, which normalises each update, moves
    # those weights by up to a learning rate: the MLP's parameters agree to
    # two of them. The smooth workloads agree to 1e-5.
    atol = 2 * lr if workload == "mlp" else 1e-5
    for name, value in kept["cpu"].items():
        torch.testing.assert_close(kept["tpu"][name], value, rtol=1e-4, atol=atol, msg=name)
    m = compiled_metrics()
    assert m["eager_graphs"] == {}
    # forward, backward, optimizer step (SGD's first step, which creates its
    # momentum buffers, is a graph of its own)
    assert m["compiled_graphs"] == (4 if workload == "cnn" else 3), m
    assert m["compiled_graph_captures"] == m["compiled_graphs"], m
    assert m["compiled_graph_calls"] == 3 * steps, m


def test_compiled_call_is_one_program():
    """Inference of the GPT at batch 1: one graph; its call records one op
    and runs one program (strict), or joins the trace with the eager code
    around it (fused: one program for all of it)."""
    torch.manual_seed(0)
    net = GPT(vocab=64, seq=16, d=32, heads=2, layers=2).eval()
    idx = torch.randint(0, 64, (1, 16))
    expected = net(idx)
    net.to("tpu")
    compiled = torch.compile(net)
    explained = torch._dynamo.explain(net)(idx.to("tpu"))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx.to("tpu")).cpu(), expected.detach(), rtol=1e-4, atol=1e-5)
        x = idx.to("tpu")
        with torchtpu.mode("strict"):
            before = torchtpu.metrics()
            out = compiled(x)
            after = torchtpu.metrics()
        assert after["ops"] - before["ops"] == 1
        assert after["executions"] - before["executions"] == 1
        torch.testing.assert_close(out.cpu(), expected.detach(), rtol=1e-4, atol=1e-5)
        torch.tpu.synchronize()
        before = torchtpu.metrics()
        y = (compiled(x * 1) * 2).softmax(-1)
        torch.testing.assert_close(y.cpu(), (expected.detach() * 2).softmax(-1), rtol=1e-4, atol=1e-6)
        after = torchtpu.metrics()
        assert after["executions"] - before["executions"] == 1
        assert after["compiled_graph_captures"] == 1
        # A call read once, then a loop of calls read only at its end: each
        # call runs the read call's program (a one-op step of a compiled
        # graph is a step met), not a new program fusing calls in pairs.
        compiled(x).cpu()
        torchtpu.reset_metrics()
        outs = [compiled(x) for _ in range(5)]
        torch.tpu.synchronize()
        m = torchtpu.metrics()
        assert (m["compilations"], m["executions"], m["fused_replays"]) == (0, 5, 5), m
        assert m["flushes"]["step_repeat"] == 4, m
        for out in outs:
            torch.testing.assert_close(out.cpu(), expected.detach(), rtol=1e-4, atol=1e-5)


def test_dropout_draws_fresh_masks_without_recompiling():
    drop = torch.compile(torch.nn.Dropout(0.5))
    x = torch.ones(4000, device="tpu")
    masks = [drop(x).cpu() != 0 for _ in range(3)]
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    for m in masks:
        assert 0.45 < m.float().mean().item() < 0.55
    assert compiled_metrics()["compiled_graph_captures"] == 1
    torch.manual_seed(7)
    a = drop(x).cpu()
    torch.manual_seed(7)
    assert torch.equal(drop(x).cpu(), a), "the tpu generator's seed decides the masks"


def test_lr_schedule_and_partial_batch():
    """A tensor learning rate changed by a scheduler never recompiles; a
    partial last batch costs at most one more graph."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to("tpu")
    opt = torch.optim.AdamW(net.parameters(), lr=torch.tensor(0.01))
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    model, step = torch.compile(net, backend=counter), torch.compile(opt.step, backend=counter)
    for batch in [16] * 5 + [5]:
        loss = model(torch.randn(batch, 8, device="tpu")).square().mean()
        loss.backward()
        step()
        opt.zero_grad()
        sched.step()
        if batch == 16:
            frames, captures = counter.frame_count, compiled_metrics()["compiled_graph_captures"]
    assert counter.frame_count <= frames + 1
    assert compiled_metrics()["compiled_graph_captures"] <= captures + 2  # the new graph's forward and backward
    assert compiled_metrics()["eager_graphs"] == {}


def test_outputs_aliasing_inputs_are_views():
    def f(x, y):
        x.add_(1)
        return x.t(), x[1:], y * 2, y

    compiled = torch.compile(f, backend="tpu")
    base = torch.arange(12.0).reshape(3, 4)
    x, y = base.clone().to("tpu"), torch.ones(3, device="tpu")
    xt, rest, doubled, same = compiled(x, y)
    torch.testing.assert_close(x.cpu(), base + 1)
    assert xt.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert rest.storage_offset() == 4 and same.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    x.zero_()
    assert xt.cpu().abs().sum().item() == 0  # a true view sees the write
    torch.testing.assert_close(doubled.cpu(), torch.full((3,), 2.0))


def test_views_of_results_laid_out_otherwise_on_cpu():
    """The trace follows CPU's stride rules (an elementwise result keeps a
    transposed input's order, so transposing it back is viewable); tpu's
    results are contiguous, and the graph's views of them still work."""
    def f(x):
        y = x.transpose(1, 2) * 2
        return y.transpose(1, 2).view(2, 15, 8) + 1

    x = torch.randn(2, 5, 3, 8)
    out = torch.compile(f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x))
    assert torchtpu.metrics()["eager_graphs"] == {}


def test_inputs_sharing_a_storage():
    """Views of one storage are one parameter; a write through one is seen
    through the other, and a view with an offset is written in place."""
    def f(a, b):
        a.mul_(2)
        return a + b

    compiled = torch.compile(f, backend="tpu")
    for offset in (0, 2):
        base_cpu = torch.arange(10.0)
        base = base_cpu.to("tpu")
        out = compiled(base[offset:offset + 4], base[6:])
        expected = f(base_cpu[offset:offset + 4], base_cpu[6:])
        torch.testing.assert_close(out.cpu(), expected)
        torch.testing.assert_close(base.cpu(), base_cpu)


def test_a_dropped_graph_frees_its_constant_tensors():
    """A tensor a graph makes (here `torch.tensor(3.0)`) is a constant of its
    program. Fused mode remembers the steps it met (replays, recompilation
    explanations), but not what they held: the constant goes with the graph."""
    import gc

    def device_buffers():
        gc.collect()
        torch.tpu.synchronize()
        m = torchtpu.metrics()
        return m["live_buffers"] - m["cached_scalars"], m["live_storages"]

    before = device_buffers()
    layer = torch.nn.Linear(16, 16).to("tpu")
    compiled = torch.compile(lambda x: layer(x) + torch.tensor(3.0, device=x.device), backend="tpu")
    x = torch.randn(4, 16, device="tpu")
    for _ in range(3):  # captured, then replayed
        y = compiled(x)
        torch.testing.assert_close(y.cpu(), layer(x).cpu() + 3)
    del compiled, layer, x, y
    torch._dynamo.reset()
    assert device_buffers() == before


def test_graph_that_reads_values_runs_op_by_op():
    """A value read on the host inside a graph (captured scalar outputs)
    cannot be one program: the graph runs op by op, reported, and right."""
    def f(x):
        n = x.sum().item()  # an integer: Dynamo cannot turn it back into a tensor op
        return x * n

    x = torch.arange(4)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        out = torch.compile(f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x))
    assert len(compiled_metrics()["eager_graphs"]) == 1


def test_linear_algebra_with_its_checks_compiles():
    """`linalg.solve`, `inv` and `cholesky` end with a check AOTAutograd
    orders by an effect token (None when the graph runs): CPU's values and
    gradients, and for a singular matrix what AOTAutograd gives on CPU: its
    error, raised by the call (torch 2.11's drops the check)."""
    def f(a, b):
        spd = a @ a.mT + torch.eye(4, device=a.device)
        return torch.linalg.solve(a, b) + torch.linalg.inv(a) @ b + torch.linalg.cholesky(spd) @ b

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 4, 4, generator=g), torch.randn(2, 4, 3, generator=g)
    tpu = [t.to("tpu").requires_grad_() for t in (a, b)]
    cpu = [t.clone().requires_grad_() for t in (a, b)]
    compiled = torch.compile(f, backend="tpu")
    out = compiled(*tpu)
    out.sum().backward()
    f(*cpu).sum().backward()
    torch.testing.assert_close(out.cpu(), f(a, b), rtol=1e-4, atol=1e-4)
    for t, c in zip(tpu, cpu):
        torch.testing.assert_close(t.grad.cpu(), c.grad, rtol=1e-4, atol=1e-4)
    singular = a.clone()
    singular[1] = 0
    try:
        expected = torch.compile(f, backend="aot_eager")(singular, b)
    except torch.linalg.LinAlgError as e:
        with pytest.raises(torch.linalg.LinAlgError, match=re.escape(str(e))):
            compiled(singular.to("tpu"), b.to("tpu"))
    else:
        torch.testing.assert_close(compiled(singular.to("tpu"), b.to("tpu")).cpu(), expected, equal_nan=True)


def test_graph_break_runs_in_eager_mode():
    def f(x):
        y = x.sin()
        print("a graph break")  # noqa: T201
        return y.cos()

    x = torch.randn(5)
    explained = torch._dynamo.explain(f)(x.to("tpu"))
    assert explained.graph_break_count == 1
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x.to("tpu")).cpu(), f(x))


# PyTorch's OpInfo samples through torch.compile: the lowering of each op
# reached from an FX graph, its views and layouts, against CPU eager.
OPS = ["add", "mul", "div", "where", "clamp", "softmax", "log_softmax", "matmul", "bmm", "addmm", "sum", "mean",
       "amax", "var", "cumsum", "cat", "stack", "split", "chunk", "transpose", "permute", "reshape", "expand",
       "narrow", "index_select", "gather", "scatter_add", "masked_fill", "nn.functional.gelu",
       "nn.functional.silu", "nn.functional.layer_norm", "nn.functional.embedding", "nn.functional.conv2d",
       "nn.functional.max_pool2d", "nn.functional.cross_entropy", "sort", "topk", "tril", "flip", "roll", "pow",
       "atan2", "erf", "rsqrt", "argmax", "nn.functional.pad", "unbind", "diagonal", "repeat", "outer"]


@pytest.mark.parametrize("name", OPS)
def test_opinfo_samples_compiled(name):
    info = next(o for o in op_db if o.name == name)
    samples = list(info.sample_inputs("cpu", torch.float32, requires_grad=False))[:2]
    to = lambda v, device: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
    tree = torch.utils._pytree.tree_map
    for s in samples:
        def f(inp, *args, **kwargs):
            return info.op(inp, *args, **kwargs)

        expected = f(s.input, *s.args, **s.kwargs)
        torch._dynamo.reset()
        got = torch.compile(f, backend="tpu")(*tree(lambda v: to(v, "tpu"), (s.input, *s.args)),
                                              **tree(lambda v: to(v, "tpu"), s.kwargs))
        torch.testing.assert_close(tree(lambda v: to(v, "cpu"), got), expected, rtol=1e-4, atol=1e-5)
    assert compiled_metrics()["eager_graphs"] == {}


COMPILED_STEPS = """
    import torch, torchtpu
    from workloads import train
    with torchtpu.mode("strict"):
        losses = train("mlp", "tpu", 3, compile=True)
    m = torchtpu.metrics()
    print(m["compilations"], m["disk_cache_hits"], m["compiled_graph_captures"], repr(losses))
"""


def test_second_process_compiles_no_graph(tmp_path):
    """The persistent cache serves compiled graphs' programs as it serves
    eager ones; their StableHLO is dumped like any new program's."""
    cache, dump = tmp_path / "cache", tmp_path / "dump"
    env = dict(TORCHTPU_CACHE_DIR=str(cache), TORCHTPU_DUMP_DIR=str(dump))
    first = run_script(tmp_path, COMPILED_STEPS, **env).stdout.split(maxsplit=3)
    second = run_script(tmp_path, COMPILED_STEPS, **env).stdout.split(maxsplit=3)
    assert int(first[0]) > 0 and first[2] == "3", first
    assert int(second[0]) == 0 and int(second[1]) > 0, second
    assert first[3] == second[3]
    dumped = {p.name.split("-")[0]: p.read_text() for p in dump.glob("compiled_graph_*.mlir")}
    assert len(dumped) == 3, os.listdir(dump)
    assert "stablehlo.dot_general" in dumped["compiled_graph_forward_0"]


def test_modes_and_module_compile():
    """Inductor's modes and Dynamo's options are accepted (every graph is
    one program, which is what "reduce-overhead" asks for), in debug mode
    too; `model.compile()` compiles in place."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    x = torch.randn(2, 4)
    expected = net(x).detach()
    net.to("tpu")
    with torchtpu.mode("debug"):
        for options in [dict(mode="reduce-overhead"), dict(mode="max-autotune"), dict(fullgraph=True),
                        dict(dynamic=True)]:
            torch._dynamo.reset()
            torch.testing.assert_close(torch.compile(net, **options)(x.to("tpu")).detach().cpu(), expected)
        net.compile()
        torch.testing.assert_close(net(x.to("tpu")).detach().cpu(), expected)
    assert compiled_metrics()["eager_graphs"] == {}


def test_cpu_graphs_keep_inductor():
    f = torch.compile(lambda x: (x.sin() + 1).sum())
    torch.testing.assert_close(f(torch.ones(8)), (torch.ones(8).sin() + 1).sum())
    assert compiled_metrics()["compiled_graphs"] == 0
