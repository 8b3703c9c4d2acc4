"""Worker programs of tests/test_distributed.py: each runs in every process of
a torchrun-style launch (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
environment) and raises on any difference from the CPU reference."""
import contextlib
import datetime
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

import torchtpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from workloads import GPT, Block, mlp_model  # noqa: E402

TIMEOUT = datetime.timedelta(seconds=int(os.environ.get("DIST_TIMEOUT", "60")))


def _setup(backend=None):
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=TIMEOUT)
    device = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
    torch.tpu.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def _same(tpu, cpu, what, **tol):
    torch.testing.assert_close(tpu.cpu(), cpu, msg=lambda m: f"{what} (rank {dist.get_rank()}): {m}", **tol)


def collectives():
    """Every collective on tpu tensors equals the same collective on CPU
    tensors of the same group (gloo)."""
    rank, world, device = _setup()
    g = torch.Generator().manual_seed(rank)

    def both(fn, *tensors):
        cpu = [t.clone() for t in tensors]
        tpu = [t.to(device) for t in tensors]
        fn(*cpu)
        fn(*tpu)
        return tpu, cpu

    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = (torch.randn(5, 3, generator=g) * 10).to(dtype)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            (tpu,), (cpu,) = both(lambda t, op=op: dist.all_reduce(t, op=op), x)
            _same(tpu, cpu, f"all_reduce {op} {dtype}")
        if dtype.is_floating_point:  # gloo has neither: as NCCL computes them
            total = x.clone().float()
            dist.all_reduce(total)
            for op, expected in ((dist.ReduceOp.AVG, total / world), (dist._make_nccl_premul_sum(0.25), total * 0.25)):
                tpu = x.to(device)
                dist.all_reduce(tpu, op=op)
                _same(tpu, expected.to(dtype), f"all_reduce {op} {dtype}")
        (tpu,), (cpu,) = both(lambda t: dist.broadcast(t, src=1), x)
        _same(tpu, cpu, f"broadcast {dtype}")
        (tpu, _), (cpu, _) = both(lambda o, i: dist.all_gather_into_tensor(o, i), torch.zeros(5 * world, 3, dtype=dtype), x)
        _same(tpu, cpu, f"all_gather_into_tensor {dtype}")
        (tpu, _), (cpu, _) = both(lambda o, i: dist.reduce_scatter_tensor(o, i), torch.zeros(5, 3, dtype=dtype),
                                  x.repeat(world, 1))
        _same(tpu, cpu, f"reduce_scatter_tensor {dtype}")

    # gloo writes in place into an output's buffer only where nothing else sees
    # it: `kept` shares the first output's buffer and keeps its value; an input
    # inside its output (FSDP2's all-gather) is read before the output is written.
    x = torch.randn(5, 3, generator=g)
    expected = torch.zeros(5 * world, 3)
    dist.all_gather_into_tensor(expected, x)
    out = torch.full((5 * world, 3), -1.0, device=device)
    kept = torch.empty_like(out).copy_(out)
    for _ in range(2):  # a second call may reuse the buffer the first wrote
        x_tpu = x.to(device)
        before = torchtpu.metrics()["transfers_to_host"]
        dist.all_gather_into_tensor(out, x_tpu)
        assert torchtpu.metrics()["transfers_to_host"] == before, "gloo got copies"
        _same(out, expected, "all_gather_into_tensor in place")
    _same(kept, torch.full((5 * world, 3), -1.0), "a tensor sharing the output's buffer")
    inside = torch.zeros(5 * world, 3, device=device)
    inside[5 * rank:5 * (rank + 1)] = x.to(device)
    dist.all_gather_into_tensor(inside, inside[5 * rank:5 * (rank + 1)])
    _same(inside, expected, "all_gather_into_tensor of a slice of its output")

    x = torch.randn(4, 2, generator=g)
    outs_tpu = [torch.zeros(4, 2, device=device) for _ in range(world)]
    outs_cpu = [torch.zeros(4, 2) for _ in range(world)]
    dist.all_gather(outs_tpu, x.to(device))
    dist.all_gather(outs_cpu, x)
    for t, c in zip(outs_tpu, outs_cpu):
        _same(t, c, "all_gather")
    out_tpu, out_cpu = torch.zeros(4, 2, device=device), torch.zeros(4, 2)
    dist.reduce_scatter(out_tpu, [x.to(device) * (i + 1) for i in range(world)])
    dist.reduce_scatter(out_cpu, [x * (i + 1) for i in range(world)])
    _same(out_tpu, out_cpu, "reduce_scatter")
    a2a_tpu, a2a_cpu = torch.zeros(world * 2, device=device), torch.zeros(world * 2)
    src = torch.arange(world * 2.0) + 10 * rank
    dist.all_to_all_single(a2a_tpu, src.to(device))
    dist.all_to_all_single(a2a_cpu, src)
    _same(a2a_tpu, a2a_cpu, "all_to_all_single")
    # The list form's reference is the single tensor's (gloo before torch 2.15
    # has no list form).
    lists_tpu = [torch.zeros(2, device=device) for _ in range(world)]
    dist.all_to_all(lists_tpu, [src[2 * i:2 * i + 2].to(device) for i in range(world)])
    for t, c in zip(lists_tpu, a2a_cpu.split(2)):
        _same(t, c, "all_to_all")
    r_tpu, r_cpu = x.to(device), x.clone()
    dist.reduce(r_tpu, dst=0)
    dist.reduce(r_cpu, dst=0)
    if rank == 0:  # other ranks' buffers are undefined afterwards
        _same(r_tpu, r_cpu, "reduce")
    s_tpu, s_cpu = torch.zeros(3, device=device), torch.zeros(3)
    chunks = [torch.full((3,), float(i)) for i in range(world)]
    dist.scatter(s_tpu, [c.to(device) for c in chunks] if rank == 0 else None, src=0)
    dist.scatter(s_cpu, chunks if rank == 0 else None, src=0)
    _same(s_tpu, s_cpu, "scatter")
    gathered_tpu = [torch.zeros(3, device=device) for _ in range(world)] if rank == 1 else None
    dist.gather(s_tpu, gathered_tpu, dst=1)
    if rank == 1:
        for i, t in enumerate(gathered_tpu):
            _same(t, torch.full((3,), float(i)), "gather")
    p2p = torch.full((2,), float(rank), device=device)
    if rank == 0:
        dist.send(p2p + 5, dst=1)
    elif rank == 1:
        dist.recv(p2p, src=0)
        _same(p2p, torch.full((2,), 5.0), "send/recv")
    works = [dist.all_reduce(t, async_op=True) for t in (x.to(device), x.to(device) * 2)]
    for w in works:
        assert w.wait()
    total = x.clone()
    dist.all_reduce(total)
    shared = x.to(device)
    other = torch.empty_like(shared).copy_(shared)  # two storages, one buffer: gloo must not write in place
    dist.all_reduce(other)
    _same(other, total, "all_reduce of a tensor sharing its buffer")
    _same(shared, x, "the tensor it shares its buffer with")
    fut = dist.all_reduce(x.to(device), async_op=True).get_future()
    _same(fut.wait()[0], total, "async all_reduce's future")
    coalesced = [x.to(device), x.to(device) * 3]
    dist.all_reduce_coalesced(coalesced)
    _same(coalesced[1], total * 3, "all_reduce_coalesced")
    members = [0, world - 1]  # a subgroup: the first and last ranks
    sub = dist.new_group(members)
    y = torch.ones(2, device=device) * (rank + 1)
    dist.all_reduce(y, group=sub)
    expected = float(sum(r + 1 for r in members)) if rank in members else float(rank + 1)
    _same(y, torch.full((2,), expected), "subgroup all_reduce")
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "tensor_sum": float(x.sum())})
    assert [o["rank"] for o in objects] == list(range(world))
    dist.barrier()
    cpu_in_tpu_group = torch.ones(3) * rank
    dist.all_reduce(cpu_in_tpu_group)  # a CPU tensor in the same (default) group
    _same(cpu_in_tpu_group, torch.full((3,), float(sum(range(world)))), "CPU tensor in the default group")
    dist.destroy_process_group()


