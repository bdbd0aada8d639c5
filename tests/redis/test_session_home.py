"""A session's home runner (``coxswain.rpc.Op.home``), against a real nats-server and Redis.

The send script names the runner a session's turn runs on in every disposition; the gateway's
:class:`~cox_gateway.deps.Services` sends a session's next send, Lead, Stop or answer to the
replica its last reply named (on that replica's own subject), learns a new home from each reply,
goes to any replica when its home stopped listening (no wait), forgets a home that did not answer
in time, keeps one across a refusal, and remembers a bounded number of sessions. Two "runners" here
are plain NATS subscribers answering as a runner does (``bus.ok`` with the home its handler set),
each on the queue group and on its own subject, and counting what reached it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import nats
import pytest
import uvloop
from nats.aio.msg import Msg

from cox.servers import NatsServer
from cox_gateway import deps as gateway_deps
from cox_gateway.deps import Services
from coxswain import bus, logs, rpc, subjects
from coxswain.config import Settings
from coxswain.errors import NotFound, Unavailable
from coxswain.models import SendCmd, SendResult
from coxswain.service import connect_nats
from tests.redis.test_budget_library import send
from tests.support.library import Library

SEND = rpc.RUNNER_SEND
QUICK_SEND = rpc.Op(SEND.service, SEND.name, SendCmd, SendResult, 1.0, SEND.callers, home=True)
"""The send, with a time-out a test can wait out (only where it waits one out: a loaded machine
may take longer than this to answer)."""


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with NatsServer(tmp_path_factory.mktemp("nats")) as ns:
        yield ns.admin_url


def test_the_send_script_names_the_runner_the_turn_runs_on_in_every_disposition(lib: Library) -> None:
    sid = lib.create("s_home")
    started = send(lib, sid, "m_1")
    assert started["disposition"] == "started" and started["runner"] == "r_1", started
    queued = dict(lib(lib.fns.send(sid=sid, principal="p", message_id="m_2", text="x", mode="queue", client_id="",
                                   runner="r_2", lease_ms=5000, turn_id="t_2", owner="", models="", agents_md="",
                                   over="")))
    assert queued["disposition"] == "queued" and queued["runner"] == "r_1", \
        "queued on another runner: the home is the runner running the turn"
    steered = send(lib, sid, "m_3", "steer")
    assert steered["disposition"] == "steered" and steered["runner"] == "r_1", steered


class Runner:
    """A replica answering sends: ``home`` is what its replies name (its own id unless told)."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.home: str | None = rid
        self.got: list[str] = []
        self.txs: list[str | None] = []
        self.refuse = False
        self.hold = False
        self.subs: list[Any] = []

    async def start(self, nc: Any) -> None:
        self.subs = [await nc.subscribe(SEND.subject, queue=subjects.queue_group(SEND.service), cb=self.on),
                     await nc.subscribe(SEND.subject_at(self.rid), cb=self.on)]

    async def on(self, msg: Msg) -> None:
        self.got.append(msg.subject)
        self.txs.append(json.loads(msg.data).get("tx"))
        if self.hold:
            return
        if self.refuse:
            await msg.respond(bus.err(NotFound("no such session")))
            return
        cmd = SendCmd.model_validate_json(msg.data)
        await msg.respond(bus.ok(SendResult(message_id=f"m_{cmd.text}", disposition="started"), self.home))


def run(url: str, body: Any) -> None:
    async def go() -> None:
        nc: Any = await connect_nats(url, "home-gateway", logs.get("test"))
        peer = await nats.connect(url)
        a, b = Runner("r_a"), Runner("r_b")
        await a.start(peer)
        await b.start(peer)
        await peer.flush()
        try:
            await body(Services(nc), a, b, peer)
        finally:
            await peer.close()
            await nc.close()

    uvloop.run(go())


def cmd(sid: str, text: str) -> SendCmd:
    return SendCmd(principal="p", sid=sid, text=text)


