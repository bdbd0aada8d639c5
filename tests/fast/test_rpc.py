"""The table of request-reply operations (coxswain.rpc) is the one description of who calls what:
servers register from it, callers call through it, NATS permissions are derived from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from coxswain import access, rpc, subjects
from coxswain.errors import Invalid
from coxswain.models import HomeCmd

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
        homes = {op.subject + ".*" for op in rpc.called_by(svc) if op.home}
        assert rpc_publish == {op.subject for op in rpc.called_by(svc)} | homes, svc
        # the one wildcard: a session's operation on one replica (its home runner)
        assert not any("*" in s for s in rpc_publish - homes), f"{svc}: a wildcard request permission"


def test_a_sessions_operations_reach_one_replica_only_where_the_table_says() -> None:
    """A home operation (rpc.Op.home) takes a session id, its replica subject is its own subject
    and one more token, which only the serving service may subscribe to and only its callers
    publish; no other operation has such a subject."""
    assert {op.name for op in rpc.HOME_OPS} == {"send", "lead", "stop", "answer"}
    for op in rpc.HOME_OPS:
        assert "sid" in op.request.model_fields, op.subject
        # a late home's request goes to any replica too: only one made once whoever runs it may
        assert issubclass(op.request, HomeCmd) and "tx" in op.request.model_fields, op.subject
        assert op.subject_at("r_abc") == op.subject + ".r_abc"
        for svc in subjects.SERVICES:
            may_publish = op.subject + ".*" in access.NATS[svc].publish
            assert may_publish == (svc in op.callers), (op.subject, svc)
            may_serve = subjects.rpc(op.service, "*") + ".*" in access.NATS[svc].subscribe
            assert may_serve == (svc == op.service), (op.subject, svc)
    for svc in subjects.SERVICES:
        if not any(op.home for op in rpc.served_by(svc)):
            assert not any(s.count(".") > 3 and s.startswith("cox.rpc.") for s in access.NATS[svc].subscribe), svc
    with pytest.raises(Invalid):
        rpc.RUNNER_SEND.subject_at("r.x.>")  # a replica id is one token, never a wildcard


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
    # the home a handler names (rpc.Op.home) rides beside the result, which reads the same
    sent = SendResult(message_id="m_1", disposition="started")
    assert json.loads(bus.ok(sent, "r_1")) == {"ok": True, "result": sent.model_dump(mode="json"), "home": "r_1"}
    assert json.loads(bus.ok({"a": 1}, "r_\u00e9")) == {"ok": True, "result": {"a": 1}, "home": "r_\u00e9"}
