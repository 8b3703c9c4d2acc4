"""The compilation cache as one file, to start elsewhere with it warm: another
directory, virtualenv or machine with the same torchtpu, plugin build, XLA
flags and (on the CPU plugin) CPU features.

    torchtpu.cache.export("warm.ttc")   # where the programs were compiled
    torchtpu.cache.import_("warm.ttc")  # before the first step elsewhere

`python -m torchtpu.warmup` runs a script's first steps and exports them;
`warm_buckets` adds the programs of sizes those
steps did not meet.
"""
import atexit
import os

from . import _C

# Neither an import's preload nor the flush thread may be inside XLA while
# the process exits.
atexit.register(_C.settle)


def export(path) -> int:
    """Writes the programs in the compilation cache (`TORCHTPU_CACHE_DIR`)
    that this process's plugin and flags can use to `path`, after a manifest
    of what they were built for. Returns how many."""
    return _C.cache_export(os.fspath(path))


def import_(path) -> int:
    """Adds the programs of a bundle written by `export` to the compilation
    cache, so that this and later processes load them instead of compiling.
    The bundle's most recently used programs are loaded into memory in a
    background thread meanwhile, ready for the first step. Returns how many.
    Raises ValueError, writing nothing, for a bundle built for another
    torchtpu, plugin, XLA flags or CPU, or a damaged one."""
    return _C.cache_import(os.fspath(path))


def warm_buckets(up_to, threads=None) -> int:
    """Compiles, into the cache, the programs of every bucket up to size
    `up_to` of the sizes that changed so far (in fused mode), from bucket 1,
    on `threads` threads (default: one
    per CPU). Each changing structure's fit of its sizes is in the cache
    too, so a later process runs sizes it has not met without compiling.
    Returns how many programs there are."""
    return _C.warm_buckets(int(up_to), threads or os.cpu_count() or 1)
