"""Identifiers: how they are made and how untrusted ones are checked.

A session id ends up inside NATS subjects (``cox.ev.<sid>``) and Redis keys, so it is checked
against a strict alphabet before it reaches either: no ``.``, ``*``, ``>`` or whitespace.
"""

from __future__ import annotations

import re
import secrets
import time

from .errors import Invalid

ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def new_id(prefix: str) -> str:
    """A sortable, unguessable id: ``<prefix>_<time><random>`` (time first so ids sort by birth)."""
    t = int(time.time() * 1000)
    stamp = ""
    for _ in range(9):
        stamp = _ALPHABET[t & 31] + stamp
        t >>= 5
    # One read of the OS's random source for all twelve characters (secrets.choice read it once
    # per character: 12 getrandom calls per id, 4% of a runner's CPU starting runs). 256 is a
    # multiple of 32, so the low five bits of each byte are uniform.
    rand = "".join(_ALPHABET[b & 31] for b in secrets.token_bytes(12))
    return f"{prefix}_{stamp}{rand}"


def id_time(version_id: str) -> float | None:
    """When an id of :func:`new_id` was made (seconds), or None if it is not one."""
    _, sep, rest = version_id.partition("_")
    if not sep or len(rest) < 9:
        return None
    t = 0
    for ch in rest[:9]:
        n = _ALPHABET.find(ch)
        if n < 0:
            return None
        t = t * 32 + n
    return t / 1000


def check_id(value: str, what: str = "id") -> str:
    """Return ``value`` when it is a safe id, else raise :class:`Invalid`."""
    if not isinstance(value, str) or not ID_RE.fullmatch(value):
        raise Invalid(f"{what} must match {ID_RE.pattern}")
    return value
