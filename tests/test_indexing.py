"""Advanced indexing, data-dependent shapes and sorting, against CPU: no
CPU fallback, CPU's errors, and fused mode's flush for a count the host
must read."""
import pytest
import torch

import torchtpu
from conftest import synced, to_cpu


def same(fn, *args):
    """fn on CPU tensors and on their tpu copies gives the same results."""
    expected = fn(*args)
    actual = synced(fn, *[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args])
    torch.testing.assert_close(to_cpu(actual), expected, equal_nan=True)


def test_boolean_masks(mode, seeded_without_fallbacks):
    x = torch.randn(4, 5, 3)
    mask = x[..., 0] > 0
    same(lambda x, m: x[m], x, mask)
    same(lambda x, m: x[:, m[0]], x, mask)
    same(lambda x, m: x[m.to(torch.uint8) * 3, 1], x, mask)  # a deprecated byte mask
    same(lambda x: x[x > 0.5], x)
    same(lambda x: x[torch.zeros_like(x, dtype=torch.bool)], x)
    same(lambda x, m: torch.masked_select(x, m[..., None]), x, mask)


def test_integer_indices_broadcast_and_none_slots(mode, seeded_without_fallbacks):
    x = torch.randn(4, 5, 6)
    i, j = torch.tensor([[0], [3]]), torch.tensor([1, -1, 4], dtype=torch.int32)
    same(lambda x, i, j: x[i, j], x, i, j)  # adjacent: result dims stay in place
    same(lambda x, i, j: x[:, i, j], x, i, j)
    same(lambda x, i, j: x[i, :, j], x, i, j)  # separated: result dims come first
    same(lambda x, j: x[..., j], x, j)
    same(lambda x, i: x[i, 2], x, i)


def test_index_put_accumulates_duplicates(mode, seeded_without_fallbacks):
    x = torch.randn(5, 3)
    i = torch.tensor([0, 2, 0, 0, 4])
    v = torch.randn(5, 3)
    same(lambda x, i, v: x.clone().index_put_((i,), v, accumulate=True), x, i, v)
    same(lambda x, i: x.clone().index_put_((i, torch.tensor([1])), torch.tensor(2.0), accumulate=True), x, i)
    same(lambda x, i, v: x.clone().index_put_((i[1:2],), v[0]), x, i, v)

    def put_by_mask(x):
        y = x.clone()
        y[y > 0] = torch.arange(int((x > 0).sum()), dtype=x.dtype, device=x.device)
        return y

    same(put_by_mask, x)


def test_nonzero_and_its_composites(mode, seeded_without_fallbacks):
    x = torch.randint(-1, 2, (3, 4, 2))
    same(torch.nonzero, x)
    same(torch.argwhere, x)
    same(lambda x: torch.where(x > 0), x)
    same(lambda x: torch.nonzero(x > 5), x)
    same(lambda: torch.nonzero(torch.tensor(3.0)))


def test_nonzero_in_fused_mode_flushes_once_for_its_count():
    with torchtpu.mode("fused"):
        x = torch.arange(-3.0, 5.0, device="tpu").reshape(2, 4)
        torch.tpu.synchronize()
        torchtpu.reset_metrics()
        y = x * 2  # recorded: the count needs it computed
        nz = torch.nonzero(y > 1)
        assert torchtpu.metrics()["flushes"] == {"data_dependent": 1}
        assert torchtpu.metrics()["fallbacks"] == {}
        torch.testing.assert_close(nz.cpu(), torch.nonzero(torch.arange(-3.0, 5.0).reshape(2, 4) * 2 > 1))


def test_printing_a_tensor_does_not_fall_back(mode):
    torchtpu.reset_metrics()
    x = torch.tensor([[1.5, -2.25, float("nan")], [1e10, 0.0, float("inf")]])
    assert str(x.to("tpu")) == str(x).replace(")", ", device='tpu:0')")
    assert torchtpu.metrics()["fallbacks"] == {}


