"""A session's attachments: an upload recorded (its bytes the gateway kept, content-addressed:
:mod:`coxswain.attachments`), and the attachments a send names, checked before it is admitted."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from coxswain import attachments as att
from coxswain import keys
from coxswain.errors import LeadTextOnly, NotAccepting, NotFound
from coxswain.models import AttachCmd, Attachment

from .deps import Deps


class Attachments:
    def __init__(self, deps: Deps) -> None:
        self.r = deps

    async def attach(self, cmd: AttachCmd) -> Attachment:
        """Record an upload whose bytes the gateway kept; it expires unless a message names it."""
        r = self.r
        if await r.redis.hget(keys.session(cmd.sid), "principal") != cmd.principal:
            raise NotFound("no such session")
        now_ms = int(time.time() * 1000)
        record = {"attachment_id": cmd.attachment_id, "name": cmd.name, "media_type": cmd.media_type,
                  "size": cmd.size, "sha256": cmd.sha256, "expires": now_ms + r.settings.attachments.ttl_s * 1000}
        await r.store.fns.emit(sid=cmd.sid, token="", owner=r.owner, events=[],
                               ops=[("hset", keys.ATTACHMENTS, cmd.attachment_id, json.dumps(record))])
        return Attachment(attachment_id=cmd.attachment_id, name=cmd.name, media_type=cmd.media_type, size=cmd.size)

    @staticmethod
    def text_only(ids: list[str]) -> None:
        """A Lead joins text to a running turn; an attachment goes with a send or a queued message."""
        if ids:
            raise LeadTextOnly("a Lead carries text only: send or queue a message with the attachment")

    async def named(self, sid: str, ids: list[str]) -> tuple[list[dict[str, Any]], str]:
        """The records of the attachments a send names, and them as the Lua send takes them (a
        JSON array, '' for none), checked before anything is recorded: each must be this
        session's and unexpired, and an image needs a model that takes images (409
        ``not_accepting`` naming why, before any turn starts)."""
        r = self.r
        if not ids:
            return [], ""
        raw = await r.redis.hmget(keys.session(sid) + keys.ATTACHMENTS, ids)
        now_ms = int(time.time() * 1000)
        out: list[dict[str, Any]] = []
        for aid, rec in zip(ids, raw, strict=True):
            if rec is None or int(json.loads(rec).get("expires") or 0) < now_ms:
                raise NotFound(f"no attachment {aid} in this session (an upload no message names expires after "
                               f"{r.settings.attachments.ttl_s} s)")
            d = json.loads(rec)
            d.pop("expires", None)
            out.append(d)
        images = [a["name"] for a in out if str(a["media_type"]).startswith("image/")]
        if images:
            base = keys.session(sid)
            model, nxt = await r.redis.hmget(base, ["model", "next_model"])
            name = nxt or model or ""
            if name and not r.models.takes_images(name):
                raise NotAccepting(f"model {name!r} does not take images ({', '.join(images)}): set vision = true "
                                   "on its [[model.providers]] entry if it does, or choose a model that does")
        # named by a message from now on: never collected (marked before the send is recorded)
        await asyncio.to_thread(att.mark_kept, r.settings.root, r.settings.store_dir, [str(a["sha256"]) for a in out])
        return out, json.dumps(out, ensure_ascii=False)

    async def collect(self) -> None:
        """Remove the bytes of uploads no message named, ``ttl_s`` (and the grace) after the last."""
        r = self.r
        gone = await asyncio.to_thread(att.collect, r.settings.root, r.settings.store_dir,
                                       r.settings.attachments.ttl_s, time.time())
        if gone:
            r.log.info("attachments.collected", blobs=len(gone))
