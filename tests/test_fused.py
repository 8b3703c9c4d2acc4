"""Fused mode: one program per training step, cache keys that ignore values,
state kept exact across flushes, the persistent cache and the diagnostics."""
import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchtpu
from conftest import synced

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))
from workloads import WORKLOADS, mlp_batches, train  # noqa: E402


@pytest.fixture(autouse=True)
def fused():
    with torchtpu.mode("fused"):
        yield


def per_step(workload, measure, steps=5, **options):
    """`measure(before, now)` of the metrics around each step of an
    unmodified training loop, and its losses."""
    deltas = []
    torchtpu.reset_metrics()
    before = torchtpu.metrics()

    def on_step(step, *_):
        nonlocal before
        now = torchtpu.metrics()
        deltas.append(measure(before, now))
        before = now

    return deltas, train(workload, "tpu", steps, on_step=on_step, **options)


def step_deltas(workload, steps=5, **options):
    """Per step: (programs executed, compilations, CPU fallbacks) during it."""
    def measure(before, now):
        return (now["executions"] - before["executions"], now["compilations"] - before["compilations"],
                sum(now["fallbacks"].values()) - sum(before["fallbacks"].values()))

    return per_step(workload, measure, steps, **options)[0]


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_steps_met_again_replay(workload):
    """Reading the loss after optimizer.step(): from step 3 on, each step is
    one program, launched as the step before it without lowering its trace
    (same ops, wired the same way, the same values held), compiling nothing,
    falling back to nothing, with CPU's losses. Reading the loss before the
    step splits it in two programs: those replay too, after lowering each
    new split once."""
    # Dropout off (both devices compute the same function); the learning
    # rates that keep CPU's losses within rounding (test_training).
    options = dict(dropout=0.0) if workload == "transformer" else {}
    lr = {"mlp": 1e-4, "transformer": 1e-4, "cnn": 0.005}[workload]
    for read_first in (False, True):
        deltas, losses = per_step(
            workload, lambda b, n: tuple(n[k] - b[k] for k in ("fused_replays", "executions", "compilations"))
            + (sum(n["fallbacks"].values()) - sum(b["fallbacks"].values()),),
            6, lr=lr, read_loss_before_step=read_first, **options)
        flushes = 2 if read_first else 1
        assert deltas[2:] == [(flushes, flushes, 0, 0)] * 4, (read_first, deltas)
        expected = train(workload, "cpu", 6, lr, read_loss_before_step=read_first, **options)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-4, atol=0)


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_a_scheduled_learning_rate_keeps_one_program_per_step(workload):
    """A learning rate changed every step by a scheduler: after step 2, each
    step is still one program, compiles nothing and falls back to nothing."""
    deltas = step_deltas(workload, schedule=True)
    assert deltas[2:] == [(1, 0, 0)] * (len(deltas) - 2), deltas


def test_a_step_that_differs_is_lowered_again():
    """A value held in one step and not the next changes the program's
    outputs: that step misses the replays and is lowered, with the same
    values either way."""
    w = torch.randn(64, 64, device="tpu")
    x = torch.randn(8, 64, device="tpu")
    expected_w, expected_x = w.cpu(), x.cpu()
    kept = []
    torchtpu.reset_metrics()
    for i in range(8):
        h = torch.tanh(x @ w)
        y = h * 2 + 1
        if i % 3 == 2:
            kept.append(h)  # h outlives the flush: an output of this step only
        w.sub_(y.t() @ x * 1e-3)
        torch.tpu.synchronize()
        eh = torch.tanh(expected_x @ expected_w)
        if i % 3 == 2:
            torch.testing.assert_close(kept[-1].cpu(), eh)
        expected_w = expected_w - (eh * 2 + 1).t() @ expected_x * 1e-3
    torch.testing.assert_close(w.cpu(), expected_w, rtol=1e-4, atol=1e-5)
    m = torchtpu.metrics()
    # Two kinds of step (h kept or not): each lowered once or twice, the rest replayed.
    assert m["fused_replays"] >= 4 and m["fused_replays"] + m["fused_cache_misses"] <= 8, m


