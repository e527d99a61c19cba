"""demb-redis: a :class:`~dynamicemb_core.types.Storage` on Redis for dynamicemb-core."""

from __future__ import annotations

from demb_redis.storage import RedisStorage, RedisStorageError

__all__ = ["RedisStorage", "RedisStorageError", "__version__"]
__version__ = "0.1.0"