def test_out_of_range_indices_raise_cpus_errors(mode):
    x = torch.zeros(4, 3, device="tpu")
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 4"):
        synced(lambda: x[torch.tensor([1, 5], device="tpu")])
    with pytest.raises(IndexError, match="index -4 is out of bounds for dimension 1 with size 3"):
        synced(lambda: x[torch.tensor([0], device="tpu"), torch.tensor([-4], device="tpu")])
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
        synced(lambda: x.index_put_((torch.tensor([4], device="tpu"),), torch.tensor(1.0, device="tpu")))
    with pytest.raises(IndexError, match=r"The shape of the mask \[3\] at index 0 does not match"):
        synced(lambda: x[torch.tensor([True, False, True], device="tpu")])
    with pytest.raises(IndexError, match="index is out of bounds for dimension with size 0"):
        synced(lambda: torch.empty(0, device="tpu").index_put_((torch.tensor([0], device="tpu"),),
                                                               torch.tensor([1.0], device="tpu")))
    # The process stays usable.
    torch.testing.assert_close((x + 1).cpu(), torch.ones(4, 3))


def test_empty_dimensions_are_gathered_and_scattered(mode, seeded_without_fallbacks):
    """XLA rejects a gather or scatter slicing an empty dimension: nothing is
    read or written there (combinations of fewer elements than r, or with
    replacement, index such tensors)."""
    for n, r, replace in [(0, 2, False), (1, 2, False), (1, 3, True), (2, 3, True), (3, 2, False)]:
        same(lambda x: torch.combinations(x, r, replace), torch.arange(float(n)))
    same(lambda x, i: x[i], torch.empty(0, 3), torch.empty(0, dtype=torch.long))
    same(lambda x, i: x.index_put((i,), torch.ones(0, 3), accumulate=True), torch.empty(0, 3),
         torch.empty(0, dtype=torch.long))


def test_unstable_sorts_with_ties_give_consistent_indices(mode, seeded_without_fallbacks):
    """CPU orders equal values arbitrarily unless stable=True (then tpu's
    indices are CPU's): values must match, indices must point at them."""
    x = torch.randint(0, 4, (6, 50)).float()
    x[0, 3] = float("nan")
    xt = x.to("tpu")
    for descending in (False, True):
        values, indices = synced(torch.sort, xt, 1, descending)
        torch.testing.assert_close(values.cpu(), torch.sort(x, 1, descending).values, equal_nan=True)
        torch.testing.assert_close(x.gather(1, indices.cpu()), values.cpu(), equal_nan=True)
        stable = torch.sort(xt, dim=1, descending=descending, stable=True)
        torch.testing.assert_close(to_cpu(stable), torch.sort(x, dim=1, descending=descending, stable=True),
                                   equal_nan=True)
    values, indices = torch.topk(xt, 7, 1)
    torch.testing.assert_close(values.cpu(), torch.topk(x, 7, 1).values, equal_nan=True)
    torch.testing.assert_close(x.gather(1, indices.cpu()), values.cpu(), equal_nan=True)
    for fn in (torch.median, torch.nanmedian):
        values, indices = fn(xt, 1)
        torch.testing.assert_close(values.cpu(), fn(x, 1).values, equal_nan=True)
        torch.testing.assert_close(x.gather(1, indices.cpu()[:, None])[:, 0], values.cpu(), equal_nan=True)


def test_mode_values_and_an_occurrence(mode, seeded_without_fallbacks):
    """The most frequent value (the smallest of several) as on CPU; its index
    is CPU's (the last occurrence) on rows of up to 16 elements, and names an
    occurrence on longer ones, where CPU's unstable sort picks any."""
    short = torch.tensor([[3, 1, 3, 1, 2], [2, 2, 1, 1, 1]])
    torch.testing.assert_close(to_cpu(synced(torch.mode, short.to("tpu"), 1)), tuple(torch.mode(short, 1)))
    x = torch.randint(0, 5, (3, 40, 4)).float()
    for dim, keepdim in ((1, False), (-1, True)):
        values, indices = synced(torch.mode, x.to("tpu"), dim, keepdim)
        torch.testing.assert_close(values.cpu(), torch.mode(x, dim, keepdim).values)
        at = indices.cpu() if keepdim else indices.cpu().unsqueeze(dim)
        torch.testing.assert_close(x.gather(dim, at), values.cpu() if keepdim else values.cpu().unsqueeze(dim))
