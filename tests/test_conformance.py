"""The CI part of the OpInfo conformance sweep (tests/conformance): every
op_db entry but the excluded ones and those test_ops.py covers, on a fixed, seeded subset of
CI_SAMPLES samples per entry and dtype, CI_DTYPES of an entry's dtypes (in
turn from a place seeded by its name: across entries, every dtype), each in
one of CI_MODES (in turn: an entry meets both), in worker processes (a crash
or hang fails its entry, not the session). `make conformance` runs every
sample in every mode and dtype.

An entry fails if a mode or dtype fails that known_failures.py does not
list; listed failures are expected failures (xfail) with their reason."""
import os

import pytest

from conformance import sweep
from conformance.known_failures import known_failure
from test_ops import OPS

CI_SAMPLES = 1
CI_DTYPES = 2
# Debug mode runs strict's programs; test_ops.py runs it on the lowered ops.
CI_MODES = ["fused", "strict"]


@pytest.fixture(scope="session")
def subset(request):
    """Sweeps the entries this session selected, once."""
    chosen = sorted({item.callspec.params["entry"] for item in request.session.items
                     if getattr(item, "originalname", None) == "test_conformance"})
    jobs = int(os.environ.get("TORCHTPU_CONFORMANCE_JOBS", 0)) or None
    return sweep.run(chosen, limit=CI_SAMPLES, modes=CI_MODES, jobs=jobs, split=True, per_entry=CI_DTYPES)


# The lowered entries test_ops.py checks in depth (every sample across the
# modes, out= and in-place forms, errors, no fallback) are left out here.
CI_ENTRIES = [e for e in sweep.entries() if e not in OPS]


@pytest.mark.parametrize("entry", CI_ENTRIES)
def test_conformance(entry, subset):
    failed = [(mode, dtype, u) for e, mode, dtype, u in sweep.failures({entry: subset.get(entry, {})})]
    unexpected = [f"{mode} {dtype}: {u['status']}: {u['message']}" for mode, dtype, u in failed
                  if known_failure(entry, mode, dtype) is None]
    assert not unexpected, "\n".join(unexpected)
    if failed:
        pytest.xfail("; ".join(sorted({known_failure(entry, mode, dtype) for mode, dtype, _ in failed})))
