"""An embedding table trained with sparse gradients (recommender-style
EmbeddingBag, nn.Embedding(sparse=True)): tpu fused vs PyTorch CPU eager, and
each against the same table trained with dense gradients, side by side in one
process (cells interleaved over rounds, medians; each step reads its loss).

    .venv/bin/python bench/sparse.py [rows]
"""
import statistics
import sys
import time
import warnings

import torch
import torchtpu

warnings.filterwarnings("ignore", message="Sparse invariant checks")

ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
WIDTH, BAGS, PER_BAG, STEPS, ROUNDS = 64, 256, 20, 10, 5

# name: the optimizer of the table's parameters, given whether its gradient is sparse
OPTIMIZERS = {
    "SGD": lambda p, sparse: torch.optim.SGD(p, lr=0.1),
    "Adagrad": lambda p, sparse: torch.optim.Adagrad(p, lr=0.1),
    "SparseAdam / Adam": lambda p, sparse: (torch.optim.SparseAdam if sparse else torch.optim.Adam)(p, lr=1e-3),
}


def make(device, optimizer, sparse):
    torch.manual_seed(0)
    emb = torch.nn.EmbeddingBag(ROWS, WIDTH, mode="sum", sparse=sparse).to(device)
    head = torch.nn.Linear(WIDTH, 1).to(device)
    opt = OPTIMIZERS[optimizer](emb.parameters(), sparse)
    head_opt = torch.optim.SGD(head.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    batches = [
        (torch.randint(0, ROWS, (BAGS, PER_BAG), generator=generator).to(device), torch.randn(BAGS, 1).to(device))
        for _ in range(4)
    ]

    def steps(n):
        for i in range(n):
            idx, target = batches[i % len(batches)]
            loss = torch.nn.functional.mse_loss(head(emb(idx)), target)
            opt.zero_grad()
            head_opt.zero_grad()
            loss.backward()
            opt.step()
            head_opt.step()
            loss.item()

    return steps


def main():
    print(f"EmbeddingBag({ROWS}, {WIDTH}), {BAGS} bags of {PER_BAG}; ms per step, medians of {ROUNDS} rounds")
    cells = {}
    for optimizer in OPTIMIZERS:
        for sparse in (True, False):
            for device in ("cpu", "tpu"):
                steps = make(device, optimizer, sparse)
                steps(3)  # warm-up (and compilation)
                cells[optimizer, sparse, device] = (steps, [])
    torchtpu.reset_metrics()
    for _ in range(ROUNDS):
        for steps, times in cells.values():
            start = time.perf_counter()
            steps(STEPS)
            times.append((time.perf_counter() - start) / STEPS * 1e3)
    metrics = torchtpu.metrics()
    print(f"| optimizer | gradient | CPU eager ms | tpu ms | CPU/tpu |")
    print("|---|---|---|---|---|")
    for optimizer in OPTIMIZERS:
        for sparse in (True, False):
            cpu = statistics.median(cells[optimizer, sparse, "cpu"][1])
            tpu = statistics.median(cells[optimizer, sparse, "tpu"][1])
            kind = "sparse" if sparse else "dense"
            print(f"| {optimizer} | {kind} | {cpu:.2f} | {tpu:.2f} | {cpu / tpu:.2f}x |")
    print(f"while timed: compilations {metrics['compilations']}, fallbacks {metrics['fallbacks'] or 'none'}")


if __name__ == "__main__":
    main()
