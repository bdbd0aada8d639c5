"""The archive of idle sessions: a JetStream KV bucket, one entry per archived session.

A session idle for ``[sessions] idle_days`` has its Redis keys saved here and dropped
(``cox_runner.redis.archive``); its next change loads them back. An entry (key = the session id) is
zlib-compressed JSON (:func:`encode`)::

    {"v": 1, "sid": ..., "principal": ..., "seq": <seq of its session.archived event>,
     "sha": <sha1 of the snapshot text>, "archived": <ms>, "keys": [[suffix, type, values], ...]}

``keys`` is the snapshot the Redis library took (``cox_archive_take``): every key of
:data:`coxswain.keys.ARCHIVED` that existed, by suffix. An entry is only the truth while Redis
does not hold the session: whoever finds the session in Redis ignores it (a reload deletes it,
conditionally on its revision, once the keys are back).

Reads (the gateway's views of an archived session) come from here without loading it back, so
looking at or listing sessions never churns them back into Redis.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any, Final

import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from . import keys
from .config import McpConfig, SandboxConfig
from .models import STANDING_NETWORK, SandboxInfo, Session

BUCKET: Final = "COX_ARCHIVE"
STREAM: Final = f"KV_{BUCKET}"
"""The stream JetStream keeps the bucket in (what the NATS permissions name)."""
VERSION: Final = 1


@dataclass(frozen=True)
class Entry:
    record: dict[str, Any]
    revision: int

    @property
    def seq(self) -> int:
        return int(self.record["seq"])

    def key_values(self) -> dict[str, tuple[str, list[str]]]:
        """suffix -> (type, values) of the snapshot."""
        return {str(k[0]): (str(k[1]), list(k[2])) for k in self.record.get("keys", [])}


async def bucket(js: JetStreamContext, create: bool = False, replicas: int = 1) -> KeyValue | None:
    """The bucket; ``create`` (the turn-runner, at start) makes it when missing. None: it does not
    exist (nothing was ever archived)."""
    try:
        return await js.key_value(BUCKET)
    except nats.js.errors.BucketNotFoundError:
        if not create:
            return None
    try:
        return await js.create_key_value(api.KeyValueConfig(
            bucket=BUCKET, history=1, storage=api.StorageType.FILE, replicas=replicas, direct=True,
            description="coxswain: idle sessions' Redis keys (docs/operations.md, Idle sessions)"))
    except nats.js.errors.BadRequestError:
        return await js.key_value(BUCKET)  # another runner created it meanwhile


async def read(kv: KeyValue | None, sid: str) -> Entry | None:
    """The session's archive entry, or None (never archived, or loaded back since)."""
    if kv is None:
        return None
    try:
        got = await kv.get(sid)
    except nats.js.errors.KeyNotFoundError:
        return None
    if got.value is None:
        return None
    record = decode(got.value)
    if not isinstance(record, dict) or record.get("sid") != sid:
        return None
    return Entry(record=record, revision=int(got.revision or 0))


def encode(record: dict[str, Any]) -> bytes:
    """An entry's value: its JSON, zlib-compressed (a session's text compresses well, and a KV
    value, like every NATS message, is at most ``max_payload``: 1 MiB)."""
    return zlib.compress(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode())


def decode(value: bytes) -> Any:
    return json.loads(zlib.decompress(value))


def hash_of(entry: Entry) -> dict[str, str]:
    """The session hash as the snapshot holds it."""
    kind, vals = entry.key_values().get("", ("hash", []))
    return dict(zip(vals[0::2], vals[1::2], strict=True)) if kind == "hash" else {}


def view(entry: Entry, principal: str | None, sandbox: SandboxConfig | None = None,
         mcp: McpConfig | None = None, admin: bool = False) -> Session | None:
    """The API's session object of an archived session (what :func:`coxswain.session_view.load`
    answers for one in Redis), or None when it belongs to another principal."""
    from . import session_view

    kv = entry.key_values()
    h = hash_of(entry)
    access = session_view.access_of(h, principal, admin) if principal is not None else None
    if not h or (principal is not None and access is None):
        return None

    def lst(sfx: str) -> list[str]:
        return kv.get(sfx, ("list", []))[1]

    def hsh(sfx: str) -> dict[str, str]:
        vals = kv.get(sfx, ("hash", []))[1]
        return dict(zip(vals[0::2], vals[1::2], strict=True))

    out = session_view.build(entry.record["sid"], h, lst(keys.STEER), lst(keys.QUEUE), hsh(keys.LEADS),
                             hsh(keys.APPROVALS))
    standing = kv.get(keys.STANDING, ("set", []))[1]
    out.standing = sorted(standing)
    if sandbox is not None:
        network = "on" if sandbox.network else "session" if STANDING_NETWORK in standing else "off"
        out.sandbox = SandboxInfo(mode=sandbox.mode, network=network)
    out.mcp_servers = session_view.mcp_servers(h.get("mcp"), mcp, busy=False)
    out.access = access  # type: ignore[assignment]  # one of the Literal's values (access_of)
    return out
