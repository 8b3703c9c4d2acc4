"""A step's program as torchtpu runs it against the same program run by JAX,
on the same PJRT plugin, side by side in one run.

The step is a tiny Llama's forward over 12 tokens (transformers, built from a
config; the decoding workload of `bench/dynamic.py` without its cache). One
process runs it on tpu (fused) and times, per step, recording it and
`torch.tpu.synchronize()` (the flush: the replay's launch, then the wait for
the program), and the launch alone (`execute_ns`); it dumps the step's
StableHLO (`TORCHTPU_DUMP_DIR`). A second process loads the same plugin
into JAX (`register_plugin`), compiles the largest dumped program, and times
its execute call and its execute-and-wait on inputs of the same types; the
`pjrt` crate's example `execute` does the same through torchtpu's own PJRT
wrapper alone, back to back and then with its thread kept busy before each
call as long as torchtpu's recording took.

    python bench/program.py

JAX and the crate back to back run the program with the machine's caches
and the plugin's threads warm from the call before; torchtpu's flush comes
after recording. The last line is the fair comparison: where the flush
takes about what the crate takes after the same gap, the time is the
program's on this machine when met after other work, not the core's.
"""
import json
import os
import subprocess
import sys
import tempfile
import time


def _tpu(dump, rounds=5, steps=200):
    import torch
    import torchtpu
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to("tpu")
    ids = torch.randint(0, 256, (1, 12)).to("tpu")
    mask = torch.ones(1, 12, dtype=torch.long, device="tpu")
    best = None
    with torch.no_grad():
        # transformers reads whether the mask is all ones early in the
        # forward (one small program); the rest is the program timed here.
        def step():
            return model(input_ids=ids, attention_mask=mask, use_cache=False).logits.argmax()

        for _ in range(20):
            step().item()
        for _ in range(rounds):
            record = flush = launch = 0.0
            for _ in range(steps):
                start = time.perf_counter()
                y = step()
                recorded = time.perf_counter()
                launched = torchtpu.metrics()["execute_ns"]
                torch.tpu.synchronize()
                flush += time.perf_counter() - recorded
                launch += (torchtpu.metrics()["execute_ns"] - launched) * 1e-9
                record += recorded - start
                y.item()
            times = dict(record=record / steps * 1e6, flush=flush / steps * 1e6, launch=launch / steps * 1e6)
            if best is None or times["flush"] < best["flush"]:
                best = times
    programs = [os.path.join(dump, f) for f in os.listdir(dump) if f.endswith(".mlir")]
    best["program"] = max(programs, key=os.path.getsize)
    best["plugin"] = torchtpu._plugin.find_plugin()[0]
    best["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    return best


def _jax(program, plugin, rounds=5, calls=200):
    import re

    import jax
    import numpy as np
    from jax._src import compiler
    from jax._src import xla_bridge

    xla_bridge.register_plugin("torchtpu_plugin", priority=500, library_path=plugin, options={"cpu_device_count": 1})
    jax.config.update("jax_enable_x64", True)
    import jax.extend

    # Donations would consume the inputs of the first call.
    text = re.sub(r" {tf.aliasing_output = \d+ : i32}", "", open(program).read())
    signature = re.search(r"@main\((.*?)\) ->", text, re.S).group(1)
    dtypes = {"f32": np.float32, "f64": np.float64, "bf16": np.float32, "i64": np.int64, "i32": np.int32,
              "i1": np.bool_}
    rng = np.random.default_rng(0)
    args = []
    for ty in re.findall(r"tensor<([^>]*)>", signature):
        *dims, dtype = ty.split("x")
        shape = [int(d) for d in dims]
        # Zero integers: in range for every gather and slice.
        args.append((rng.standard_normal(shape) * 0.1).astype(dtypes[dtype]) if dtype[0] in "fb"
                    else np.zeros(shape, dtypes[dtype]))
    backend = jax.extend.backend.get_backend("torchtpu_plugin")
    device = backend.devices()[0]
    exe = backend.compile_and_load(text, [device], compiler.get_compile_options(num_replicas=1, num_partitions=1))
    inputs = [jax.device_put(a, device) for a in args]
    for _ in range(20):
        exe.execute(inputs)[0].block_until_ready()
    best = None
    for _ in range(rounds):
        launch = total = 0.0
        for _ in range(calls):
            start = time.perf_counter()
            out = exe.execute(inputs)
            launched = time.perf_counter()
            out[0].block_until_ready()
            launch += launched - start
            total += time.perf_counter() - start
        times = dict(launch=launch / calls * 1e6, total=total / calls * 1e6)
        if best is None or times["total"] < best["total"]:
            best = times
    return best


def _pjrt_alone(program, plugin, xla_flags, gap_us=0):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(["cargo", "run", "--release", "-q", "-p", "pjrt", "--example", "execute", "--", plugin,
                           program, str(gap_us)], cwd=root, env=dict(os.environ, XLA_FLAGS=xla_flags), capture_output=True,
                          text=True)
    if done.returncode:
        sys.exit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _child(what, *args, env=None):
    code = f"import sys, json; sys.path.insert(0, {os.path.dirname(__file__)!r}); import program; " \
           f"print(json.dumps(program.{what}(*{list(args)!r})))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    with tempfile.TemporaryDirectory() as dump:
        tpu = _child("_tpu", dump, env=dict(os.environ, TORCHTPU_DUMP_DIR=dump, TORCHTPU_CACHE_DIR=""))
        jax = _child("_jax", tpu["program"], tpu["plugin"], env=dict(os.environ, XLA_FLAGS=tpu["xla_flags"]))
        alone = _pjrt_alone(tpu["program"], tpu["plugin"], tpu["xla_flags"])
        gap = round(tpu["record"])
        after = _pjrt_alone(tpu["program"], tpu["plugin"], tpu["xla_flags"], gap)
    print("tiny Llama forward, 12 tokens (best round of 200 steps), us per step:")
    print(f"  torchtpu: recording {tpu['record']:.0f}; flush {tpu['flush']:.0f} "
          f"(of which the execute call {tpu['launch']:.0f}, after it {tpu['flush'] - tpu['launch']:.0f})")
    print(f"  JAX, the same program on the same plugin: execute and wait {jax['total']:.0f} "
          f"(the execute call {jax['launch']:.0f}, after it {jax['total'] - jax['launch']:.0f})")
    print(f"  the pjrt crate alone, the same program: execute and wait {alone['total']:.0f} "
          f"(the execute call {alone['launch']:.0f}, after it {alone['total'] - alone['launch']:.0f})")
    print(f"  the pjrt crate alone, each call after {gap} us busy (torchtpu's recording): execute and wait "
          f"{after['total']:.0f} (the execute call {after['launch']:.0f}, after it {after['total'] - after['launch']:.0f})")
    print(f"  torchtpu's flush / JAX's execute and wait: {tpu['flush'] / jax['total']:.2f}x; "
          f"/ the pjrt crate's: {tpu['flush'] / alone['total']:.2f}x back to back, "
          f"{tpu['flush'] / after['total']:.2f}x after the same gap")


if __name__ == "__main__":
    main()
