"""torchtpu's `torch.backends` entry point: `import torch` calls `autoload()`.

It lives outside the `torchtpu` package so that deciding not to load leaves
`torchtpu` unimported: a later `import torchtpu` then registers the device.

PyTorch holds one accelerator per process, and a registered PrivateUse1
backend takes the place of CUDA (`at::getAccelerator()` prefers it; CUDA's
autograd then finds no streams, pytorch/pytorch#161129). So on a machine with
a CUDA or ROCm GPU, `import torch` leaves torch as it is and a script asks
for tpu with `import torchtpu`; elsewhere `import torch` makes "tpu" a device.
TORCHTPU_AUTOLOAD=1 or 0 decides instead.
"""
import os


def gpu_machine(torch) -> bool:
    """Whether this torch was built for CUDA/ROCm and the machine has such a
    GPU, asked without initialising CUDA (NVML or AMD SMI, as torch.cuda does
    for a fork-safe check): a process that forks workers must stay able to
    use CUDA in them."""
    if not torch.cuda._is_compiled():
        return False
    if torch.version.hip:
        count, device_file = torch.cuda._device_count_amdsmi(), "/dev/kfd"
    else:
        count, device_file = torch.cuda._device_count_nvml(), "/dev/nvidiactl"
    # A negative count: NVML/AMD SMI could not tell (no library, MIG UUIDs).
    return count > 0 if count >= 0 else os.path.exists(device_file)


def wanted(torch) -> bool:
    explicit = os.environ.get("TORCHTPU_AUTOLOAD")
    if explicit in ("0", "1"):
        return explicit == "1"
    return not gpu_machine(torch)


def autoload():
    import torch

    if wanted(torch):
        import torchtpu  # noqa: F401  (registers the device)
