"""What torchtpu tells the libraries that name their devices one by one
(Hugging Face Accelerate and Trainer, Lightning, PyTorch's FlexAttention), so
that they treat tpu as they treat CUDA.

Each integration is a set of small wrappers around the library's functions,
applied in memory when the library's module is imported (at once if it
already is); nothing on disk changes, and a library that is never imported
costs nothing. A wrapper changes only what happens for the tpu device and
leaves every other device's path as the library wrote it.
"""
import functools
import importlib.abc
import importlib.util
import os
import sys

import torch

from .._plugin import find_plugin

# module name -> functions to call with the module once it has executed.
_after_import: dict[str, list] = {}


def tpu_wanted() -> bool:
    """Whether tpu is this process's accelerator and a plugin can run it —
    asked without starting the runtime, which a distributed group must do
    first on GPUs."""
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "tpu" and find_plugin()[0] is not None


def replace(owner, name: str, wrapper):
    """Replaces the function (or a class's property getter) `owner.name` by
    `wrapper(original)`, also where another loaded module has imported it by
    name (a module imported later takes the new one from `owner`)."""
    if isinstance(owner, type) and isinstance(owner.__dict__.get(name), property):
        getter = owner.__dict__[name].fget
        setattr(owner, name, property(functools.wraps(getter)(wrapper(getter))))
        return
    original = getattr(owner, name)
    new = functools.wraps(original)(wrapper(original))
    setattr(owner, name, new)
    if not isinstance(owner, type):
        for module in list(sys.modules.values()):
            if getattr(module, "__dict__", {}).get(name) is original:
                setattr(module, name, new)


def after_import(module_name: str, patch):
    """Calls `patch(module)` once `module_name` has been imported: now, at the
    end of its import, or — if its import is under way (it imported torch,
    which loaded torchtpu) — at the first use of one of its names after it."""
    module = sys.modules.get(module_name)
    if module is None:
        _after_import.setdefault(module_name, []).append(patch)
    elif getattr(module.__spec__, "_initializing", False):
        _patch_on_first_use(module, patch)
    else:
        patch(module)


def _patch_on_first_use(module, patch):
    """The module's code stores and reads its names in its dict directly;
    everyone else goes through its attributes, so the first attribute read
    once its code has run (the importer's `from module import name`) patches
    it first."""
    plain = type(module)

    class Patching(plain):
        def __getattribute__(self, name):
            if not plain.__getattribute__(self, "__spec__")._initializing:
                self.__class__ = plain
                patch(self)
            return plain.__getattribute__(self, name)

    module.__class__ = Patching


def save_rng_states(path, key: str, load):
    """Adds the tpu generators' states, under `key`, to the file of random
    states a library has written at `path` (read with the library's `load`)."""
    states = load(path)
    states[key] = torch.tpu.get_rng_state_all()
    torch.save(states, path)


def restore_rng_states(path, key: str, load):
    """Sets the tpu generators' states from `key` of such a file, if there."""
    if os.path.isfile(path):
        states = load(path)
        if key in states:
            torch.tpu.set_rng_state_all(states[key])


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then the patches waiting for it."""

    def __init__(self, loader, patches):
        self._loader, self._patches = loader, patches

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for patch in self._patches:
            patch(module)

    def __getattr__(self, name):  # get_source, get_filename ...: the real loader's
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patches = _after_import.pop(name, None)
        if patches is None:
            return None
        spec = importlib.util.find_spec(name)  # the finders after this one
        if spec is None or spec.loader is None:
            _after_import[name] = patches
            return None
        spec.loader = _PatchingLoader(spec.loader, patches)
        return spec


def install():
    """Applies every integration: now to the libraries already imported, at
    import to the others."""
    from . import accelerate, flex_attention, lightning, transformers

    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for integration in (accelerate, transformers, lightning, flex_attention):
        integration.install()
