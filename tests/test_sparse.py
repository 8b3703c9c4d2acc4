"""Sparse COO tensors on tpu: embeddings' sparse gradients with the
optimizers that take them, sparse-dense products of graph networks, and the
sparse ops between them, against CPU; ops without a device kernel run CPU's,
counted."""
import pytest
import torch
import torchtpu

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse invariant checks"),
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
]


def fallbacks():
    return dict(torchtpu.metrics()["fallbacks"])


def dense(x):
    """A result as CPU numbers: a sparse one's dense form, nnz and flag."""
    if x.is_sparse:
        return x.to_dense().cpu(), x._nnz(), x.is_coalesced()
    return x.cpu(), None, None


def sparse(device, dtype=torch.float32):
    """A 4x3 matrix with a repeated index (uncoalesced)."""
    indices = torch.tensor([[0, 1, 1, 3, 0], [2, 0, 2, 1, 2]])
    values = torch.tensor([0.5, -1.5, 2.0, 0.25, 1.0], dtype=dtype)
    return torch.sparse_coo_tensor(indices, values, (4, 3)).to(device)


DENSE = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
RIGHT = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))

# name: (call, runs on the device)
OPS = {
    "coalesce": (lambda d: sparse(d).coalesce(), True),
    "to_dense": (lambda d: sparse(d).to_dense(), True),
    "add sparse": (lambda d: sparse(d) + sparse(d).coalesce() * 2, True),
    "add dense": (lambda d: DENSE.to(d) + sparse(d), True),
    "add_ float64": (lambda d: DENSE.clone().to(d).add_(sparse(d, torch.float64), alpha=-0.5), True),
    "sub sparse": (lambda d: sparse(d) - sparse(d), True),
    "mul scalar": (lambda d: sparse(d) * 3, True),
    "mul dense": (lambda d: DENSE.to(d) * sparse(d), True),
    "div": (lambda d: sparse(d) / 4, True),
    "pow": (lambda d: sparse(d).pow(2), True),
    "sqrt of abs": (lambda d: sparse(d).abs().sqrt(), True),
    "sum": (lambda d: torch.sparse.sum(sparse(d)), True),
    "sum dim": (lambda d: torch.sparse.sum(sparse(d), dim=1), True),
    "mm": (lambda d: torch.sparse.mm(sparse(d), RIGHT.to(d)), True),
    "transposed mm": (lambda d: sparse(d).t() @ DENSE.to(d), True),
    "addmm": (lambda d: torch.addmm(torch.ones(5, device=d), sparse(d), RIGHT.to(d), beta=0.5, alpha=2), True),
    "mv": (lambda d: torch.mv(sparse(d), torch.arange(3.0, device=d)), True),
    "sparse_mask": (lambda d: DENSE.to(d).sparse_mask(sparse(d).coalesce()), True),
    "transpose coalesced": (lambda d: sparse(d).transpose(0, 1).coalesce(), True),
    "hybrid coalesce": (
        lambda d: torch.sparse_coo_tensor(torch.tensor([[2, 0, 2]]), DENSE[:3], (4, 3)).to(d).coalesce(),
        True,
    ),
    "empty coalesce": (
        lambda d: torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (4, 3))
        .to(d)
        .coalesce(),
        True,
    ),
    "sparse times sparse": (lambda d: sparse(d) * sparse(d), False),
    "sparse times sparse in place": (lambda d: sparse(d).coalesce().mul_(sparse(d)), False),
    "softmax": (lambda d: torch.sparse.softmax(sparse(d), 1), False),
    "to_sparse": (lambda d: torch.nn.functional.threshold(DENSE, 0.5, 0).to(d).to_sparse(), True),
    "to_sparse dense_dim": (lambda d: DENSE.to(d).reshape(2, 2, 3).to_sparse(2), True),
    "sin": (lambda d: sparse(d).sin(), False),
    "csr mm": (lambda d: DENSE.to(d).to_sparse_csr() @ RIGHT.to(d), False),
    "csr to_dense": (lambda d: DENSE.to(d).to_sparse_csr().to_dense(), False),
    "csr mul": (lambda d: DENSE.to(d).to_sparse_csr() * 2, False),
}


@pytest.mark.parametrize("name", list(OPS))
def test_op_as_on_cpu(name):
    call, on_device = OPS[name]
    expected = dense(call("cpu"))
    before = fallbacks()
    got = call("tpu")
    assert got.device.type == "tpu" and got.layout == call("cpu").layout
    value, nnz, coalesced = dense(got)
    torch.testing.assert_close(value, expected[0], rtol=1e-6, atol=1e-6)
    # Sums of sparse tensors concatenate, as CUDA's do; CPU merges.
    if name not in ("add sparse", "sub sparse"):
        assert (nnz, coalesced) == expected[1:]
    assert (fallbacks() == before) == on_device


