"""One command for a GPU machine: the test suite on the GPU's PJRT plugin, the
checks a GPU user relies on, and step times side by side (tpu fused, strict
and compiled vs CUDA eager and Inductor), written to one report.

    python bench/gpu.py [--out gpu-report.md] [--workers 8] [--no-suite] [--quick]
                        [--pairs gpt:tpu-fused,op:jax-jit,...] [--math-attention] [--channels-last]

Every measurement and check runs in a process of its own: PyTorch holds one
accelerator per process, so a CUDA process never imports torchtpu (with
torchtpu installed, `import torch` leaves CUDA alone on a GPU machine, which
the checks verify). All processes run in the same order with the same float32
setting (`--precision`, default "high": TF32 on CUDA, and what XLA's dots get
on tpu). Without CUDA (a CPU machine) the reference column is PyTorch CPU
eager, the plugin is whatever torchtpu finds (the CPU plugin) and the CUDA-only
checks say they were skipped: the command runs as far as the machine goes.
"""
import argparse
import contextlib
import gc
import json
import operator
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# name: (what, full size, --quick size: the default without CUDA)
WORKLOADS = {
    "mlp": ("MLP train", dict(inputs=4096, width=8192, batch=1024), dict(inputs=256, width=512, batch=64)),
    "gpt": ("GPT train (full: ~135M)", dict(layers=8, d=1024, heads=16, seq=1024, batch=8, vocab=32768),
            dict(layers=2, d=128, heads=4, seq=64, batch=4, vocab=1024)),
    "cnn": ("ResNet-style CNN train, 32x32", dict(batch=64), dict(batch=8)),
    "infer": ("GPT inference, batch 1", dict(layers=8, d=1024, heads=16, seq=1024, batch=1, vocab=32768),
              dict(layers=2, d=128, heads=4, seq=64, batch=1, vocab=1024)),
    "ctc": ("CTC speech step (1-d conv model, new lengths every batch)", dict(batch=32, frames=800),
            dict(batch=8, frames=200)),
    "generate": ("Llama generate()", dict(layers=8, d=1024, new=128), dict(layers=2, d=128, new=16)),
    "op": ("a + b, f32[4], results dropped", dict(iters=5000), dict(iters=5000)),
}
BACKENDS = ["cuda-eager", "cuda-inductor", "tpu-fused", "tpu-strict", "tpu-compiled", "jax-jit"]


# ------------------------------------------------------------- one measurement (child)

def _model_and_step(workload, size, device, compiled, backend, channels_last):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "examples"))
    from workloads import GPT, cnn_model

    torch.manual_seed(0)
    compile_ = (lambda m: torch.compile(m, backend=backend)) if compiled else (lambda m: m)
    if workload in ("gpt", "infer"):
        net = GPT(vocab=size["vocab"], seq=size["seq"], d=size["d"], heads=size["heads"], layers=size["layers"],
                  dropout=0.0).to(device)
        x = torch.randint(0, size["vocab"], (size["batch"], size["seq"]), device=device)
        y = torch.randint(0, size["vocab"], (size["batch"], size["seq"]), device=device)
    elif workload == "ctc":
        sys.path.insert(0, str(HERE))
        from ctc import batches, model as ctc_model
        net = ctc_model().to(device)
        data = [tuple(t.to(device) for t in b) for b in batches(8, size["batch"], size["frames"])]
    elif workload == "mlp":
        w = size["width"]
        net = nn.Sequential(nn.Linear(size["inputs"], w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                            nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 1000)).to(device)
        x = torch.randn(size["batch"], size["inputs"], device=device)
        y = torch.randint(0, 1000, (size["batch"],), device=device)
    else:
        net = cnn_model().to(device)
        x = torch.randn(size["batch"], 3, 32, 32, device=device)
        y = torch.randint(0, 10, (size["batch"],), device=device)
        if channels_last:
            net, x = net.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    model = compile_(net)
    if workload == "infer":
        net.eval()

        def step():
            with torch.no_grad():
                return model(x)
        return step
    opt = torch.optim.AdamW(net.parameters(), 1e-4)
    if workload == "ctc":
        turn = iter(range(1 << 30))

        def loss_of():
            x, targets, input_lengths, target_lengths = data[next(turn) % len(data)]
            log_probs = model(x).permute(2, 0, 1).log_softmax(2)
            return F.ctc_loss(log_probs, targets, input_lengths, target_lengths)
    else:
        def loss_of():
            return F.cross_entropy(model(x).flatten(0, -2), y.flatten())

    def step():
        opt.zero_grad()
        loss = loss_of()
        loss.backward()
        opt.step()
        return loss
    return step


