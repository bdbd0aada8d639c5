"""Attachments: a file a person sends with a message, uploaded first and named by its id.

The upload's bytes are kept by the gateway itself, content-addressed beside the workspaces
(:mod:`coxswain.attachments`): NATS carries at most 4 MB a message, an attachment up to
``[attachments] max_mb``. What makes it an attachment of the session is the runner's record
(``RUNNER_ATTACH``), written like any other change of a session; a message then carries its
record in ``user.msg``, which is what reads, forks and rewinds go by.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import mimetypes
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile as StarletteUpload

from coxswain import attachments as att
from coxswain import eventlog, keys, rpc
from coxswain.errors import BadJson, Invalid, NotFound, TooLarge, Unsupported
from coxswain.ids import new_id
from coxswain.models import AttachCmd, Attachment

from .. import errors
from ..deps import Principal, ReadsDep, ServicesDep, SettingsDep, Sid, StreamsDep, VersionId

router = APIRouter(responses=errors.responses(401, 403, 404, 422, 503))

CHUNK = 1 << 20


def _media_type(given: str | None, name: str) -> str:
    given = (given or "").split(";", 1)[0].strip().lower()
    if given and given != "application/octet-stream":
        return given
    guessed, _ = mimetypes.guess_type(name)
    return guessed or "application/octet-stream"


class Base64Upload(BaseModel):
    """``POST .../attachments`` as JSON: the file's bytes in base64 (standard alphabet, padded)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=255)
    media_type: str | None = Field(None, min_length=3, max_length=255)
    data: str


UPLOAD_BODY = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                       "properties": {"file": {"type": "string", "format": "binary"}}}},
    "application/json": {"schema": Base64Upload.model_json_schema()},
}}}


async def _parts(request: Request) -> tuple[str, str | None, Iterable[bytes], int | None, Any]:
    """The upload's name, given media type, its bytes (chunks) and size when known, from either
    form: multipart (the field ``file``) or JSON ``{name, media_type?, data}`` (base64)."""
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype == "application/json":
        raw = await request.body()
        try:
            got = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadJson("the body is not valid UTF-8 JSON") from exc
        try:
            up = Base64Upload.model_validate(got)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from exc
        try:
            data = base64.b64decode(up.data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise Invalid("data must be the file's bytes in base64 (the standard alphabet, padded)") from exc
        return up.name.strip(), up.media_type, [data], len(data), None
    if ctype != "multipart/form-data":
        raise Invalid("an upload is multipart/form-data (the file in the field file) or application/json "
                      "{name, media_type?, data: base64}")
    form = await request.form()
    file = form.get("file")
    if not isinstance(file, StarletteUpload):
        raise Invalid("the multipart body needs the file in the field file")

    def chunks() -> Any:
        file.file.seek(0)
        while c := file.file.read(CHUNK):
            yield c

    return (file.filename or "").strip(), file.content_type, chunks(), file.size, form


@router.post("/v1/sessions/{sid}/attachments", status_code=201, responses=errors.responses(400, 413, 415),
             openapi_extra=UPLOAD_BODY)
async def upload(sid: Sid, request: Request, services: ServicesDep, reads: ReadsDep, settings: SettingsDep,
                 who: Principal) -> Attachment:
    """Keep a file (multipart, field ``file``; or JSON ``{name, media_type?, data}`` with the
    bytes in base64) to send with a message; it expires unless a message names it."""
    acting = await reads.writable(sid, who)  # before its bytes are kept: a reader keeps nothing
    name, given, chunks, size, form = await _parts(request)
    try:
        if not name or len(name) > 255:
            raise Invalid("the file needs a name (the multipart part's filename, or name), at most 255 characters")
        media = _media_type(given, name)
        if not settings.attachments.allows(media):
            raise Unsupported(f"attachments of type {media} are not accepted; allowed: "
                              f"{', '.join(settings.attachments.allowed_types)} ([attachments] allowed_types)")
        limit = int(settings.attachments.max_mb * 1024 * 1024)
        if (size or 0) > limit:
            raise TooLarge(f"an attachment may have at most {limit} bytes ([attachments] max_mb); this one has {size}")
        sha, kept = await asyncio.to_thread(att.keep, settings.root, settings.store_dir, chunks)
    finally:
        if form is not None:
            await form.close()
    size = kept
    if size > limit:  # a part without a size: measured as it was kept (the blob stays unnamed)
        raise TooLarge(f"an attachment may have at most {limit} bytes ([attachments] max_mb); this one has {size}")
    return await services.call(rpc.RUNNER_ATTACH, AttachCmd(principal=acting, sid=sid, attachment_id=new_id("att"),
                                                            name=name, media_type=media, size=size, sha256=sha))


async def _record(sid: str, aid: str, seq: int, reads: ReadsDep, streams: StreamsDep) -> dict[str, Any]:
    """The attachment's record: the session's upload, else the message that carried it (a
    fork's or an archived session's attachments are in its log only)."""
    raw = await reads.redis.hget(keys.session(sid) + keys.ATTACHMENTS, aid)
    if raw is not None:
        rec: dict[str, Any] = json.loads(raw)
        return rec
    after = 0
    while after < seq:
        page = await eventlog.backlog(streams.js, sid, after, seq, 10_000)
        if not page:
            break
        for e in page:
            if e.get("type") == "user.msg":
                for a in e.get("attachments") or []:
                    if a.get("attachment_id") == aid:
                        return dict(a)
        after = int(page[-1].get("seq") or seq)
    raise NotFound(f"no attachment {aid} in this session")


@router.get("/v1/sessions/{sid}/attachments/{attachment_id}", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "the file's bytes"}})
async def read(sid: Sid, attachment_id: VersionId, reads: ReadsDep, streams: StreamsDep, settings: SettingsDep,
               who: Principal) -> FileResponse:
    """The file's bytes, with its media type; ``X-Cox-Sha256`` and the name in ``Content-Disposition``."""
    h = await reads.owned(sid, who)
    rec = await _record(sid, attachment_id, int(h.get("seq") or 0), reads, streams)
    path = att.blob(settings.root, settings.store_dir, str(rec.get("sha256", "")))
    if not await asyncio.to_thread(path.is_file):
        raise NotFound(f"attachment {attachment_id}'s content is no longer kept")
    return FileResponse(path, media_type=str(rec.get("media_type") or "application/octet-stream"),
                        filename=str(rec.get("name") or attachment_id),
                        headers={"X-Cox-Sha256": str(rec.get("sha256", ""))})
