"""Loading the compiled ops library and typed wrappers over ``torch.ops.dynamicemb.*``.

Importing this package builds nothing: the library is built (once, cached) and loaded on the first
call of a wrapper, or ahead of time with ``python -m dynamicemb_core build``.
"""

from dynamicemb_core.ops.loader import ensure_loaded, is_loaded

__all__ = ["ensure_loaded", "is_loaded"]
