"""torch.distributed on tpu, side by side in one launch of 2 processes:

1. all_reduce bandwidth of tpu tensors through the "pjrt" backend vs gloo on
   CPU tensors of the same group, 1 KB to 64 MB (algorithm bandwidth: bytes
   reduced per second; the best of 3 rounds), and the same for
   all_gather_into_tensor (FSDP2's collective; bytes of each process's input);
2. a DDP training step of the MLP of examples/workloads.py (batch 128 per
   process) on 2 processes vs the same step in 1 process.

    python bench/distributed.py
"""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SIZES = [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 23, 1 << 26]  # bytes


def _launch(world, mode):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, __file__, mode], stdout=subprocess.PIPE, text=True, env={
        **os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(r), "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world)}) for r in range(world)]
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{mode} failed")
    return outs[0]


def _worker(mode):
    import torch
    import torch.distributed as dist

    import torchtpu  # noqa: F401

    dist.init_process_group()
    device = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
    torch.tpu.set_device(device)
    if mode == "collectives":
        collectives = {
            "all_reduce": lambda x, out: dist.all_reduce(x),
            "all_gather_into_tensor": lambda x, out: dist.all_gather_into_tensor(out, x),
        }
        for name, call in collectives.items():
            print(f"{name}, 2 processes   tpu (pjrt) MB/s   gloo CPU MB/s   ratio")
            for size in SIZES:
                n = size // 4
                reps = max(8, min(200, (1 << 26) // size))
                best = {"tpu": 0.0, "cpu": 0.0}
                for _ in range(3):  # the best of 3 rounds, tpu and CPU alternating: the machine is shared
                    for dev in best:
                        on = device if dev == "tpu" else "cpu"
                        x, out = torch.ones(n, device=on), torch.empty(2 * n, device=on)
                        call(x, out)
                        if dev == "tpu":
                            torch.tpu.synchronize()
                        start = time.perf_counter()
                        for _ in range(reps):
                            call(x, out)
                        if dev == "tpu":
                            torch.tpu.synchronize()
                        best[dev] = max(best[dev], size * reps / (time.perf_counter() - start) / 1e6)
                tpu, cpu = best["tpu"], best["cpu"]
                print(f"  {size / 1024:10.0f} KB            {tpu:10.1f}      {cpu:10.1f}   {tpu / cpu:5.2f}x")
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
        from workloads import mlp_model

        torch.manual_seed(0)
        model = mlp_model().to(device)
        if dist.get_world_size() > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(128, 784, device=device), torch.randint(0, 10, (128,), device=device)
        times = []
        for step in range(8):
            start = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            if step >= 3:
                times.append(time.perf_counter() - start)
        print(sorted(times)[len(times) // 2] * 1e3)
    dist.destroy_process_group()


def main():
    print(_launch(2, "collectives"), end="")
    one, two = float(_launch(1, "ddp")), float(_launch(2, "ddp"))
    print(f"DDP step, MLP, batch 128 per process: 1 process {one:.1f} ms, 2 processes {two:.1f} ms "
          f"({two / one:.2f}x the time for 2x the samples)")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _worker(sys.argv[1])
    else:
        main()
