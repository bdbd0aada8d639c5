"""Identifiers: how they are made and how untrusted ones are checked.

A session id ends up inside NATS subjects (``cox.ev.<sid>``) and Redis keys, so it is checked
against a strict alphabet before it reaches either: no ``.``, ``*``, ``>`` or whitespace.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import time

from .errors import Invalid

ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
_RANDOM = 12
"""Random characters of an id, one byte of the OS's random source each."""
_AHEAD = _RANDOM * 256
"""Bytes read from the OS's random source at once: one getrandom call for 256 ids (a turn makes
about seven; one call each was a third of a runner's system calls besides its sockets)."""
_pool = b""
_pos = 0
_lock = threading.Lock()


def _forget() -> None:
    """After a fork the child must not hand out the bytes its parent still holds: both would make
    the same ids (the services are forks of cox up's fork server)."""
    global _pool, _pos, _lock
    _pool, _pos, _lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_forget)


def _random_bytes() -> bytes:
    global _pool, _pos
    with _lock:
        if _pos + _RANDOM > len(_pool):
            _pool, _pos = secrets.token_bytes(_AHEAD), 0
        out = _pool[_pos:_pos + _RANDOM]
        _pos += _RANDOM
    return out


_LETTER = bytes(ord(_ALPHABET[b & 31]) for b in range(256))
"""Each byte's letter: its low five bits' (``bytes.translate``: one C call for an id's twelve)."""
_stamped: tuple[int, str] = (-1, "")
"""The last millisecond an id was made in and its nine letters (a turn makes several ids in one)."""


def time_letters(ms: int) -> str:
    """``ms`` (a count of milliseconds) as nine base32 letters, the most significant first."""
    stamp = ""
    for _ in range(9):
        stamp = _ALPHABET[ms & 31] + stamp
        ms >>= 5
    return stamp


def new_id(prefix: str) -> str:
    """A sortable, unguessable id: ``<prefix>_<time><random>`` (time first so ids sort by birth)."""
    global _stamped
    t = int(time.time() * 1000)
    made = _stamped  # one read of a tuple: another thread may set it meanwhile, never half of it
    if made[0] == t:
        stamp = made[1]
    else:
        stamp = time_letters(t)
        _stamped = (t, stamp)
    # Twelve bytes of the OS's random source, read ahead for many ids (_AHEAD). 256 is a
    # multiple of 32, so the low five bits of each byte are uniform.
    return f"{prefix}_{stamp}{_random_bytes().translate(_LETTER).decode('ascii')}"


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
