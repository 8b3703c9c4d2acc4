"""The training libraries users hand their models to, unmodified, on tpu
(runs in library_runs.py): Hugging Face `Trainer` and a plain Accelerate loop
pick tpu by themselves, a Lightning `Trainer` with `accelerator="torchtpu"`;
each trains with CPU's losses, in one process and as DDP over 2 launched the
libraries' way (`accelerate launch`, `torchrun`, Lightning's own launcher)."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate", reason="pip install --no-deps -r requirements-models.txt")
pytest.importorskip("lightning", reason="pip install --no-deps -r requirements-models.txt")

from conftest import require_autoload, require_devices  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import library_runs as runs  # noqa: E402

RTOL = 1e-4


def _launch(command, timeout=300):
    """Runs a launcher command (its processes print runs.RESULT lines; "PORT"
    in it becomes a free port); the results of every process, as printed."""
    require_devices(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["MASTER_PORT"] = str(port)
    command = [str(port) if part == "PORT" else part for part in command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=HERE)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    results = [json.loads(line[len(runs.RESULT):]) for line in done.stdout.splitlines() if line.startswith(runs.RESULT)]
    assert results, done.stdout[-3000:]
    return results


def _close(a, b, rtol=RTOL):
    torch.testing.assert_close(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64),
                               rtol=rtol, atol=1e-6)


# ---------------------------------------------------------------- Hugging Face


def test_trainer_picks_tpu_and_trains_with_cpu_losses(tmp_path):
    """Nothing device-specific: accumulation, clipping (the default 1.0), the
    default fused AdamW, evaluate and predict; `use_cpu=True` still gets the CPU."""
    import torchtpu

    torchtpu.reset_metrics()
    tpu = runs.trainer(str(tmp_path / "tpu"), gradient_accumulation_steps=2, predict=True)
    assert torchtpu.metrics()["fallbacks"] == {}
    cpu = runs.trainer(str(tmp_path / "cpu"), gradient_accumulation_steps=2, predict=True, use_cpu=True)
    assert (tpu["args_device"], tpu["model_device"]) == ("tpu:0", "tpu:0")
    assert (cpu["args_device"], cpu["model_device"]) == ("cpu", "cpu")
    assert len(tpu["losses"]) == 6
    for key in ("losses", "parameters", "eval_loss", "logits"):
        _close(tpu[key], cpu[key])


def test_trainer_mixed_precision(tmp_path):
    """fp16 autocasts to float16 with a gradient scaler on tpu (Accelerate
    names fp16's devices one by one); bf16 to bfloat16. Both within their
    precision of float32's losses."""
    fp32 = runs.trainer(str(tmp_path / "fp32"))
    fp16 = runs.trainer(str(tmp_path / "fp16"), fp16=True)
    bf16 = runs.trainer(str(tmp_path / "bf16"), bf16=True)
    assert fp16["scaler"] == "tpu" and fp16["model_device"] == "tpu:0"
    assert bf16["scaler"] is None
    _close(fp16["losses"], fp32["losses"], rtol=2e-3)
    _close(bf16["losses"], fp32["losses"], rtol=2e-2)


def test_trainer_resumes_a_tpu_checkpoint(tmp_path):
    """A checkpoint saved on tpu (with the tpu generators' states: attention
    dropout draws on tpu) resumes with the losses of the run not stopped."""
    whole = runs.trainer(str(tmp_path / "whole"), dropout=0.3)
    runs.trainer(str(tmp_path / "stopped"), dropout=0.3, steps=6, save_strategy="steps", save_steps=3)
    resumed = runs.trainer(str(tmp_path / "stopped"), dropout=0.3, resume=str(tmp_path / "stopped" / "checkpoint-3"))
    # Its history holds the checkpoint's 3 losses, then its own.
    _close(resumed["losses"], whole["losses"])
    _close(resumed["parameters"], whole["parameters"])


def test_accelerator_loop_picks_tpu(tmp_path):
    tpu = runs.accelerate_loop(checkpoint=str(tmp_path / "state"))
    cpu = runs.accelerate_loop(cpu=True)
    assert (tpu["device"], cpu["device"]) == ("tpu", "cpu")
    _close(tpu["losses"], cpu["losses"])
    _close(tpu["parameters"], cpu["parameters"])
    # load_state restores the tpu generator: the draws after it repeat.
    assert tpu["draws"][0] == tpu["draws"][1]


def test_accelerator_fp16_on_tpu():
    fp16 = runs.accelerate_loop(mixed_precision="fp16")
    fp32 = runs.accelerate_loop()
    assert fp16["scaler"] == "tpu" and fp16["dtypes"] == ["torch.float16"]
    _close(fp16["losses"], fp32["losses"], rtol=1e-2)


def test_a_script_that_imports_accelerate_before_torch():
    """`import torch` inside Accelerate's own import loads torchtpu while
    Accelerate's modules are half made: they are adjusted on first use."""
    require_autoload()
    program = ("from accelerate import Accelerator\n"
               "accelerator = Accelerator(mixed_precision='fp16')\n"
               "assert (accelerator.device.type, accelerator.scaler._device) == ('tpu', 'tpu')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_trainer_under_accelerate_launch_is_ddp_of_the_global_batch(tmp_path):
    """`accelerate launch --num_processes 2`: DDP over torchtpu's backend, each
    process half the batch, the losses of one process on the whole batch."""
    one = runs.trainer(str(tmp_path / "one"))
    arguments = json.dumps({"output_dir": str(tmp_path / "two"), "per_device_train_batch_size": 2})
    two = _launch([str(Path(sys.executable).parent / "accelerate"), "launch", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "PORT",
                   "library_runs.py", "trainer", arguments])
    assert len(two) == 2
    for rank in two:
        assert rank["distributed"] == "DistributedType.MULTI_GPU" and rank["processes"] == 2
        _close(rank["losses"], one["losses"])
        _close(rank["parameters"], one["parameters"])
    assert sorted(rank["model_device"] for rank in two) == ["tpu:0", "tpu:1"]


def test_accelerate_loop_under_torchrun_equals_one_process():
    one = runs.accelerate_loop()
    two = _launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                   "PORT", "library_runs.py", "accelerate_loop"])
    assert sorted(rank["device"] for rank in two) == ["tpu:0", "tpu:1"]
    for rank in two:
        _close(rank["losses"], one["losses"])
        _close(rank["parameters"], one["parameters"])


