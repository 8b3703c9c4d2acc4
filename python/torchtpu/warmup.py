"""Fills the compilation cache with a script's first training steps:

    python -m torchtpu.warmup [--steps N] [--buckets-up-to SIZE] [--export BUNDLE] script.py [args...]

runs `script.py args...` as Python would, until its N-th optimizer step
(default 3) or its end. Every program those steps need is then in the cache
(`TORCHTPU_CACHE_DIR`), so the script's next run compiles nothing; with
--buckets-up-to, so are the programs of every
bucket up to SIZE of the sizes that changed, compiled in parallel threads
(`torchtpu.cache.warm_buckets`); with --export they are also written as one
bundle for `torchtpu.cache.import_` elsewhere.
"""
import argparse
import runpy
import sys
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import torchtpu


class _Enough(BaseException):
    """Ends the script at the last step wanted (not an Exception: the
    script's own handlers let it through)."""


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torchtpu.warmup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps to run (default 3)")
    parser.add_argument("--buckets-up-to", type=int, metavar="SIZE",
                        help="also compile every bucket up to SIZE of the sizes that changed")
    parser.add_argument("--export", metavar="BUNDLE", help="also write the cache as one file")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    steps = 0

    def count(optimizer, args, kwargs):
        nonlocal steps
        steps += 1
        if steps >= options.steps:
            raise _Enough

    hook = register_optimizer_step_post_hook(count)  # after torchtpu's, which compiles the step
    sys.argv = [options.script, *options.args]
    sys.path.insert(0, str(Path(options.script).resolve().parent))
    try:
        runpy.run_path(options.script, run_name="__main__")
    except _Enough:
        pass
    finally:
        hook.remove()
    torch.tpu.synchronize()
    m = torchtpu.metrics()
    print(f"torchtpu.warmup: {steps} step(s); {m['compilations']} program(s) compiled, "
          f"{m['disk_cache_hits']} loaded from the cache")
    if options.buckets_up_to:
        n = torchtpu.cache.warm_buckets(options.buckets_up_to)
        print(f"torchtpu.warmup: {n} program(s) for buckets up to {options.buckets_up_to}")
    if options.export:
        n = torchtpu.cache.export(options.export)
        print(f"torchtpu.warmup: {n} program(s) written to {options.export}")


if __name__ == "__main__":
    main()
