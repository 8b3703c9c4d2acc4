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
    print(m["compilations"], m["disk_cache_hits"], m["program_cache_misses"], repr(losses))
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


CHANGING = """
    import sys, torch, torchtpu
    F = torch.nn.functional
    if len(sys.argv) > 2:
        assert torchtpu.cache.import_(sys.argv[2]) > 0

    def train(device):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 5)).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for b in map(int, sys.argv[1].split(",")):
            g = torch.Generator().manual_seed(b)
            x, y = torch.randn(b, 8, generator=g), torch.randint(0, 5, (b,), generator=g)
            loss = F.cross_entropy(m(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    losses = train("tpu")
    m = torchtpu.metrics()
    print(m["compilations"], m["bucketed_runs"], max(abs(a - b) / b for a, b in zip(losses, train("cpu"))))
"""


def _run(args, cache, cwd):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]),
                                  TORCHTPU_CACHE_DIR=str(cache)))
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
                tmp_path).split(maxsplit=3)
    # Every program loaded from the bundle, and each found in memory: the import preloaded them.
    assert int(warm[0]) == 0 and int(warm[1]) == compiled and int(warm[2]) == 0, (cold, warm)
    assert warm[3].strip() == cold[0], (cold, warm)


def test_bucket_warmup_makes_sizes_it_never_met_compile_nothing(tmp_path):
    """Changing sizes: the warmup meets batches of one bucket, compiles every
    bucket up to 128 in threads and exports them with the structure's fit;
    a fresh process runs batches of every other bucket compiling nothing."""
    (tmp_path / "changing.py").write_text(textwrap.dedent(CHANGING))
    bundle = tmp_path / "warm.ttc"
    cold = _run(["-m", "torchtpu.warmup", "--steps", "100", "--buckets-up-to", "128", "--export", str(bundle),
                 "changing.py", "5,7,6"], tmp_path / "cache", tmp_path).splitlines()
    assert "program(s) for buckets up to 128" in cold[-2] and not cold[-2].split(": ")[1].startswith("0 "), cold
    sizes = "5,40,100,20,70,3,128,2"  # the first step's structure is met once: as in the warmup
    warm = _run(["changing.py", sizes, str(bundle)], tmp_path / "elsewhere", tmp_path).split()
    assert int(warm[0]) == 0 and int(warm[1]) == len(sizes.split(",")) - 1 and float(warm[2]) < 1e-5, (cold, warm)