def test_dropout_never_recompiles():
    """Random keys are program inputs: dropout in train mode recompiles nothing."""
    deltas = step_deltas("transformer", dropout=0.1)
    assert [c for _, c, _ in deltas[2:]] == [0] * (len(deltas) - 2), deltas


def test_partial_final_batch_compiles_at_most_once_more():
    xs, ys = mlp_batches(6)
    xs[-1], ys[-1] = xs[-1][:50], ys[-1][:50]
    deltas = step_deltas("mlp", steps=6, batches=(xs, ys))
    assert [c for _, c, _ in deltas[2:-1]] == [0] * 3 and deltas[-1][1] <= 1, deltas


def test_optimizer_updates_are_donated():
    """Parameters and optimizer state are updated in place: the step's program
    takes their old buffers, and the live buffer count stays flat (but for
    scalars seen the first time: AdamW's per-step values enter the scalar
    cache, which earlier tests may have filled)."""
    params = 8  # 4 Linear layers
    live = []

    def on_step(step, *_):
        torch.tpu.synchronize()
        m = torchtpu.metrics()
        live.append(m["live_buffers"] - m["cached_scalars"])

    torchtpu.reset_metrics()
    train("mlp", "tpu", 5, on_step=on_step)
    # weight, exp_avg, exp_avg_sq per parameter from step 2 on, at least.
    assert torchtpu.metrics()["donated_buffers"] >= 3 * params * 3
    assert live[2:] == [live[2]] * 3, live


STEPS_UNREAD = """
    import torch, torchtpu
    from workloads import WORKLOADS, _flat_cross_entropy
    w = WORKLOADS["mlp"]
    torch.manual_seed(0)
    net = w.model().to("tpu")
    opt = w.optimizer(net.parameters(), w.lr)
    xs, ys = w.batches(5)
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss = _flat_cross_entropy(net(x.to("tpu")), y.to("tpu"))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    m = torchtpu.metrics()
    print(repr(([l.item() for l in losses], m["overlapped_flushes"], m["compilations"], m["donated_buffers"],
                m["live_buffers"])))
"""


def test_step_flushes_overlap_the_next_steps_recording(tmp_path):
    """A loop that reads its losses only at the end: the first two steps
    (two programs: AdamW's first step makes its state) are flushed on the
    flush thread while the next step records, reading the values they
    compute; the later ones, met before, on the main thread. Losses,
    programs, donations and live buffers are those of the same loop flushed
    on the main thread throughout, losses those of CPU."""
    runs = [run_script(tmp_path, STEPS_UNREAD, TORCHTPU_CACHE_DIR="", TORCHTPU_OVERLAP=overlap).stdout.splitlines()[-1]
            for overlap in ("1", "0")]
    (losses, overlapped, *counts), (serial_losses, none, *serial_counts) = map(ast.literal_eval, runs)
    assert (overlapped, none) == (2, 0) and counts == serial_counts and losses == serial_losses, runs
    torch.testing.assert_close(losses, train("mlp", "cpu", 5), rtol=1e-4, atol=1e-5)


def test_views_and_inplace_across_flushes():
    base = torch.randn(6, 8)
    t = base.to("tpu")
    ref = base.clone()
    for x in (t, ref):
        v = x[1:5, ::2]
        v.mul_(2)
        x.t()[3].add_(1)
    torch.tpu.synchronize()
    for x in (t, ref):
        w = x.view(2, 3, 8)[:, 1]
        w.sub_(x[0])
        x.diagonal().zero_()
    torch.testing.assert_close(t.cpu(), ref)


def test_flush_reasons_are_counted():
    torchtpu.reset_metrics()
    x = torch.ones(4, device="tpu") * 3
    x.sum().item()
    y = x + 1
    torch.tpu.synchronize()
    z = y * 2
    torch.linalg.eigvals(z.reshape(2, 2))  # no tpu lowering: runs on the CPU
    flushes = torchtpu.metrics()["flushes"]
    assert flushes.get("host_read", 0) >= 1 and flushes.get("synchronize") == 1, flushes
    assert flushes.get("cpu_fallback") == 1, flushes


