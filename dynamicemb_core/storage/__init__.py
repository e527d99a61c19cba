"""Storage of the dynamic tables: a lookup module's group (device, hybrid and cached tables in one
table state), the host table and other backing stores of cached tables."""

from dynamicemb_core.storage.backing import StorageTierError

__all__ = [
    "StorageTierError",
]
