"""Changing sizes with bounded dynamic dimensions (TORCHTPU_DYNAMIC=1), side
by side in one run:

- generation: greedy tokens/s of a tiny Llama (transformers, built from a
  config), tpu fused vs PyTorch CPU eager, after a warm-up call of the same
  lengths;
- training: steps/s of a loop whose sequence length changes every step
  (8 to 128; the timed pass meets lengths the warm-up pass did not) with and
  without buckets, vs one whose length stays at 64, all on tpu fused;
- windows: a language-model tutorial's epochs (an LSTM trained on
  `source[i:i+35]` at every i, the last window shorter), seconds per epoch
  and compilations, tpu fused (with and without buckets) vs CPU eager;
- architectures: greedy `generate()` of tiny decoders of fourteen
  transformers architectures (built from configs), tpu fused vs CPU eager
  in one process, rounds interleaved: tokens/s, programs and host reads per
  new token, same tokens;
- detection: torchvision's `fasterrcnn_mobilenet_v3_large_fpn` training
  steps (2 images of 128x128; proposal and sample counts read from the
  device every step), seconds and compilations per step, tpu fused (with
  and without buckets) vs CPU eager.

    python bench/dynamic.py [generation|training|windows|architectures|detection ...]

Each tpu figure comes from a fresh process (the setting is read at start).
"""
import copy
import json
import os
import subprocess
import sys
import time

LENGTHS = [8, 100, 33, 64, 17, 128, 90, 45, 12, 71, 120, 28, 56, 99, 9, 64]
# Other lengths in the same buckets, for the timed pass.
LATER = [7, 97, 35, 61, 19, 125, 88, 47, 11, 74, 118, 30, 54, 101, 10, 63]


def _generation(device, tokens):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if device == "tpu":
        import torchtpu  # noqa: F401
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to(device)
    prompt = torch.randint(0, 256, (1, 12)).to(device)
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=tokens, do_sample=False)  # warm-up
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=tokens, do_sample=False).cpu()
        seconds = time.perf_counter() - start
    return dict(tokens_per_s=tokens / seconds, ids=out.tolist())


# Decoder architectures for `architectures`, each shrunk to two layers of
# width 64 (the keys a config lacks are skipped).
ARCHITECTURES = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "phi", "gemma", "gemma2", "gpt_neox", "opt", "bloom",
                 "starcoder2", "olmo", "stablelm"]
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, n_embd=64, n_layer=2, n_head=4,
            n_inner=128, n_positions=256, ffn_dim=128, word_embed_proj_dim=64)


def _architectures(tokens=32, rounds=5):
    """Per architecture: medians over interleaved rounds of CPU eager and
    tpu fused `generate()` calls on copies of one model, and the last tpu
    call's programs and host reads per new token (its few set-up reads
    included)."""
    import statistics

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import torchtpu

    rows = []
    for name in ARCHITECTURES:
        config = AutoConfig.for_model(name)
        for key, value in TINY.items():
            if hasattr(config, key):
                setattr(config, key, value)
        torch.manual_seed(0)
        models = {"cpu": AutoModelForCausalLM.from_config(config).eval()}
        models["tpu"] = copy.deepcopy(models["cpu"]).to("tpu")
        prompt = torch.randint(3, 500, (1, 12))

        def run(device):
            start = time.perf_counter()
            out = models[device].generate(prompt.to(device), max_new_tokens=tokens, min_new_tokens=tokens,
                                          do_sample=False, pad_token_id=0).cpu()
            return tokens / (time.perf_counter() - start), out

        run("cpu"), run("tpu")  # warm-up: compilations, caches
        rates = {"cpu": [], "tpu": []}
        for _ in range(rounds):
            rate, expected = run("cpu")
            rates["cpu"].append(rate)
            torchtpu.reset_metrics()
            rate, out = run("tpu")
            rates["tpu"].append(rate)
        m = torchtpu.metrics()
        rows.append(dict(name=name, cpu=statistics.median(rates["cpu"]), tpu=statistics.median(rates["tpu"]),
                         programs=m["executions"] / tokens, reads=m["flushes"].get("host_read", 0) / tokens,
                         compilations=m["compilations"], fallbacks=sum(m["fallbacks"].values()),
                         same=torch.equal(out, expected)))
    return rows