# The models trained: the MLP and a small GPT (no dropout: ranks draw other numbers).
MODELS = {
    "mlp": mlp_model,
    "gpt": lambda: GPT(vocab=64, seq=16, d=32, heads=2, layers=2, dropout=0.0),
}
ROWS = 8  # per rank and step


def _global_batches(kind, steps, world):
    g = torch.Generator().manual_seed(0)
    if kind == "mlp":
        return torch.randn(steps, ROWS * world, 784, generator=g), torch.randint(0, 10, (steps, ROWS * world), generator=g)
    tokens = torch.randint(0, 64, (steps, ROWS * world, 17), generator=g)
    return tokens[..., :-1], tokens[..., 1:]


def _loss(out, y):
    return nn.functional.cross_entropy(out.flatten(0, -2), y.flatten())


def _rows(rank, micro, j):
    """Rows of the global batch in rank `rank`'s micro-batch `j` of `micro`."""
    per = ROWS // micro
    return torch.arange(ROWS * rank + per * j, ROWS * rank + per * (j + 1))


def _cpu_reference(kind, steps, world, micro=1):
    """Single-process CPU training on the global batch (micro-batch j being
    every rank's j-th, gradients accumulated): (losses, parameters)."""
    torch.manual_seed(0)
    model = MODELS[kind]()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x, y in zip(*_global_batches(kind, steps, world)):
        opt.zero_grad()
        total = 0.0
        for j in range(micro):
            rows = torch.cat([_rows(r, micro, j) for r in range(world)])
            loss = _loss(model(x[rows]), y[rows])
            loss.backward()
            total += loss.item() / micro
        opt.step()
        losses.append(total)
    return torch.tensor(losses), [p.detach() for p in model.parameters()]


