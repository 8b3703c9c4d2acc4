"""Trains the MLP of examples/workloads.py on "tpu" in each eager mode, next to
PyTorch on CPU, and prints losses and steps/s."""
import time

import torchtpu
from workloads import train

STEPS = 20
LR = 1e-3


def timed(device):
    marks = []
    losses = train("mlp", device, STEPS, LR, on_step=lambda *_: marks.append(time.perf_counter()))
    # The first steps compile; the rate is over the rest.
    return losses, (len(marks) - 3) / (marks[-1] - marks[2])


def main():
    results = {"cpu": timed("cpu")}
    for mode in ("debug", "strict", "fused"):
        with torchtpu.mode(mode):
            torchtpu.reset_metrics()
            results[f"tpu/{mode}"] = timed("tpu")
            fallbacks = torchtpu.metrics()["fallbacks"]
            if fallbacks:
                print(f"tpu/{mode}: CPU fallbacks {fallbacks}")
    ref = results["cpu"][0]
    for name, (losses, rate) in results.items():
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        print(f"{name:>11}: {rate:6.1f} steps/s  losses " + " ".join(f"{l:.4f}" for l in losses[::4])
              + f"  (max relative difference to CPU {worst:.1e})")


if __name__ == "__main__":
    main()
