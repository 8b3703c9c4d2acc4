"""Entries of the conformance sweep known to fail, with the reason: an
expected failure, so that the suite stays green while a lowering is awaited
or a bug is open. The sweep reports entries listed here that pass.

Keys: "entry" (every mode and dtype), or ("entry", "dtype") where only
that dtype fails."""

AWAITING = "awaiting lowering"

KNOWN_FAILURES = {
}


def known_failure(entry, mode, dtype):
    """Why (entry, mode, dtype) is expected to fail, or None."""
    return KNOWN_FAILURES.get(entry) or KNOWN_FAILURES.get((entry, dtype))