def _train_sharded(wrap, kind, steps, log_on_rank0=False, micro=1):
    """Each rank trains on its share of the global batch, in `micro`
    micro-batches (all but the last under DDP's no_sync); returns the global
    mean loss per step and the trained module."""
    rank, world, device = _setup()
    torch.manual_seed(0)
    model = wrap(MODELS[kind](), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step, (x, y) in enumerate(zip(*_global_batches(kind, steps, world))):
        opt.zero_grad()
        total = torch.zeros((), device=device)
        for j in range(micro):
            rows = _rows(rank, micro, j)
            sync = model.no_sync() if j < micro - 1 else contextlib.nullcontext()
            with sync:
                loss = _loss(model(x[rows].to(device)), y[rows].to(device))
                loss.backward()
            total += loss.detach() / micro
        opt.step()
        if log_on_rank0 and rank == 0:
            # Rank-divergent work between collectives: host reads, other shapes.
            print(f"step {step} loss {total.item():.4f}", flush=True)
            extra = torch.randn(3 + step, 7, device=device) @ torch.randn(7, 2 + step, device=device)
            assert torch.isfinite(extra).all().item()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    return torch.tensor(losses), model


def _check_training(losses, params, kind, steps, what, micro=1):
    ref_losses, ref_params = _cpu_reference(kind, steps, dist.get_world_size(), micro)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=1e-5)
    for p, r in zip(params, ref_params):
        _same(p.detach(), r, f"{what} parameter of the {kind}", rtol=1e-4, atol=1e-5)


def ddp_rank0_logs():
    """DDP (several gradient buckets, two micro-batches per step, the first
    under no_sync) trains as one CPU process on the global batch while rank 0
    logs and runs other work."""
    steps = 3
    for kind in MODELS:
        def wrap(module, device):
            return nn.parallel.DistributedDataParallel(module.to(device), bucket_cap_mb=0.05)

        losses, model = _train_sharded(wrap, kind, steps, log_on_rank0=True, micro=2)
        _check_training(losses, model.module.parameters(), kind, steps, "DDP", micro=2)
        # DDP's logger timed the iterations with the tpu timer (host timestamps).
        assert model._get_ddp_logging_data()["avg_forward_compute_time"] > 0
    dist.destroy_process_group()


