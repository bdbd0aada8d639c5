"""The error hierarchy every service raises and the gateway maps to HTTP in one place.

    CoxError                      code            status
    ├── Invalid                   invalid         422   bad input (shape, encoding, ids)
    │   ├── BadJson               bad_json        400   body is not UTF-8 JSON
    │   └── WorkspaceInvalid      workspace_invalid 422 the root itself, or a store folder
    ├── Unauthorized              unauthorized    401
    ├── NotFound                  not_found       404   also: another principal's session
    │   └── Collected             collected       410   a version the retention policy removed
    ├── Conflict                  (various)       409   busy, not_accepting, no_turn, lead_closed,
    │   │                                               lead_text_only, resolved, fenced, run_active
    │   ├── BudgetReached         budget_reached  409   a daily spend budget paused the session
    │   └── WorkspaceNested       workspace_nested 409  inside or around another workspace
    ├── TooLarge                  too_large       413
    ├── Unsupported               unsupported_media_type 415  an attachment type not allowed
    ├── TooManyPending            too_many_pending 429
    ├── TooManyStreams            too_many_streams 429   max_streams_per_principal event streams open
    ├── Refused                   refused         403   policy refused a path or command
    ├── Forbidden                 forbidden       403   the session is visible to the caller, the call is not theirs to make
    └── Unavailable               unavailable     503   NATS, Redis or a service is down

Over NATS an error travels as ``{"ok": false, "error": code, "status": n, "detail": text}`` and
is rebuilt into the same class on the other side by :func:`from_wire`.
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar


class CoxError(Exception):
    """Base of every error that has a wire code and an HTTP status."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, detail: str = "", *, code: str | None = None, status: int | None = None) -> None:
        super().__init__(detail or self.code)
        self.detail = detail or self.code
        if code is not None:
            self.code = code  # type: ignore[misc]
        if status is not None:
            self.status = status  # type: ignore[misc]

    def to_wire(self) -> dict[str, Any]:
        return {"ok": False, "error": self.code, "status": self.status, "detail": self.detail}


class Invalid(CoxError):
    code = "invalid"
    status = 422


class BadJson(Invalid):
    code = "bad_json"
    status = 400


class WorkspaceInvalid(Invalid):
    """A workspace that can never be one: the root itself (any spelling), a store folder."""

    code = "workspace_invalid"
    status = 422


class Unauthorized(CoxError):
    code = "unauthorized"
    status = 401


class NotFound(CoxError):
    code = "not_found"
    status = 404


class Collected(NotFound):
    """The version was collected by the retention policy (``[versions] keep_days``, ``keep_per_file``)."""

    code = "collected"
    status = 410


class Conflict(CoxError):
    """A 409; ``code`` says which rule refused (busy, not_accepting, no_turn, ...)."""

    code = "conflict"
    status = 409


class Busy(Conflict):
    code = "busy"


class NotAccepting(Conflict):
    code = "not_accepting"


class TooManyPrograms(Conflict):
    """The session runs ``[sandbox] max_programs`` programs already (a person's ``!&command``)."""

    code = "too_many_programs"


class NoTurn(Conflict):
    code = "no_turn"


class LeadTextOnly(Conflict):
    """A Lead carries text only: an attachment goes with a send or a queued message."""

    code = "lead_text_only"


class Unsupported(CoxError):
    """An attachment whose media type ``[attachments] allowed_types`` does not list."""

    code = "unsupported_media_type"
    status = 415


class LeadClosed(Conflict):
    code = "lead_closed"


class Resolved(Conflict):
    code = "resolved"


class Fenced(Conflict):
    """A write carried a fencing token that is no longer the session's lease."""

    code = "fenced"


class RunActive(Conflict):
    """A run drives the session: a send, queue, steer (or a Lead into an unsupervised run) waits
    for ``run.end`` or a Stop."""

    code = "run_active"


class BudgetReached(Conflict):
    """A send or Lead to a session a daily spend budget paused (``[limits] session_spend``,
    ``principal_spend`` or its ``spend_limit``)."""

    code = "budget_reached"


class WorkspaceNested(Conflict):
    """A new workspace inside another one, or holding one."""

    code = "workspace_nested"


class TooLarge(CoxError):
    code = "too_large"
    status = 413


class TooManyPending(CoxError):
    code = "too_many_pending"
    status = 429


class TooManyStreams(CoxError):
    """The principal holds ``[gateway] max_streams_per_principal`` event streams already."""

    code = "too_many_streams"
    status = 429


class Refused(CoxError):
    code = "refused"
    status = 403


class Forbidden(CoxError):
    """The caller may see the session (a reader, an approver) but not make this call."""

    code = "forbidden"
    status = 403


class Unavailable(CoxError):
    code = "unavailable"
    status = 503


_BY_CODE: dict[str, type[CoxError]] = {
    cls.code: cls
    for cls in (
        Invalid, BadJson, Unauthorized, NotFound, Collected, Conflict, Busy, NotAccepting, NoTurn,
        LeadClosed, LeadTextOnly, Unsupported, Resolved, Fenced, RunActive, BudgetReached, WorkspaceInvalid,
        WorkspaceNested, TooLarge,
        TooManyPending, TooManyStreams, Refused, Forbidden, Unavailable,
    )
}


def from_wire(payload: dict[str, Any]) -> CoxError:
    """Rebuild an error sent by another service; unknown codes keep their code and status."""
    code = str(payload.get("error", "internal"))
    detail = str(payload.get("detail", ""))
    status = int(payload.get("status", 500))
    cls = _BY_CODE.get(code)
    if cls is None:
        return CoxError(detail, code=code, status=status)
    return cls(detail, status=status) if status != cls.status else cls(detail)


_ABS_PATH = re.compile(r"(?<![\w.~:/-])/(?:[^\s'\"/:,;()\[\]{}<>]+/?)+")
"""An absolute path as it appears in an exception's text: ``/`` then names (not a URL's, a
route's ``/v1/...`` only when it starts the text: routes are not in exception texts)."""


def without_paths(text: str, *roots: str | os.PathLike[str]) -> str:
    """``text`` with every path under one of ``roots`` made relative to it (``<root>/ws/f`` ->
    ``ws/f``, the root itself -> ``.``), and any other absolute path replaced by ``<path>``:
    an error a client reads names no folder of the host."""
    for root in roots:
        for r in {str(root), os.path.realpath(root)}:
            r = r.rstrip("/")
            if r:
                text = text.replace(r + "/", "").replace(r, ".")
    return _ABS_PATH.sub("<path>", text)


def logged(exc: BaseException) -> str:
    """An exception for a log line: its repr, and its message where the repr leaves it out
    (redis-py's errors are ``network:ConnectionError`` whatever went wrong, and a script's
    ``server:ResponseError`` without the script's words)."""
    shown = repr(exc)
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the log line
        return shown
    return shown if not text or text in shown else f"{shown}: {text}"


def describe(exc: BaseException) -> str:
    """An unexpected exception as a client may read it: its type and message, never a host path
    (an OSError's file names are left out; other absolute paths are replaced)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return without_paths(repr(exc))
