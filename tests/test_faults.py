"""The fault drills, as tests: real servers, real signals, bounded in time (``-m faults``).

Each test repeats one drill of the fault-injection review and checks what the drill found
broken: a paused runner's late write, oversize events, idle event readers, a NATS outage under
queued messages, a Redis restart under writes, ``cox up`` losing a server. Measured times are
printed (run with ``-s``); the heaviest repetitions are marked ``long`` (``./dev test --long``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from .logcheck import log_of, replay
from .runners import records
from .stack import Api, Stack, script, stack_fixture

pytestmark = pytest.mark.faults

TIMES: dict[str, list[float]] = {}


def measured(name: str, value: float) -> None:
    TIMES.setdefault(name, []).append(value)
    print(f"[faults] {name}: {value:.2f}")


def ok(r: Any, status: int = 202) -> dict[str, Any]:
    assert r.status_code == status, r.text
    return dict(r.json())


# ---------------------------------------------------------------------------------------------
# 1. A runner paused past its lease writes nothing once the lease has passed on.

PAUSE_LEASE_MS = 5000
SESSIONS = 20
WRITES = 100
REWRITES = 30

paused = stack_fixture("faults-pause", runners=2, lease_ms=PAUSE_LEASE_MS)


def _writes(i: int, prefix: str, n: int, delay_ms: int = 0) -> str:
    steps = [{"tools": [{"name": "write_file", "args": {"path": f"d/s{i}/w{j}.txt", "content": f"{prefix}-{j}"}}],
              "delay_ms": delay_ms} for j in range(n)]
    return script(*steps, {"text": f"{prefix} done"}, text=f"{prefix} writes")


def disk_vs_log(api: Api, sid: str, folder: Path) -> list[str]:
    """Where the folder and the log disagree: a file whose content is not the last successful
    write the log records for it, a file the log never wrote, a temp file left behind."""
    evs = log_of(api, sid)
    args = {e["call_id"]: e["args"] for e in evs if e["type"] == "tool.call" and e["name"] == "write_file"}
    last: dict[str, str] = {}
    for e in evs:
        if e["type"] == "tool.result" and e["ok"] and e["call_id"] in args:
            a = args[e["call_id"]]
            last[a["path"]] = a["content"]
    ws = Path(api.session(sid)["workspace"])
    problems = []
    for f in sorted(folder.rglob("*")) if folder.exists() else []:
        if not f.is_file():
            continue
        rel = f.relative_to(ws).as_posix()
        if f.name.startswith("."):
            problems.append(f"{rel}: a temporary file was left behind")
            continue
        got = f.read_text()
        if rel not in last:
            problems.append(f"{rel} holds {got!r} but the log records no successful write of it")
        elif got != last[rel]:
            problems.append(f"{rel} holds {got!r} but the log's last successful write says {last[rel]!r}")
    for rel in last:
        if not (ws / rel).exists():
            problems.append(f"{rel}: the log says it was written but it does not exist")
    return problems


def holders(stack: Stack, sids: list[str], timeout: float = 30.0) -> dict[str, str]:
    """The runner instance that began a turn of each session (from the runners' JSON logs)."""
    deadline = time.monotonic() + timeout
    found: dict[str, str] = {}
    while time.monotonic() < deadline:
        for name in stack.runner_names():
            for rec in records(stack, name):
                if rec.get("event") == "turn.begin" and rec.get("sid") in sids:
                    found.setdefault(rec["sid"], name)
        if len(found) == len(sids):
            return found
        time.sleep(0.05)
    raise AssertionError(f"no turn.begin logged for {set(sids) - set(found)}")


def pause_trial(stack: Stack, api: Api, trial: int) -> None:
    t_start = time.monotonic()
    sids = [api.create(f"pause-{trial}-{i}")["id"] for i in range(SESSIONS)]
    for i, sid in enumerate(sids):
        ok(api.send(sid, _writes(i, "stale", WRITES, delay_ms=40)))
    for i, sid in enumerate(sids):
        ok(api.send(sid, _writes(i, "NEW", REWRITES), mode="queue"))
    held = holders(stack, sids)
    victim = max(stack.runner_names(), key=lambda n: sum(1 for h in held.values() if h == n))
    mine = [sid for sid in sids if held[sid] == victim]
    # Pause while the writes are going (each turn takes 4 s or more). The runners' own log lines
    # say who holds what: reading the event log over HTTP can lag on a loaded machine.
    time.sleep(1.0)
    stack.signal(victim, signal.SIGSTOP)
    t0 = time.monotonic()
    print(f"[faults] paused {t0 - t_start:.2f}s after the first send, holding {len(mine)} sessions")
    try:
        time.sleep(8.0)
    finally:
        stack.signal(victim, signal.SIGCONT)
    measured("pause.sigstop_s", time.monotonic() - t0)
    for sid in sids:
        api.wait_idle(sid, timeout=120)
    time.sleep(1.0)  # whatever the woken runner still had in hand has landed by now (or never will)
    problems: dict[str, list[str]] = {}
    crashed = 0
    for i, sid in enumerate(sids):
        evs = log_of(api, sid)
        r = replay(evs)
        crashed += sum(1 for o in r.ends.values() if o == "crashed")
        found = disk_vs_log(api, sid, Path(api.session(sid)["workspace"]) / "d" / f"s{i}")
        if found:
            problems[sid] = found
    print(f"[faults] pause trial {trial}: {len(mine)} sessions on the paused runner, {crashed} turns crashed, "
          f"{len(problems)} sessions where disk and log disagree")
    assert crashed >= 1, "the pause was past the lease: the paused runner's turns end crashed"
    assert not problems, problems


@pytest.mark.parametrize("trial", range(3))
def test_paused_runner_writes_nothing_after_the_takeover(paused: Stack, trial: int) -> None:
    with paused.client(timeout=60) as api:
        pause_trial(paused, api, trial)


@pytest.mark.long
@pytest.mark.parametrize("trial", range(3, 13))
def test_paused_runner_writes_nothing_after_the_takeover_repeated(paused: Stack, trial: int) -> None:
    with paused.client(timeout=60) as api:
        pause_trial(paused, api, trial)


# ---------------------------------------------------------------------------------------------
# 3. Whatever is answered 202 can be recorded: size limits before acceptance.

small = stack_fixture("faults-small", runners=1, config='[approval]\ncommands = "allow"\n')


def test_a_message_at_the_recordable_limit_runs_and_one_over_is_413(small: Stack) -> None:
    from coxswain.events import MAX_TEXT_BYTES

    with small.client(timeout=60) as api:
        sid = api.create("size")["id"]
        for text in ("/" * 600_000, "a" * 1_048_400, "a" * (MAX_TEXT_BYTES + 1),
                     "/" * (MAX_TEXT_BYTES // 2) + "a"):
            r = api.send(sid, text)
            assert r.status_code == 413, (len(text), r.status_code, r.text[:300])
            assert r.json()["error"] == "too_large" and str(MAX_TEXT_BYTES) in r.json()["detail"], r.text
        assert api.session(sid)["busy"] is False, "nothing was accepted"
        for text in ("a" * MAX_TEXT_BYTES, "/" * (MAX_TEXT_BYTES // 2)):
            t0 = time.monotonic()
            sent = ok(api.send(sid, text))
            start = api.wait_type(sid, "turn.start", message_id=sent["message_id"], timeout=60)
            end = api.wait_type(sid, "turn.end", turn_id=start["turn_id"], timeout=60)
            measured("size.at_limit_turn_s", time.monotonic() - t0)
            assert end["outcome"] == "completed", end
            user = [e for e in log_of(api, sid) if e["type"] == "user.msg" and e["message_id"] == sent["message_id"]]
            assert len(user) == 1 and user[0]["text"] == text, "the whole text is in the log"
        # the log goes on: the next message runs
        nxt = ok(api.send(sid, "after the large ones"))
        st = api.wait_type(sid, "turn.start", message_id=nxt["message_id"], timeout=30)
        assert api.wait_type(sid, "turn.end", turn_id=st["turn_id"], timeout=30)["outcome"] == "completed"


# ---------------------------------------------------------------------------------------------
# 6. A cut command output counts what was cut, in the unit it names.

def test_a_cut_command_output_counts_the_bytes_not_shown(small: Stack) -> None:
    total = 1_224_895
    with small.client(timeout=60) as api:
        sid = api.create("cut")["id"]
        sent = ok(api.send(sid, script({"tools": [{"name": "run_command",
                                                   "args": {"command": f"head -c {total} /dev/zero | tr '\\0' x"}}]},
                                       {"text": "done"})))
        start = api.wait_type(sid, "turn.start", message_id=sent["message_id"], timeout=30)
        api.wait_type(sid, "turn.end", turn_id=start["turn_id"], timeout=60)
        res = next(e for e in log_of(api, sid) if e["type"] == "tool.result")
        head, body = res["output"].split("\n", 1)
        assert head == "exit code 0", head
        shown = body.count("x")
        note = body.rsplit("\n", 1)[-1]
        assert note == f"[... {total - shown} more bytes of output not shown ({total} in all)]", note


# ---------------------------------------------------------------------------------------------
# 2. After Redis dies and comes back, writes work again by themselves, within seconds.

def test_writes_from_12_sessions_after_redis_is_killed_and_restarted(small: Stack) -> None:
    with small.client(timeout=60) as api:
        sids = [api.create(f"redis-{i}")["id"] for i in range(12)]
        for sid in sids:  # every service has pooled connections to the old server
            st = api.wait_type(sid, "turn.start", message_id=ok(api.send(sid, script(
                {"tools": [{"name": "write_file", "args": {"path": "before.txt", "content": "b"}}]},
                {"text": "done"})))["message_id"])
            api.wait_type(sid, "turn.end", turn_id=st["turn_id"], timeout=30)
        small.redis.kill()
        small.redis.start()
        t0 = time.monotonic()
        while True:  # the API answers again (the gateway retries its reads)
            r = api.http.get(f"/v1/sessions/{sids[0]}")
            if r.status_code == 200:
                break
            assert time.monotonic() - t0 < 30, r.text
            time.sleep(0.1)
        sent = [ok(api.send(sid, script(
            {"tools": [{"name": "write_file", "args": {"path": f"after{j}.txt", "content": "a"}} for j in range(3)]},
            {"text": "done"}))) for sid in sids]
        for sid, s in zip(sids, sent, strict=True):
            st = api.wait_type(sid, "turn.start", message_id=s["message_id"], timeout=30)
            api.wait_type(sid, "turn.end", turn_id=st["turn_id"], timeout=60)
        measured("redis_restart.writes_done_s", time.monotonic() - t0)
        bad = [e["output"] for sid in sids for e in log_of(api, sid) if e["type"] == "tool.result" and not e["ok"]]
        assert not bad, bad
