"""Convolutions, normalizations and triangles (lower/conv.rs, lower/norm.rs)
against PyTorch on CPU, and two small training loops that use them: a
ResNet-style CNN (SGD with momentum, batch norm in train mode) and a
decoder-only transformer (AdamW, layer norm, causal attention). No test may
fall back to CPU.
"""
import copy
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchtpu
from torch.utils._python_dispatch import TorchDispatchMode


pytestmark = pytest.mark.usefixtures("seeded_without_fallbacks")


def close(tpu, cpu, **tol):
    assert tpu.device.type == "tpu"
    torch.testing.assert_close(tpu.cpu(), cpu, **tol)


def run_both(fn, *tensors, **tol):
    """fn on CPU tensors and on tpu copies: outputs and the gradients of all
    floating inputs (from one random cotangent) must agree."""
    cpu = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    tpu = [t.detach().to("tpu").requires_grad_(t.is_floating_point()) for t in tensors]
    expected, actual = fn(*cpu), fn(*tpu)
    close(actual, expected.detach(), **tol)
    cotangent = torch.randn_like(expected)
    expected.backward(cotangent)
    actual.backward(cotangent.to("tpu"))
    for c, t in zip(cpu, tpu):
        if c.requires_grad:
            close(t.grad, c.grad, **tol)


# ------------------------------------------------------------------ convolutions

CONV_TOL = dict(atol=1e-4, rtol=1e-4)

# (spatial dims, stride, padding, dilation, groups, output_padding)
CONV_CASES = [
    (1, 1, 0, 1, 1, 0),
    (1, 2, 1, 1, 2, 1),
    (2, 1, 1, 1, 1, 0),
    (2, 2, 1, 1, 1, 1),
    (2, (2, 1), (0, 2), (1, 2), 2, (1, 0)),
    (2, 1, 2, 1, 1, 0),  # padding beyond the dilated kernel: negative pads in the gradient
    (2, 3, 1, 2, 4, 2),
    (3, 1, 1, 1, 1, 0),
    (3, 2, (1, 0, 1), (1, 2, 1), 2, 1),
]


