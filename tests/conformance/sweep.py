"""The OpInfo conformance sweep: every op_db entry but exclusions.py's, in
each mode and dtype, on tpu against CPU (values, shapes, dtypes, and
gradients where the op supports autograd in that dtype).

Entries run in worker processes (`--worker`), one sample at a time: a
sample that crashes its worker or runs past the timeout is recorded as a
crash or hang, the rest of that entry is not run, and a fresh worker takes
the next entry. Results are aggregated per (entry, mode, dtype): its status,
how many samples passed, the first failure, and the ops that fell back to
CPU (metrics()["fallbacks"]).
"""
import argparse
import collections
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import traceback
import zlib

MODES = ["fused", "strict", "debug"]
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A unit's status: a failure of the op ("fail": a wrong result or a
# different exception), of its worker, or no samples to compare.
FAILED = ("fail", "crash", "hang")


def entries():
    """Every op_db entry the sweep runs (all but the excluded ones)."""
    from conformance.compare import BY_NAME
    from conformance.exclusions import EXCLUDED
    return [name for name in BY_NAME if name not in EXCLUDED]


# ---------------------------------------------------------------- worker


def check_sample(name, op, sample, grad):
    """Compares one sample on tpu with CPU."""
    import torch
    from conformance.compare import assert_close, copy_sample, expect_same, expect_same_error, grads, to_float64

    found = expect_same(name, op, sample)
    if grad and found is not None:
        (cpu_sample, tpu_sample), (expected, actual) = found
        try:
            expected_grads = grads(op, cpu_sample, expected)
        except Exception as e:
            expect_same_error(e, grads, op, tpu_sample, actual)
        else:
            if expected_grads is not None:
                dtype = expected_grads[0].dtype

                def reference():
                    return grads(op, to_float64(copy_sample(sample, "cpu", name)), cotangent_dtype=dtype)

                try:
                    assert_close(name, grads(op, tpu_sample, actual), expected_grads, reference)
                except AssertionError as e:
                    raise AssertionError(f"gradient: {e}") from None
    torch.tpu.synchronize()


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def run_entry(name, limit, modes, dtypes, split, emit, per_entry=None):
    """Every sample of `name` (at most `limit`) in each mode and dtype; with
    `split`, each dtype in one of the modes, taken in turn from a place
    seeded by the name, so that an entry of several dtypes meets each mode;
    with `per_entry`, that many of its dtypes, in turn from the same place."""
    import torch
    import torchtpu
    from conformance.compare import DTYPES, describe, opinfo, samples

    op = opinfo(name)
    first = zlib.crc32(name.encode())
    chosen = [d for d in DTYPES if d in op.supported_dtypes("cpu") and dtype_name(d) in dtypes]
    if per_entry and len(chosen) > per_entry:
        chosen = (chosen * 2)[first % len(chosen):][:per_entry]
    for i, dtype in enumerate(chosen):
        grad = op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")
        key = dict(entry=name, dtype=dtype_name(dtype))
        emit(start=dict(key, mode=None, sample="generating samples"))
        try:
            found = samples(name, dtype, limit, requires_grad=grad)
        except Exception as e:
            found, message = [], f"sample_inputs raised {type(e).__name__}: {e}"
        else:
            message = "no samples"
        for mode in [modes[(first + i) % len(modes)]] if split else modes:
            unit = dict(key, mode=mode)
            if not found:
                emit(sample=dict(unit, status="no_samples", message=message, fallbacks=[]))
            with torchtpu.mode(mode):
                for s in found:
                    emit(start=dict(unit, sample=describe(s)))
                    result = dict(unit, status="pass")
                    torchtpu.reset_metrics()
                    try:
                        check_sample(name, op, s, grad)
                    except Exception as e:
                        kind = "" if isinstance(e, AssertionError) else f"tpu raised {type(e).__name__}: "
                        result.update(status="fail", message=f"{kind}{str(e)[:400]} [sample {describe(s)[:200]}]")
                        try:
                            torch.tpu.synchronize()  # a deferred error of this sample stays with it
                        except Exception:
                            pass
                    emit(sample=dict(result, fallbacks=sorted(torchtpu.metrics()["fallbacks"])))


