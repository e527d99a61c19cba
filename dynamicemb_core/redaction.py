"""The one rule for hiding secrets wherever options are shown (repr, errors, logs, printouts).

Users put credentials into ``DynamicEmbTableOptions(external_storage_options=...)``: a URL with a
password (``redis://user:PASSWORD@host``), ``password=...``, a ``client_options`` dict holding
``ssl_password`` or a token. Every place that shows options or a message built from them passes
them through :func:`redact` (structures) or :func:`redact_text` (free text) first; plugins import
these functions from here rather than keeping their own copies.

The rule:

- **Keys that name a secret.** A dict key is split into lower-case words (at ``_``, ``-``, ``.``,
  spaces and camelCase boundaries). Its value is replaced by ``***`` when one of the words is, or
  ends with, one of ``password``, ``passwd``, ``passphrase``, ``pwd``, ``secret``, ``token``,
  ``credential(s)``, ``creds``, ``auth``, ``apikey``, ``cookie``; or when its **last** word is
  ``key`` (``key``, ``api_key``, ``secret_key``, ``access_key``, ``private_key``). A ``key`` word
  elsewhere stays visible: ``key_type``, ``max_keys``, ``keys``, ``ssl_keyfile`` (a path, not the
  key itself: its passphrase is ``ssl_password``) describe data, not credentials, and hiding them
  would hide what a user needs to debug. ``username`` and certificate paths stay visible too.
  Whole values go, whatever their type (a nested ``credentials`` dict included); ``None`` stays, as
  it says that no secret is set.
- **The password of a URL.** In any string, ``scheme://user:PASSWORD@`` and ``scheme://:PASSWORD@``
  become ``scheme://user:***@`` / ``scheme://:***@``; the user, host, port and path stay.

Redaction is recursive through dicts, lists, tuples and sets; other objects are left as they are
(their own ``repr`` is theirs to keep clean, as :class:`~dynamicemb_core.config.DynamicEmbTableOptions`
does with :func:`redacted_fields_repr`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, List

__all__ = [
    "REDACTED",
    "is_secret_key",
    "redact",
    "redact_text",
    "redacted_fields_repr",
    "redacted_repr",
]

REDACTED = "***"

# A word of a key name that makes its value a secret (also as a suffix: "dbpassword", "authtoken").
_SECRET_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "credential",
    "credentials",
    "creds",
    "auth",
    "apikey",
    "cookie",
)
# The last word "key" alone makes a secret (api_key, secret_key, private_key, key).
_KEY_WORD = "key"
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# scheme://[user]:password@ ; the user stops at ':' or a quote, the password runs to the last '@'
# before the host (as urlsplit reads it: a raw '@' or quote in a password is still hidden).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:@/?#'\"]*:)[^\s/?#]*@")


def _words(name: str) -> List[str]:
    return [w.lower() for w in _WORD_SPLIT.split(name) if w]


def is_secret_key(name: object) -> bool:
    """Whether a dict key names a secret (see the module docstring for the rule)."""
    if not isinstance(name, str):
        return False
    words = _words(name)
    if not words:
        return False
    if words[-1] == _KEY_WORD:
        return True
    return any(w.endswith(s) for w in words for s in _SECRET_WORDS)


def redact_text(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", text)


def redact(value: Any) -> Any:
    """A copy of ``value`` with secrets replaced by ``***``: values under secret keys, recursively
    through dicts, lists, tuples and sets, and URL passwords in strings. Other objects are returned
    as they are."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            k: (REDACTED if v is not None and is_secret_key(k) else redact(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [redact(v) for v in value]
        if isinstance(value, list):
            return items
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        return type(value)(items)
    return value


def redacted_repr(value: Any) -> str:
    """``repr(redact(value))``, and the result's URLs redacted once more (an object inside may have
    printed one in its own repr)."""
    return redact_text(repr(redact(value)))


def redacted_fields_repr(obj: Any, fields: Iterable[str] = ()) -> str:
    """A dataclass's ``ClassName(field=value, ...)`` repr with every value redacted.

    Args:
        obj: a dataclass instance.
        fields: the names to show (default: every field with ``repr=True``, in order).
    """
    names = list(fields) or [f.name for f in dataclasses.fields(obj) if f.repr]
    body = ", ".join(f"{name}={redacted_repr(getattr(obj, name))}" for name in names)
    return f"{type(obj).__qualname__}({body})"
