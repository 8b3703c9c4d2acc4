"""A model zoo trained on tpu against CPU: tiny transformers and torchvision
models (random weights, built from configs in code; nothing is downloaded),
a few training steps in fused and strict modes. Each test checks CPU's losses,
no CPU fallbacks, no compilations after step 2 and, for generative models,
CPU's greedy tokens. Every failed check is reported, not only the first."""
import copy
import os
import time

# Nothing is fetched from the hub: every model is built from a config here.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import torch

import torchtpu

transformers = pytest.importorskip("transformers", reason="pip install --no-deps -r requirements-models.txt")
torchvision = pytest.importorskip("torchvision", reason="pip install --no-deps -r requirements-models.txt")

STEPS = 3
BATCH = 2
SEQ = 12
VOCAB = 128
# Images are 32x32 but for the models with batch norm: there the last batch
# norms would see 2 values per channel, and ResNet-18's losses differ between
# float32 and float64 by 14% (so between any two float32 implementations) by
# step 3; at 64x64 by 5e-6.
IMAGE = 32
BN_IMAGE = 64
CLASSES = 10
NEW_TOKENS = 5


def _adamw(params):
    # At 3e-3, three steps of the tied models (GPT-2, BERT, T5) with their
    # embeddings untied give losses 3e-4 to 1e-3 (relative) from the tied
    # ones', beyond rtol 1e-4; float32 against float64 differ by 1e-7.
    return torch.optim.AdamW(params, lr=3e-3)


def _sgd(params):
    # Adam's normalised steps amplify ResNet-18's rounding differences (float32
    # against float64: 4e-3 at lr 1e-3); SGD keeps them at 5e-6. Without
    # momentum every step runs the same program, so the big convolutional
    # programs compile once.
    return torch.optim.SGD(params, lr=0.01)


# Models: name -> (build() on CPU, batch(generator) -> dict of CPU tensors,
# loss(model, batch), optimizer(params), generative). Dropout probabilities
# are 0 and models train in train mode, so both devices compute the same
# function.

def _lm_batch(g):
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    return dict(input_ids=ids, labels=ids.clone())


def _mlm_batch(g):
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    masked = torch.rand(BATCH, SEQ, generator=g) < 0.3
    masked[:, 1] = True
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return dict(input_ids=torch.where(masked, torch.full_like(ids, 2), ids), labels=labels)


def _seq2seq_batch(g):
    return dict(input_ids=torch.randint(3, VOCAB, (BATCH, SEQ), generator=g),
                labels=torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=g))


def _image_batch(g, size=IMAGE):
    return dict(pixel_values=torch.randn(BATCH, 3, size, size, generator=g),
                labels=torch.randint(0, CLASSES, (BATCH,), generator=g))


def _bn_image_batch(g):
    return _image_batch(g, BN_IMAGE)


def _speech_batch(g):
    """Two clips and CTC labels whose lengths change from batch to batch
    (their total stays, so the targets `masked_select` keeps its size)."""
    lengths = torch.tensor([3, 7])[torch.randperm(2, generator=g)]
    labels = torch.randint(1, VOCAB // 4, (BATCH, 7), generator=g)
    labels[torch.arange(7) >= lengths[:, None]] = -100
    return dict(input_values=torch.randn(BATCH, 1600, generator=g), labels=labels)


def _hf_loss(model, batch):
    return model(**batch).loss


def _vision_loss(model, batch):
    return torch.nn.functional.cross_entropy(model(batch["pixel_values"]), batch["labels"])


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=1, pad_token_id=0))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False, attention_dropout=0.0, bos_token_id=1, eos_token_id=1, pad_token_id=0))


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0,
        attention_dropout=0.0, bos_token_id=1, eos_token_id=1, pad_token_id=0))


def _bert():
    from transformers import BertConfig, BertForMaskedLM
    return BertForMaskedLM(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=0))


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=2, dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))


def _hf_vit():
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(
        image_size=IMAGE, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=CLASSES))


