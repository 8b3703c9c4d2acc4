"""Results of the lowered operators (values, dtype, shape) as on CPU: the
first check of test_ops.py, in a file of its own so that `make test`'s
workers (a whole file each) share the OpInfo suite. A lowering is the same
in every mode: each (op, dtype) runs its samples in fused or strict mode, in
turn (`one_mode`), as the conformance sweep splits dtypes between them;
TORCHTPU_TEST_ALL_MODES=1 and `make conformance` run every mode."""
import pytest

from conformance.compare import DTYPES, for_each_sample, opinfo
from test_ops import OPS, expect_same, mark_known_gap, left_to_strict, samples


@pytest.mark.one_mode
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_values(request, name, dtype, mode):
    """Results as on CPU; dtypes CPU does not support raise its errors."""
    mark_known_gap(request, name, "values")
    left_to_strict(mode, dtype, "values")
    op = opinfo(name)
    try:
        samples_ = samples(name, dtype, mode)
    except Exception as e:
        pytest.skip(f"no {dtype} samples: {e}")
    for_each_sample(name, samples_, lambda s: expect_same(name, "values", op, s))