@pytest.mark.one_mode
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transposed"])
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_convolution(case, transposed, mode):
    dims, stride, padding, dilation, groups, output_padding = case
    cin, cout = 4, 8
    x = torch.randn((2, cin) + (7, 6, 5)[:dims])
    k = (3, 2, 3)[:dims]
    if transposed:
        w = torch.randn((cin, cout // groups) + k)
        fn = getattr(F, f"conv_transpose{dims}d")
        kwargs = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    else:
        w = torch.randn((cout, cin // groups) + k)
        fn = getattr(F, f"conv{dims}d")
        kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    b = torch.randn(cout)
    run_both(lambda x, w, b: fn(x, w, b, **kwargs), x, w, b, **CONV_TOL)
    run_both(lambda x, w: fn(x, w, None, **kwargs), x, w, **CONV_TOL)


# (kernel, stride, padding, dilation) of depthwise convolutions (as many
# groups as channels, one weight per channel), lowered as taps.
DEPTHWISE_CASES = [
    ((3,), 1, 1, 1),
    ((7, 7), 1, 3, 1),  # ConvNeXt's
    ((3, 3), 2, 1, 1),  # MobileNet's downsampling
    ((5, 5), 2, 2, 1),
    ((3, 2), (2, 1), (0, 2), (1, 2)),
    ((3, 2, 3), 1, 1, 1),
]


@pytest.mark.one_mode
@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=str)
def test_depthwise_convolution(case, mode):
    kernel, stride, padding, dilation = case
    dims = len(kernel)
    x = torch.randn((2, 6) + (9, 8, 5)[:dims])
    w = torch.randn((6, 1) + kernel)
    fn = getattr(F, f"conv{dims}d")
    kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=6)
    run_both(lambda x, w, b: fn(x, w, b, **kwargs), x, w, torch.randn(6), **CONV_TOL)
    run_both(lambda x: fn(x, w.to(x.device), None, **kwargs), x, **CONV_TOL)


def test_depthwise_convolution_over_changing_batches_buckets():
    """The weight gradient's variadic reduction meets a changing batch: 8
    batch sizes train in a few bucketed programs, none refused."""
    conv = nn.Conv2d(8, 8, 3, padding=1, groups=8)
    tpu = copy.deepcopy(conv).to("tpu")
    torchtpu.reset_metrics()
    for n in [3, 5, 6, 7, 9, 11, 12, 13]:
        x = torch.randn(n, 8, 6, 6)
        for c, device in ((conv, "cpu"), (tpu, "tpu")):
            c.zero_grad()
            c(x.to(device)).square().sum().backward()
        close(tpu.weight.grad, conv.weight.grad, **CONV_TOL)
    metrics = torchtpu.metrics()
    assert metrics["compilations"] <= 4 and not metrics["bucket_refusals"], metrics


# (input shape, output channels, dtype) of pointwise convolutions (1x1
# kernels, unit strides, no padding), lowered as matrix products per image.
POINTWISE_CASES = [
    ((2, 5, 7), 3, torch.float32),
    ((3, 16, 6, 5), 24, torch.float32),  # a bottleneck's expansion
    ((2, 4, 3, 4, 2), 6, torch.float32),
    ((2, 8, 5, 5), 4, torch.float64),
    ((2, 8, 4, 4), 8, torch.bfloat16),
]


@pytest.mark.one_mode
@pytest.mark.parametrize("case", POINTWISE_CASES, ids=str)
def test_pointwise_convolution(case, mode):
    shape, cout, dtype = case
    x = torch.randn(shape, dtype=dtype)
    w = torch.randn((cout, shape[1]) + (1,) * (len(shape) - 2), dtype=dtype)
    fn = getattr(F, f"conv{len(shape) - 2}d")
    tol = dict(atol=0.05, rtol=0.02) if dtype == torch.bfloat16 else CONV_TOL
    run_both(lambda x, w, b: fn(x, w, b), x, w, torch.randn(cout, dtype=dtype), **tol)
    run_both(lambda x: fn(x, w.to(x.device)), x, **tol)  # the input's gradient alone
    if len(shape) == 4:
        last = x.contiguous(memory_format=torch.channels_last)
        run_both(lambda x, w: fn(x, w), last, w, **tol)


def test_convolution_input_without_grad(mode):
    """Only the weight's gradient is asked for (output_mask): the first layer."""
    x, w = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3)
    wc, wt = w.clone().requires_grad_(), w.to("tpu").requires_grad_()
    F.conv2d(x, wc, padding=1).sum().backward()
    F.conv2d(x.to("tpu"), wt, padding=1).sum().backward()
    close(wt.grad, wc.grad, **CONV_TOL)


def test_convolution_errors():
    x, w = torch.randn(1, 4, 5, 5), torch.randn(2, 3, 3, 3)
    with pytest.raises(RuntimeError) as cpu:
        F.conv2d(x, w)
    with pytest.raises(RuntimeError, match=re.escape(str(cpu.value).split("\n")[0])):
        F.conv2d(x.to("tpu"), w.to("tpu"))


# ------------------------------------------------------------------ normalizations


@pytest.mark.one_mode
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 2, 3)], ids=str)
def test_batch_norm_train_and_eval(shape, affine, mode):
    bn = nn.BatchNorm1d if len(shape) <= 3 else nn.BatchNorm2d if len(shape) == 4 else nn.BatchNorm3d
    cpu = bn(3, affine=affine, momentum=0.3)
    tpu = copy.deepcopy(cpu).to("tpu")
    for step in range(3):
        x = torch.randn(shape) * 2 + 1
        run_both(lambda x: (cpu if x.device.type == "cpu" else tpu)(x), x, atol=1e-5, rtol=1e-5)
        close(tpu.running_mean, cpu.running_mean, atol=1e-6, rtol=1e-6)
        close(tpu.running_var, cpu.running_var, atol=1e-6, rtol=1e-6)
        assert tpu.num_batches_tracked.item() == cpu.num_batches_tracked.item() == step + 1
    cpu.eval(), tpu.eval()
    run_both(lambda x: (cpu if x.device.type == "cpu" else tpu)(x), torch.randn(shape), atol=1e-5, rtol=1e-5)
    close(tpu.running_mean, cpu.running_mean)


def test_batch_norm_without_running_stats(mode):
    run_both(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
             torch.randn(3, 4, 5), torch.randn(4), torch.randn(4), atol=1e-5, rtol=1e-5)


def test_batch_norm_running_stats_in_a_view(mode):
    """Running stats that are views of a larger buffer are written through."""
    stats = torch.zeros(2, 4)
    stats[1] = 1
    cpu, tpu = stats.clone(), stats.to("tpu")
    x = torch.randn(5, 4)
    F.batch_norm(x, cpu[0], cpu[1], training=True, momentum=0.5)
    F.batch_norm(x.to("tpu"), tpu[0], tpu[1], training=True, momentum=0.5)
    close(tpu, cpu)