def test_a_sessions_sends_go_to_the_home_its_last_reply_named(nats_url: str) -> None:
    async def body(s: Services, a: Runner, b: Runner, peer: Any) -> None:
        got = await s.call(SEND, cmd("s_1", "first"))
        assert got == SendResult(message_id="m_first", disposition="started")
        first = a if a.got else b
        other = b if first is a else a
        assert first.got == [SEND.subject] and not other.got, "an unknown session: any replica, by the queue"
        assert s.homes == {"s_1": first.rid}
        for i in range(20):
            await s.call(SEND, cmd("s_1", str(i)))
        assert first.got == [SEND.subject] + [SEND.subject_at(first.rid)] * 20
        assert not other.got, "a session with a home: never the queue group"
        # a reply naming another runner (the turn runs there): the next send goes there
        first.home = other.rid
        await s.call(SEND, cmd("s_1", "moved"))
        assert s.homes == {"s_1": other.rid}
        await s.call(SEND, cmd("s_1", "there"))
        assert other.got == [SEND.subject_at(other.rid)]
        # a reply naming no home (a replay) keeps the one known, as does one naming no runner id
        for named in (None, "r_x.>", ""):
            other.home = named
            await s.call(SEND, cmd("s_1", "replayed"))
            assert s.homes == {"s_1": other.rid}, named

    run(nats_url, body)


def test_a_home_that_stopped_listening_sends_to_any_replica_at_once(nats_url: str) -> None:
    async def body(s: Services, a: Runner, b: Runner, peer: Any) -> None:
        s.homes["s_2"] = a.rid
        for sub in a.subs:
            await sub.unsubscribe()
        await peer.flush()
        # NATS says "no responders" at once: well within the send's own 30 s time-out, however
        # loaded the machine (no wait for that time-out, no retry pause on the home's subject)
        async with asyncio.timeout(SEND.timeout_s() / 3):
            got = await s.call(SEND, cmd("s_2", "after"))
        assert got.message_id == "m_after"
        assert b.got == [SEND.subject] and s.homes == {"s_2": b.rid}

    run(nats_url, body)


def test_a_home_that_does_not_answer_is_forgotten_and_a_refusal_keeps_it(nats_url: str) -> None:
    async def body(s: Services, a: Runner, b: Runner, peer: Any) -> None:
        s.homes["s_3"] = a.rid
        a.refuse = True
        with pytest.raises(NotFound):
            await s.call(SEND, cmd("s_3", "refused"))
        assert s.homes == {"s_3": a.rid}, "a refusal is the session's answer, from its home"
        a.refuse, a.hold, b.hold = False, True, True
        with pytest.raises(Unavailable):
            await s.call(QUICK_SEND, cmd("s_3", "held"))
        assert "s_3" not in s.homes, "a home that did not answer is not asked first again"
        a.hold = b.hold = False
        a.got.clear()
        b.got.clear()
        await s.call(SEND, cmd("s_3", "again"))
        assert a.got + b.got == [SEND.subject], "the next send: any replica"

    run(nats_url, body)


def test_a_late_home_s_request_goes_to_any_replica_too_under_its_one_transition_id(nats_url: str) -> None:
    """A home that holds a request (frozen, or dead a moment ago while a NATS route still claims
    its subject: no "no responders" comes back) does not hold the send for its 30 s time-out.
    After ``bus.HOME_PATIENCE_S`` the same request, with the transition id the gateway gave it,
    goes to any replica too (again each half ``HOME_PATIENCE_S``: the queue group may pick the
    late home itself), and the first answer is the send's. The runners' library makes the change once
    under that id (tests/redis/test_idempotent_library.py)."""
    async def body(s: Services, a: Runner, b: Runner, peer: Any) -> None:
        s.homes["s_5"] = a.rid
        a.hold = True
        t0 = asyncio.get_running_loop().time()
        async with asyncio.timeout(SEND.timeout_s() * 2 / 3):
            got = await s.call(SEND, cmd("s_5", "late"))
        took = asyncio.get_running_loop().time() - t0
        assert got.message_id == "m_late"
        assert b.got == [SEND.subject], b.got
        assert set(a.got) <= {SEND.subject_at(a.rid), SEND.subject}, a.got
        if a.got[:1] == [SEND.subject_at(a.rid)]:  # (NATS may answer "no responders" for a live subject, rarely)
            assert took >= bus.HOME_PATIENCE_S * 0.9, f"asked elsewhere after {took:.2f}s: the home was not given its time"
        assert len(set(a.txs + b.txs)) == 1 and str(b.txs[0]).startswith("x_"), "one transition id, the same to all"
        assert s.homes == {"s_5": b.rid}, "the replica that answered is the home now"
        # every request has its own id; one a caller gave is kept
        a.hold = False
        await s.call(SEND, cmd("s_5", "next"))
        await s.call(SEND, SendCmd(principal="p", sid="s_5", text="given", tx="x_mine"))
        assert b.txs[1] not in (None, b.txs[0]) and b.txs[2] == "x_mine", b.txs

    run(nats_url, body)


