"""torchtpu.advise(): the products and convolutions whose shapes a TPU pads or
under-fills, with the model's lines, shapes and padded fractions (from the
plans a run built, on any plugin)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchtpu

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from workloads import GPT  # noqa: E402

WORKLOADS = str(ROOT / "examples" / "workloads.py")


def findings_of(**sizes):
    torchtpu._C.clear_advice()
    torch.manual_seed(0)
    model = GPT(vocab=256, seq=128, dropout=0.0, layers=1, **sizes).to("tpu")
    tokens = torch.randint(0, 256, (4, 128), device="tpu")
    model(tokens).logsumexp(-1).mean().backward()
    torch.tpu.synchronize()
    return torchtpu.advise(file=open(os.devnull, "w"), clear=True)


def line_of(text):
    return next(i for i, line in enumerate(open(WORKLOADS), 1) if text in line)


@pytest.fixture(autouse=True)
def fused():
    with torchtpu.mode("fused"):
        yield


def test_heads_of_64_are_reported_at_the_attention_line():
    found = findings_of(d=128, heads=2)
    attention = f"{WORKLOADS}:{line_of('F.scaled_dot_product_attention')}"
    # Q·Kᵀ of the fused attention: [batch, heads, 128, 64] by [batch, heads, 128, 64], over 64.
    scores = [f for f in found if f["source"] == attention and f["shapes"] == ([4, 2, 128, 64], [4, 2, 128, 64])]
    assert scores and scores[0]["wasted"] == pytest.approx(0.5), found
    assert "attention head dimension of 64" in scores[0]["reasons"][0]
    # Every finding is attention's (forward or backward): the rest is aligned.
    assert found and all(f["source"].startswith(attention) for f in found), found


def test_a_hidden_size_of_96_is_reported_at_its_linear_layers():
    found = findings_of(d=96, heads=1)
    qkv = f"{WORKLOADS}:{line_of('self.qkv(self.ln1(x))')}"
    (projection,) = [f for f in found if f["source"] == qkv and f["op"].startswith("aten::addmm")]
    assert projection["shapes"] == ([512, 96], [96, 288])
    assert projection["wasted"] == pytest.approx(1 - 96 * 288 / (128 * 384))
    assert any("contracting dimension 96" in r and "make it 128" in r for r in projection["reasons"])


def test_heads_of_128_and_a_hidden_size_of_256_are_not():
    assert findings_of(d=256, heads=2) == []


def test_printed_at_exit_when_asked():
    script = ("import torch, torchtpu; "
              "(torch.randn(64, 96, device='tpu') @ torch.randn(96, 1000, device='tpu')).sum().item()")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TORCHTPU_ADVISE": "1"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "contracting dimension 96 is not a multiple of 128" in done.stderr
    assert "only 64 rows per product" in done.stderr, done.stderr
