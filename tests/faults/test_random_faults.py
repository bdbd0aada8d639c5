"""A seeded random-fault drill: several runners, several sessions, a random mix of every
person's action, with runners killed (-9) and Redis and NATS restarted at random points; then
every request the API accepted is checked against its session's log: once, in order, nothing
lost (``-m faults``).

The seed is printed; ``COX_FAULT_SEED`` sets it (default fixed, for CI). It fixes the sequence of
actions and of faults (which, and when); where a fault lands in a turn still depends on timing,
which is the point. Every request carries a ``client_id`` where the API takes one, and is sent
again with it after a 503 or a broken connection (the documented contract while a server comes
back), so each accepted request has exactly one reply the client knows.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.logcheck import check_accepted, log_of, replay
from tests.support.runners import respawn
from tests.support.stack import Api, Stack, script, stack_fixture

pytestmark = pytest.mark.faults

SEED = int(os.environ.get("COX_FAULT_SEED", "2022"))
RUNNERS = 3
SESSIONS = 4
ACTIONS = int(os.environ.get("COX_FAULT_ACTIONS", "60"))
"""At least this many actions; they go on until the last fault has healed."""
FAULTS = ("kill", "kill", "kill", "redis", "nats")
"""The faults of one run (their order and times come from the seed)."""
CHAOS_S = 25.0
"""The faults fall within this many seconds of the first action."""
RETRY_S = 60.0
"""How long a request is sent again (503, a broken connection) before the test gives up."""

stack = stack_fixture("random-faults", runners=RUNNERS, lease_ms=2000)


def message(kind: str, label: str) -> str:
    """A message whose turn is short, slow (a few seconds), asks the person, or has boundaries."""
    if kind == "quick":
        return f"{label}\nhello"
    if kind == "tools":
        return script({"tools": [{"name": "run_command", "args": {"command": f"echo {label}"}},
                                 {"name": "write_file", "args": {"path": f"{label}.txt", "content": label}}]},
                      {"text": f"{label} done"}, text=label)
    if kind == "stream":
        return script({"text": f"{label} " * 20, "delay_ms": 2500}, text=label)
    if kind == "command":
        return script({"tools": [{"name": "run_command", "args": {"command": "sleep 2"}}]},
                      {"text": f"{label} slept"}, text=label)
    if kind == "approval":
        return script({"tools": [{"name": "write_file", "args": {"path": "Makefile", "content": f"{label}:\n"}}]},
                      {"text": f"{label} asked"}, text=label)
    assert kind == "ticks"
    return script(*({"tools": [{"name": "respond", "args": {"text": f"{label} tick {i}"}}], "delay_ms": 300}
                    for i in range(8)), {"text": f"{label} ticked"}, text=label)


KINDS = ("quick", "tools", "stream", "command", "approval", "ticks")


@dataclass
class Record:
    """What the client was told about one session, in the order it was told."""

    sid: str
    replies: list[dict[str, Any]] = field(default_factory=list)
    """202 replies of sends, each with its ``mode``"""
    leads: list[str] = field(default_factory=list)
    stops: list[dict[str, Any]] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)
    """approval_id -> decision, for each answer the API took (200)"""
    removed: list[str] = field(default_factory=list)
    """queued messages a removal was answered 200 for"""


class Client:
    """HTTP with the retry a client makes while a server comes back: a 503 or a broken
    connection is sent again (same body, same ``client_id``) until it is answered otherwise."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.retries = 0
        self.unexpected: list[str] = []

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        deadline = time.monotonic() + RETRY_S
        while True:
            try:
                r = self.api.http.request(method, path, json=body, timeout=20)
                if r.status_code != 503:
                    if r.status_code >= 500:
                        self.unexpected.append(f"{method} {path} {body}: {r.status_code} {r.text[:300]}")
                    return r
            except httpx.TransportError:
                pass
            self.retries += 1
            assert time.monotonic() < deadline, f"{method} {path} unanswered for {RETRY_S}s"
            time.sleep(0.2)