def test_batch_norm_eval_needs_running_stats():
    x = torch.randn(2, 3).to("tpu")
    with pytest.raises(RuntimeError, match="running_mean must be defined in evaluation mode"):
        torch.native_batch_norm(x, None, None, None, None, False, 0.1, 1e-5)


@pytest.mark.one_mode
@pytest.mark.parametrize("normalized", [(5,), (4, 5)], ids=str)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm(normalized, affine, mode):
    x = torch.randn(3, 4, 5) * 3 + 2
    w = torch.randn(normalized) if affine != "none" else None
    b = torch.randn(normalized) if affine == "both" else None
    args = [t for t in (x, w, b) if t is not None]

    def fn(x, *params):
        return F.layer_norm(x, normalized, *params, eps=1e-4)
    run_both(fn, *args, atol=1e-5, rtol=1e-5)


def test_layer_norm_bfloat16(mode):
    x, w = torch.randn(4, 8).bfloat16(), torch.randn(8)
    close(F.layer_norm(x.to("tpu"), (8,), w.to("tpu")), F.layer_norm(x, (8,), w))


def test_layer_norm_shape_error():
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match=r"Given normalized_shape=\[5\], expected input with shape \[\*, 5\]"):
        F.layer_norm(x.to("tpu"), (5,))


@pytest.mark.one_mode
@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm(groups, mode):
    run_both(lambda x, w, b: F.group_norm(x, groups, w, b), torch.randn(2, 6, 3, 4), torch.randn(6),
             torch.randn(6), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ triangles, infinities


@pytest.mark.parametrize("diagonal", [-2, 0, 1, 5])
def test_tril_triu(diagonal, mode):
    x = torch.randn(2, 4, 6)
    for fn in (torch.tril, torch.triu):
        close(fn(x.to("tpu"), diagonal), fn(x, diagonal))
        y = x.to("tpu")
        getattr(y, fn.__name__ + "_")(diagonal)
        close(y, fn(x, diagonal))


def test_isposinf_isneginf(mode):
    x = torch.tensor([1.0, float("inf"), -float("inf"), float("nan"), 0.0])
    for fn in (torch.isposinf, torch.isneginf):
        close(fn(x.to("tpu")), fn(x))
        close(fn(torch.arange(3).to("tpu")), fn(torch.arange(3)))


# ------------------------------------------------------------------ channels-last layouts

CL, CL3 = torch.channels_last, torch.channels_last_3d

# name: (fn, operand shapes, their memory formats)
CHANNELS_LAST_CASES = {
    "conv_input": (lambda x, w: F.conv2d(x, w, padding=1), [(2, 4, 6, 6), (6, 4, 3, 3)], [CL, None]),
    "conv_weight": (lambda x, w: F.conv2d(x, w, stride=2), [(2, 4, 6, 6), (6, 4, 3, 3)], [None, CL]),
    "conv_depthwise": (lambda x, w: F.conv2d(x, w, groups=4), [(2, 4, 6, 6), (4, 1, 3, 3)], [CL, None]),
    "conv_transposed": (lambda x, w: F.conv_transpose2d(x, w, stride=2), [(2, 4, 5, 5), (4, 3, 3, 3)], [CL, CL]),
    "conv3d": (lambda x, w: F.conv3d(x, w), [(2, 4, 4, 4, 4), (6, 4, 3, 3, 3)], [CL3, None]),
    "batch_norm": (lambda x: F.batch_norm(x, None, None, training=True), [(4, 6, 5, 5)], [CL]),
    "group_norm": (lambda x: F.group_norm(x, 2), [(4, 6, 5, 5)], [CL]),
    "max_pool": (lambda x: F.max_pool2d(x, 2), [(2, 6, 6, 6)], [CL]),
    "max_pool3d": (lambda x: F.max_pool3d(x, 2), [(2, 6, 4, 4, 4)], [CL3]),
    "avg_pool": (lambda x: F.avg_pool2d(x, 2), [(2, 6, 6, 6)], [CL]),
    "adaptive_avg_pool": (lambda x: F.adaptive_avg_pool2d(x, 3), [(2, 6, 6, 6)], [CL]),
    "upsample_bilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), [(2, 6, 4, 4)], [CL]),
    "upsample_bicubic": (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), [(2, 6, 4, 4)], [CL]),
    "upsample_nearest3d": (lambda x: F.interpolate(x, scale_factor=2), [(2, 6, 3, 3, 3)], [CL3]),
    "cat": (lambda x, y: torch.cat([x, y], 1), [(2, 6, 4, 4), (2, 3, 4, 4)], [CL, CL]),
    "cat_mixed": (lambda x, y: torch.cat([x, y], 1), [(2, 6, 4, 4), (2, 3, 4, 4)], [CL, None]),
}


