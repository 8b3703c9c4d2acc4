"""Training runs of the libraries users hand their models to — Hugging Face
`Trainer`, a plain Accelerate loop, a Lightning `Trainer` — written as their
documentation writes them, with nothing device-specific: the device is what
the library picks (or `accelerator=` for Lightning). Each returns what the
tests compare (losses, parameters, devices); run as a script, one run per
process (`python library_runs.py <run> <json arguments>`), it prints them as
a JSON line for the launcher tests.
"""
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

RESULT = "RESULT "


def _llama(dropout=0.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         attention_dropout=dropout)
    return LlamaForCausalLM(config)


def _token_rows(n=32, seq=16):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": x, "labels": x} for x in torch.randint(0, 64, (n, seq), generator=g)]


def trainer(output_dir, steps=6, dropout=0.0, resume=None, predict=False, **arguments):
    """`transformers.Trainer` on a tiny Llama: logged losses, final
    parameters' sum, the device of the arguments and of the model."""
    from transformers import Trainer, TrainingArguments

    model = _llama(dropout)
    arguments = {"per_device_train_batch_size": 4, "max_steps": steps, "logging_steps": 1, "report_to": [],
                 "save_strategy": "no", "seed": 0, "data_seed": 0, "disable_tqdm": True, **arguments}
    args = TrainingArguments(output_dir=output_dir, **arguments)
    rows = _token_rows()
    run = Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows[:8])
    run.train(resume_from_checkpoint=resume)
    out = {"losses": [h["loss"] for h in run.state.log_history if "loss" in h],
           "args_device": str(args.device), "model_device": str(next(model.parameters()).device),
           "distributed": str(run.accelerator.distributed_type), "processes": args.world_size,
           "parameters": sum(p.detach().double().sum().item() for p in model.parameters()),
           "scaler": _scaler_device(run.accelerator.scaler)}
    if predict:
        out["eval_loss"] = run.evaluate()["eval_loss"]
        out["logits"] = run.predict(rows[:4]).predictions[0, :2, :4].tolist()
    return out


def _scaler_device(scaler):
    return None if scaler is None else scaler._device


def accelerate_loop(mixed_precision="no", cpu=False, checkpoint=None):
    """A plain `Accelerator()` loop: a small MLP, SGD, gradient accumulation
    and clipping, the losses gathered from every process; with `checkpoint`
    it saves its state there after 2 steps and reloads it, and reports the
    next dropout mask both ways."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import set_seed

    AcceleratorState._reset_state(reset_partial_state=True)  # as in a process of its own
    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=cpu, gradient_accumulation_steps=2)
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8 // accelerator.num_processes)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    dtypes = set()  # of the first layer's outputs (Accelerate returns float32 from the model)
    accelerator.unwrap_model(model)[0].register_forward_hook(lambda m, i, out: dtypes.add(str(out.dtype)))
    losses = []
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()).mean().item())
    out = {"losses": losses, "device": str(accelerator.device), "distributed": str(accelerator.distributed_type),
           "scaler": _scaler_device(accelerator.scaler), "dtypes": sorted(dtypes),
           "parameters": sum(p.detach().double().sum().item() for p in accelerator.unwrap_model(model).parameters())}
    if checkpoint:
        accelerator.save_state(checkpoint)
        drawn = torch.rand(4, device=accelerator.device).tolist()
        torch.rand(100, device=accelerator.device)  # moves the generator on
        accelerator.load_state(checkpoint)
        out["draws"] = [drawn, torch.rand(4, device=accelerator.device).tolist()]
    return out


def lightning_fit(accelerator, devices=1, precision="32-true", checkpoint_dir=None, resume=None, epochs=2):
    """A Lightning `Trainer.fit` of a small MLP with validation: losses of the
    first steps of this process, validation loss, parameters' sum."""
    import lightning as L

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
            self.losses = []

        def training_step(self, batch, index):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
            self.losses.append(loss.item())
            return loss

        def validation_step(self, batch, index):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x).float(), y), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    train = torch.utils.data.DataLoader(data, batch_size=16 // devices)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:16], y[:16]), batch_size=8)
    model = Regression()
    run = L.Trainer(accelerator=accelerator, devices=devices, precision=precision, max_epochs=epochs, logger=False,
                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=checkpoint_dir,
                    enable_checkpointing=checkpoint_dir is not None)
    run.fit(model, train, val, ckpt_path=resume)
    return {"losses": model.losses, "val_loss": run.callback_metrics["val_loss"].item(), "rank": run.global_rank,
            "strategy": type(run.strategy).__name__, "device": str(run.strategy.root_device),
            "precision": type(run.precision_plugin).__name__,
            "autocast": getattr(run.precision_plugin, "device", None),
            "parameters": sum(p.detach().double().sum().item() for p in model.parameters())}


if __name__ == "__main__":
    run, arguments = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    line = (RESULT + json.dumps(globals()[run](**arguments)) + "\n").encode()
    # One write of less than a pipe's atomic size: the lines of the processes
    # sharing the launcher's stdout do not interleave.
    assert len(line) < 4096
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line)