def test_data_dependent_error_surfaces_where_the_host_waits():
    x = torch.ones(4, 2, device="tpu")
    bad = x.index_select(0, torch.tensor([1, 4], device="tpu"))  # recorded, not yet run
    with pytest.raises(IndexError, match="index out of range in self"):
        synced(lambda: bad)
    torch.testing.assert_close((x * 2).cpu(), torch.full((4, 2), 2.0))


def run_script(tmp_path, code, **env):
    """Runs `code` as a script file in a fresh interpreter; returns the
    finished process (asserting it exited cleanly)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(EXAMPLES), **env))
    assert out.returncode == 0, out.stderr
    return out


TRAIN_AND_REPORT = """
    import torch, torchtpu
    from workloads import train
    losses = train("mlp", "tpu", 3)
    m = torchtpu.metrics()
    print(m["compilations"], m["disk_cache_hits"], repr(losses))
"""


def test_second_process_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    first = run_script(tmp_path, TRAIN_AND_REPORT, TORCHTPU_CACHE_DIR=str(cache)).stdout.split(maxsplit=2)
    second = run_script(tmp_path, TRAIN_AND_REPORT, TORCHTPU_CACHE_DIR=str(cache)).stdout.split(maxsplit=2)
    assert int(first[0]) > 0 and int(second[0]) == 0, (first, second)
    assert int(second[1]) == int(first[0])
    assert second[2] == first[2]


def test_corrupt_cache_entries_are_recompiled(tmp_path):
    cache = tmp_path / "cache"
    first = run_script(tmp_path, TRAIN_AND_REPORT, TORCHTPU_CACHE_DIR=str(cache)).stdout.split(maxsplit=2)
    entries = sorted(cache.glob("*.xla"), key=lambda p: p.stat().st_size)
    truncated, flipped = entries[-1], entries[-2]
    truncated.write_bytes(truncated.read_bytes()[:1000])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    out = run_script(tmp_path, TRAIN_AND_REPORT, TORCHTPU_CACHE_DIR=str(cache))
    second = out.stdout.split(maxsplit=2)
    assert int(second[0]) == 2 and second[2] == first[2], (first, second)
    assert "truncated" in out.stderr and "checksum mismatch" in out.stderr, out.stderr
    assert "recompiling and replacing it" in out.stderr
    third = run_script(tmp_path, TRAIN_AND_REPORT, TORCHTPU_CACHE_DIR=str(cache)).stdout.split(maxsplit=2)
    assert int(third[0]) == 0, third


def test_cache_directory_stays_within_its_bound(tmp_path):
    cache = tmp_path / "cache"
    run_script(tmp_path, TRAIN_AND_REPORT, TORCHTPU_CACHE_DIR=str(cache), TORCHTPU_CACHE_SIZE_MB="1")
    sizes = [p.stat().st_size for p in cache.glob("*.xla")]
    assert sum(sizes) <= 1 << 20, sizes


def test_loaded_programs_stay_within_their_bound(tmp_path):
    """Each loaded executable holds memory mappings of its own: a process
    that compiles without bound reaches the kernel's limit and crashes. An
    evicted program comes back from the disk cache, not a compilation."""
    out = run_script(tmp_path, """
        import os, torch, torchtpu
        maps = lambda: sum(1 for _ in open(f"/proc/{os.getpid()}/maps"))
        def run(n):
            with torchtpu.mode("strict"):
                return (torch.arange(n, device="tpu") * 2 + 1).tolist()
        for n in range(1, 21):
            run(n)
        before, compiled = maps(), torchtpu.metrics()["compilations"]
        for n in range(21, 121):
            assert run(n) == [2 * i + 1 for i in range(n)]
        assert run(1) == [1] and run(2) == [1, 3]
        m = torchtpu.metrics()
        print(maps() - before, m["programs_evicted"], m["compilations"] - compiled, m["disk_cache_hits"])
    """, TORCHTPU_MAX_PROGRAMS="16", TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    grown, evicted, compiled, disk_hits = map(int, out.stdout.split())
    assert evicted >= 300 - 16 and compiled == 300, out.stdout  # 3 programs per n, run(1), run(2) from disk
    assert disk_hits >= 6, out.stdout
    assert grown < 100, out.stdout  # 300 programs unbounded: ~900 mappings


RECOMPILE_BY_ROWS = """
import torch, torchtpu
w = torch.randn(8, 8, device="tpu")
for rows in (4, 4, 6):
    x = torch.randn(rows, 8).to("tpu")
    y = (x @ w).relu()
    y.sum().item()