def test_device_map_auto_loads_onto_tpu(tmp_path):
    """`from_pretrained(..., device_map="auto")` places the model on the
    devices Accelerate lists (tpu, as CUDA's), and it generates CPU's tokens."""
    from transformers import LlamaForCausalLM

    runs._llama().save_pretrained(tmp_path)
    placed = LlamaForCausalLM.from_pretrained(tmp_path, device_map="auto")
    assert {p.device for p in placed.parameters()} == {torch.device("tpu", 0)}
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    tokens = placed.generate(ids.to("tpu"), max_new_tokens=4, do_sample=False).cpu()
    assert torch.equal(tokens, LlamaForCausalLM.from_pretrained(tmp_path).generate(ids, max_new_tokens=4, do_sample=False))


# ---------------------------------------------------------------- Lightning


def test_lightning_fit_on_tpu_equals_cpu(tmp_path):
    tpu = runs.lightning_fit("torchtpu")
    cpu = runs.lightning_fit("cpu")
    assert (tpu["strategy"], tpu["device"]) == ("SingleDeviceStrategy", "tpu:0")
    for key in ("losses", "val_loss", "parameters"):
        _close(tpu[key], cpu[key])
    bf16 = runs.lightning_fit("torchtpu", precision="bf16-mixed")
    assert (bf16["precision"], bf16["autocast"]) == ("MixedPrecision", "tpu")
    _close(bf16["losses"], cpu["losses"], rtol=2e-2)


def test_lightning_checkpoint_resumes(tmp_path):
    """A checkpoint of epoch 1 written on tpu, resumed for epoch 2, ends
    where two epochs in one run end."""
    whole = runs.lightning_fit("torchtpu", epochs=2)
    runs.lightning_fit("torchtpu", epochs=1, checkpoint_dir=str(tmp_path))
    (checkpoint,) = (tmp_path / "checkpoints").glob("*.ckpt")
    resumed = runs.lightning_fit("torchtpu", epochs=2, checkpoint_dir=str(tmp_path / "again"), resume=str(checkpoint))
    _close(resumed["losses"], whole["losses"][len(whole["losses"]) // 2:])
    _close(resumed["parameters"], whole["parameters"])


def test_lightning_ddp_on_tpu_equals_ddp_on_cpu():
    """`devices=2`: Lightning launches the second process itself."""
    def fit(accelerator):
        arguments = json.dumps({"accelerator": accelerator, "devices": 2})
        return sorted(_launch([sys.executable, "library_runs.py", "lightning_fit", arguments]),
                      key=lambda r: r["rank"])

    tpu, cpu = fit("torchtpu"), fit("cpu")
    assert [(r["strategy"], r["device"]) for r in tpu] == [("DDPStrategy", "tpu:0"), ("DDPStrategy", "tpu:1")]
    for t, c in zip(tpu, cpu):
        for key in ("losses", "val_loss", "parameters"):
            _close(t[key], c[key])