def test_a_home_that_cannot_take_a_request_hands_it_to_any_replica(nats_url: str) -> None:
    """A home that answers ``unavailable`` (shutting down, its Redis call unconfirmed) may have
    run nothing, or the change under the request's transition id: any replica runs it again
    under that id, and its answer is the send's."""
    async def body(s: Services, a: Runner, b: Runner, peer: Any) -> None:
        s.homes["s_6"] = a.rid

        async def down(msg: Msg) -> None:
            a.got.append(msg.subject)
            await msg.respond(bus.err(Unavailable("this turn-runner is shutting down; send again")))

        for sub in a.subs:
            await sub.unsubscribe()
        a.subs = [await peer.subscribe(SEND.subject_at(a.rid), cb=down)]
        await peer.flush()
        got = await s.call(SEND, cmd("s_6", "moved"))
        assert got.message_id == "m_moved" and b.got == [SEND.subject] and s.homes == {"s_6": b.rid}

    run(nats_url, body)


def test_a_request_without_a_transition_id_is_never_sent_to_a_second_replica(nats_url: str) -> None:
    """``bus.call_home`` of a request that has no ``tx`` (it could be made twice): a home that
    took it and does not answer is ``Unavailable``, and no other replica hears of it."""
    async def body(s: Services, a: Runner, b: Runner, peer: Any) -> None:
        a.hold = b.hold = True
        bare = cmd("s_7", "bare")
        assert bare.tx is None
        with pytest.raises(Unavailable):
            await bus.call_home(s.nc, SEND.subject, SEND.subject_at(a.rid), bare, SendResult, timeout=1.5)
        if a.got:
            assert a.got == [SEND.subject_at(a.rid)] and not b.got, (a.got, b.got)
        else:  # NATS said "no responders" (rarely, for a live subject): it reached nobody, so any replica
            assert b.got == [SEND.subject], b.got

    run(nats_url, body)


def test_the_homes_kept_are_bounded_oldest_learnt_first(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway_deps, "HOMES_KEPT", 3)

    async def body(s: Services, a: Runner, b: Runner, peer: Any) -> None:
        for sid in ("s_a", "s_b", "s_c", "s_d"):
            await s.call(SEND, cmd(sid, sid))
        assert list(s.homes) == ["s_b", "s_c", "s_d"]
        b.home = a.home = "r_x"  # s_b moves: learnt again, so it is the newest
        await s.call(SEND, cmd("s_b", "moved"))
        assert list(s.homes) == ["s_c", "s_d", "s_b"] and s.homes["s_b"] == "r_x"

    run(nats_url, body)


def test_a_reply_carries_the_home_its_own_handler_set_never_another_requests(nats_url: str) -> None:
    """``bus.HOME`` is per request: a service answers each in a task of its own."""
    from coxswain.service import Service

    class Echo(Service):
        name = "x-home"

    async def go() -> None:
        nc: Any = await connect_nats(nats_url, "home-serve", logs.get("test"))
        svc = Echo(Settings())
        svc._nc = nc  # its endpoints on this connection; nothing else of the service is started

        async def handler(req: SendCmd) -> SendResult:
            if req.text != "none":
                bus.set_home(req.text)
            await asyncio.sleep(0.01)  # the requests overlap
            return SendResult(message_id="m_1", disposition="started")

        await svc.add_endpoint("op", SendCmd, handler, subject="x.home.op", queue="")
        client = await nats.connect(nats_url)
        try:
            replies = await asyncio.gather(*(client.request("x.home.op", cmd("s", t).model_dump_json().encode(), 5)
                                             for t in ("r_1", "none", "r_2", "none")))
            assert [json.loads(m.data).get("home") for m in replies] == ["r_1", None, "r_2", None]
        finally:
            await client.close()
            await nc.close()

    uvloop.run(go())
