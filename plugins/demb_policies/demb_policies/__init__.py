"""demb-policies: admission and eviction policies for dynamicemb-core.

- :class:`ProbabilisticAdmissionStrategy` (``admit_strategy="probabilistic"``)
- :class:`CountingBloomCounter` (``admission_counter="counting_bloom"``)
- :func:`make_decayed_lfu` (``score_function="decayed_lfu"``)
"""

from __future__ import annotations

from demb_policies.admission import ProbabilisticAdmissionStrategy
from demb_policies.bloom_counter import CountingBloomCounter
from demb_policies.score_functions import (
    decayed_lfu_count_first,
    decayed_lfu_ts_first,
    make_decayed_lfu,
)

__all__ = [
    "CountingBloomCounter",
    "ProbabilisticAdmissionStrategy",
    "__version__",
    "decayed_lfu_count_first",
    "decayed_lfu_ts_first",
    "make_decayed_lfu",
]
__version__ = "0.1.0"