def worker(limit, modes, dtypes, split, per_entry):
    """Runs the entries named on stdin; reports on the original stdout, one
    JSON object a line (stray prints go to stderr)."""
    report = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def emit(**event):
        report.write(json.dumps(event) + "\n")

    for line in sys.stdin:
        name = line.strip()
        try:
            run_entry(name, limit, modes, dtypes, split, emit, per_entry)
        except Exception:
            emit(sample=dict(entry=name, mode=None, dtype=None, status="fail",
                             message=traceback.format_exc()[-600:], fallbacks=[]))
        emit(done=name)


# ---------------------------------------------------------------- parent


class Results:
    """Per (entry, mode, dtype): status, samples, passed, first failure, fallbacks."""

    def __init__(self):
        self.units = {}

    def unit(self, entry, mode, dtype):
        return self.units.setdefault(entry, {}).setdefault(mode or "*", {}).setdefault(
            dtype or "*", dict(status="no_samples", samples=0, passed=0, message=None, fallbacks=[]))

    def add(self, event):
        u = self.unit(event["entry"], event["mode"], event["dtype"])
        status = event["status"]
        if status == "no_samples":
            u["message"] = event["message"]
            return
        u["samples"] += 1
        u["fallbacks"] = sorted(set(u["fallbacks"]) | set(event["fallbacks"]))
        if status == "pass":
            u["passed"] += 1
            if u["status"] == "no_samples":
                u["status"] = "pass"
        elif u["status"] not in FAILED or status in ("crash", "hang"):
            u.update(status=status, message=event["message"])


class Worker:
    def __init__(self, argv, env):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=env, text=False)
        self.buffer = b""
        self.entry = self.current = None
        self.deadline = None

    def assign(self, entry, timeout):
        self.entry, self.current = entry, None
        self.deadline = time.monotonic() + timeout
        self.proc.stdin.write(entry.encode() + b"\n")
        self.proc.stdin.flush()

    def lines(self):
        """Complete lines read so far; None at end of file."""
        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not chunk:
            return None
        self.buffer += chunk
        *done, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in done if line]

    def stderr_tail(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-600:]

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.stderr.close()


def run(names, limit=None, modes=MODES, dtypes=None, jobs=None, timeout=120.0, progress=None, split=False,
        per_entry=None):
    """Runs the sweep over `names` in `jobs` workers (every dtype of
    compare.DTYPES, or the `dtypes` named, or `per_entry` of them in turn;
    each in one of the modes with `split`); returns Results.units.
    `timeout` bounds each sample (and a worker's start-up, twice over)."""
    from conformance.compare import DTYPES
    # A worker holds torch, op_db and XLA: about 1.5 GB.
    jobs = max(1, min(jobs or min(os.cpu_count() or 1, 8), len(names)))
    dtypes = dtypes or [dtype_name(d) for d in DTYPES]
    argv = [sys.executable, "-m", "conformance", "--worker", "--modes", ",".join(modes), "--dtypes", ",".join(dtypes)]
    argv += ["--limit", str(limit)] if limit is not None else []
    argv += ["--split"] if split else []
    argv += ["--per-entry", str(per_entry)] if per_entry else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [TESTS_DIR, os.environ.get("PYTHONPATH")])))
    # The workers share one compilation cache (the session's, or one of the sweep's own).
    with tempfile.TemporaryDirectory(prefix="torchtpu-conformance-") as cache:
        env.setdefault("TORCHTPU_CACHE_DIR", cache)
        return sweep_in_workers(names, argv, env, jobs, timeout, progress)


