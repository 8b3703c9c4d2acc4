"""Bounded dynamic dimensions (bounded.rs): a training loop whose batch size
changes every step compiles one fused program per bucket, with CPU's
losses, parameters and outputs; a trace it cannot bucket stays exact."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, torch, torchtpu
    F = torch.nn.functional

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 5))

    def seq():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Embedding(40, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 40))

    torch.manual_seed(1)
    batches = [37, 45, 33, 60, 3, 4, 100, 128, 70, 2, 90, 50]
    data = [(torch.randn(b, 8), torch.randint(0, 5, (b,))) for b in batches]
    lengths = [9, 12, 15, 10, 14]
    tokens = [torch.randint(0, 40, (2, n)) for n in lengths]

    def train(device, model, steps):
        m = model().to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for inputs, loss_of in steps:
            loss = loss_of(m(inputs.to(device)))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return m, losses

    def mlp_steps(device):
        return [(x, lambda out, y=y: F.cross_entropy(out, y.to(device))) for x, y in data]

    def seq_steps(device):
        return [(t[:, :-1], lambda out, t=t: F.cross_entropy(out.reshape(-1, 40), t[:, 1:].reshape(-1).to(device)))
                for t in tokens]

    torchtpu.reset_metrics()
    m, tpu = train("tpu", mlp, mlp_steps("tpu"))
    metrics = torchtpu.metrics()
    probe = torch.randn(21, 8)
    m.eval()
    out = m(probe.to("tpu")).cpu()
    c, cpu = train("cpu", mlp, mlp_steps("cpu"))
    c.eval()
    params = max((a.detach().cpu() - b.detach()).abs().max().item()
                 for a, b in zip(list(m.parameters()) + list(m.buffers()), list(c.parameters()) + list(c.buffers())))
    _, tpu_seq = train("tpu", seq, seq_steps("tpu"))
    _, cpu_seq = train("cpu", seq, seq_steps("cpu"))
    print(json.dumps(dict(
        tpu=tpu, cpu=cpu, params=params, out=(out - c(probe)).abs().max().item(),
        buckets=len({torchtpu._C.bucket(b) for b in batches[1:]}), misses=metrics["fused_cache_misses"],
        bucketed=metrics["bucketed_runs"], repads=metrics["repads"],
        tpu_seq=tpu_seq, cpu_seq=cpu_seq, refusals=torchtpu.metrics()["bucket_refusals"])))
    """
)


def test_a_changing_batch_compiles_once_per_bucket_with_cpu_results(tmp_path):
    env = dict(os.environ, TORCHTPU_DYNAMIC="1", TORCHTPU_CACHE_DIR=str(tmp_path), TORCHTPU_MODE="fused")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    r = json.loads(done.stdout.strip().splitlines()[-1])
    for a, b in zip(r["tpu"], r["cpu"]):
        assert abs(a - b) <= 1e-5 * abs(b), (r["tpu"], r["cpu"])
    assert r["params"] < 1e-5 and r["out"] < 1e-5
    # A step's first structure compiles as it is (the first step, the first
    # with momentum buffers, and one more for the smallest sizes); later
    # sizes run their bucket's program (12 sizes in 4 more buckets: 2 to 128).
    assert r["misses"] <= r["buckets"] + 3, r
    assert r["bucketed"] >= len(r["tpu"]) - 3, r
    assert r["repads"] > 0
    # A sequence that changes inside the batch is not bucketed yet: exact.
    for a, b in zip(r["tpu_seq"], r["cpu_seq"]):
        assert abs(a - b) <= 1e-5 * abs(b), (r["tpu_seq"], r["cpu_seq"])
    assert r["refusals"], r
