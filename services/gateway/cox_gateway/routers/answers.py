"""Answer links (docs/api.md, "Answer links"): a minimal page that answers one approval without
the bearer token, from a phone as well as a desktop (:mod:`coxswain.approval_links`).

``GET /answer/{token}`` shows the question (the command or the diff, the judge's view, the
reason) with Allow and Deny and an optional message; ``POST`` (a form, or JSON ``{decision,
message}``) answers it as the session's person. A used link (the approval was answered,
through it or anywhere else) and an expired one answer **410**; a link this stack did not sign
answers 404. The token is a credential: never logged, never sent on as a Referer, never cached.
"""

from __future__ import annotations

import html
import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from coxswain import approval_links, keys, rpc
from coxswain.errors import CoxError, Resolved
from coxswain.models import ApprovalCmd

from ..deps import ReadsDep, ServicesDep

router = APIRouter(include_in_schema=False)

HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
}
STYLE = """body{font:16px/1.45 system-ui,sans-serif;margin:0 auto;max-width:40rem;padding:1rem;color:#111}
pre{background:#f4f4f4;padding:.75rem;overflow-x:auto;white-space:pre-wrap;word-break:break-word}
textarea{width:100%;box-sizing:border-box;min-height:4.5rem;font:inherit}
.row{display:flex;gap:.75rem;margin-top:.75rem}
button{flex:1;min-height:48px;font:inherit;font-weight:600;border-radius:8px;border:1px solid #444}
button[value=allow]{background:#1a7f37;color:#fff}button[value=deny]{background:#fff;color:#b00}
.muted{color:#555}"""


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    doc = (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
           f'<meta name="viewport" content="width=device-width,initial-scale=1">'
           f"<title>{html.escape(title)} - coxswain</title><style>{STYLE}</style></head>"
           f"<body><main><h1>{html.escape(title)}</h1>{body}</main></body></html>")
    return HTMLResponse(doc, status_code=status, headers=HEADERS)


def _said(text: str) -> str:
    return f"<p>{html.escape(text)}</p>"


async def _approval(reads: Any, token: str) -> tuple[approval_links.Link | None, dict[str, Any] | None, Response | None]:
    """The link and its approval's record, or the page that says why not."""
    try:
        link = approval_links.verify(await approval_links.gateway_key(reads.redis), token, int(time.time() * 1000))
    except approval_links.BadLink:
        return None, None, _page("Not found", _said("This is not an answer link of this coxswain."), 404)
    except approval_links.Expired:
        return None, None, _page("Link expired", _said("This answer link has expired; answer in the console."), 410)
    raw = await reads.redis.hget(keys.session(link.sid) + keys.APPROVALS, link.approval_id)
    record = json.loads(raw) if raw else None
    if record is None or record.get("state") != "pending":
        return link, None, _used(record)
    return link, record, None


def _used(record: dict[str, Any] | None) -> HTMLResponse:
    if record is not None and record.get("decision") in ("allow", "deny"):
        said = "allowed" if record["decision"] == "allow" else "denied"
        return _page("Already answered", _said(f"This approval was already answered: {said}."), 410)
    return _page("Already answered", _said("This approval is no longer open (answered, or its turn ended)."), 410)


def _question(record: dict[str, Any]) -> str:
    args = record.get("args")
    name = str(record.get("name") or "")
    parts = [f"<p>The model asks to run <strong>{html.escape(name)}</strong>"
             f"{' (a security confirm)' if record.get('security') else ''}:</p>"]
    if isinstance(args, dict) and isinstance(args.get("command"), str):
        parts.append(f"<pre>{html.escape(args['command'])}</pre>")
    elif args is not None:
        parts.append(f"<pre>{html.escape(json.dumps(args, ensure_ascii=False, indent=2)[:20_000])}</pre>")
    preview = record.get("preview")
    if isinstance(preview, dict) and isinstance(preview.get("diff"), str):
        parts.append(f"<p>The change:</p><pre>{html.escape(preview['diff'][:20_000])}</pre>")
    if record.get("reason"):
        parts.append(f'<p class="muted">Why it asks: {html.escape(str(record["reason"]))}</p>')
    judge = record.get("judge")
    if isinstance(judge, dict):
        verdict = html.escape(str(judge.get("verdict", "")))
        why = html.escape(str(judge.get("reason", "")))
        parts.append(f'<p class="muted">The judge: {verdict}{": " + why if why else ""}</p>')
    return "".join(parts)


@router.get("/answer/{token}")
async def page(token: str, reads: ReadsDep) -> Response:
    _, record, refused = await _approval(reads, token)
    if refused is not None:
        return refused
    assert record is not None
    form = ('<form method="post"><label for="m">Message to the model (optional)</label>'
            '<textarea id="m" name="message" maxlength="4000"></textarea><div class="row">'
            '<button type="submit" name="decision" value="allow">Allow</button>'
            '<button type="submit" name="decision" value="deny">Deny</button></div></form>')
    return _page("Approval needed", _question(record) + form)


@router.post("/answer/{token}")
async def answer(token: str, request: Request, reads: ReadsDep, services: ServicesDep) -> Response:
    wants_json = request.headers.get("content-type", "").startswith("application/json")
    if wants_json:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return JSONResponse({"ok": False, "error": "bad_json", "detail": "the body must be a JSON object"}, 400,
                                headers=HEADERS)
    else:
        body = dict(await request.form())
    decision, message = body.get("decision"), body.get("message") or ""
    link, record, refused = await _approval(reads, token)
    if refused is not None:
        if wants_json:
            return JSONResponse({"ok": False, "error": "gone" if refused.status_code == 410 else "not_found",
                                 "detail": "this answer link is used, expired or unknown"},
                                refused.status_code, headers=HEADERS)
        return refused
    assert link is not None and record is not None
    if decision not in ("allow", "deny") or not link.allows(str(decision)) or not isinstance(message, str) \
            or len(message) > 4000:
        detail = "decision must be allow or deny (and a message at most 4000 characters)"
        if wants_json:
            return JSONResponse({"ok": False, "error": "invalid", "detail": detail}, 400, headers=HEADERS)
        return _page("Not answered", _said(detail), 400)
    owner = await reads.redis.hget(keys.session(link.sid), "principal")
    try:
        await services.call(rpc.RUNNER_ANSWER, ApprovalCmd(principal=str(owner or ""), sid=link.sid,
                                                           approval_id=link.approval_id, decision=decision,
                                                           message=message or None))
    except Resolved:
        record = json.loads(await reads.redis.hget(keys.session(link.sid) + keys.APPROVALS, link.approval_id) or "null")
        if wants_json:
            return JSONResponse({"ok": False, "error": "gone", "detail": "this approval was already answered"}, 410,
                                headers=HEADERS)
        return _used(record)
    except CoxError as exc:
        if wants_json:
            return JSONResponse(exc.to_wire(), exc.status, headers=HEADERS)
        return _page("Not answered", _said(exc.detail), exc.status)
    if wants_json:
        return JSONResponse({"ok": True, "approval_id": link.approval_id, "decision": decision}, headers=HEADERS)
    return _page("Allowed" if decision == "allow" else "Denied",
                 _said("Your answer is recorded; the turn goes on. You can close this page."))
