"""A speech-style CTC training step: tpu fused against PyTorch CPU eager, side
by side in one run. A 1-D convolutional acoustic model over [batch, features,
frames], per-frame log-probabilities, `F.ctc_loss` of padded targets, AdamW;
every batch has new input and target lengths (as a data loader's would), and
every step reads its loss. Each measurement runs in a process of its own, in
the order CPU, tpu, tpu, CPU (steps of one device slowed the other's next
step in a shared process: each other's spinning worker threads).

    .venv/bin/python bench/ctc.py [--steps 30] [--frames 200] [--batch 8]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def model(features=40, width=128, classes=32):
    return nn.Sequential(
        nn.Conv1d(features, width, 5, padding=2), nn.ReLU(),
        nn.Conv1d(width, width, 5, padding=2), nn.ReLU(),
        nn.Conv1d(width, classes, 1),
    )


def batches(n, batch, frames, features=40, classes=32, longest_target=40):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        x = torch.randn(batch, features, frames, generator=g)
        input_lengths = torch.randint(frames // 2, frames + 1, (batch,), generator=g)
        target_lengths = torch.randint(longest_target // 4, longest_target + 1, (batch,), generator=g)
        targets = torch.randint(1, classes, (batch, longest_target), generator=g)
        out.append((x, targets, input_lengths, target_lengths))
    return out


def child(device, steps, frames, batch):
    """Median step ms after 3 warm-up steps, the losses, and tpu's counters."""
    if device == "tpu":
        import torchtpu
    torch.manual_seed(0)
    net = model().to(device)
    opt = torch.optim.AdamW(net.parameters(), 1e-3)
    losses, times = [], []
    for i, (x, targets, input_lengths, target_lengths) in enumerate(batches(steps, batch, frames)):
        if i == 3 and device == "tpu":
            torchtpu.reset_metrics()
        start = time.perf_counter()
        log_probs = net(x.to(device)).permute(2, 0, 1).log_softmax(2)
        loss = F.ctc_loss(log_probs, targets.to(device), input_lengths.to(device), target_lengths.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    out = {"ms": 1e3 * statistics.median(times[3:]), "losses": losses}
    if device == "tpu":
        metrics = torchtpu.metrics()
        out.update(compilations=metrics["compilations"], fallbacks=sum(metrics["fallbacks"].values()))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.frames, args.batch)))
        return
    runs = {"cpu": [], "tpu": []}
    for device in ("cpu", "tpu", "tpu", "cpu"):
        out = subprocess.run([sys.executable, __file__, "--child", device, "--steps", str(args.steps),
                              "--frames", str(args.frames), "--batch", str(args.batch)],
                             capture_output=True, text=True, check=True)
        runs[device].append(json.loads(out.stdout.strip().splitlines()[-1]))
    cpu, tpu = (statistics.median(r["ms"] for r in runs[d]) for d in ("cpu", "tpu"))
    drift = max(abs(a - b) / abs(a) for a, b in zip(runs["cpu"][0]["losses"], runs["tpu"][0]["losses"]))
    print(f"CTC training step, batch {args.batch}, {args.frames} frames, new lengths every batch "
          f"({args.steps - 3} timed steps, medians of two processes each)")
    print("| CPU eager ms | tpu fused ms | CPU/tpu | tpu compilations while timed | tpu fallbacks | largest loss drift |")
    print("|---|---|---|---|---|---|")
    print(f"| {cpu:.2f} | {tpu:.2f} | {cpu / tpu:.2f}x | {max(r['compilations'] for r in runs['tpu'])} | "
          f"{max(r['fallbacks'] for r in runs['tpu'])} | {drift:.1e} |")


if __name__ == "__main__":
    main()
