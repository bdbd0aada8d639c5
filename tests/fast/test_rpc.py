"""The table of request-reply operations (coxswain.rpc) is the one description of who calls what:
servers register from it, callers call through it, NATS permissions are derived from it."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from coxswain import access, rpc, subjects

ROOT = Path(__file__).resolve().parents[2]


def test_every_operation_is_named_once_and_well_formed() -> None:
    seen = [op.subject for op in rpc.OPS]
    assert len(seen) == len(set(seen)), "an operation is listed twice"
    for op in rpc.OPS:
        assert op.service in subjects.SERVICES, op.subject
        assert bool(op.callers) != (op in rpc.OPERATOR_OPS), f"{op.subject}: callers, or an operator's op"
        assert set(op.callers) <= set(subjects.SERVICES), op.subject
        assert issubclass(op.request, BaseModel) and issubclass(op.reply, BaseModel), op.subject
        if not callable(op.timeout):
            assert 0 < op.timeout <= 600, op.subject
    for svc in subjects.SERVICES:
        assert rpc.HEALTH[svc] in rpc.served_by(svc)


def test_nats_permissions_allow_exactly_the_requests_the_table_lists() -> None:
    for svc in subjects.SERVICES:
        rpc_publish = {s for s in access.NATS[svc].publish if s.startswith("cox.rpc.")}
        assert rpc_publish == {op.subject for op in rpc.called_by(svc)}, svc
        assert not any("*" in s for s in rpc_publish), f"{svc}: a wildcard request permission"


DOORBELL_ASK = "services/turn-runner/cox_runner/doorbell.py"
"""The one request outside the table: a runner's doorbell to one other runner (its own
``cox.ctl.<runner_id>`` subject, not a service's queue group), waited for only to learn whether
that runner still listens (``Doorbell.ask``: a turn routed to where the session's programs run)."""


def test_no_request_reply_outside_the_table() -> None:
    """Services and the CLI call through rpc.call: no subject, model or time-out at a call site."""
    bad = re.compile(r"bus\.(raw_)?call\(|subjects\.rpc\(|\bnc\.request\(")
    for path in [*ROOT.joinpath("services").rglob("*.py"), *ROOT.joinpath("cli").rglob("*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            rel = str(path.relative_to(ROOT))
            if rel == DOORBELL_ASK and "nc.request(subjects.control(" in line:
                continue
            assert not bad.search(line), f"{rel}:{n}: {line.strip()}"


def test_a_reply_envelope_carries_the_result_as_the_caller_parses_it() -> None:
    """``bus.ok`` writes a model with pydantic's serializer: what a caller reads back through the
    operation's reply model is the result, whatever text it holds (non-ASCII, quotes, nulls)."""
    import json

    from coxswain import bus
    from coxswain.models import LeadResult, SendResult

    for result in (SendResult(message_id="m_1", disposition="queued", position=3),
                   SendResult(message_id="m_\u00e9\"\\\n\u2028", disposition="started"),
                   LeadResult(lead_id="l_1", pending=2, turn_id=None)):
        wire = json.loads(bus.ok(result))
        assert wire == {"ok": True, "result": result.model_dump(mode="json")}
        assert type(result).model_validate(wire["result"]) == result
    assert json.loads(bus.ok({"a": "\u00e9", "b": None})) == {"ok": True, "result": {"a": "\u00e9", "b": None}}
