"""Float32 dots and convolutions follow PyTorch's float32 matmul setting
(DESIGN §10), read from the programs tpu compiles: "highest" (the default)
is XLA's HIGHEST, "high" HIGH, "medium" XLA's default; other dtypes carry
nothing, and the setting is part of a program's identity in every mode."""
import os
import subprocess
import sys
import textwrap

SCRIPT = """
    import json, os, pathlib, torch, torchtpu
    import torch.nn.functional as F

    dump = pathlib.Path(os.environ["TORCHTPU_DUMP_DIR"])
    a = torch.randn(16, 16, device="tpu")
    # 5x5: more offsets than lower as matrix products (taps), so a convolution
    x, w = torch.randn(2, 3, 8, 8, device="tpu"), torch.randn(4, 3, 5, 5, device="tpu")
    def step(a, x, w):
        return (a @ a).sum() + F.conv2d(x, w).sum()
    # Doubled: the same ops as fused mode's would be the same program (no compilation to read).
    compiled = torch.compile(lambda a, x, w: step(a, x, w) * 2)
    runs = {
        "fused": lambda: step(a, x, w).item(),
        "strict": lambda: step(a, x, w).item(),
        "compiled": lambda: compiled(a, x, w).item(),
        "float64": lambda: step(a.double(), x.double(), w.double()).item(),
    }
    report = []
    for name, run in runs.items():
        with torchtpu.mode("strict" if name == "strict" else "fused"):
            for setting in ["highest", "high", "medium", "highest"]:
                torch.set_float32_matmul_precision(setting)
                seen, before = set(dump.iterdir()), torchtpu.metrics()["compilations"]
                run()
                texts = [p.read_text() for p in set(dump.iterdir()) - seen]
                uses = [t for t in texts if "stablehlo.dot_general" in t or "stablehlo.convolution" in t]
                report.append([name, setting, torchtpu.metrics()["compilations"] - before,
                               sum("stablehlo.dot_general" in t for t in uses),
                               sum("stablehlo.convolution" in t for t in uses),
                               sorted({line.split("precision ")[1].split(">")[0]
                                       for t in uses for line in t.splitlines() if "precision_config" in line})])
    print(json.dumps(report))
"""


def test_dots_and_convolutions_carry_the_matmul_setting(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TORCHTPU_DUMP_DIR=str(tmp_path / "dump"), TORCHTPU_CACHE_DIR=""))
    assert out.returncode == 0, out.stderr
    report = __import__("json").loads(out.stdout.splitlines()[-1])
    expected = {"highest": ["HIGHEST"], "high": ["HIGH"], "medium": []}
    for i, (name, setting, compiled, dots, convs, precisions) in enumerate(report):
        if name == "float64" and i % 4:  # float64 programs never depend on the setting
            assert compiled == 0, (setting, compiled)
        elif i % 4 == 3:  # "highest" again: its programs are reused, never those of another setting
            assert compiled == 0, (name, compiled)
        else:
            assert compiled > 0 and dots >= 1 and convs >= 1, (name, setting, compiled, dots, convs)
            assert precisions == ([] if name == "float64" else expected[setting]), (name, setting, precisions)
