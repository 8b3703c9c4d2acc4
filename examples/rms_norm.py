"""RMSNorm as a Pallas kernel with a backward of its own, called on tpu
tensors (the README's worked kernel; the tests and bench/custom_kernels.py use it).

The forward is a `pallas_call` over blocks of rows; `jax.custom_vjp` gives it
a backward written in JAX, which torchtpu.pallas lowers as a second kernel.
On the CPU plugin the Pallas kernel runs in interpret mode; on a TPU the same
source compiles through Mosaic.
"""
import math

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

import torchtpu.pallas as tp

EPS = 1e-6


def _forward_block(x_ref, w_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)
    o_ref[...] = (x * r * w_ref[...]).astype(o_ref.dtype)


def _forward(x, w):
    rows = x.reshape(-1, x.shape[-1])
    n, d = rows.shape
    block = math.gcd(n, 256)
    out = pl.pallas_call(
        _forward_block,
        grid=(n // block,),
        in_specs=[pl.BlockSpec((block, d), lambda i: (i, 0)), pl.BlockSpec((d,), lambda i: (0,))],
        out_specs=pl.BlockSpec((block, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(rows.shape, x.dtype),
    )(rows, w)
    return out.reshape(x.shape)


@jax.custom_vjp
def _rms_norm(x, w):
    return _forward(x, w)


def _rms_norm_fwd(x, w):
    return _forward(x, w), (x, w)


def _rms_norm_bwd(residuals, g):
    x, w = residuals
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)
    gw = (g * x * r).reshape(-1, x.shape[-1]).sum(0)
    gx = r * (g * w) - x * r**3 * jnp.mean(g * w * x, axis=-1, keepdims=True)
    return gx, gw


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)

rms_norm = tp.custom_jax_kernel(_rms_norm, name="rms_norm")


def torch_rms_norm(x, w):
    """The same function in torch ops."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w