class Faults:
    """Injects :data:`FAULTS` at seeded times; every fault is healed before the next one.

    Runs in the test's own thread: a process is started with PR_SET_PDEATHSIG
    (``die_with_parent``), which fires when the *thread* that started it ends, so a server or
    runner restarted from a helper thread would be killed when that thread finished."""

    def __init__(self, stack: Stack, rng: random.Random) -> None:
        self.stack = stack
        self.plan = sorted(zip((rng.uniform(1.0, CHAOS_S) for _ in FAULTS), rng.sample(FAULTS, len(FAULTS)),
                               strict=True))
        self.down = [rng.uniform(0.3, 3.0) for _ in FAULTS]
        """A Redis down longer than the lease (2 s) makes every holder fence itself: crashed turns."""
        kills = iter(rng.sample(range(RUNNERS), RUNNERS) * len(FAULTS))
        self.victims = [next(kills) if what == "kill" else -1 for _, what in self.plan]
        self.done: list[str] = []

    def run(self, t0: float) -> None:
        for (at, what), down, victim in zip(self.plan, self.down, self.victims, strict=True):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if what == "kill":
                name = self.stack.runner_names()[victim]
                self.stack.kill(name)
                time.sleep(down)
                respawn(self.stack, name)
            else:
                server = self.stack.redis if what == "redis" else self.stack.nats
                server.kill()
                time.sleep(down)
                server.start()
            self.done.append(f"{what}{f' turn-runner-{victim + 1}' if what == 'kill' else ''} at {at:.1f}s"
                             f" down {down:.1f}s")


