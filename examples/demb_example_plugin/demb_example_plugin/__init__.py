"""An example dynamicemb-core plugin: ``external_storage="example_array"`` and
``admit_strategy="example_hash_sample"``."""

from __future__ import annotations

from demb_example_plugin.admission import HashSampleAdmissionStrategy
from demb_example_plugin.storage import ArrayStorage

__all__ = ["ArrayStorage", "HashSampleAdmissionStrategy", "__version__"]
__version__ = "0.1.0"
