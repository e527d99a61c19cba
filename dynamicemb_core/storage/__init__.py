"""Storage of the dynamic tables: device table, hybrid device+host rows, a lookup module's group
(device, hybrid and cached tables in one table state), the backing stores of cached tables."""

from dynamicemb_core.storage.backing import StorageTierError
from dynamicemb_core.storage.device import DeviceStorage
from dynamicemb_core.storage.hybrid import HybridStorage

__all__ = [
    "DeviceStorage",
    "HybridStorage",
    "StorageTierError",
]