class Person(threading.Thread):
    """The seeded sequence of actions on the sessions, one request at a time."""

    def __init__(self, c: Client, recs: list[Record], rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.c, self.recs, self.rng = c, recs, rng
        self.counts: dict[str, int] = {}
        self.error: BaseException | None = None
        self.enough = threading.Event()
        self.n = 0

    def run(self) -> None:
        try:
            while self.n < ACTIONS or not self.enough.is_set():
                self.n += 1
                self.act(self.n)
                time.sleep(self.rng.uniform(0.0, 0.5))  # a person's pace, not a synchronisation
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.error = exc

    def act(self, n: int) -> None:
        rng, c = self.rng, self.c
        rec = rng.choice(self.recs)
        action = rng.choices(["send", "queue", "steer", "lead", "stop", "answer", "edit"], [4, 6, 2, 3, 1, 3, 4])[0]
        label = f"m{n}"
        base = f"/v1/sessions/{rec.sid}"
        if action in ("send", "queue", "steer"):
            body: dict[str, Any] = {"text": message(rng.choice(KINDS), label), "client_id": f"c{n}"}
            if action != "send":
                body["mode"] = action
            r = c.call("POST", base + "/messages", body)
            assert r.status_code in (202, 409), r.text
            if r.status_code == 202:
                rec.replies.append({**r.json(), "mode": body.get("mode")})
            else:
                assert r.json()["error"] == "busy", r.text
        elif action == "lead":
            text = message("ticks", label) if rng.random() < 0.3 else f"{label}: lead"
            r = c.call("POST", base + "/lead", {"text": text, "client_id": f"c{n}"})
            assert r.status_code in (202, 409, 429), r.text
            if r.status_code == 202:
                rec.leads.append(r.json()["lead_id"])
            else:
                assert r.json()["error"] in ("no_turn", "lead_closed", "too_many_pending"), r.text
        elif action == "edit":
            view = c.call("GET", base)
            assert view.status_code == 200, view.text
            queued = [q["message_id"] for q in view.json()["queue"] if q["mode"] == "queue"]
            if not queued:
                action = "edit (none queued)"
            elif rng.random() < 0.5:
                action = "remove"
                mid = rng.choice(queued)
                r = c.call("DELETE", f"{base}/queue/{mid}")
                assert r.status_code in (200, 409), r.text
                if r.status_code == 200:
                    assert r.json()["removed"] == mid, r.text
                    rec.removed.append(mid)
                else:
                    assert r.json()["error"] == "not_queued", r.text  # it started meanwhile
            else:
                action = "reorder"
                r = c.call("PUT", f"{base}/queue/order", {"message_ids": queued[::-1]})
                assert r.status_code in (200, 409), r.text
                if r.status_code == 409:
                    assert r.json()["error"] == "not_queued", r.text  # the queue moved on meanwhile
        elif action == "stop":
            r = c.call("POST", base + "/stop")
            assert r.status_code == 200, r.text
            rec.stops.append(r.json())
        else:
            view = c.call("GET", base)
            assert view.status_code == 200, view.text
            pending = view.json()["approvals"]
            decision = rng.choice(["allow", "deny"])
            if not pending:
                action = "answer (none pending)"
            else:
                aid = pending[0]["approval_id"]
                r = c.call("POST", f"{base}/approvals/{aid}", {"decision": decision})
                assert r.status_code in (200, 409), r.text
                if r.status_code == 200:
                    rec.answers[aid] = decision
                else:
                    assert r.json()["error"] == "resolved", r.text
        self.counts[action] = self.counts.get(action, 0) + 1


def test_random_actions_under_random_faults_lose_nothing(stack: Stack) -> None:
    print(f"[random-faults] seed {SEED} (COX_FAULT_SEED), {ACTIONS} actions, faults {FAULTS}")
    with stack.client(timeout=20) as api:
        c = Client(api)
        recs = [Record(api.create(f"chaos-{SEED}-{i}")["id"]) for i in range(SESSIONS)]
        faults = Faults(stack, random.Random(SEED + 1))
        person = Person(c, recs, random.Random(SEED))
        t0 = time.monotonic()
        person.start()
        try:
            faults.run(t0)
            time.sleep(2.0)  # a few actions on the healed system too (pace, not synchronisation)
        finally:
            person.enough.set()
        person.join(RETRY_S * 3)
        chaos_s = time.monotonic() - t0
        assert not person.is_alive(), "the person's actions did not end"
        if person.error is not None:
            raise person.error
        stack.wait_healthy(60)
        drained = drain(c, recs)
        print(f"[random-faults] {person.n} actions {person.counts}; faults {faults.done}; {c.retries} retries; chaos {chaos_s:.1f}s, "
              f"drained {drained:.1f}s later")
        for rec in recs:
            check_session(api, rec)
        assert not c.unexpected, c.unexpected


def drain(c: Client, recs: list[Record], timeout: float = 120.0) -> float:
    """Answer what still asks (allow) until every session is idle with nothing waiting."""
    t0 = time.monotonic()
    left = list(recs)
    while left:
        assert time.monotonic() - t0 < timeout, f"sessions still busy: {[r.sid for r in left]}"
        for rec in list(left):
            view = c.call("GET", f"/v1/sessions/{rec.sid}").json()
            for a in view["approvals"]:
                r = c.call("POST", f"/v1/sessions/{rec.sid}/approvals/{a['approval_id']}", {"decision": "allow"})
                if r.status_code == 200:
                    rec.answers[a["approval_id"]] = "allow"
            if not view["busy"] and not view["queue"]:
                left.remove(rec)
        time.sleep(0.2)
    return time.monotonic() - t0


def check_session(api: Api, rec: Record) -> None:
    """The log against what the client was told: every accepted message once, in the order it was
    accepted, run, discarded or removed (a removal answered 200 recorded once); every accepted Lead saved once, in order, then applied or
    unapplied once; every answer taken recorded once; every Stop's discards recorded."""
    evs = log_of(api, rec.sid, timeout=60)
    where = f"session {rec.sid} (seed {SEED})"
    try:
        r = replay(evs)
        check_accepted(r, rec.replies)
    except AssertionError as exc:
        raise AssertionError(f"{where}: {exc}") from exc
    removed = [e["message_id"] for e in evs if e["type"] == "queue.removed"]
    assert [m for m in removed if m in rec.removed] == rec.removed, (
        f"{where}: removals answered {rec.removed}, the log removed {removed}")
    saved = [e["lead_id"] for e in evs if e["type"] == "lead.saved"]
    assert saved == rec.leads, f"{where}: Leads saved {saved}, accepted {rec.leads}"
    fates: dict[str, list[str]] = {}
    for e in evs:
        if e["type"] in ("lead.applied", "lead.unapplied"):
            for lid in e["lead_ids"]:
                fates.setdefault(lid, []).append(e["type"])
    for lid in rec.leads:
        assert len(fates.get(lid, [])) == 1, f"{where}: Lead {lid} ended {fates.get(lid)}"
    resolved: dict[str, list[dict[str, Any]]] = {}
    for e in evs:
        if e["type"] == "approval.resolved":
            resolved.setdefault(e["approval_id"], []).append(e)
    for aid, decision in rec.answers.items():
        got = resolved.get(aid, [])
        assert len(got) == 1 and got[0]["actor"] == "person" and got[0]["decision"] == decision, (
            f"{where}: answered {aid} {decision}, the log has {got}")
    assert all(len(v) == 1 for v in resolved.values()), f"{where}: an approval resolved twice"
    reported = [s["discarded"] for s in rec.stops if s["discarded"]]
    it = iter(r.discarded)
    assert all(batch in it for batch in reported), f"{where}: Stops discarded {reported}, the log {r.discarded}"
    for s in rec.stops:
        if s["turn_id"]:
            assert r.ends.get(s["turn_id"]) in ("stopped", "crashed"), (
                f"{where}: Stop answered for {s['turn_id']}, which ended {r.ends.get(s['turn_id'])}")