def sweep_in_workers(names, argv, env, jobs, timeout, progress):
    """Hands the entries to `jobs` workers one at a time; a worker that
    crashes or hangs fails its entry and is replaced."""
    queue = collections.deque(names)
    results = Results()
    sel = selectors.DefaultSelector()
    finished = 0

    def start():
        w = Worker(argv, env)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        w.assign(queue.popleft(), 2 * timeout)
        return w

    def retire(w, status, message):
        nonlocal finished
        c = w.current or dict(entry=w.entry, mode=None, dtype=None, sample="starting")
        results.add(dict(c, status=status, message=f"{message} [sample {c['sample'][:200]}]", fallbacks=[]))
        sel.unregister(w.proc.stdout)
        w.stop()
        finished += 1
        if progress:
            progress(finished, len(names), w.entry)
        return start() if queue else None

    workers = [start() for _ in range(jobs)]
    while any(workers):
        now = time.monotonic()
        for i, w in enumerate(workers):
            if w and now > w.deadline:
                workers[i] = retire(w, "hang", f"no result within {timeout:.0f} s")
        live = [w for w in workers if w]
        if not live:
            break
        for key, _ in sel.select(max(0.0, min(w.deadline for w in live) - time.monotonic())):
            w = key.data
            i = workers.index(w)
            events = w.lines()
            if events is None:
                workers[i] = retire(w, "crash", f"worker died (exit {w.proc.wait()}): {w.stderr_tail()}")
                continue
            for e in events:
                if "start" in e:
                    w.current = e["start"]
                    w.deadline = time.monotonic() + timeout
                elif "sample" in e:
                    results.add(e["sample"])
                elif "done" in e:
                    finished += 1
                    if progress:
                        progress(finished, len(names), e["done"])
                    if queue:
                        w.assign(queue.popleft(), timeout)
                    else:
                        sel.unregister(w.proc.stdout)
                        w.proc.stdin.close()
                        w.stop()
                        workers[i] = None
    return results.units


def failures(units):
    """[(entry, mode, dtype, unit)] of the units that failed."""
    return [(entry, mode, dtype, u) for entry, by_mode in units.items() for mode, by_dtype in by_mode.items()
            for dtype, u in by_dtype.items() if u["status"] in FAILED]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m conformance", description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, help="samples per entry and dtype (a fixed, seeded subset); default all")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--dtypes", help="comma-separated dtypes; default all of compare.DTYPES")
    p.add_argument("--ops", help="comma-separated op_db entries; default all but the excluded ones")
    p.add_argument("--jobs", type=int, help="worker processes; default the number of CPUs, at most 8")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a sample may run")
    p.add_argument("--out", default="build/conformance.json", help="where the results go (JSON)")
    p.add_argument("--split", action="store_true", help="each dtype in one of the modes, in turn")
    p.add_argument("--per-entry", type=int, help="dtypes per entry, in turn; default every dtype")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    dtypes = args.dtypes.split(",") if args.dtypes else None
    if args.worker:
        return worker(args.limit, modes, dtypes, args.split, args.per_entry)

    from torchtpu.coverage import pass_rates

    from conformance.compare import DTYPES
    from conformance.known_failures import known_failure

    names = args.ops.split(",") if args.ops else entries()
    began = time.monotonic()

    def progress(done, total, name):
        print(f"[{done}/{total} {time.monotonic() - began:.0f}s] {name}", file=sys.stderr, flush=True)

    units = run(names, args.limit, modes, dtypes, args.jobs, args.timeout, progress, args.split, args.per_entry)
    import torch
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(torch=torch.__version__, limit=args.limit, modes=modes, split=args.split,
                       per_entry=args.per_entry,
                       seconds=time.monotonic() - began, dtypes=dtypes or [dtype_name(d) for d in DTYPES],
                       results=units), f, indent=1, sort_keys=True)
    print(f"{len(names)} entries in {time.monotonic() - began:.0f} s; results in {args.out}")
    print("pass rate (entries passing every sample / entries with samples):")
    for (mode, dtype), (ok, n) in sorted(pass_rates(units).items()):
        print(f"  {mode:7} {dtype:9} {ok:4}/{n:<4} {100 * ok / n:6.2f}%")
    unexpected = [f for f in failures(units) if known_failure(*f[:3]) is None]
    stale = sorted({e for e, by_mode in units.items() for m, by_dtype in by_mode.items()
                    for d, u in by_dtype.items() if u["status"] == "pass" and known_failure(e, m, d)})
    for entry, mode, dtype, u in unexpected:
        print(f"UNEXPECTED {u['status']}: {entry} {mode} {dtype}: {u['message']}")
    if stale:
        print(f"known failures that passed (remove them from known_failures.py if they pass everywhere): {stale}")
    return 1 if unexpected else 0
