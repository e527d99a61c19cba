"""Hypothesis profiles for the randomized table tests (tests/table/test_against_reference.py).

The profiles are registered here and applied by name in those tests only, so loading them changes
nothing for the rest of the suite (no ``settings.load_profile``).

* ``demb-table``: the default run, a few thousand operations in well under two minutes on 2 cores.
* ``demb-table-slow``: many more and longer op sequences, for ``pytest -m slow`` / ``nox -s slow``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,  # the first call compiles a score function with numba
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)

settings.register_profile("demb-table", max_examples=100, stateful_step_count=50, **_COMMON)
settings.register_profile("demb-table-slow", max_examples=1500, stateful_step_count=100, **_COMMON)