def _per_op_us(device):
    """One small op (a + b, f32[4, 8]): CPU eager's whole op against tpu fused
    recording it (flushed and read every 100 ops), the floor under a decoding
    token's ~130 ops."""
    import torch

    if device == "tpu":
        import torchtpu  # noqa: F401
    a, b = torch.ones(4, 8, device=device), torch.ones(4, 8, device=device)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for i in range(10000):
            c = a + b
            if i % 100 == 99:
                c[0, 0].item()
        best = min(best, (time.perf_counter() - start) / 10000 * 1e6)
    return best


def _training(lengths, later):
    import torch

    import torchtpu

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(512, 64)
            self.layers = torch.nn.TransformerEncoder(
                torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True), 2,
                enable_nested_tensor=False)
            self.head = torch.nn.Linear(64, 512)

        def forward(self, ids):
            return self.head(self.layers(self.embed(ids)))

    torch.manual_seed(0)
    model = Encoder().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    def epoch(lengths):
        for n in lengths:
            ids = torch.randint(0, 512, (8, n + 1))
            ids = ids.to("tpu")
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()

    def timed(lengths):
        start = time.perf_counter()
        epoch(lengths)
        return len(lengths) / (time.perf_counter() - start)

    epoch(lengths)  # warm-up
    new = timed(later)  # lengths not met before
    return dict(new=new, steady=timed(later), compilations=torchtpu.metrics()["compilations"])


def _windows(device, epochs=2):
    """Seconds per epoch of the tutorial's loop, and compilations."""
    import torch

    if device == "tpu":
        import torchtpu
    torch.manual_seed(0)
    tokens = torch.randint(0, 200, (1500, 8))

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.rnn, self.head = torch.nn.Embedding(200, 64), torch.nn.LSTM(64, 128), torch.nn.Linear(128, 200)

        def forward(self, x):
            return self.head(self.rnn(self.embed(x))[0])

    model = LM().to(device)
    opt, data, seconds = torch.optim.SGD(model.parameters(), lr=0.5), tokens.to(device), []
    for _ in range(epochs):
        start = time.perf_counter()
        for i in range(0, len(tokens) - 1, 35):
            n = min(35, len(tokens) - 1 - i)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data[i:i + n]).view(-1, 200), data[i + 1:i + 1 + n].reshape(-1))
            loss.backward()
            opt.step()
            loss.item()
        seconds.append(time.perf_counter() - start)
    return dict(seconds=seconds, compilations=torchtpu.metrics()["compilations"] if device == "tpu" else 0)


def _detection(device, steps):
    import torch
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn

    if device == "tpu":
        import torchtpu

    def counts():
        """Compilations, and those of them that made a bucketed program: a
        count met in a bucket for the first time."""
        if device != "tpu":
            return 0, 0
        m = torchtpu.metrics()
        return m["compilations"], m["bucketed_programs"]

    torch.manual_seed(0)
    # The samplers' budgets take every box, so that which boxes a step trains
    # on does not depend on the random stream (tpu's is not CPU's).
    model = fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None, num_classes=3,
                                              min_size=128, max_size=128, rpn_batch_size_per_image=100000,
                                              box_batch_size_per_image=100000).train().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    images = [torch.rand(3, 128, 128, generator=g).to(device) for _ in range(2)]
    targets = [dict(boxes=torch.tensor([[10., 20., 60., 90.], [30., 30., 100., 110.]]), labels=torch.tensor([1, 2])),
               dict(boxes=torch.tensor([[5., 5., 50., 40.]]), labels=torch.tensor([2]))]
    targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
    seconds, compiled, bucketed, losses = [], [], [], []
    for step in range(steps):
        start, before = time.perf_counter(), counts()
        torch.manual_seed(100 + step)
        loss = sum(model(images, targets).values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - start)
        after = counts()
        compiled.append(after[0] - before[0])
        bucketed.append(after[1] - before[1])
    fallbacks = torchtpu.metrics()["fallbacks"] if device == "tpu" else {}
    return {"seconds": seconds, "compilations": compiled, "new buckets": bucketed, "losses": losses,
            "fallbacks": fallbacks}


def _child(what, *args, dynamic="1"):
    env = dict(os.environ, TORCHTPU_DYNAMIC=dynamic, TORCHTPU_CACHE_DIR="")
    code = f"import sys, json; sys.path.insert(0, {os.path.dirname(__file__)!r}); import dynamic; " \
           f"print(json.dumps(dynamic.{what}(*{list(args)!r})))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parts = sys.argv[1:] or ["generation", "training", "windows"]
    if "generation" in parts:
        generation()
    if "training" in parts:
        training()
    if "windows" in parts:
        windows()
    if "architectures" in parts:
        architectures()
    if "detection" in parts:
        detection()