def ddp_sparse_embedding():
    """DDP of an EmbeddingBag with sparse gradients (a recommender's table):
    trains as one CPU process on the global batch. Sparse gradients are
    all-reduced by gloo on the CPU (counted fallbacks)."""
    import warnings

    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    rank, world, device = _setup()

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.EmbeddingBag(50, 8, sparse=True), nn.Linear(8, 1))

    data = torch.randint(0, 50, (4, ROWS * world, 5), generator=torch.Generator().manual_seed(1))
    ddp = nn.parallel.DistributedDataParallel(model().to(device))
    ref = model()
    for module, rows in ((ddp, slice(ROWS * rank, ROWS * (rank + 1))), (ref, slice(None))):
        opt = torch.optim.SGD(module.parameters(), lr=0.5)
        for batch in data:
            opt.zero_grad()
            module(batch[rows].to(next(module.parameters()).device)).pow(2).mean().backward()
            opt.step()
    for p, r in zip(ddp.module.parameters(), ref.parameters()):
        _same(p.detach(), r.detach(), "DDP sparse embedding parameter", rtol=1e-5, atol=1e-6)
    assert set(torchtpu.metrics()["fallbacks"]) == {"c10d::allreduce_"}
    dist.destroy_process_group()


def fsdp2():
    """FSDP2's fully_shard: parameters are sharded DTensors; training equals
    one CPU process on the global batch."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    steps = 3

    def wrap(module, device):
        module.to(device)
        # The GPT's blocks or else the MLP's layers, then the root.
        layers = [m for m in module.modules() if isinstance(m, Block)]
        for layer in layers or [m for m in module.modules() if isinstance(m, nn.Linear)]:
            fully_shard(layer)
        return fully_shard(module)

    for kind in MODELS:
        losses, model = _train_sharded(wrap, kind, steps)
        assert all(isinstance(p, DTensor) for p in model.parameters())
        _check_training(losses, (p.full_tensor() for p in model.parameters()), kind, steps, "FSDP2")
    dist.destroy_process_group()


def fsdp_wrapper():
    """The FSDP wrapper as users write it, `FSDP(model, device_id=torch.device("tpu"))`,
    trains as one CPU process on the global batch."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    steps = 3
    losses, model = _train_sharded(lambda module, device: FSDP(module, device_id=torch.device("tpu")), "mlp", steps)
    with FSDP.summon_full_params(model):
        _check_training(losses, model.parameters(), "mlp", steps, "FSDP")
    dist.destroy_process_group()


def dtensor():
    """DTensor on a tpu DeviceMesh: sharded matmul, redistribute, full_tensor
    and a tensor-parallel MLP equal the same math on CPU."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rank, world, device = _setup()
    mesh = init_device_mesh("tpu", (world,))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 6, generator=g), torch.randn(6, 4, generator=g)
    da, db = distribute_tensor(a, mesh, [Shard(0)]), distribute_tensor(b, mesh, [Replicate()])
    assert da.to_local().device == device and da.to_local().shape == (8 // world, 6)
    _same((da @ db).full_tensor(), a @ b, "sharded matmul", rtol=1e-5, atol=1e-5)
    _same(da.redistribute(mesh, [Replicate()]).to_local(), a, "redistribute")
    _same(distribute_tensor(b, mesh, [Shard(1)]).full_tensor(), b, "full_tensor")
    _dtensor_random(mesh)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    ref = copy.deepcopy(mlp)
    tp = parallelize_module(mlp.to(device), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, 16, generator=g)
    out = tp(x.to(device))
    expected = ref(x)
    _same(out, expected, "tensor-parallel MLP", rtol=1e-5, atol=1e-5)
    out.sum().backward()
    expected.sum().backward()
    for p, r in zip(tp.parameters(), ref.parameters()):
        _same(p.grad.full_tensor(), r.grad, "tensor-parallel gradient", rtol=1e-5, atol=1e-5)
    dist.destroy_process_group()


def _dtensor_random(mesh):
    """Random ops on DTensors (model initialisation on the device): each
    shard draws its own stream, a replicated tensor draws the same values on
    every rank, the generators end in step, and a seed repeats it all."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def draw():
        torch.manual_seed(1)
        sharded = distribute_tensor(torch.empty(8, 6), mesh, [Shard(0)]).normal_()
        replicated = distribute_tensor(torch.empty(8, 6), mesh, [Replicate()]).uniform_()
        return sharded.full_tensor().cpu(), replicated.to_local().cpu()

    def gathered(t):
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather_object(parts, t)
        return parts

    full, replicated = draw()
    rows = full.shape[0] // dist.get_world_size()
    assert not torch.equal(full[:rows], full[rows:2 * rows]), "two shards drew the same values"
    assert abs(full.mean().item()) < 0.6 and 0.5 < full.std().item() < 1.5, full
    assert all(torch.equal(r, replicated) for r in gathered(replicated)), "replicas drew differently"
    state = torch.tpu.get_rng_state()
    assert state.numel() == 16 and all(torch.equal(s, state) for s in gathered(state))
    again, _ = draw()
    assert torch.equal(full, again)


