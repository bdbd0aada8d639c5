"""Answer links: an approval answered from anywhere, without the bearer token (docs/api.md,
"Answer links").

Each ``approval.pending`` carries ``answer_url``: ``<[gateway] public_url>/answer/<token>``, the
token ``<sid>.<approval id>.<expiry ms>.<decisions>.<mac>``, where the MAC is HMAC-SHA256 over the
rest under the stack's link key (a field of ``cox:meta`` the first turn-runner makes; the
gateway reads it). It is bound to one approval of one session and the decisions it may give
(``ad``: allow and deny), and expires ``[approval] link_ttl_s`` after the approval opened. It is
single-use because the approval is: once answered (by the link, the console or anyone) the link
answers 410, as it does once expired. The token is a credential: it is never logged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from . import keys
from .ids import ID_RE

KEY_FIELD = "approval_link_key"
"""The field of :data:`coxswain.keys.META` that holds the stack's link key (hex)."""
PATH = "/answer/"
DECISIONS = "ad"
"""The decisions a link may give: ``a`` allow, ``d`` deny."""

_key: bytes | None = None


class BadLink(Exception):
    """Not a link of this stack (malformed or a wrong MAC): answered 404, saying nothing more."""


class Expired(Exception):
    """A link of this stack past its expiry: answered 410."""


@dataclass(frozen=True)
class Link:
    sid: str
    approval_id: str
    expires_ms: int
    decisions: str

    def allows(self, decision: str) -> bool:
        return decision[:1] in self.decisions


async def runner_key(redis: Any) -> bytes:
    """The link key, made by the first runner that needs one (HSETNX: every process agrees)."""
    global _key
    if _key is None:
        await redis.hsetnx(keys.META, KEY_FIELD, secrets.token_hex(32))
        _key = bytes.fromhex(str(await redis.hget(keys.META, KEY_FIELD)))
    return _key


async def gateway_key(redis: Any) -> bytes | None:
    """The link key as the gateway reads it (None until a runner made it: no link exists yet)."""
    global _key
    if _key is None:
        raw = await redis.hget(keys.META, KEY_FIELD)
        if raw is None:
            return None
        _key = bytes.fromhex(str(raw))
    return _key


def _mac(key: bytes, body: str) -> str:
    digest = hmac.new(key, body.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def sign(key: bytes, sid: str, approval_id: str, expires_ms: int, decisions: str = DECISIONS) -> str:
    body = f"{sid}.{approval_id}.{expires_ms}.{decisions}"
    return f"{body}.{_mac(key, body)}"


def url(public_url: str, token: str) -> str:
    """The link: absolute under ``[gateway] public_url``, else the path on the gateway."""
    return public_url.rstrip("/") + PATH + token


def verify(key: bytes | None, token: str, now_ms: int) -> Link:
    """The link ``token`` names. BadLink unless this stack signed it; Expired once past its time."""
    parts = token.split(".")
    if key is None or len(parts) != 5:
        raise BadLink("not an answer link")
    sid, aid, exp, decisions, mac = parts
    if not (ID_RE.match(sid) and ID_RE.match(aid) and exp.isdigit() and decisions and set(decisions) <= set(DECISIONS)):
        raise BadLink("not an answer link")
    if not hmac.compare_digest(mac, _mac(key, f"{sid}.{aid}.{exp}.{decisions}")):
        raise BadLink("not an answer link")
    link = Link(sid, aid, int(exp), decisions)
    if now_ms >= link.expires_ms:
        raise Expired("this answer link has expired")
    return link
