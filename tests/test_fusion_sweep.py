"""Random fused programs of products, broadcasts, elementwise ops and sums
against CPU: XLA fuses such neighbours in ways one op at a time never shows
(the CPU plugin's YNNPACK fusions returned 1e200s for a product by a
broadcast scalar; bench/RESULTS.md, 2026-11-30). With those fusions back on,
two of the four parts fail (200 programs, ~10 s)."""
import random

import pytest
import torch
import torchtpu

UNARY = ["exp", "tanh", "mT", "sum", "amax"]
BINARY = ["matmul", "mul", "add", "sub", "where"]


def expression(rng, depth):
    """A random expression tree over x, y and broadcasts of a scalar, a row and a column."""
    if depth == 0:
        return rng.choice(["x", "y", "scalar", "row", "col"])
    op = rng.choice(UNARY + BINARY)
    return (op, *(expression(rng, depth - 1) for _ in range(1 if op in UNARY else 2)))


def evaluate(e, leaves, n):
    if isinstance(e, str):
        return leaves[e]
    op, *args = e
    a, *b = [evaluate(x, leaves, n) for x in args]
    return {
        "exp": lambda: a.clamp(max=5).exp(),
        "tanh": lambda: a.tanh(),
        "mT": lambda: a.mT,
        "sum": lambda: a.sum(-1, keepdim=True).expand_as(a),
        "amax": lambda: a.amax(-1, keepdim=True).expand_as(a),
        "matmul": lambda: (a @ b[0]) / n,
        "mul": lambda: a * b[0],
        "add": lambda: a + b[0],
        "sub": lambda: a - b[0],
        "where": lambda: torch.where(a > b[0], a, b[0]),
    }[op]()


def leaves(device, batch, n, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = (torch.randn(batch, n, n, generator=g, dtype=torch.float64).to(device) for _ in range(2))
    row, col = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, 1, generator=g, dtype=torch.float64)
    return dict(x=x, y=y, scalar=torch.full_like(x, 0.37), row=row.to(device).expand_as(x),
                col=col.to(device).expand_as(x))


@pytest.mark.parametrize("part", range(4))
def test_random_fused_programs_match_cpu(part):
    rng = random.Random(part)
    with torchtpu.mode("fused"):
        for case in range(50):
            batch, n = rng.choice([1, 3, 5]), rng.choice([8, 17, 32, 60])
            e, summed = expression(rng, rng.choice([2, 3, 4])), rng.random() < 0.5

            def f(device):
                out = evaluate(e, leaves(device, batch, n, case), n)
                return out.sum(-1) if summed else out

            want = f("cpu")
            got = f("tpu").cpu()
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10 * (1 + want.abs().max().item()),
                                       msg=lambda m: f"{e} (summed: {summed}, {batch}x{n}x{n}): {m}")
