"""The Rust core's layers (DESIGN §2, docs/ARCHITECTURE.md): each top-level
module of crates/torchtpu/src uses only the layers below it, so the tree has
no cycle. Read from the sources' `crate::` paths, unit-test modules aside."""
import pathlib
import re

SRC = pathlib.Path(__file__).parent.parent / "crates" / "torchtpu" / "src"

BASE = {"error", "metrics"}
# What each layer may use. The op table and the runtime sit side by side:
# a lowering never reaches a storage, the runtime never reaches the op table.
MAY_USE = {
    "error": set(),
    "metrics": set(),
    "ir": BASE,
    "lower": BASE | {"ir"},
    "runtime": BASE | {"ir"},
    "exec": BASE | {"ir", "lower", "runtime"},
    "distributed": BASE | {"ir", "lower", "runtime", "exec"},
    "boundary": BASE | {"ir", "lower", "runtime", "exec", "distributed"},
}

PATH = re.compile(r"(?<![\w$])crate::(?:\{([^}]*)\}|(\w+))")


def top_level_modules():
    return {p.stem if p.is_file() else p.name for p in SRC.iterdir() if p.name != "lib.rs"}


def uses(module):
    """The top-level modules that `module`'s files name, tests aside."""
    root = SRC / module if (SRC / module).is_dir() else SRC / f"{module}.rs"
    found = {}
    for f in [root] if root.is_file() else sorted(root.rglob("*.rs")):
        code = f.read_text().split("#[cfg(test)]")[0]
        for group, single in PATH.findall(code):
            names = [single] if single else re.findall(r"(?:^|,)\s*(\w+)", group)
            for name in names:
                if name != module:
                    found.setdefault(name, f.relative_to(SRC).as_posix())
    return found


def test_every_module_is_a_known_layer():
    modules = top_level_modules()
    assert modules == set(MAY_USE), "a new top-level module needs its place among the layers"
    assert len(modules) <= 10


def test_layers_use_only_the_layers_below():
    up = {
        f"{module} -> {used} ({where})"
        for module in MAY_USE
        for used, where in uses(module).items()
        if used in MAY_USE and used not in MAY_USE[module]
    }
    assert not up, "arrows pointing up a layer:\n" + "\n".join(sorted(up))
