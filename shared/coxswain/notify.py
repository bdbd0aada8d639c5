"""Webhook notifications: what a delivery carries and how its signature is made and checked.

The gateway's notifier (``cox_gateway.notifier``) posts chosen events of the log to each
``[[notify.webhooks]]`` URL. A delivery is one POST whose body is the event exactly as the log
holds it (JSON, ``sid`` included) with these headers:

- ``X-Cox-Delivery``: ``<stream seq>-<webhook name>``, the same on every attempt of that event
  to that webhook (a receiver drops a repeat by it: delivery is at least once);
- ``X-Cox-Event``: the event type;
- ``X-Cox-Timestamp``: seconds since the epoch when this attempt was signed;
- ``X-Cox-Signature``: ``sha256=`` + hex HMAC-SHA256 of ``<timestamp>.<body>`` under the
  webhook's secret (:func:`sign`; a receiver checks it with :func:`verify`).

The functions here are pure, so a receiver written in Python may copy them (docs/api.md shows
the same check in a few lines).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from typing import Final, Literal, get_args

NotifyEvent = Literal["approval.pending", "turn.end", "limit.warning"]
"""The event types a webhook may subscribe to."""
NOTIFY_EVENTS: Final[tuple[str, ...]] = get_args(NotifyEvent)

DELIVERY_HEADER: Final = "X-Cox-Delivery"
EVENT_HEADER: Final = "X-Cox-Event"
TIMESTAMP_HEADER: Final = "X-Cox-Timestamp"
SIGNATURE_HEADER: Final = "X-Cox-Signature"
SIGNATURE_PREFIX: Final = "sha256="
DEFAULT_TOLERANCE_S: Final = 300
"""How old a signed timestamp :func:`verify` accepts by default (replay protection)."""

NAME_RE: Final = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
"""A webhook name: it names the JetStream consumer too (no dots, spaces or wildcards)."""
CONSUMER_PREFIX: Final = "cox-notify-"


def sign(secret: str | bytes, timestamp: int | str, body: bytes) -> str:
    """The ``X-Cox-Signature`` value: ``sha256=<hex HMAC-SHA256 of b"<timestamp>." + body>``."""
    key = secret.encode() if isinstance(secret, str) else secret
    mac = hmac.new(key, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return SIGNATURE_PREFIX + mac.hexdigest()


def verify(secret: str | bytes, timestamp: str, body: bytes, signature: str,
           tolerance_s: float = DEFAULT_TOLERANCE_S, now: float | None = None) -> bool:
    """Is ``signature`` this body's, signed under ``secret`` at ``timestamp``, not longer ago
    (or further ahead) than ``tolerance_s``? Compared in constant time."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    current = time.time() if now is None else now
    if abs(current - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, ts, body), signature)


def delivery_id(stream_seq: int, webhook: str) -> str:
    """``X-Cox-Delivery``: the event's place in the stream and the webhook, stable across retries."""
    return f"{stream_seq}-{webhook}"


def consumer_name(webhook: str) -> str:
    """The durable JetStream consumer of one webhook, shared by every gateway replica."""
    return CONSUMER_PREFIX + webhook


def default_name(url: str) -> str:
    """A webhook's name when the config gives none: from its URL, which may hold a token (so
    hashed, never shown), and stable while the URL is (its consumer keeps its place)."""
    return "wh-" + hashlib.sha256(url.encode()).hexdigest()[:12]


def backoff_s(attempt: int, base_s: float, max_s: float) -> float:
    """The wait after failed attempt ``attempt`` (1, 2, ...): ``base_s`` doubling, at most ``max_s``."""
    return float(min(max_s, base_s * 2 ** min(max(attempt - 1, 0), 32)))
