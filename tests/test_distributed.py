"""torch.distributed on tpu tensors, in torchrun-style launches of 2 (or 4)
processes on the CPU plugin (the programs are in dist_workers.py); each launch is
bounded by a timeout, so a hang fails the test instead of the suite."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import GLOO_CARRIES_TPU, require_devices

HERE = Path(__file__).resolve().parent


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(program, world=2, timeout=240, env=None):
    """Runs dist_workers.<program> in `world` processes; returns their outputs."""
    require_devices(max(world, int((env or {}).get("TORCHTPU_DEVICE_COUNT", 1))))
    port = str(_free_port())
    procs = []
    for rank in range(world):
        penv = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
                "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world), **(env or {})}
        procs.append(subprocess.Popen([sys.executable, str(HERE / "dist_workers.py"), program], env=penv,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    assert not failed, "\n".join(f"--- rank {r} (exit {c}):\n{outputs[r][-4000:]}" for r, c in failed)
    return outputs


def test_collectives_equal_gloo_on_cpu():
    """4 processes: subgroups that leave ranks out, roots and all-to-all beyond 2."""
    launch("collectives", world=4)


def test_ddp_with_sparse_embedding_gradients():
    launch("ddp_sparse_embedding")


def test_fsdp2_trains_as_one_cpu_process():
    launch("fsdp2")


def test_fsdp_wrapper_trains_as_one_cpu_process():
    launch("fsdp_wrapper")


def test_dtensor_and_tensor_parallel():
    launch("dtensor")


def test_ddp_with_rank_divergent_code_trains_as_one_cpu_process():
    """DDP (several gradient buckets) while rank 0 logs `loss.item()` and runs
    extra ops of other shapes every step: losses and parameters equal one CPU
    process on the global batch (as without the logging), nothing hangs."""
    outputs = launch("ddp_rank0_logs")
    assert "step 2 loss" in outputs[0] and "step 2 loss" not in outputs[1]
    assert not any("Time stats are currently only collected" in out for out in outputs)


def test_mismatched_collectives_raise_on_every_rank():
    launch("mismatch", env={"DIST_TIMEOUT": "20"})


def test_collective_programs_over_the_devices_of_one_process_equal_gloo():
    launch("collective_programs", world=1, env={"TORCHTPU_DEVICE_COUNT": "4"})


@pytest.mark.parametrize("backend", ["", "gloo", "cpu:gloo"])
def test_device_id_point_to_point_and_splits(backend):
    if backend and not GLOO_CARRIES_TPU:
        pytest.skip(f"torch {torch.__version__} makes gloo groups without a creator to wrap (before 2.15)")
    launch("device_id_and_p2p", env={"DIST_BACKEND": backend})


# The schedules of one world size share a launch: one group, one process
# start, and the programs of same-shaped stages compiled once.
@pytest.mark.parametrize("schedules, world", [
    ("gpipe,1f1b,interleaved_zero_bubble,zbv_zero_bubble", 2), ("interleaved_1f1b", 4),
])
def test_pipeline_schedules_train_as_one_cpu_process(schedules, world):
    launch("pipeline", world=world, env={"PP_SCHEDULES": schedules})


def test_pipeline_stage_whose_peer_never_sends_raises_within_the_timeout():
    outputs = launch("pipeline_peer_missing", env={"DIST_TIMEOUT": "5"})
    assert "raised after" in outputs[1], outputs[1]


@pytest.mark.skipif(not GLOO_CARRIES_TPU, reason="this torch makes nccl groups without a registered creator (before 2.15)")
def test_nccl_names_the_backends_that_carry_tpu_tensors():
    outputs = launch("nccl_refused", world=1)
    assert "'nccl' carries CUDA tensors only" in outputs[0] and "'gloo'" in outputs[0], outputs[0]


def test_processes_meet_through_the_groups_store():
    launch("runtime_group")


def test_registered_for_tpu_tensors():
    import torch.distributed as dist

    assert dist.Backend.default_device_backend_map["tpu"] == "pjrt"
    assert dist.Backend.backend_capability["pjrt"] == ["tpu"]
