"""TorchTitan trains on tpu: its Llama 3 debug model, launched as its README
launches training (`torchrun ... -m torchtitan.train --module llama3 --config
llama3_debugmodel`), with a tokenizer and a dataset made here, in four
layouts: FSDP2 over 2 processes, FSDP2 x tensor parallel over 4, pipeline
parallel (interleaved 1F1B) over 2, and FSDP2 with torch.compile. Each equals
the same run on CPU with gloo (cpu_reference.py): the same losses and
gradient norms at every step, both runs starting from one seed checkpoint
(TorchTitan's way of comparing runs, as random initialisation differs between
devices) and saving a checkpoint at the end. The debug config's selective
activation checkpointing and FlexAttention are on throughout; float32
parameters, so that the comparison is tight.

Runs in `make titan`'s own venv (requirements-titan.txt); `make test` checks
what TorchTitan asks of the device (tests/test_accelerator.py)."""
import json
import os
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

HERE = Path(__file__).resolve().parent
STEPS = 4
TRAIN = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", str(STEPS),
         "--training.seq_len", "64", "--training.local_batch_size", "2",
         "--training.mixed_precision_param", "float32", "--metrics.log_freq", "1",
         "--metrics.disable_color_printing"]
LAYOUTS = {
    "fsdp2": (2, ["--parallelism.data_parallel_shard_degree", "2"]),
    "fsdp2_tp": (4, ["--parallelism.data_parallel_shard_degree", "2", "--parallelism.tensor_parallel_degree", "2"]),
    "pp": (2, ["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_microbatch_size", "1",
            "--training.disable_cuda_graphs"]),
    # Each TransformerBlock and the loss compiled (Inductor's wrapper hands
    # tpu graphs to torchtpu.compiler); the reference runs them eagerly.
    "fsdp2_compiled": (2, ["--parallelism.data_parallel_shard_degree", "2", "--compile.enable"]),
}
_cpu_runs = {}
STEP_LINE = re.compile(r"step:\s+(\d+)\s+loss:\s+([-\d.]+)\s+grad_norm:\s+([-\d.]+)")


def _make_assets(root: Path):
    """A word-level tokenizer of 1500 words (the model's vocabulary is 2048)
    and 200 documents of Zipf-distributed words, where TorchTitan's debug
    config looks for them (tests/assets under the working directory)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    rng = random.Random(0)
    words = [f"w{i}" for i in range(1500)]
    tokenizer_dir, data_dir = root / "tests/assets/tokenizer", root / "tests/assets/c4_test"
    tokenizer_dir.mkdir(parents=True)
    data_dir.mkdir(parents=True)
    vocab = {"<unk>": 0, "<|begin_of_text|>": 1, "<|end_of_text|>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    (tokenizer_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}))
    with open(data_dir / "data.json", "w") as f:
        for _ in range(200):
            text = " ".join(words[min(int(rng.paretovariate(1.2)), len(words)) - 1] for _ in range(rng.randint(50, 400)))
            f.write(json.dumps({"text": text}) + "\n")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(workdir: Path, device: str, processes: int, args, timeout=1500):
    """One torchrun launch; returns {step: (loss, grad_norm)} as logged."""
    env = {**os.environ, "HF_HOME": str(workdir / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        entry = [str(HERE / "cpu_reference.py")]
    else:
        entry = ["-m", "torchtitan.train"]
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
               f"--master_port={_free_port()}", *entry, *TRAIN, *args]
    run = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    log = run.stdout + run.stderr
    assert run.returncode == 0, f"{device} run failed:\n{log[-6000:]}"
    # Every rank logs; a pipeline's stages without the loss log -1.
    steps = {int(m[1]): (float(m[2]), float(m[3])) for m in STEP_LINE.finditer(log) if float(m[2]) >= 0}
    return steps, log


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Assets and one seed checkpoint (made on the CPU, one process, as
    TorchTitan requires) that every run loads."""
    root = tmp_path_factory.mktemp("titan")
    _make_assets(root)
    _train(root, "cpu", 1, ["--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
                            "--dump_folder", str(root / "seed")])
    assert (root / "seed/checkpoint/step-0").is_dir()
    return root


@pytest.mark.parametrize("layout", LAYOUTS)
def test_trains_as_on_cpu(workdir, layout):
    processes, parallelism = LAYOUTS[layout]
    seed = ["--checkpoint.enable", "--checkpoint.initial_load_path", str(workdir / "seed/checkpoint/step-0")]
    tpu, tpu_log = _train(workdir, "tpu", processes, [*parallelism, *seed, "--dump_folder", str(workdir / layout)])
    reference = tuple(a for a in parallelism if a != "--compile.enable")
    if reference not in _cpu_runs:
        _cpu_runs[reference] = _train(workdir, "cpu", processes,
                                      [*reference, *seed, "--dump_folder", str(workdir / f"{layout}-cpu")])[0]
    cpu = _cpu_runs[reference]
    assert "TPU capacity" in tpu_log and (workdir / layout / f"checkpoint/step-{STEPS}").is_dir()
    assert sorted(cpu) == sorted(tpu) == list(range(1, STEPS + 1)), (cpu, tpu)
    for step in cpu:
        (loss, norm), (cpu_loss, cpu_norm) = tpu[step], cpu[step]
        assert loss == pytest.approx(cpu_loss, rel=1e-4), (step, loss, cpu_loss)
        assert norm == pytest.approx(cpu_norm, rel=3e-4), (step, norm, cpu_norm)