def mismatch():
    """Ranks that call different collectives all raise the same error."""
    rank, world, device = _setup()
    x = torch.ones(4, device=device)
    try:
        if rank == 0:
            dist.all_reduce(x)
        else:
            dist.broadcast(x[:2], src=0)
    except RuntimeError as e:
        assert "collectives do not match" in str(e) and "allreduce" in str(e) and "broadcast" in str(e), e
    else:
        raise AssertionError("no error")
    dist.all_reduce(x)  # the group is still usable
    _same(x, torch.full((4,), float(world)), "all_reduce after a mismatch")
    dist.destroy_process_group()


def collective_programs():
    """The collective programs of GPU and TPU plugins, replicated over the
    devices of one process (TORCHTPU_DEVICE_COUNT), equal gloo's results on
    the same values (gloo's ranks as threads of this process)."""
    import threading

    n = torch.tpu.device_count()
    devices = [torch.device("tpu", i) for i in range(n)]
    ids = list(range(n))

    def on_gloo(fn, values):
        """fn(group, rank, value) on every rank of an in-process gloo group."""
        store, results, errors = dist.HashStore(), [None] * n, []

        def rank_main(rank):
            try:
                group = dist.ProcessGroupGloo(store, rank, n, TIMEOUT)
                results[rank] = fn(group, rank, values[rank].clone())
            except Exception as e:  # noqa: BLE001 (raised below, on the main thread)
                errors.append(e)

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    def on_tpu(kind, values, out_shape, op="sum", scale=1.0, root=0, pairs=()):
        ins = [v.to(d) for v, d in zip(values, devices)]
        outs = [torch.full(out_shape, -7, dtype=v.dtype, device=d) for v, d in zip(values, devices)]
        torch.ops.torchtpu.collective(kind, op, scale, root, list(pairs), ids, ins, outs)
        assert all(o.device == d for o, d in zip(outs, devices))
        return outs

    def same(what, tpu, cpu):
        # gloo rounds bfloat16 sums at every step, XLA once: an ulp of the values (|v| < 16) apart.
        tol = {"atol": 0.0625, "rtol": 0.016} if tpu[0].dtype == torch.bfloat16 else {}
        for r, (t, c) in enumerate(zip(tpu, cpu)):
            torch.testing.assert_close(t.cpu(), c, msg=lambda m: f"{what}, replica {r}: {m}", **tol)

    def allreduce(op, scale=1.0):
        def fn(g, rank, v):
            if op == dist.ReduceOp.PREMUL_SUM:
                v = v * scale
            g.allreduce([v], dist.AllreduceOptions() if op in (dist.ReduceOp.AVG, dist.ReduceOp.PREMUL_SUM)
                        else _opts(dist.AllreduceOptions(), reduceOp=op)).wait()
            return v / n if op == dist.ReduceOp.AVG else v
        return fn

    g = torch.Generator().manual_seed(0)
    before = torchtpu.metrics()["collectives"]
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        values = [(torch.randn(6, 3, generator=g) * 4).to(dtype) for _ in range(n)]
        ops = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
               "min": dist.ReduceOp.MIN}
        if dtype.is_floating_point:
            ops.update(avg=dist.ReduceOp.AVG, premul_sum=dist.ReduceOp.PREMUL_SUM)
        for name, op in ops.items():
            same(f"all_reduce {name} {dtype}", on_tpu("all_reduce", values, (6, 3), op=name, scale=0.25),
                 on_gloo(allreduce(op, 0.25), values))
        def into(call, shape):
            """A gloo collective that writes a new tensor of `shape`."""
            def fn(g, rank, v):
                out = torch.empty(shape, dtype=v.dtype)
                call(g, out, v).wait()
                return out
            return fn

        big = [v.repeat(n, 1) for v in values]
        same(f"all_gather {dtype}", on_tpu("all_gather", values, (6 * n, 3)),
             on_gloo(into(lambda g, o, v: g._allgather_base(o, v), (6 * n, 3)), values))
        same(f"reduce_scatter {dtype}", on_tpu("reduce_scatter", big, (6, 3)),
             on_gloo(into(lambda g, o, v: g._reduce_scatter_base(o, v), (6, 3)), big))
        same(f"all_to_all {dtype}", on_tpu("all_to_all", big, (6 * n, 3)),
             on_gloo(into(lambda g, o, v: g.alltoall_base(o, v, [], [], dist.AllToAllOptions()), (6 * n, 3)), big))
        same(f"broadcast {dtype}", on_tpu("broadcast", values, (6, 3), root=n - 1),
             on_gloo(into(lambda g, o, v: g.broadcast([o.copy_(v)], _opts(dist.BroadcastOptions(), rootRank=n - 1)),
                          (6, 3)), values))
    ring = [(r, (r + 1) % n) for r in range(n)]
    values = [torch.full((5,), float(r)) for r in range(n)]
    same("permute", on_tpu("permute", values, (5,), pairs=[i for p in ring for i in p]),
         [values[(r - 1) % n] for r in range(n)])
    assert torchtpu.metrics()["collectives"] - before == 10 + 10 + 8 + 1
    backend_programs()