def _wav2vec2_ctc():
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    return Wav2Vec2ForCTC(Wav2Vec2Config(
        vocab_size=VOCAB // 4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, pad_token_id=0))


def _resnet18():
    return torchvision.models.resnet18(num_classes=CLASSES)


def _mobilenet_v3_small():
    return torchvision.models.mobilenet_v3_small(num_classes=CLASSES, dropout=0.0)


def _convnext():
    # convnext_tiny's four stages at one block each and a quarter of its
    # widths: the same code and ops (7x7 depthwise convolutions, channel-last
    # LayerNorm, GELU, layer scale), a program a fifth the size to compile.
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    stages = [CNBlockConfig(24, 48, 1), CNBlockConfig(48, 96, 1), CNBlockConfig(96, 192, 1),
              CNBlockConfig(192, None, 1)]
    return ConvNeXt(stages, stochastic_depth_prob=0.0, num_classes=CLASSES)


def _vit_b_16_tiny():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=IMAGE, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                             mlp_dim=64, dropout=0.0, attention_dropout=0.0, num_classes=CLASSES)


MODELS = {
    "gpt2": (_gpt2, _lm_batch, _hf_loss, _adamw, True),
    "llama": (_llama, _lm_batch, _hf_loss, _adamw, True),
    "mixtral": (_mixtral, _lm_batch, _hf_loss, _adamw, True),
    "bert_mlm": (_bert, _mlm_batch, _hf_loss, _adamw, False),
    "t5": (_t5, _seq2seq_batch, _hf_loss, _adamw, True),
    "hf_vit": (_hf_vit, _image_batch, _hf_loss, _adamw, False),
    "wav2vec2_ctc": (_wav2vec2_ctc, _speech_batch, _hf_loss, _adamw, False),
    "resnet18": (_resnet18, _bn_image_batch, _vision_loss, _sgd, False),
    "mobilenet_v3_small": (_mobilenet_v3_small, _bn_image_batch, _vision_loss, _sgd, False),
    "convnext": (_convnext, _image_batch, _vision_loss, _sgd, False),
    "vit_b_16_tiny": (_vit_b_16_tiny, _image_batch, _vision_loss, _sgd, False),
}


def _move(batch, device):
    return {k: v.to(device) for k, v in batch.items()}


def _train(model, batches, loss_fn, optimizer, device, on_step=None, compile=False):
    opt = optimizer(model.parameters())
    step_fn = torch.compile(opt.step) if compile else opt.step
    model = torch.compile(model) if compile else model
    losses = []
    for step, batch in enumerate(batches):
        batch = _move(batch, device)
        opt.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        step_fn()
        losses.append(loss.item())
        if on_step:
            on_step(step)
    return losses


def _generate(model, batch, device):
    with torch.no_grad():
        out = model.generate(batch["input_ids"][:, :SEQ // 2].to(device), max_new_tokens=NEW_TOKENS,
                             do_sample=False, min_new_tokens=NEW_TOKENS)
    return out.cpu()


_CPU = {}


def _reference(name):
    """The initial CPU model (the tpu run's copy), batches, and CPU's losses
    and greedy tokens after training, computed once per model."""
    if name not in _CPU:
        build, make_batch, loss_fn, optimizer, generative = MODELS[name]
        started = time.perf_counter()
        torch.manual_seed(0)
        initial = build()
        initial.train()
        g = torch.Generator().manual_seed(1)
        batches = [make_batch(g) for _ in range(STEPS)]
        model = copy.deepcopy(initial)
        losses = _train(model, batches, loss_fn, optimizer, "cpu")
        tokens = _generate(model, batches[0], "cpu") if generative else None
        _CPU[name] = initial, batches, losses, tokens
        print(f"\n{name}: CPU reference {time.perf_counter() - started:.1f}s")
    return _CPU[name]


# Every model in fused mode; in strict mode a language model, an encoder and
# a ViT (CI budget): the CNNs' layers run in strict mode in test_conv_norm (a
# ResNet's training, and depthwise and grouped convolutions, each case in one
# mode), Hugging Face's ViT has torchvision's beside it, and Llama and BERT
# run the ops of GPT-2, T5 and Mixtral.
CASES = [(name, eager) for name in MODELS for eager in ("fused", "strict")
         if eager == "fused" or name in ("llama", "bert_mlm", "vit_b_16_tiny")]


@pytest.mark.parametrize("name,eager", CASES)
def test_model_trains_as_on_cpu(name, eager):
    initial, batches, cpu_losses, cpu_tokens = _reference(name)
    _, _, loss_fn, optimizer, generative = MODELS[name]
    model = copy.deepcopy(initial).to("tpu")
    compiled = []
    problems = []
    started = time.perf_counter()
    with torchtpu.mode(eager):
        torchtpu.reset_metrics()
        losses = _train(model, batches, loss_fn, optimizer, "tpu",
                        on_step=lambda step: compiled.append(torchtpu.metrics()["compilations"]))
        metrics = torchtpu.metrics()
        trained = time.perf_counter()
        if generative:
            torchtpu.reset_metrics()
            tokens = _generate(model, batches[0], "tpu")
            generate_fallbacks = torchtpu.metrics()["fallbacks"]
    print(f"\n{name}/{eager}: training {trained - started:.1f}s, generation {time.perf_counter() - trained:.1f}s; "
          f"losses {losses}, CPU's {cpu_losses}; compilations after each step {compiled}; "
          f"fallbacks in training {metrics['fallbacks']}" + (f", in generation {generate_fallbacks}" if generative else ""))

    try:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)
    except AssertionError as e:
        problems.append(f"losses {losses} != CPU's {cpu_losses}: {e}")
    if metrics["fallbacks"]:
        problems.append(f"CPU fallbacks in training: {metrics['fallbacks']}")
    if compiled[-1] != compiled[1]:
        problems.append(f"compiled after step 2: compilations after each step {compiled}, "
                        f"recompile reasons {metrics['recompile_reasons'][:3]}")
    if generative and generate_fallbacks:
        problems.append(f"CPU fallbacks in generate: {generate_fallbacks}")
    if generative and not torch.equal(tokens, cpu_tokens):
        problems.append(f"greedy tokens {tokens.tolist()} != CPU's {cpu_tokens.tolist()}")
    assert not problems, "\n".join(problems)


# CNNs with BatchNorm compiled: test_compile.py (the CNN workload).
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert_mlm"])
def test_model_trains_compiled_as_on_cpu(name):
    """torch.compile of the model and of the optimizer's step (fused mode):
    CPU eager's losses, nothing on the CPU, every graph one program."""
    torch._dynamo.reset()
    initial, batches, cpu_losses, _ = _reference(name)
    _, _, loss_fn, optimizer, _ = MODELS[name]
    model = copy.deepcopy(initial).to("tpu")
    torchtpu.reset_metrics()
    losses = _train(model, batches, loss_fn, optimizer, "tpu", compile=True)
    metrics = torchtpu.metrics()
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)
    assert metrics["fallbacks"] == {} and metrics["eager_graphs"] == {}, metrics["eager_graphs"]
    assert metrics["compiled_graph_captures"] == metrics["compiled_graphs"] > 0
