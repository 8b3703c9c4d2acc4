"""torch.autocast(device_type="tpu") casts as CPU autocast does."""
import torch
import torch.nn.functional as F

import torchtpu


def test_autocast_available():
    assert torch.amp.is_autocast_available("tpu")


def test_autocast_matches_cpu(mode, seeded_without_fallbacks):
    """Lower precision for convolutions and linear layers, float32 for
    softmax, losses and exp, promotion for cat: same dtypes and values."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5))
    x, target = torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))

    def run(device):
        m, xd = model.to(device), x.to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            y = m(xd)
            results = [y, y.softmax(1), F.cross_entropy(y, target.to(device)),
                       torch.cat([y, xd[:, 0, 0, :5]]), torch.exp(y), F.mse_loss(y, y.detach() + 1)]
        return [r.cpu() for r in results]

    for expected, actual in zip(run("cpu"), run("tpu")):
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected, atol=1e-2, rtol=1.6e-2)


def test_default_dtype_is_bfloat16_as_on_cpu():
    assert torch.get_autocast_dtype("tpu") == torch.get_autocast_dtype("cpu") == torch.bfloat16
    with torch.autocast(device_type="tpu"):
        a = torch.randn(4, 4, device="tpu")
        assert (a @ a).dtype == torch.bfloat16


def test_autocast_off_outside_the_context(mode):
    a = torch.randn(4, 4, device="tpu")
    with torch.autocast(device_type="tpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32


def test_amp_module_of_the_device():
    """`torch.tpu.amp`, as older code writes `torch.cuda.amp`."""
    layer = torch.nn.Linear(4, 4).to("tpu")
    x = torch.randn(2, 4, device="tpu")
    with torch.tpu.amp.autocast():
        assert layer(x).dtype == torch.bfloat16
    with torch.tpu.amp.autocast(dtype=torch.float16):
        assert layer(x).dtype == torch.float16
    with torch.tpu.amp.autocast(enabled=False):
        assert layer(x).dtype == torch.float32

    @torch.tpu.amp.custom_fwd(cast_inputs=torch.float32)
    def dtype_inside(t):
        return t.dtype

    with torch.tpu.amp.autocast():
        assert dtype_inside(x.bfloat16()) == torch.float32
    scaler = torch.tpu.amp.GradScaler(init_scale=8.0)
    assert (scaler._device, scaler.get_scale()) == ("tpu", 8.0)
    scaler.scale(layer(x).sum()).backward()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 8.0
