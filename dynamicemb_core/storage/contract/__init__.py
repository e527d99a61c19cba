"""The storage contract toolkit: what a :class:`~dynamicemb_core.types.Storage` implementation uses.

:mod:`~dynamicemb_core.storage.contract.checks` (the input checks every storage runs before writing),
:mod:`~dynamicemb_core.storage.contract.row_codec` (the byte layout of a row in an external key-value
store) and :mod:`~dynamicemb_core.storage.contract.adapter` (the per-table adapter and one-table calls
on a multi-table storage). The storage layer and the plugins both build on it; the old paths
``dynamicemb_core.plugins.storage_checks``, ``.row_codec`` and ``.storage_adapter`` re-export it.
"""