def _generate_rate(size, device, sync, reset_counters, counters):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    d = size["d"]
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=d, intermediate_size=4 * d,
                                         num_hidden_layers=size["layers"], num_attention_heads=max(1, d // 64),
                                         num_key_value_heads=max(1, d // 128))).to(device).eval()
    prompt = torch.randint(0, 32000, (1, 32)).to(device)  # CPU's generator: the same prompt on every backend

    def run():
        out = model.generate(prompt, max_new_tokens=size["new"], do_sample=False, min_new_tokens=size["new"])
        sync()
        return out
    run()  # compilations, caches
    reset_counters()
    start = time.perf_counter()
    out = run()
    rate = size["new"] / (time.perf_counter() - start)
    # The timed call's counters, taken before the tokens are read: reading
    # them runs (and compiles) a copy of their own after the clock stopped.
    return {"tok/s": rate, "counters": counters(), "tokens": out[0, -8:].tolist()}


def _per_op_us(size, add, a, b, wait, reset_counters):
    """What one tiny op costs the host in a long run of them (best of 5)."""
    best = float("inf")
    for _ in range(6):  # the first round compiles and warms up
        wait(add(a, b))
        reset_counters()
        start = time.perf_counter()
        for _ in range(size["iters"]):
            out = add(a, b)
        wait(out)
        best = min(best, (time.perf_counter() - start) / size["iters"] * 1e6)
    return {"us per op": best}


def _jax_per_op_us(size):
    """The same op through JAX's own dispatch of a compiled function on the
    same PJRT plugin: the floor a launch per op costs there."""
    import jax
    import jax.numpy as jnp

    a, b = jnp.ones(4), jnp.ones(4)
    return _per_op_us(size, jax.jit(lambda a, b: a + b), a, b, lambda out: out.block_until_ready(), lambda: None)


def child(workload, backend, quick, precision, steps, channels_last):
    if backend == "jax-jit":
        return _jax_per_op_us(WORKLOADS[workload][2 if quick else 1]) if workload == "op" else {"skipped": "a tiny op only"}
    import torch

    torch.set_float32_matmul_precision(precision)
    if backend.startswith("tpu"):
        import torchtpu

        mode = backend.split("-")[1]
        torchtpu.set_mode("fused" if mode == "compiled" else mode)
        device, sync = "tpu", torch.tpu.synchronize
        compiled, compile_backend = mode == "compiled", "tpu"
    else:
        device = "cuda" if backend.startswith("cuda") else "cpu"
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        compiled, compile_backend = backend.endswith("inductor"), "inductor"
    size = WORKLOADS[workload][2 if quick else 1]
    compilations = [0]  # those before each reset of the counters

    def reset_counters():
        if device == "tpu":
            compilations.append(torchtpu.metrics()["compilations"])
            torchtpu.reset_metrics()

    if workload in ("generate", "op"):
        if compiled:
            return {"skipped": "measured eagerly"}
        if workload == "op":
            a, b = torch.ones(4, device=device), torch.ones(4, device=device)
            result = _per_op_us(size, operator.add, a, b, lambda out: sync(), reset_counters)
        else:
            result = _generate_rate(size, device, sync, reset_counters,
                                    lambda: torchtpu.metrics() if device == "tpu" else None)
    else:
        result = _step_times(_model_and_step(workload, size, device, compiled, compile_backend, channels_last), sync, steps,
                             lambda: torchtpu.metrics()["compilations"] if device == "tpu" else 0)
    if backend.startswith("tpu"):
        metrics = torchtpu.metrics()
        result.update(compilations=sum(compilations) + metrics["compilations"], fallbacks=metrics["fallbacks"])
        if workload == "op" and metrics["executions"]:  # the last timed round's
            result["execute us/program"] = metrics["execute_ns"] / metrics["executions"] / 1e3
        if workload == "generate":  # the timed call's
            timed = result["counters"]
            result.update({"ops/token": timed["ops"] / size["new"], "programs/token": timed["executions"] / size["new"],
                           "replays/token": timed["fused_replays"] / size["new"],
                           # transformers' own reads of device values (5.17, the GPU
                           # image's, reads a causal mask each token besides the stop check)
                           "reads/token": timed["flushes"].get("host_read", 0) / size["new"],
                           "compiled while timed": {"tok/s": timed["compilations"]}})
    result.pop("counters", None)
    return result


def _step_times(step, sync, steps, compilations):
    # Each step's result is held until the synchronize: on tpu, work whose
    # results nobody holds (an inference step's logits, dropped) is never
    # computed, which CUDA and CPU eager compute anyway.
    for _ in range(3):  # compilations and warm-up
        out = step()
        sync()
    # What warm-up left (torch.compile's graphs and guards, a large heap) is
    # frozen, as timeit turns the collector off: otherwise the one full
    # collection it triggers (~200 ms) lands in whichever timed loop it
    # falls, for every backend alike.
    gc.collect()
    gc.freeze()
    # A timed loop that compiles times the compiler: each loop's count is
    # reported, so that such a cell is seen for what it is (an unread loop
    # of compiled inference calls compiled a program of two calls, 2026-11-28).
    before = compilations()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        out = step()
        sync()
        times.append(time.perf_counter() - start)
    del out
    synced_compilations = compilations() - before
    start = time.perf_counter()
    outs = [step() for _ in range(steps)]
    sync()
    rate = steps / (time.perf_counter() - start)
    del outs
    return {"synced ms": 1e3 * statistics.median(times), "pipelined /s": rate,
            "compiled while timed": {"synced ms": synced_compilations,
                                     "pipelined /s": compilations() - before - synced_compilations}}


# ------------------------------------------------------------- checks (children)

CHECKS = {
    "precision": """
import torch, torchtpu
torch.set_float32_matmul_precision("highest")
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
exact = a.double() @ b.double()
err = ((a.to("tpu") @ b.to("tpu")).cpu().double() - exact).abs().max() / exact.abs().max()
print(f"f32 matmul at 'highest': max error {err:.2e} relative to float64")
assert err <= 1e-5, err
""",
    "memory": """
import torch, torchtpu
x = torch.ones(256 << 20, dtype=torch.uint8, device="tpu")  # torch.empty is not allocated until written
torch.tpu.synchronize()
reserved, peak = torch.tpu.memory_reserved(), torch.tpu.max_memory_allocated()
print(f"after a 256 MiB tensor: reserved {reserved >> 20} MiB, peak allocated {peak >> 20} MiB")
assert reserved >= 256 << 20 and peak >= 256 << 20, (reserved, peak)
try:
    huge = torch.zeros(1 << 40, dtype=torch.uint8, device="tpu")
    huge.sum().item()  # huge is alive: fused mode materialises it
    raise AssertionError("1 TiB allocated")
except torch.OutOfMemoryError as e:
    print("OutOfMemoryError:", str(e).splitlines()[0][:160])
assert (x[:4] * 0 + 2).sum().item() == 8  # still usable
""",
    "share": """
import subprocess, sys
work = ("import torch, torchtpu\\n"
        "n = 512 if torchtpu._plugin.find_plugin()[1] else 4096\\n"
        "x = torch.randn(n, n, device='tpu')\\n"
        "for _ in range(20): x = (x @ x).tanh()\\n"
        "print(x.sum().item())")
procs = [subprocess.Popen([sys.executable, "-c", work], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
         for _ in range(3)]
outs = [p.communicate(timeout=600)[0] for p in procs]
assert all(p.returncode == 0 for p in procs), outs
print("3 tpu processes at once on one device: all finished")
""",
    "cuda-untouched": """
import sys, torch
assert "torchtpu" not in sys.modules, "import torch loaded torchtpu on a GPU machine"
assert torch.accelerator.current_accelerator().type == "cuda", torch.accelerator.current_accelerator()
net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
opt = torch.optim.SGD(net.parameters(), 0.1)
for model in (net, torch.compile(net)):
    for _ in range(3):
        opt.zero_grad()
        loss = model(torch.randn(32, 64, device="cuda")).pow(2).mean()
        loss.backward()
        opt.step()
print(f"CUDA eager and Inductor training with torchtpu installed: loss {loss.item():.4f}")
""",
    "cuda-refused-beside-tpu": """
import torch, torchtpu
assert (torch.ones(2, device="tpu") * 2).sum().item() == 4
assert not torch.cuda.is_available()
assert torch.compile(lambda x: x * 2, backend="tpu")(torch.ones(2, device="tpu")).sum().item() == 4
try:
    torch.ones(2, device="cuda")
    raise AssertionError("CUDA initialised beside tpu")
except Exception as e:
    assert "one accelerator per process" in str(e), e
    print("CUDA after import torchtpu:", type(e).__name__, str(e).splitlines()[-1][:120])
""",
}
CUDA_ONLY = {"cuda-untouched", "cuda-refused-beside-tpu"}


# ------------------------------------------------------------- the run (parent)

def _python(args, timeout, env=None):
    """(exit status, its last stdout line when it succeeded, else the end of stderr)."""
    try:
        out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                             env=dict(os.environ, **(env or {})), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if out.returncode == 0:
        lines = out.stdout.strip().splitlines()
        return 0, lines[-1] if lines else ""
    return out.returncode, (out.stdout + out.stderr).strip()[-2000:]


def _has_cuda():
    code, out = _python(["-c", "import torch; print(torch.cuda.is_available())"], 120,
                        env={"TORCHTPU_AUTOLOAD": "0"})
    return code == 0 and out == "True"


def _cell(result, key):
    if result is None:
        return ""
    if "error" in result or "skipped" in result:
        return "—"
    value = result.get(key)
    if value is None:
        return ""
    compiled = result.get("compiled while timed", {}).get(key, 0)
    return f"{value:.3g}" + (f" ({compiled} compiled while timed)" if compiled else "")


def _side_by_side(results, backends):
    lines = ["## Side by side", "",
             "synced ms: median step, each followed by a synchronize (a loop that reads its loss); "
             "pipelined: steps/s with one synchronize at the end.", "",
             "| workload | measure | " + " | ".join(backends) + " |",
             "|---|---|" + "---|" * len(backends)]
    for workload, (title, *_) in WORKLOADS.items():
        keys = {"generate": ["tok/s"], "op": ["us per op"]}.get(workload, ["synced ms", "pipelined /s"])
        for key in keys:
            cells = [_cell(results.get((workload, b)), key) for b in backends]
            if any(cells):
                lines.append(f"| {title} | {key} | " + " | ".join(cells) + " |")
    lines += ["", "Compilations and CPU fallbacks of the tpu runs:", ""]
    for (workload, backend), r in results.items():
        if backend.startswith("tpu") and "compilations" in r:
            extra = "".join(f", {r[k]:.3g} {k}" for k in ("ops/token", "programs/token", "replays/token",
                                                                "reads/token", "execute us/program") if k in r)
            lines.append(f"- {workload} {backend}: {r['compilations']} compilations, fallbacks {r['fallbacks'] or 'none'}"
                         f"{extra}")
    for (workload, backend), r in results.items():
        if "error" in r:
            lines += ["", f"### {workload} on {backend} failed", "", "```", r["error"].strip()[-1500:], "```"]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu-report.md")
    parser.add_argument("--workers", type=int, default=8, help="pytest-xdist workers sharing the device")
    parser.add_argument("--no-suite", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small sizes (the default without CUDA)")
    parser.add_argument("--precision", default="high", choices=["highest", "high", "medium"])
    parser.add_argument("--math-attention", action="store_true",
                        help="scaled_dot_product_attention through PyTorch's math composite on every backend")
    parser.add_argument("--channels-last", action="store_true",
                        help="the CNN's weights and input channels-last on every backend")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checks", help="the checks to run, comma-separated (default: all)")
    parser.add_argument("--pairs", help="workload:backend,... to measure, in this order (default: all); "
                        "the report is rewritten after each, so a run cut short keeps what it measured")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH) if args.math_attention else contextlib.nullcontext():
            print(json.dumps(child(*args.child, args.quick, args.precision, args.steps, args.channels_last)))
        return

    os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-gpu-report-")
    cuda = _has_cuda()
    quick = args.quick or not cuda
    code, where = _python(["-c", "import torchtpu, torchtpu._plugin as p; print(p.find_plugin()[0])"], 300)
    plugin = where if code == 0 else f"(torchtpu does not import: {where[-300:]})"
    lines = [f"# torchtpu on {platform.node()}: {date.today()}", "",
             f"- plugin: `{plugin}`; CUDA {'available' if cuda else 'not available (reference: CPU eager)'}",
             f"- float32 matmul precision in every process: `{args.precision}`; {args.steps} steps; "
             f"{'math attention; ' if args.math_attention else ''}"
             f"{'the CNN channels-last; ' if args.channels_last else ''}"
             f"an empty compilation cache", "", "Sizes:", ""]
    lines += [f"- {title}: {size[1 if quick else 0]}" for title, *size in WORKLOADS.values()] + [""]

    lines += ["## Checks", ""]
    for name, code_text in CHECKS.items():
        if args.checks is not None and name not in args.checks.split(","):
            continue
        if name in CUDA_ONLY and not cuda:
            lines.append(f"- **{name}**: skipped (no CUDA here)")
            continue
        code, out = _python(["-c", code_text], 900)
        verdict = "pass" if code == 0 else "FAIL"
        lines.append(f"- **{name}**: {verdict} — {out.splitlines()[-1] if out else ''}")
        print(lines[-1], flush=True)
    lines.append("")

    backends = BACKENDS if cuda else ["cpu-eager"] + [b for b in BACKENDS if not b.startswith("cuda")]
    pairs = ([tuple(p.split(":")) for p in args.pairs.split(",")] if args.pairs
             else [(w, b) for w in WORKLOADS for b in backends])
    backends = [b for b in backends if any(b == pb for _, pb in pairs)]
    results = {}
    for workload, backend in pairs:
        code, out = _python([__file__, "--child", workload, backend, "--precision", args.precision,
                             *(["--math-attention"] if args.math_attention else []),
                             *(["--channels-last"] if args.channels_last else []),
                             "--steps", str(args.steps), *(["--quick"] if quick else [])], 1800)
        results[workload, backend] = json.loads(out) if code == 0 else {"error": out}
        print(workload, backend, results[workload, backend], flush=True)
        Path(args.out).write_text("\n".join(lines + _side_by_side(results, backends)) + "\n")
    lines += _side_by_side(results, backends)

    if not args.no_suite:
        env = {"TORCHTPU_PJRT_PLUGIN": plugin} if os.path.exists(plugin) else {}
        start = time.perf_counter()
        report = Path(args.out).with_suffix(".pytest.txt")
        with open(report, "w") as log:
            try:
                # -v: a line per test as it ends, so that the failures are known even where xdist
                # loses a worker and ends in an INTERNALERROR without its summary (H100, 2026-11-26).
                subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", str(args.workers), "--dist", "loadfile",
                                "tests", "--ignore=tests/titan", "-p", "no:cacheprovider", "-rfE", "--tb=short"],
                               stdout=log, stderr=subprocess.STDOUT, timeout=5400, env=dict(os.environ, **env),
                               cwd=ROOT)
            except subprocess.TimeoutExpired:
                log.write("\ntimed out after 5400 s\n")
        out = report.read_text().strip().splitlines()
        tail = [l for l in out if l.startswith(("FAILED", "ERROR"))][:60]
        tail = tail or [l.rsplit("] ", 1)[1] for l in out
                        if l.startswith("[gw") and (" FAILED " in l or " ERROR " in l)][:60]
        summary = f"{out[-1] if out else 'no output'} (log: {report})"
        lines += ["", "## Test suite", "",
                  f"`pytest -n {args.workers} tests` on the plugin: {summary} ({time.perf_counter() - start:.0f} s)", ""]
        lines += [f"- {l}" for l in tail]

    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"\nreport: {args.out}")


if __name__ == "__main__":
    main()