def architectures():
    print("architectures (tiny decoders, greedy generate() of 32 new tokens), tokens/s; programs, host reads")
    print("per new token, and compilations of the timed tpu call:")
    for r in _child("_architectures"):
        print(f"  {r['name']:11s} tpu fused {r['tpu']:6.1f}  cpu eager {r['cpu']:6.1f}  tpu/cpu {r['tpu'] / r['cpu']:.2f}x  "
              f"programs {r['programs']:.2f}  reads {r['reads']:.2f}  compiled {r['compilations']}  fallbacks "
              f"{r['fallbacks']}  ({'same tokens' if r['same'] else 'TOKENS DIFFER'})")


def detection(steps=10):
    cpu = _detection("cpu", steps)
    print(f"detection (fasterrcnn_mobilenet_v3_large_fpn, 2 images 128x128, training), seconds per step 1-{steps}:")
    print("  cpu eager              " + " ".join(f"{s:5.1f}" for s in cpu["seconds"]))
    for name, dynamic in [("tpu fused, buckets", "1"), ("tpu fused, no buckets", "0")]:
        r = _child("_detection", "tpu", steps, dynamic=dynamic)
        print(f"  {name:22s} " + " ".join(f"{s:5.1f}" for s in r["seconds"]))
        print(f"  {'  compilations':22s} " + " ".join(f"{c:5d}" for c in r["compilations"]))
        last = slice(steps // 2, None)
        print(f"  {'':22s} second half: {sum(r['seconds'][last]) / sum(cpu['seconds'][last]):.2f}x cpu's time; "
              f"losses {' '.join(f'{x:.5f}' for x in r['losses'][-3:])} (cpu {' '.join(f'{x:.5f}' for x in cpu['losses'][-3:])},"
              f" {max(abs(a - b) / b for a, b in zip(r['losses'], cpu['losses'])):.1e} apart at most)")


def windows():
    cpu = _windows("cpu")
    print("windows (LSTM language model over source[i:i+35], 43 steps an epoch), seconds per epoch:")
    print(f"  cpu eager                     {cpu['seconds'][0]:7.2f}  {cpu['seconds'][1]:7.2f}")
    for name, dynamic in [("tpu fused, buckets", "1"), ("tpu fused, no buckets", "0")]:
        r = _child("_windows", "tpu", dynamic=dynamic)
        print(f"  {name:29s} {r['seconds'][0]:7.2f}  {r['seconds'][1]:7.2f}  ({r['compilations']} compilations; "
              f"first epoch {r['seconds'][0] / cpu['seconds'][0]:.1f}x cpu's time, second {r['seconds'][1] / cpu['seconds'][1]:.2f}x)")


def generation():
    print("generation (tiny Llama, greedy, after a warm-up call), tokens/s:")
    for tokens in (32, 128):
        cpu = _generation("cpu", tokens)
        tpu = _child("_generation", "tpu", tokens)
        same = "same tokens" if cpu["ids"] == tpu["ids"] else "TOKENS DIFFER"
        print(f"  {tokens:4d} new tokens: tpu fused {tpu['tokens_per_s']:7.1f}  cpu eager {cpu['tokens_per_s']:7.1f}"
              f"  tpu/cpu {tpu['tokens_per_s'] / cpu['tokens_per_s']:.2f}x  ({same})")
    cpu, tpu = _per_op_us("cpu"), _child("_per_op_us", "tpu")
    print(f"  per op (a + b, f32[4, 8]): tpu fused recording {tpu:.2f} us, cpu eager {cpu:.2f} us ({tpu / cpu:.1f}x)")


def training():
    changing = _child("_training", LENGTHS, LATER)
    unbucketed = _child("_training", LENGTHS, LATER, dynamic="0")
    fixed = _child("_training", [64] * len(LENGTHS), [64] * len(LATER))
    print("training (2-layer encoder, batch 8), steps/s: a pass over lengths the warm-up pass did not meet,")
    print("then the same pass again (compilations in all):")
    for name, r in [("length changing 8-128, buckets", changing), ("length changing 8-128, no buckets", unbucketed),
                    ("length fixed at 64", fixed)]:
        print(f"  {name:34s} new {r['new']:6.2f}  again {r['steady']:6.2f}  ({r['compilations']} compilations)")
    print(f"  changing/fixed, buckets: new {changing['new'] / fixed['new']:.2f}x, again "
          f"{changing['steady'] / fixed['steady']:.2f}x; no buckets: new {unbucketed['new'] / fixed['new']:.2f}x")


if __name__ == "__main__":
    main()