def laid_out(t):
    """A tensor's strides, size-1 dimensions (whose strides say nothing) left out."""
    return [s for n, s in zip(t.shape, t.stride()) if n != 1]


class OperandLayouts(TorchDispatchMode):
    """The layouts of the tensors autograd's formulas hand each kernel."""

    def __enter__(self):
        self.seen = {}
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.setdefault(func, [laid_out(a) for a in args if isinstance(a, torch.Tensor)])
        return func(*args, **(kwargs or {}))

    def made_contiguous(self, func, operand):
        """Whether `func` got `operand`'s values contiguous though autograd held them in another layout."""
        return func in self.seen and self.seen[func][0] == laid_out(operand.contiguous()) != laid_out(operand)


@pytest.mark.one_mode
@pytest.mark.parametrize("case", CHANNELS_LAST_CASES)
def test_channels_last_results_as_on_cpu(case, mode):
    """Convolutions, batch and group norm, pools and cat lay out their results
    (and their gradients) channels-last where CPU does, so that a
    channels-last model stays channels-last past its first convolution."""
    fn, shapes, formats = CHANNELS_LAST_CASES[case]
    cpu = [torch.randn(s).contiguous(memory_format=f or torch.contiguous_format).requires_grad_() for s, f in
           zip(shapes, formats)]
    tpu = [t.detach().to("tpu").requires_grad_() for t in cpu]
    expected, actual = fn(*cpu), fn(*tpu)
    cotangent = torch.randn_like(expected)  # in the result's layout, as autograd passes it on
    expected_grads = torch.autograd.grad(expected, cpu, cotangent)
    with OperandLayouts() as handed:
        actual_grads = torch.autograd.grad(actual, tpu, cotangent.to("tpu"))
    layouts = [laid_out(e) for e in (expected, *expected_grads)]
    if handed.made_contiguous(torch.ops.aten.native_group_norm_backward.default, cotangent):
        # torch 2.11's formula hands a non-CPU kernel contiguous operands (CUDA's rule then),
        # so there the input's gradient is contiguous on CUDA and tpu alike.
        layouts[1] = laid_out(expected_grads[0].contiguous())
    for layout, e, a in zip(layouts, (expected, *expected_grads), (actual, *actual_grads)):
        assert laid_out(a) == layout
        torch.testing.assert_close(a.cpu(), e.detach(), **CONV_TOL)


# ------------------------------------------------------------------ training loops


def conv_block(i, o, stride):
    return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(),
                         nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU())


def resnet():
    return nn.Sequential(conv_block(3, 32, 1), conv_block(32, 64, 2), conv_block(64, 128, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


class DecoderBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=2, context=16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.Sequential(*[DecoderBlock(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def train(kind, device, steps):
    """Losses of a few training steps from a fixed seed."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if kind.startswith("resnet"):
        net = resnet().to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        xs, ys = torch.randn(steps, 8, 3, 32, 32, generator=g), torch.randint(0, 10, (steps, 8), generator=g)
    else:
        net = Decoder().to(device)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        xs, ys = torch.randint(0, 64, (steps, 4, 16), generator=g), torch.randint(0, 64, (steps, 4, 16), generator=g)
    if kind == "resnet_channels_last":
        net = net.to(memory_format=torch.channels_last)
    net.train()
    losses = []
    for step in range(steps):
        x, y = xs[step].to(device), ys[step].to(device)
        if kind == "resnet_channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        opt.zero_grad()
        out = net(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["resnet", "decoder"])
def test_training_matches_cpu(kind, mode):
    steps = 5
    expected = train(kind, "cpu", steps)
    torchtpu.reset_metrics()
    actual = train(kind, "tpu", steps)
    assert torchtpu.metrics()["fallbacks"] == {}
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), rtol=1e-4, atol=0)


@pytest.mark.one_mode
def test_channels_last_training_matches_cpu(mode):
    """The CNN above with its weights and inputs channels-last: CPU's losses
    through layers that now give channels-last results."""
    expected = train("resnet_channels_last", "cpu", 2)
    actual = train("resnet_channels_last", "tpu", 2)
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), rtol=1e-4, atol=0)
