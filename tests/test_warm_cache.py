"""Warm caches: `python -m torchtpu.warmup` fills the compilation cache with a
script's first steps and exports it as one bundle; imported in a fresh
process with another cache directory, the same steps compile nothing."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

TRAIN = """
    import torchtpu
    from workloads import train
    print(repr(train("mlp", "tpu", 3)))
"""

IMPORT_AND_TRAIN = """
    import sys, torch, torchtpu
    from workloads import train
    bundle = sys.argv[1]
    assert torchtpu.cache.import_(bundle) > 0
    losses = train("mlp", "tpu", 3)
    m = torchtpu.metrics()
    print(m["compilations"], m["disk_cache_hits"], repr(losses))
    data = open(bundle, "rb").read()
    for damage, why in ((data.replace(b"cpu_features=", b"cpu_features=0"), "cpu_features"),
                        (data.replace(b"xla_flags=", b"xla_flags=--other "), "xla_flags"),
                        (data[:-100], "truncated"), (b"junk", "does not start as one")):
        open(bundle + ".bad", "wb").write(damage)
        try:
            torchtpu.cache.import_(bundle + ".bad")
        except ValueError as e:
            assert why in str(e), e
        else:
            raise AssertionError(f"a bundle with {why} was imported")
    assert torch.ones(3, device="tpu").sum().item() == 3  # the process stays usable
"""


def _run(args, cache, cwd):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                         env=dict(os.environ, PYTHONPATH=str(EXAMPLES), TORCHTPU_CACHE_DIR=str(cache)))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_exported_bundle_warms_a_fresh_process_in_another_directory(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    (tmp_path / "import_and_train.py").write_text(textwrap.dedent(IMPORT_AND_TRAIN))
    bundle = tmp_path / "warm.ttc"
    cold = _run(["-m", "torchtpu.warmup", "--steps", "100", "--export", str(bundle), "train.py"],
                tmp_path / "cache", tmp_path).splitlines()
    assert "program(s) written to" in cold[-1] and not cold[-1].split(": ")[1].startswith("0 "), cold
    compiled = int(cold[-2].split("; ")[1].split()[0])
    assert compiled > 0, cold
    warm = _run([str(tmp_path / "import_and_train.py"), str(bundle)], tmp_path / "elsewhere" / "cache",
                tmp_path).split(maxsplit=2)
    assert int(warm[0]) == 0 and int(warm[1]) == compiled, (cold, warm)
    assert warm[2].strip() == cold[0], (cold, warm)
