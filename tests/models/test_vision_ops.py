"""torchvision's detection ops on tpu against their CPU kernels: RoIAlign
and its gradient (boxes inside, across and outside the image, aligned or
not, a fixed or an adaptive sampling grid) and non-maximum suppression
(exactly CPU's kept indices), in fused and strict modes, without CPU
fallbacks."""
import pytest
import torch

import torchtpu

torchvision = pytest.importorskip("torchvision", reason="pip install --no-deps -r requirements-models.txt")
from torchvision.ops import batched_nms, nms, roi_align  # noqa: E402


def boxes():
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(12, 2, generator=g) * 40 - 6  # some start left of or above the image
    wh = torch.rand(12, 2, generator=g) * 30 + 0.5
    b = torch.cat([xy, xy + wh], 1)
    b[0] = torch.tensor([50.0, 50.0, 60.0, 70.0])  # wholly outside
    b[1] = torch.tensor([3.0, 4.0, 3.2, 4.1])  # narrower than a pixel
    batch = torch.arange(12).remainder(2).float()[:, None]
    return torch.cat([batch, b], 1)


@pytest.mark.parametrize("mode", ["fused", "strict"])
@pytest.mark.parametrize("aligned, sampling_ratio", [(False, 2), (True, 2), (False, 0), (True, -1)])
def test_roi_align_and_its_gradient_equal_cpu(mode, aligned, sampling_ratio):
    """A positive sampling ratio is each bin's grid; otherwise each box's grid
    is ceil(its size / bins) (Mask R-CNN's mask targets), the largest read
    from the device."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 20, 24, generator=g)
    rois = boxes()
    cot = torch.randn(12, 3, 5, 4, generator=g)
    results = {}
    with torchtpu.mode(mode):
        torchtpu.reset_metrics()
        for device in ("cpu", "tpu"):
            inp = x.to(device).detach().requires_grad_()
            out = roi_align(inp, rois.to(device), output_size=(5, 4), spatial_scale=0.5, sampling_ratio=sampling_ratio,
                            aligned=aligned)
            (out * cot.to(device)).sum().backward()
            results[device] = (out.detach().cpu(), inp.grad.cpu())
        assert torchtpu.metrics()["fallbacks"] == {}
    torch.testing.assert_close(results["tpu"][0], results["cpu"][0])
    torch.testing.assert_close(results["tpu"][1], results["cpu"][1])


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_nms_keeps_cpus_boxes(mode):
    g = torch.Generator().manual_seed(0)
    with torchtpu.mode(mode):
        torchtpu.reset_metrics()
        for n in (0, 1, 7, 500):
            xy = torch.rand(n, 2, generator=g) * 100
            boxes_ = torch.cat([xy, xy + torch.rand(n, 2, generator=g) * 30 + 1], 1)
            scores = torch.rand(n, generator=g)
            if n > 5:
                scores[3] = scores[4]  # a tie: CPU's stable order
            for threshold in (0.3, 0.7):
                kept = nms(boxes_.to("tpu"), scores.to("tpu"), threshold).cpu()
                assert torch.equal(kept, nms(boxes_, scores, threshold)), (n, threshold)
            classes = torch.randint(0, 3, (n,), generator=g)
            kept = batched_nms(boxes_.to("tpu"), scores.to("tpu"), classes.to("tpu"), 0.5).cpu()
            assert torch.equal(kept, batched_nms(boxes_, scores, classes, 0.5))
        assert torchtpu.metrics()["fallbacks"] == {}


def test_nms_suppression_chains_beyond_the_rounds_run_on_the_cpu_counted():
    """Boxes in a row, each overlapping the next, scores falling: every other
    one is kept, a chain of 80 suppressions (more rounds than the device
    iterates)."""
    x = torch.arange(80, dtype=torch.float32)[:, None] * 2
    boxes_ = torch.cat([x, torch.zeros(80, 1), x + 6, torch.full((80, 1), 6.0)], 1)
    scores = torch.linspace(1, 0.1, 80)
    torchtpu.reset_metrics()
    assert torch.equal(nms(boxes_.to("tpu"), scores.to("tpu"), 0.3).cpu(), nms(boxes_, scores, 0.3))
    assert torchtpu.metrics()["fallbacks"] == {"torchvision::nms": 1}
