"""Compatibility module: ``dynamicemb.dump_load``'s public names (logic in :mod:`dynamicemb_core.checkpoint`)."""

from dynamicemb_core.checkpoint.dump import DynamicEmbDump, DynamicEmbLoad

__all__ = ["DynamicEmbDump", "DynamicEmbLoad"]
