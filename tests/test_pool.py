"""Pooling, padding, interpolation and the pointwise losses of lower/loss.rs
against CPU: values and gradients (float32, fused mode), no CPU fallback."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu

X3, X4, X5 = (2, 3, 10), (2, 3, 8, 8), (2, 3, 6, 6, 6)
CASES = {
    "max_pool1d": (lambda x: F.max_pool1d(x, 3, 2), X3),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1, 2, ceil_mode=True), X4),
    "max_pool2d_indices": (lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)[1], X4),
    "max_pool3d": (lambda x: F.max_pool3d(x, (2, 3, 2), (2, 1, 2), 1, ceil_mode=True), X5),
    "avg_pool1d": (lambda x: F.avg_pool1d(x, 3, 2), X3),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), X4),
    "avg_pool2d_divisor": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, divisor_override=5), X4),
    "avg_pool3d": (lambda x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True), X5),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (3, 5)), X4),
    "adaptive_avg_pool3d": (lambda x: F.adaptive_avg_pool3d(x, 4), X5),
    "adaptive_max_pool1d": (lambda x: F.adaptive_max_pool1d(x, 4), X3),
    "adaptive_max_pool2d_indices": (lambda x: F.adaptive_max_pool2d(x, (3, 5), return_indices=True)[1], X4),
    "adaptive_max_pool3d": (lambda x: F.adaptive_max_pool3d(x, 4), X5),
    **{f"pad{len(s) - 2}d_{m}": (lambda x, m=m, p=p: F.pad(x, p, mode=m), s)
       for m in ("reflect", "replicate") for s, p in ((X3, (1, 2)), (X4, (1, 2, 2, 1)), (X5, (1, 2, 2, 1, 1, 1)))},
    **{f"interpolate_{m}_{len(s) - 2}d_{ac}": (lambda x, m=m, ac=ac: F.interpolate(x, scale_factor=1.7, mode=m,
                                                                                align_corners=ac), s)
       for m, s in (("nearest", X3), ("nearest", X4), ("nearest", X5), ("nearest-exact", X4), ("linear", X3),
                    ("bilinear", X4), ("bicubic", X4), ("trilinear", X5))
       for ac in ((None,) if m.startswith("nearest") else (False, True))},
    "interpolate_bicubic_down": (lambda x: F.interpolate(x, size=(3, 5), mode="bicubic"), X4),
    "interpolate_area": (lambda x: F.interpolate(x, size=(5, 3), mode="area"), X4),
    "logsigmoid": (lambda x: F.logsigmoid(5 * x), X4),
    **{f"{name}_{r}": (lambda x, f=f, r=r: f(x, r), (4, 5))
       for r in ("mean", "sum", "none")
       for name, f in (
           ("bce", lambda x, r: F.binary_cross_entropy(x.sigmoid(), x.detach().cos().abs(), reduction=r,
                                                       weight=x.detach().sin().abs())),
           ("bce_with_logits", lambda x, r: F.binary_cross_entropy_with_logits(x, x.detach().cos().abs(),
                                                                               reduction=r)),
           ("smooth_l1", lambda x, r: F.smooth_l1_loss(x, x.detach().cos(), reduction=r, beta=0.5)),
           ("smooth_l1_beta0", lambda x, r: F.smooth_l1_loss(x, x.detach().round(), reduction=r, beta=0.0)),
           ("huber", lambda x, r: F.huber_loss(x, x.detach().cos(), reduction=r, delta=0.7)),
           ("multilabel_soft_margin", lambda x, r: F.multilabel_soft_margin_loss(x, (x.detach() > 0).float(),
                                                                                 reduction=r)))},
}


def run(fn, x, device):
    x = x.detach().to(device, copy=True).requires_grad_()
    out = fn(x)
    if not out.is_floating_point():
        return out.cpu(), None
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    (out * cotangent).sum().backward()
    return out.detach().cpu(), x.grad.cpu()


@pytest.mark.parametrize("case", CASES)
def test_matches_cpu(case):
    fn, shape = CASES[case]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    expected = run(fn, x, "cpu")
    torchtpu.reset_metrics()
    actual = run(fn, x, "tpu")
    assert torchtpu.metrics()["fallbacks"] == {}
    torch.testing.assert_close(actual, expected)


def test_bce_checks_its_input_range():
    with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
        F.binary_cross_entropy(torch.tensor([1.5], device="tpu"), torch.tensor([1.0], device="tpu"))
        torch.tpu.synchronize()
