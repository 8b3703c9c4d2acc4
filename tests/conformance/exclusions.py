"""The op_db entries and samples the conformance sweep leaves out, each with
its reason: ops whose results are undefined or random by definition (RNG
ops are compared by distribution in test_random.py and test_nn.py), sparse
layouts, entries for CUDA only, and samples tpu cannot represent. Nothing
else is skipped: every other entry runs, lowered or through the CPU
fallback, and failures are listed with their reasons in known_failures.py."""
import math

import torch

UNDEFINED = "uninitialized memory: results are undefined"
RANDOM = "random numbers: compared by distribution (test_random.py, test_nn.py dropout tests)"
SPARSE = "sparse layout: tpu tensors are strided"
CUDA_ONLY = "CUDA-only kernel"

EXCLUDED = {
    "empty": UNDEFINED,
    "empty_like": UNDEFINED,
    "empty_strided": UNDEFINED,
    "empty_permuted": UNDEFINED,
    "new_empty": UNDEFINED,
    "new_empty_strided": UNDEFINED,
    "bernoulli": RANDOM,
    "cauchy": RANDOM,
    "exponential": RANDOM,
    "geometric": RANDOM,
    "log_normal": RANDOM,
    "multinomial": RANDOM,
    "normal": RANDOM,
    "normal.in_place": RANDOM,
    "normal.number_mean": RANDOM,
    "uniform": RANDOM,
    "rand_like": RANDOM,
    "randn": RANDOM,
    "randn_like": RANDOM,
    "randint": RANDOM,
    "randint_like": RANDOM,
    "nn.functional.dropout": RANDOM,
    "nn.functional.dropout2d": RANDOM,
    "nn.functional.dropout3d": RANDOM,
    "nn.functional.alpha_dropout": RANDOM,
    "nn.functional.feature_alpha_dropout.with_train": RANDOM,
    "nn.functional.rrelu": RANDOM + " (random slopes in training)",
    "nn.functional.fractional_max_pool2d": RANDOM + " (random pooling regions)",
    "nn.functional.fractional_max_pool3d": RANDOM + " (random pooling regions)",
    "svd_lowrank": RANDOM + " (random projection)",
    "pca_lowrank": RANDOM + " (random projection)",
    "to_sparse": SPARSE,
    "sparse.sampled_addmm": SPARSE,
    "sparse.mm.reduce": SPARSE,
    "jiterator_unary": CUDA_ONLY + " (jiterator)",
    "jiterator_binary": CUDA_ONLY + " (jiterator)",
    "jiterator_4inputs_with_extra_args": CUDA_ONLY + " (jiterator)",
    "jiterator_binary_return_by_ref": CUDA_ONLY + " (jiterator)",
    "jiterator_2inputs_2outputs": CUDA_ONLY + " (jiterator)",
    "torch._scaled_mm": CUDA_ONLY + " (float8 matmul)",
    "torch._scaled_mm_v2": CUDA_ONLY + " (float8 matmul)",
    "torch.ops.aten._flash_attention_forward": CUDA_ONLY + " (flash attention)",
    "torch.ops.aten._efficient_attention_forward": CUDA_ONLY + " (memory-efficient attention)",
    "nn.functional.batch_norm.without_cudnn": CUDA_ONLY + " (the cuDNN switch)",
}


# Samples left out: entry -> [(predicate, why)].
SINGLE_ELEMENT_NORM = (lambda s: math.prod(s.args[0]) == 1,
                       "normalizing one element: CPU's fused multiply-add leaves a rounding residue "
                       "of x * rstd where the exact result, 0, is what tpu gives")
# CPU's sort is an introsort unless stable=True: the order of equal
# values among themselves (their indices) is unspecified and not
# reproducible; tests/test_indexing.py checks such indices for consistency.
UNSTABLE_TIES = (lambda s: not s.kwargs.get("stable") and s.input.numel() != s.input.unique().numel(),
                 "equal values: CPU's unstable sort orders their indices arbitrarily")


def long_mode_row(s):
    """A mode sample whose reduced rows are longer than 16 elements."""
    dim = s.args[0] if s.args else s.kwargs.get("dim", -1)
    return s.input.ndim > 0 and s.input.shape[dim] > 16


# CPU's mode sorts each row with std::sort: an introsort past 16 elements,
# so which occurrence of the mode it returns is arbitrary there;
# tests/test_indexing.py checks tpu's index names an occurrence.
MODE_TIES = (long_mode_row, "rows of more than 16 elements: CPU's unstable sort returns an arbitrary "
                            "occurrence of the mode")


EXCLUDED_SAMPLES = {
    **{name: [UNSTABLE_TIES] for name in ("sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian")},
    "mode": [MODE_TIES],
    "nn.functional.max_pool1d": [(lambda s: not s.input.is_floating_point(),
                                  "CPU runs max_pool1d without indices through a CPU-only kernel (max_pool1d_impl) "
                                  "that rejects integers; other devices use max_pool2d_with_indices, which takes them")],
    "nonzero": [(lambda s: s.kwargs.get("as_tuple"), "as_tuple=True returns a tuple, which out= cannot take")],
    **{f"index_reduce.{r}": [(lambda s: s.input.dtype == torch.bool,
                              "bool: CPU raises from one of three kernels depending on the sample, or returns "
                              "early; tpu raises index_func_'s error")]
       for r in ("prod", "mean", "amax", "amin")},
    "nn.functional.scaled_dot_product_attention": [(lambda s: s.kwargs.get("dropout_p", 0) > 0, RANDOM + " (dropout)")],
    "nn.functional.multi_head_attention_forward": [(lambda s: s.kwargs["training"] and s.args[9] > 0,
                                                    RANDOM + " (dropout)")],
    "nn.functional.layer_norm": [SINGLE_ELEMENT_NORM],
    "native_layer_norm": [SINGLE_ELEMENT_NORM],
}


def excluded_sample(name, sample):
    return any(pred(sample) for pred, _ in EXCLUDED_SAMPLES.get(name, []))