@pytest.mark.parametrize(
    "call",
    [
        lambda d: sparse(d) + DENSE.to(d),
        lambda d: torch.ones(4, 4, device=d) + sparse(d),
        lambda d: torch.sparse.mm(sparse(d), torch.ones(4, 2, device=d)),
        lambda d: torch.ones(4, 3, dtype=torch.long, device=d).add_(sparse(d)),
        lambda d: torch.ones(4, 4, device=d).sparse_mask(sparse(d)),
        lambda d: torch.nn.Embedding(5, 2, sparse=True, scale_grad_by_freq=True).to(d)(
            torch.tensor([1, 1], device=d)
        ).sum().backward(),
    ],
    ids=["sparse plus dense", "sizes", "mm sizes", "integer out", "mask sizes", "scale_grad_by_freq"],
)
def test_errors_as_on_cpu(call):
    with pytest.raises(RuntimeError) as cpu:
        call("cpu")
    with pytest.raises(RuntimeError) as tpu:
        call("tpu")
    assert str(tpu.value) == str(cpu.value)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.5),
    "sgd momentum": lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.5),
    "sparse adam": lambda p: torch.optim.SparseAdam(p, lr=0.05),
}


def train_embeddings(device, optimizer, bag, steps=5):
    torch.manual_seed(0)
    if bag:
        emb = torch.nn.EmbeddingBag(50, 8, sparse=True, mode="mean")
    else:
        emb = torch.nn.Embedding(50, 8, sparse=True, padding_idx=3)
    emb, head = emb.to(device), torch.nn.Linear(8, 1).to(device)
    opts = [OPTIMIZERS[optimizer](list(emb.parameters())), torch.optim.SGD(head.parameters(), lr=0.1)]
    indices = torch.randint(0, 50, (steps, 6, 5), generator=torch.Generator().manual_seed(1))
    for idx in indices.to(device):
        x = emb(idx) if bag else emb(idx).mean(1)
        loss = head(x).pow(2).mean()
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        assert emb.weight.grad.is_sparse
        for opt in opts:
            opt.step()
    return emb.weight.detach().cpu()


def test_sparse_embedding_in_every_mode(mode):
    expected = train_embeddings("cpu", "adagrad", False, steps=3)
    torch.testing.assert_close(train_embeddings("tpu", "adagrad", False, steps=3), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bag", [False, True], ids=["embedding", "bag"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_sparse_embedding_training_as_on_cpu(optimizer, bag):
    expected = train_embeddings("cpu", optimizer, bag)
    before = fallbacks()
    got = train_embeddings("tpu", optimizer, bag)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert fallbacks() == before


def test_graph_network_with_sparse_adjacency_as_on_cpu():
    """Two graph convolutions (sparse adjacency times dense features), the
    adjacency's values trained too."""

    def train(device):
        torch.manual_seed(0)
        edges, weights = torch.randint(0, 40, (2, 160)), torch.rand(160)
        adj = torch.sparse_coo_tensor(edges, weights, (40, 40)).coalesce().to(device).requires_grad_()
        x, y = torch.randn(40, 8).to(device), torch.randint(0, 3, (40,)).to(device)
        l1, l2 = torch.nn.Linear(8, 16).to(device), torch.nn.Linear(16, 3).to(device)
        opt = torch.optim.Adam([*l1.parameters(), *l2.parameters()], lr=0.01)
        losses = []
        for _ in range(4):
            out = torch.sparse.mm(adj, l2(torch.relu(torch.sparse.mm(adj, l1(x)))))
            loss = torch.nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, adj.grad.to_dense().cpu()

    expected = train("cpu")
    before = fallbacks()
    losses, grad = train("tpu")
    assert losses == pytest.approx(expected[0], rel=1e-5)
    torch.testing.assert_close(grad, expected[1], rtol=1e-5, atol=1e-6)
    assert fallbacks() == before


def test_sparse_updates_settle():
    """Adagrad coalesces each step's gradient: its count of distinct rows
    changes every step, and the programs after it settle in buckets."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(1000, 16, sparse=True).to("tpu")
    opt = torch.optim.Adagrad(emb.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(1)
    compiled = []
    for _ in range(10):
        before = torchtpu.metrics()["compilations"]
        idx = torch.randint(0, 1000, (32, 10), generator=generator).to("tpu")
        opt.zero_grad()
        emb(idx).pow(2).mean().backward()
        opt.step()
        emb.weight.sum().item()
        compiled.append(torchtpu.metrics()["compilations"] - before)
    assert sum(compiled[-4:]) == 0, compiled


def test_compiled_sparse_embedding_as_on_cpu():
    """A compiled graph returning a sparse gradient runs its ops eagerly
    (an XLA program's values are dense), reported with its reason."""

    def train(device):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(20, 8, sparse=True).to(device)
        step = torch.compile(lambda i: emb(i).pow(2).mean())
        opt = torch.optim.SGD(emb.parameters(), lr=0.5)
        for _ in range(2):
            opt.zero_grad()
            step(torch.tensor([[1, 2, 3], [3, 4, 19]], device=device)).backward()
            assert emb.weight.grad.is_sparse
            opt.step()
        return emb.weight.detach().cpu()

    torch._dynamo.reset()
    expected = train("cpu")
    torch._dynamo.reset()
    torchtpu.reset_metrics()
    torch.testing.assert_close(train("tpu"), expected)
    assert list(torchtpu.metrics()["eager_graphs"].values()) == ["it computes sparse tensors"]
