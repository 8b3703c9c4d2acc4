"""The compilation cache as one file, to start elsewhere with it warm: another
directory, virtualenv or machine with the same torchtpu, plugin build, XLA
flags and (on the CPU plugin) CPU features.

    torchtpu.cache.export("warm.ttc")   # where the programs were compiled
    torchtpu.cache.import_("warm.ttc")  # before the first step elsewhere

`python -m torchtpu.warmup` runs a script's first steps and exports them.
"""
import os

from . import _C


def export(path) -> int:
    """Writes the programs in the compilation cache (`TORCHTPU_CACHE_DIR`)
    that this process's plugin and flags can use to `path`, after a manifest
    of what they were built for. Returns how many."""
    return _C.cache_export(os.fspath(path))


def import_(path) -> int:
    """Adds the programs of a bundle written by `export` to the compilation
    cache, so that this and later processes load them instead of compiling.
    Returns how many. Raises ValueError, writing nothing, for a bundle built
    for another torchtpu, plugin, XLA flags or CPU, or a damaged one."""
    return _C.cache_import(os.fspath(path))