print(torchtpu.metrics()["recompile_reasons"][-1])
"""
RECOMPILE_ENV = dict(TORCHTPU_LOG="1", TORCHTPU_CACHE_DIR="", TORCHTPU_DYNAMIC="0")  # a static recompile


def test_recompilation_is_explained_with_the_source_line(tmp_path):
    out = run_script(tmp_path, RECOMPILE_BY_ROWS, **RECOMPILE_ENV)
    reason = out.stdout.strip()
    assert "op 0 differs" in reason and "aten::mm" in reason, reason
    assert "(f32[6, 8], f32[8, 8]" in reason.split(" here")[0], reason
    assert "(f32[4, 8], f32[8, 8]" in reason.split(" here")[1].split(" there")[0], reason
    assert "script.py:6" in reason, reason
    assert "new fused program" in out.stderr


def test_recompilation_of_python_c_names_its_line():
    out = subprocess.run([sys.executable, "-c", RECOMPILE_BY_ROWS], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, **RECOMPILE_ENV))
    assert out.returncode == 0, out.stderr
    assert "at <string>:6" in out.stdout, out.stdout


def test_recompilation_by_a_view_offset_says_the_types_are_the_same(tmp_path):
    """Ops whose types match but whose plans differ (here a view's offset)
    are not described as two different signatures."""
    out = run_script(tmp_path, """
        import torch, torchtpu
        x = torch.randn(40, device="tpu")
        x.sum().item()
        for i in (0, 7):
            (x[i:i + 5] * 2).sum().item()
        print(torchtpu.metrics()["recompile_reasons"][-1])
    """, TORCHTPU_CACHE_DIR="", TORCHTPU_DYNAMIC="0")
    reason = out.stdout.strip()
    assert "in both, with other values of its non-tensor arguments" in reason, reason
    assert " here, " not in reason, reason


def test_dump_dir_receives_each_new_program(tmp_path):
    """The dumped program also shows what a flush keeps: its outputs are the
    values still alive (x and the sum), not the dead intermediates."""
    dump = tmp_path / "dump"
    run_script(tmp_path, """
        import torch
        x = torch.randn(5, device="tpu")
        print((x.exp() + 1).sum().item())
    """, TORCHTPU_DUMP_DIR=str(dump), TORCHTPU_CACHE_DIR="")
    programs = [p.read_text() for p in dump.glob("fused_program-*.mlir")]
    assert len(programs) == 1, os.listdir(dump)
    assert "stablehlo.exponential" in programs[0]
    assert "-> (tensor<5xf32>, tensor<1xf32>)" in programs[0], programs[0]  # values are kept flat


def test_an_unread_loop_is_cut_into_whole_iterations(tmp_path):
    """A loop that never reads its values is cut by the size bound where an
    iteration begins: its parts are one program met again and again (plus
    the first and the last), with CPU's values."""
    out = run_script(tmp_path, """
        import torch, torchtpu
        torch.manual_seed(0)
        w, x0 = torch.randn(32, 32) * 0.1, torch.randn(4, 32)
        def run(device):
            x, ww, outs = x0.to(device), w.to(device), []
            for _ in range(300):
                x = torch.tanh(x @ ww) + 0.5
                outs.append(x.sum())
            return torch.stack(outs).cpu()
        expected = run("cpu")
        torchtpu.reset_metrics()
        torch.testing.assert_close(run("tpu"), expected)
        m = torchtpu.metrics()
        print(m["compilations"], m["flushes"]["size_limit"], m["fused_replays"])
    """, TORCHTPU_FUSE_LIMIT="200", TORCHTPU_CACHE_DIR="")
    compilations, parts, replays = map(int, out.stdout.split())
    assert parts >= 20 and compilations <= 3 and replays >= parts - 3, out.stdout


def test_a_long_step_runs_in_parts_met_again(tmp_path):
    """Where the device is not the host's cores, a long step is flushed in
    parts so that the device starts on one while Python records the next
    (TORCHTPU_PART_OPS; off by default on XLA:CPU). The cuts fall at the same
    ops every step: from step 3 each part replays, nothing compiles, and the
    losses are CPU's."""
    out = run_script(tmp_path, """
        import json, torch, torchtpu
        from workloads import train
        deltas, before = [], [torchtpu.metrics()]
        def on_step(*_):
            now = torchtpu.metrics()
            deltas.append([now[k] - before[0][k] for k in ("executions", "fused_replays", "compilations")])
            before[0] = now
        losses = train("transformer", "tpu", 6, 1e-4, on_step=on_step, dropout=0.0)
        print(json.dumps([deltas, losses, torchtpu.metrics()["flushes"].get("part", 0)]))
    """, TORCHTPU_PART_OPS="64", TORCHTPU_PART_FLOPS="0", TORCHTPU_CACHE_DIR="")
    deltas, losses, parts = json.loads(out.stdout)
    executions = deltas[2][0]
    assert executions >= 3 and parts >= 6 * (executions - 1), out.stdout
    assert deltas[2:] == [[executions, executions, 0]] * 4, deltas
    expected = train("transformer", "cpu", 6, 1e-4, dropout=0.0)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-4, atol=0)


