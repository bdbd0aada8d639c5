"""Reading a session's state from Redis into the API's session object (read-only)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from . import keys
from .config import McpConfig, SandboxConfig
from .models import (
    STANDING_NETWORK,
    ApprovalInfo,
    BudgetInfo,
    LeadInfo,
    McpServerInfo,
    Plan,
    ProgramInfo,
    QueueItem,
    RunInfo,
    SandboxInfo,
    Session,
    ShareInfo,
    UsageTotals,
)


def shares_of(h: dict[str, str]) -> dict[str, str]:
    """The session's shares (principal -> ``reader`` | ``approver``) from its hash."""
    raw = h.get("shares")
    if not raw:
        return {}
    try:
        got = json.loads(raw)
    except ValueError:
        return {}
    return {str(p): str(r) for p, r in got.items()} if isinstance(got, dict) else {}


def access_of(h: dict[str, str], principal: str, admin: bool = False) -> str | None:
    """``principal``'s access to the session whose hash is ``h``: ``owner``, ``admin``, the role
    it was shared with them as (``reader``, ``approver``), or None (it reads as no session)."""
    if not h:
        return None
    if h.get("principal") == principal:
        return "owner"
    if admin:
        return "admin"
    return shares_of(h).get(principal)


async def load(redis: Any, sid: str, principal: str | None,
               sandbox: SandboxConfig | None = None, mcp: McpConfig | None = None,
               admin: bool = False) -> Session | None:
    """The session, or None when it does not exist or ``principal`` has no access to it (its
    owner's, an admin's, or shared with them: :func:`access_of`). With ``sandbox`` (the
    process's settings) the view says where the session's commands run."""
    base = keys.session(sid)
    # One MULTI (all keys in the session's slot, so a cluster runs it too). Raw commands: redis-py's
    # cluster transaction passes the typed commands' ``keys`` to reply parsers that take none.
    async with redis.pipeline(transaction=True) as pipe:
        pipe.execute_command("HGETALL", base)
        pipe.execute_command("LRANGE", base + keys.STEER, 0, -1)
        pipe.execute_command("LRANGE", base + keys.QUEUE, 0, -1)
        pipe.execute_command("HGETALL", base + keys.LEADS)
        pipe.execute_command("HGETALL", base + keys.APPROVALS)
        pipe.execute_command("SMEMBERS", base + keys.STANDING)
        h, steer, queue, leads, approvals, standing = await pipe.execute()
    access = access_of(h, principal, admin) if principal is not None else None
    if not h or (principal is not None and access is None):
        return None
    view = build(sid, h, steer, queue, leads, approvals)
    view.access = access  # type: ignore[assignment]  # one of the Literal's values (access_of)
    view.standing = sorted(standing)
    if sandbox is not None:
        network = "on" if sandbox.network else "session" if STANDING_NETWORK in standing else "off"
        view.sandbox = SandboxInfo(mode=sandbox.mode, network=network)
    view.mcp_servers = mcp_servers(h.get("mcp"), mcp, busy=h.get("busy") == "1")
    view.programs = programs(h.get("programs"))
    return view


def programs(raw: str | None) -> list[ProgramInfo]:
    """The running programs as their runner recorded them (the session hash's ``programs``)."""
    if not raw:
        return []
    try:
        items = json.loads(raw)
    except ValueError:
        return []
    out: list[ProgramInfo] = []
    for item in items if isinstance(items, list) else []:
        try:
            out.append(ProgramInfo.model_validate(item))
        except ValueError:
            continue
    return out


def mcp_servers(raw: str | None, mcp: McpConfig | None, busy: bool = True) -> list[McpServerInfo]:
    """The servers' states as the runner recorded them (the session hash's ``mcp``), and the
    configured servers it has not started yet as ``idle``. Servers run only while a runner
    drives the session: an idle session's ``ready`` servers are stopped, so they show ``idle``
    (with the tools they listed); a failure stays shown until the next start."""
    seen: list[McpServerInfo] = []
    if raw:
        try:
            seen = [McpServerInfo(**x) for x in json.loads(raw)]
        except (ValueError, TypeError):
            seen = []
    if not busy:
        seen = [s.model_copy(update={"state": "idle"}) if s.state == "ready" else s for s in seen]
    names = {s.name for s in seen}
    idle = [McpServerInfo(name=c.name, state="idle") for c in (mcp.enabled() if mcp else []) if c.name not in names]
    return [*seen, *idle]


