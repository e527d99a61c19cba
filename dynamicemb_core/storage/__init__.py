"""Storage tiers of the dynamic tables: device table, hybrid device+host rows, device cache."""

from dynamicemb_core.storage.cache import CachedStorage, StorageTierError
from dynamicemb_core.storage.device import DeviceStorage
from dynamicemb_core.storage.hybrid import HybridStorage
from dynamicemb_core.storage.tier import HOME_BACKING, HOME_NONE, LookupTier, TierRows

__all__ = [
    "CachedStorage",
    "DeviceStorage",
    "HOME_BACKING",
    "HOME_NONE",
    "HybridStorage",
    "LookupTier",
    "StorageTierError",
    "TierRows",
]