def test_a_step_of_few_products_is_not_cut(tmp_path):
    """A part must hold products worth a cut (TORCHTPU_PART_FLOPS, default
    2^38): a small model's step stays one program however many ops it has."""
    out = run_script(tmp_path, """
        import torch, torchtpu
        from workloads import train
        train("transformer", "tpu", 3, 1e-4, dropout=0.0)
        print(torchtpu.metrics()["flushes"].get("part", 0), torchtpu.metrics()["executions"])
    """, TORCHTPU_PART_OPS="64", TORCHTPU_CACHE_DIR="")
    parts, executions = map(int, out.stdout.split()[-2:])
    assert parts == 0 and executions <= 6, out.stdout


def test_a_one_op_step_is_not_cut_at_each_repeat():
    """A step of a single op read once does not make every later use of that
    op a flush of its own (fused mode would run as strict)."""
    a, b = torch.ones(4, device="tpu"), torch.ones(4, device="tpu")
    out = a + b
    torch.tpu.synchronize()
    torchtpu.reset_metrics()
    for _ in range(100):
        out = a + b
    torch.tpu.synchronize()
    m = torchtpu.metrics()
    assert "step_repeat" not in m["flushes"] and m["executions"] == 1, m
    assert out.tolist() == [2.0] * 4


def test_an_unread_loop_runs_the_programs_of_a_read_one():
    """A step met before that begins again unread is flushed there: a loop
    that synchronizes only at its end replays the program its synchronized
    steps compiled, compiling nothing, with CPU's values."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    x = torch.randn(4, 32)
    tnet, tx = net.to("tpu"), x.to("tpu")
    state = torch.zeros(4, 8, device="tpu")

    def forward(net, x, state):
        with torch.no_grad():
            state.add_(net(x).tanh())

    for _ in range(3):
        forward(tnet, tx, state)
        torch.tpu.synchronize()
    torchtpu.reset_metrics()
    for _ in range(20):
        forward(tnet, tx, state)
    torch.tpu.synchronize()
    m = torchtpu.metrics()
    assert m["compilations"] == 0 and m["flushes"]["step_repeat"] == 19, m
    assert m["fused_replays"] == 20, m
    expected = torch.zeros(4, 8)
    for _ in range(23):
        forward(net.cpu(), x, expected)
    torch.testing.assert_close(state.cpu(), expected)


def test_size_bound_splits_long_traces(tmp_path):
    out = run_script(tmp_path, """
        import torch, torchtpu
        x = torch.randn(16)
        y = x.to("tpu")
        for _ in range(200):
            x, y = x * 0.5 + 1, y * 0.5 + 1
        assert torch.equal(y.cpu(), x)
        print(torchtpu.metrics()["flushes"].get("size_limit", 0))
    """, TORCHTPU_FUSE_LIMIT="100", TORCHTPU_CACHE_DIR="")
    assert int(out.stdout) >= 3, out.stdout