def backend_programs():
    """The backend's transport on GPUs and TPUs (collective programs), in a
    group of this one process: each collective the members' single program,
    its results those of a one-member group."""
    from torch._C._distributed_c10d import AllgatherOptions, AllToAllOptions
    from torchtpu.distributed import TpuBackend

    backend = TpuBackend(dist.HashStore(), 0, 1, TIMEOUT, devices=[torchtpu._C.device_id(1)])
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    before = torchtpu.metrics()["collectives"]

    def run(call, *tensors, **fields):
        """`call` on tpu:1 copies of `tensors`; their values afterwards."""
        on_tpu = [t.to("tpu:1") for t in tensors]
        options = {"allreduce": dist.AllreduceOptions, "broadcast": dist.BroadcastOptions,
                   "reduce_scatter_single": dist.ReduceScatterOptions,
                   "all_to_all_single": AllToAllOptions}.get(call, AllgatherOptions)
        args = (on_tpu,) if call in ("allreduce", "broadcast") else (*on_tpu,)
        if call == "all_to_all_single":
            args = (*args, [], [])
        getattr(backend, call)(*args, _opts(options(), **fields)).wait()
        return [t.cpu() for t in on_tpu]

    for op, expected in [(dist.ReduceOp.SUM, x), (dist.ReduceOp.AVG, x), (dist.ReduceOp.MAX, x),
                         (dist.ReduceOp.PRODUCT, x), (dist._make_nccl_premul_sum(0.5), x * 0.5)]:
        torch.testing.assert_close(run("allreduce", x, reduceOp=op)[0], expected)
    torch.testing.assert_close(run("broadcast", x, rootRank=0)[0], x)
    out, _ = run("all_gather_single", torch.zeros(4, 3), x)
    torch.testing.assert_close(out, x)
    out, _ = run("reduce_scatter_single", torch.zeros(4, 3), x, reduceOp=dist.ReduceOp.SUM)
    torch.testing.assert_close(out, x)
    out, _ = run("all_to_all_single", torch.zeros(4, 3), x)
    torch.testing.assert_close(out, x)
    assert torchtpu.metrics()["collectives"] - before == 9