def build(sid: str, h: dict[str, str], steer: list[str], queue: list[str], leads: dict[str, str],
          approvals: dict[str, str]) -> Session:
    items = [QueueItem(**_pick(json.loads(x), "message_id", "text", "mode")) for x in [*steer, *queue]]
    for item in items:
        if item.mode not in ("queue", "steer"):
            item.mode = "queue"
    lead_list = sorted((json.loads(v) for v in leads.values()), key=lambda x: x.get("lead_id", ""))
    appr = [json.loads(v) for v in approvals.values()]
    pending = sorted((a for a in appr if a.get("state") == "pending"), key=lambda a: a.get("approval_id", ""))
    plan_raw = h.get("plan")
    plan = Plan(**json.loads(plan_raw)) if plan_raw else None
    return Session(
        id=sid,
        workspace=h.get("workspace", ""),
        model=h.get("model") or None,
        title=h.get("title") or None,
        title_source=h.get("title_source") or None,
        auto_title=h.get("auto_title", "1") == "1",
        busy=h.get("busy") == "1",
        turn_id=h.get("turn_id") or None,
        queue=items,
        leads=[LeadInfo(lead_id=x["lead_id"], state=x.get("state", "pending"), text=x.get("text", ""))
               for x in lead_list],
        approvals=[ApprovalInfo(**_pick(a, "approval_id", "call_id", "name", "args", "security", "reason",
                                        "judge", "turn_id", "answer_url")) for a in pending],
        plan=plan,
        dont_ask=h.get("dont_ask") == "1",
        usage=UsageTotals(
            requests=int(h.get("usage_requests", 0) or 0), input_tokens=int(h.get("usage_input_tokens", 0) or 0),
            output_tokens=int(h.get("usage_output_tokens", 0) or 0),
            cache_read_tokens=int(h.get("usage_cache_read_tokens", 0) or 0),
            cache_write_tokens=int(h.get("usage_cache_write_tokens", 0) or 0),
            cost=round(float(h.get("usage_cost", 0) or 0), 8),
        ),
        created=int(h.get("created", 0) or 0),
        next_model=h.get("next_model") or None,
        run=run_info(h.get("run")),
        **spend_info(h),
        last_seq=int(h.get("seq", 0) or 0),
        shares=[ShareInfo(principal=p, role=r) for p, r in sorted(shares_of(h).items())
                if r in ("reader", "approver")],
    )


DAY_S = 86_400


def spent_on(h: Mapping[str, Any], day: int | str) -> float:
    """The session's spend on UTC day number ``day`` as its hash holds it (0 when it counted another day)."""
    return float(h.get("spend_today") or 0) if str(h.get("spend_day") or "") == str(day) else 0.0


def spend_info(h: dict[str, str], now: float | None = None) -> dict[str, Any]:
    """The session object's ``spend_today``, ``spend_limit`` and ``budget_reached`` from its hash
    (docs/api.md, "Budgets"): the day is the UTC day (the runner counts it by Redis's clock); a
    spend or a pause of an earlier day is over."""
    today = str(int((time.time() if now is None else now) // DAY_S))
    spent = spent_on(h, today)
    limit = h.get("spend_limit")
    reached: BudgetInfo | None = None
    raw = h.get("budget")
    if raw:
        try:
            b = json.loads(raw)
            if str(b.get("day")) == today:
                reached = BudgetInfo(budget=b["budget"], limit=float(b["limit"]), spent=float(b["spent"]),
                                     detail=str(b.get("detail") or ""))
        except (ValueError, KeyError, TypeError):
            reached = None
    return {"spend_today": round(spent, 8), "spend_limit": float(limit) if limit else None, "budget_reached": reached}


def run_info(raw: str | None) -> RunInfo | None:
    """The session hash's ``run`` (JSON the Lua library keeps) as the session object shows it."""
    if not raw:
        return None
    r = json.loads(raw)
    return RunInfo(state=r.get("state", "running"), confirm=r.get("confirm", "person"),
                   unattended=bool(r.get("unattended")), max_turns=int(r.get("max_turns") or 0),
                   turns=int(r.get("turns") or 0), outcome=r.get("outcome") or None)


def _pick(d: dict[str, Any], *names: str) -> dict[str, Any]:
    return {n: d[n] for n in names if n in d and d[n] is not None}
