"""The MLP training step of examples/workloads.py written in JAX and jitted
whole: the floor for fused mode. Prints "<first step s> <steps/s>". Run by
bench/training.py in a process of its own:

    python bench/jax_mlp.py [PJRT plugin .so]

With a plugin path JAX runs on that PJRT plugin (torchtpu's, so both use the
same XLA CPU backend); without one, on jaxlib's own CPU backend.
"""
import sys
import time
from pathlib import Path

import jax

if len(sys.argv) > 1:
    from jax._src import xla_bridge

    xla_bridge.register_plugin("torchtpu_plugin", priority=500, library_path=sys.argv[1], options=None)
    jax.config.update("jax_platforms", "torchtpu_plugin")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from workloads import mlp_batches  # noqa: E402

SIZES = [(784, 1024), (1024, 1024), (1024, 1024), (1024, 10)]
LR, BETAS, EPS, DECAY = 1e-3, (0.9, 0.999), 1e-8, 1e-2  # torch.optim.AdamW's defaults


def init():
    rng = np.random.default_rng(0)
    params = []
    for fan_in, fan_out in SIZES:
        bound = 1 / np.sqrt(fan_in)
        params.append((jnp.asarray(rng.uniform(-bound, bound, (fan_out, fan_in)), jnp.float32),
                       jnp.asarray(rng.uniform(-bound, bound, (fan_out,)), jnp.float32)))
    return params


def loss_fn(params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w.T + b
        if i < len(params) - 1:
            h = jax.nn.relu(h)
    logp = jax.nn.log_softmax(h)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def step(params, m, v, t, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    b1, b2 = BETAS
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t

    def update(p, m, v):
        p = p * (1 - LR * DECAY)
        return p - LR / c1 * m / (jnp.sqrt(v) / jnp.sqrt(c2) + EPS)

    return jax.tree.map(update, params, m, v), m, v, loss


def main(steps=20):
    xs, ys = mlp_batches(steps)
    xs, ys = [jnp.asarray(x.numpy()) for x in xs], [jnp.asarray(y.numpy()) for y in ys]
    params = init()
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    train_step = jax.jit(step, donate_argnums=(0, 1, 2))
    marks = [time.perf_counter()]
    for i in range(steps):
        params, m, v, loss = train_step(params, m, v, jnp.float32(i + 1), xs[i], ys[i])
        float(loss)  # the torch loop reads loss.item() every step
        marks.append(time.perf_counter())
    print(f"{marks[1] - marks[0]:.3f} {(steps - 3) / (marks[-1] - marks[3]):.2f}")


if __name__ == "__main__":
    main()