def runtime_group():
    """Each process's runtime joins the group through its store (`_C.join`,
    what the default group's creation calls). Rank 0's client is made for the
    group, as on GPUs (without the options XLA:CPU refuses), and a group made again finds it;
    rank 1 used the device first, so that such a join is refused. A process
    on another platform and a missing one are clear errors."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0)

    def join(prefix, timeout=30.0, tell_plugin=False):
        return torchtpu._C.join(dist.PrefixStore(prefix, store), rank, world, rank, timeout, tell_plugin)

    def refused(expected, prefix, **kwargs):
        try:
            join(prefix, **kwargs)
        except RuntimeError as e:
            assert expected in str(e), e
        else:
            raise AssertionError(f"joined {prefix}")

    if rank == 1:
        assert (torch.ones(3, device="tpu:1") * 2).sum().item() == 6
    assert join("first/", tell_plugin=rank == 0) == [0, 1]  # tpu:<local rank> of each
    if rank == 1:
        refused("must come before the first use of the tpu device", "late/", tell_plugin=True)
    assert join("again/", tell_plugin=rank == 0) == [0, 1]
    assert (torch.ones(3, device=f"tpu:{rank}") * 2).sum().item() == 6
    if rank == 1:
        dist.PrefixStore("other/", store).set("torchtpu/runtime/1", "0 cuda 12.9")  # a process on GPUs
        return
    refused("different PJRT platforms: process 0 runs cpu", "other/")
    refused("meeting process 1 of the group's 2: DEADLINE_EXCEEDED", "missing/", timeout=0.5)
    assert (torch.ones(3, device="tpu:0") * 2).sum().item() == 6  # still usable


def device_id_and_p2p():
    """`init_process_group(DIST_BACKEND, device_id=...)`, as Lightning and
    pipelining users call it (DIST_BACKEND: none, "gloo" or "cpu:gloo", gloo
    carrying tpu tensors as it carries CUDA's), then the point-to-point
    traffic of pipeline stages (batch_isend_irecv of P2POps, both ranks
    sending first, a rank to itself; send_object_list), groups split from the default one and
    made anew (a rank left out), and DDP training as one CPU process."""
    rank = int(os.environ["RANK"])
    device = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(os.environ.get("DIST_BACKEND") or None, device_id=device, timeout=TIMEOUT)
    peer = 1 - rank
    mine, theirs = torch.full((4,), rank + 1.0, device=device), torch.empty(4, device=device)
    for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]):
        request.wait()
    assert theirs.tolist() == [peer + 1.0] * 4, theirs
    # To itself, received first, as NCCL takes it (torch 2.11's pipelining
    # warms up a V layout's stages on one rank so).
    back = torch.empty(4, device=device)
    for request in dist.batch_isend_irecv([dist.P2POp(dist.irecv, back, rank), dist.P2POp(dist.isend, mine, rank)]):
        request.wait()
    assert back.tolist() == [rank + 1.0] * 4, back
    shapes = [{"shape": [2, 3]} if rank == 0 else None]
    if rank == 0:
        dist.send_object_list(shapes, dst=1, device=device)
    else:
        dist.recv_object_list(shapes, src=0, device=device)
        assert shapes == [{"shape": [2, 3]}], shapes

    # Split in reverse order: global rank 1 is the new group's rank 0. (torch
    # 2.11's split_group splits CUDA groups only: a new group, in rank order.)
    if torch.__version__ >= "2.15":
        pair, lead = dist.split_group(split_ranks=[[1, 0]]), 1
    else:
        pair, lead = dist.new_group([0, 1]), 0
    assert dist.get_rank(pair) == (rank - lead) % 2
    t = torch.full((2,), rank + 1.0, device=device)
    dist.broadcast(t, group_src=0, group=pair)
    assert t.tolist() == [lead + 1.0] * 2, t
    t = torch.ones(2, device=device)
    dist.all_reduce(t, group=pair)
    assert t.tolist() == [2.0, 2.0], t
    on_cpu = torch.ones(2)
    dist.all_reduce(on_cpu, group=pair)
    assert on_cpu.tolist() == [2.0, 2.0], on_cpu
    alone = dist.new_group([0])
    if rank == 0:
        t = torch.ones(2, device=device)
        dist.all_reduce(t, group=alone)
        assert t.tolist() == [1.0, 1.0]

    losses, model = _train_sharded(lambda module, device: nn.parallel.DistributedDataParallel(module.to(device)),
                                   "mlp", 2)
    _check_training(losses, model.module.parameters(), "mlp", 2, "DDP")
    dist.destroy_process_group()


def nccl_refused():
    """nccl cannot carry tpu tensors: its creation says which backends can."""
    try:
        dist.init_process_group("nccl", timeout=TIMEOUT)
    except RuntimeError as e:
        print(e)
    else:
        raise AssertionError("an nccl group was made in a tpu process")


# Pipeline schedules: name -> (class, stages per rank, how a rank's stages
# are laid out: "loop" rank r holds r, r + world; "v" holds r, 2 world - 1 - r).
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1, "loop"),
    "1f1b": ("Schedule1F1B", 1, "loop"),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", 2, "loop"),
    "interleaved_zero_bubble": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "zbv_zero_bubble": ("ScheduleZBVZeroBubble", 2, "v"),
}
MICROBATCHES = 4


def _pipeline_model(stages):
    """A model of `stages` blocks, the last with the head."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(stages)]
    blocks[-1].append(nn.Linear(16, 4))
    return blocks


def pipeline():
    """torch.distributed.pipelining on tpu, each schedule of PP_SCHEDULES in
    turn over one group: each rank holds its stages of a model split in
    blocks, the stages exchange shapes and activations point to point; losses
    and parameters equal one CPU process training the whole model on the
    same micro-batches (rtol 1e-4)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(device_id=device, timeout=TIMEOUT)
    for schedule in os.environ["PP_SCHEDULES"].split(","):
        _pipeline_schedule(schedule, rank, world, device)
    dist.destroy_process_group()


def _pipeline_schedule(schedule, rank, world, device):
    import torch.distributed.pipelining as pp

    name, per_rank, layout = SCHEDULES[schedule]
    stages = world * per_rank
    mine = [rank] if per_rank == 1 else [rank, rank + world if layout == "loop" else 2 * world - 1 - rank]
    blocks = _pipeline_model(stages)
    modules = {i: blocks[i].to(device) for i in mine}
    loss_fn = nn.CrossEntropyLoss()
    stage_objects = [pp.PipelineStage(modules[i], i, stages, device) for i in mine]
    schedule_class = getattr(pp, name)
    pipe = schedule_class(stage_objects[0] if per_rank == 1 else stage_objects, n_microbatches=MICROBATCHES,
                          loss_fn=loss_fn)
    opt = torch.optim.SGD([p for m in modules.values() for p in m.parameters()], lr=0.1)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(3)]
    holds_first, holds_last = 0 in mine, stages - 1 in mine
    losses = []
    for x, y in batches:
        opt.zero_grad()
        out = []
        kwargs = {"target": y.to(device), "losses": out} if holds_last else {}
        pipe.step(*([x.to(device)] if holds_first else []), **kwargs)
        opt.step()
        losses.append([l.item() for l in out])

    # One CPU process, the same micro-batches, their mean loss.
    reference = _pipeline_model(stages)
    whole = nn.Sequential(*reference)
    ref_opt = torch.optim.SGD(whole.parameters(), lr=0.1)
    ref_losses = []
    for x, y in batches:
        ref_opt.zero_grad()
        micro = [loss_fn(whole(xm), ym) for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES))]
        (sum(micro) / MICROBATCHES).backward()
        ref_opt.step()
        ref_losses.append([l.item() for l in micro])
    if holds_last:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{schedule}'s losses: {m}")
    for i in mine:
        for p, r in zip(modules[i].parameters(), reference[i].parameters()):
            _same(p.detach(), r.detach(), f"{schedule}: stage {i}'s parameter", rtol=1e-4, atol=1e-5)


def pipeline_peer_missing():
    """The last stage waits for activations its peer never sends: it raises
    within the group's timeout (DIST_TIMEOUT), rather than hanging."""
    import time

    import torch.distributed.pipelining as pp

    rank = int(os.environ["RANK"])
    device = torch.device("tpu", rank)
    dist.init_process_group(device_id=device, timeout=TIMEOUT)
    if rank == 0:  # never sends; stays until its peer has given up
        time.sleep(TIMEOUT.total_seconds() + 10)
        return
    stage = pp.PipelineStage(_pipeline_model(2)[1].to(device), 1, 2, device,
                             input_args=torch.empty(2, 16, device=device))
    schedule = pp.ScheduleGPipe(stage, n_microbatches=1, loss_fn=nn.CrossEntropyLoss())
    start = time.monotonic()
    try:
        schedule.step(target=torch.zeros(2, dtype=torch.int64, device=device), losses=[])
    except Exception as e:  # gloo's timeout, as the group's
        waited = time.monotonic() - start
        assert waited < TIMEOUT.total_seconds() + 10, waited
        print(f"raised after {waited:.1f}s: {type(e).__name__}: {str(e)[:200]}")
    else:
        raise AssertionError("a stage received what was never sent")


def _opts(options, **fields):
    for k, v in fields.items():
        setattr(options, k, v)
    return options


if __name__ == "__main__":
    globals()[sys.argv[1]]()
