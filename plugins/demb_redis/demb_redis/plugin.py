"""Entry point of demb-redis in the ``dynamicemb`` group: registers the ``redis`` storage."""

from __future__ import annotations

from dynamicemb_core.plugins import RegisterFn, hookimpl


@hookimpl
def dynamicemb_register_storages(register: RegisterFn) -> None:
    from demb_redis.storage import RedisStorage

    register("redis", RedisStorage, description="rows in Redis hashes, one per (model, table)")
