"""`transformers.Trainer` on tpu: the device comes from Accelerate (see
`torchtpu.integrations.accelerate`) and from `is_torch_tpu_available`, which
before transformers 5.23 asked for Google's `torch_tpu` package rather than
for a tpu accelerator (5.17: the Trainer left its batches on the CPU); the
Trainer's own checkpoints save and restore the random states of the devices
it names, and tpu's join them (key "tpu", beside "cuda"), so that a resumed
run draws what it would have.
"""
import os

import torch

from . import after_import, replace, restore_rng_states, save_rng_states, tpu_wanted


def _rng_file(trainer, directory):
    name = "rng_state.pth" if trainer.args.world_size <= 1 else f"rng_state_{trainer.args.process_index}.pth"
    return os.path.join(directory, name)


def _patch_trainer(trainer_module):
    from transformers.trainer_pt_utils import safe_globals

    def load(path):
        with safe_globals():
            return torch.load(path, weights_only=True)

    def save(original):
        def _save_rng_state(self, output_dir):
            original(self, output_dir)
            if tpu_wanted():
                save_rng_states(_rng_file(self, output_dir), "tpu", load)

        return _save_rng_state

    def restore(original):
        def _load_rng_state(self, checkpoint):
            original(self, checkpoint)
            if checkpoint is not None and tpu_wanted():
                restore_rng_states(_rng_file(self, checkpoint), "tpu", load)

        return _load_rng_state

    replace(trainer_module.Trainer, "_save_rng_state", save)
    replace(trainer_module.Trainer, "_load_rng_state", restore)


def _patch_import_utils(import_utils):
    def available(original):
        def is_torch_tpu_available(*args, **kwargs):
            return tpu_wanted() or original(*args, **kwargs)

        return is_torch_tpu_available

    replace(import_utils, "is_torch_tpu_available", available)


def install():
    after_import("transformers.utils.import_utils", _patch_import_utils)
    after_import("transformers.trainer", _patch_trainer)
