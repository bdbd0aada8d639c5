"""The fault drills, as tests: real servers, real signals, bounded in time (``-m faults``).

Each test repeats one drill of the fault-injection review and checks what the drill found
broken: a paused runner's late write, oversize events, idle event readers, a NATS outage under
queued messages, a Redis restart under writes, ``cox up`` losing a server. Measured times are
printed (run with ``-s``); the heaviest repetitions are marked ``long`` (``./dev test --long``).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.coxup import CoxUp, cox_up
from tests.support.logcheck import log_of, replay
from tests.support.runners import records
from tests.support.stack import OTHER_TOKEN, TOKEN, Api, Stack, script, stack_fixture

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
    # Pause while the writes are going (each turn takes 4 s or more): once every session the victim
    # holds has a file on disk. The runners' own log lines say who holds what and the disk what was
    # written: reading the event log over HTTP can lag on a loaded machine.
    folders = {sid: Path(api.session(sid)["workspace"]) / "d" / f"s{sids.index(sid)}" for sid in mine}
    deadline = time.monotonic() + 60
    while not all(f.is_dir() and any(f.iterdir()) for f in folders.values()):
        assert time.monotonic() < deadline, "the paused runner's sessions are writing"
        time.sleep(0.05)
    stack.pause(victim)
    t0 = time.monotonic()
    print(f"[faults] paused {t0 - t_start:.2f}s after the first send, holding {len(mine)} sessions")
    try:
        time.sleep(8.0)  # the pause: past the lease (5 s), so the others take over
    finally:
        since = len(stack.log(victim))
        stack.resume(victim)
    measured("pause.sigstop_s", time.monotonic() - t0)
    for sid in sids:
        api.wait_idle(sid, timeout=120)
    # Whatever the woken runner still had in hand has landed or never will: each drive it held has
    # ended (cancelled at its passed deadline, or told its lease is lost).
    ended = ("drive.cancelled", "drive.lease_lost", "drive.store_down", "drive.failed")
    deadline = time.monotonic() + 60
    while {r.get("sid") for r in records(stack, victim, since) if r.get("event") in ended} < set(mine):
        assert time.monotonic() < deadline, f"the woken runner's drives did not end:\n{stack.log(victim)[since:][-3000:]}"
        time.sleep(0.05)
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

# A message of about 1 MB is some 260,000 tokens: more than the script model's default window, so
# this stack gives it room (the drill is about what the log can record, not about compaction).
small = stack_fixture("faults-small", runners=1,
                      config='[approval]\ncommands = "allow"\n[model.script]\ncontext_window = 2000000\n')


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
        # The contract while a server comes back: 503 (retry it; a client_id makes it idempotent),
        # never a quiet failure. A runner's call on a connection the old server closed is retried
        # by the runner itself with its transition id (it may have run), so a 503 is rare here.
        sent: list[dict[str, Any]] = []
        retried = 0
        for i, sid in enumerate(sids):
            text = script({"tools": [{"name": "write_file", "args": {"path": f"after{j}.txt", "content": "a"}}
                                     for j in range(3)]}, {"text": "done"})
            for _ in range(5):
                r = api.send(sid, text, client_id=f"after-restart-{i}")
                if r.status_code != 503:
                    break
                retried += 1
                time.sleep(0.2)
            sent.append(ok(r))
        measured("redis_restart.sends_retried", retried)
        for sid, s in zip(sids, sent, strict=True):
            st = api.wait_type(sid, "turn.start", message_id=s["message_id"], timeout=30)
            api.wait_type(sid, "turn.end", turn_id=st["turn_id"], timeout=60)
        measured("redis_restart.writes_done_s", time.monotonic() - t0)
        bad = [e["output"] for sid in sids for e in log_of(api, sid) if e["type"] == "tool.result" and not e["ok"]]
        assert not bad, bad


# ---------------------------------------------------------------------------------------------
# 4. A slow event reader hurts only itself: 200 readers that never read, one session's big turn.

IDLE_READERS = 200
FILES = 10
FILE_BYTES = 60_000
STREAMS_CONFIG = '[approval]\ncommands = "allow"\n[gateway]\nmax_streams_per_principal = 250\n'

streams = stack_fixture("faults-streams", runners=2, config=STREAMS_CONFIG)


def idle_reader(port: int, sid: str, after: int = 0) -> socket.socket:
    """An SSE client that connects, asks, and never reads a byte (a 2 KB receive buffer)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET /v1/sessions/{sid}/events?after={after} HTTP/1.1\r\nHost: t\r\n"
              f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n".encode())
    return s


class SseReader(threading.Thread):
    """A normal SSE client: reads as fast as events come and notes each seq (and when)."""

    def __init__(self, url: str, sid: str, after: int, until: Callable[[dict[str, Any]], bool],
                 token: str = TOKEN) -> None:
        super().__init__(daemon=True)
        self.url, self.sid, self.after, self.until, self.token = url, sid, after, until, token
        self.seqs: list[int] = []
        self.done = threading.Event()
        self.error = ""
        self.statuses: list[int] = []

    def run(self) -> None:
        try:
            with httpx.stream("GET", f"{self.url}/v1/sessions/{self.sid}/events",
                              params={"after": self.after}, headers={"Authorization": f"Bearer {self.token}"},
                              timeout=httpx.Timeout(120, connect=10)) as r:
                self.statuses.append(r.status_code)
                if r.status_code != 200:
                    self.error = r.read().decode()
                    return
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        ev = json.loads(line[6:])
                        self.seqs.append(int(ev["seq"]))
                        if self.until(ev):
                            return
        except Exception as exc:  # noqa: BLE001 - the test reports it
            self.error = repr(exc)
        finally:
            self.done.set()


class Sampler(threading.Thread):
    """/healthz statuses and the gateway's RSS, every 0.2 s, until stopped."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.stop = threading.Event()
        self.health: list[int] = []
        self.unhealthy: list[str] = []
        """What each answer other than 200 said (which service failed, and how)."""
        self.rss: list[int] = []

    def run(self) -> None:
        gw = psutil.Process(self.stack.procs["gateway"].pid)
        while not self.stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.rss.append(gw.memory_info().rss)
            try:
                r = httpx.get(self.stack.url + "/healthz", timeout=5)
                self.health.append(r.status_code)
                if r.status_code != 200:
                    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
                    failed = {k: v for k, v in body.get("services", {}).items() if not v.get("ok")}
                    self.unhealthy.append(f"{r.status_code} {failed or r.text[:300]}")
            except httpx.HTTPError as exc:
                self.health.append(0)
                self.unhealthy.append(repr(exc))
            self.stop.wait(0.2)


def metric(stack: Stack, name: str) -> float:
    text = httpx.get(stack.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and (line[len(name)] in " {"))


def small_turn(api: Api, sid: str, text: str) -> float:
    """Seconds from sending ``text`` to ``sid`` to its turn's end, as the client sees them."""
    t0 = time.monotonic()
    sent = ok(api.send(sid, text))
    st = api.wait_type(sid, "turn.start", message_id=sent["message_id"], timeout=60)
    api.wait_type(sid, "turn.end", turn_id=st["turn_id"], timeout=60)
    return time.monotonic() - t0


def test_readers_that_never_read_are_dropped_and_hurt_no_one_else(streams: Stack) -> None:
    with streams.client(timeout=60) as api:
        sid = api.create("streams-big")["id"]
        other = api.create("streams-other")["id"]
        ws = Path(api.session(sid)["workspace"])
        ws.mkdir(parents=True, exist_ok=True)
        for i in range(FILES):
            (ws / f"big{i}.txt").write_text((f"line {i} " + "x" * 90 + "\n") * (FILE_BYTES // 100))
        # The floor, in the same run: a small turn of the other session before the slow readers.
        floor_s = small_turn(api, other, "a small turn first")
        measured("streams.other_session_turn_alone_s", floor_s)
        before = metric(streams, "cox_event_streams")
        base_rss = psutil.Process(streams.procs["gateway"].pid).memory_info().rss / 2**20
        measured("streams.gateway_rss_before_mb", base_rss)
        idle = [idle_reader(streams.port, sid) for _ in range(IDLE_READERS)]
        try:
            t0 = time.monotonic()
            while metric(streams, "cox_event_streams") < before + IDLE_READERS:
                assert time.monotonic() - t0 < 30, "the idle readers' streams are open"
                time.sleep(0.2)
            sampler = Sampler(streams)
            sampler.start()
            start = api.session(sid)["last_seq"]
            reader = SseReader(streams.url, sid, start, lambda e: e["type"] == "turn.end")
            reader.start()
            t_open = time.monotonic()
            while metric(streams, "cox_event_streams") < before + IDLE_READERS + 1:
                assert time.monotonic() - t_open < 30, "the normal reader's stream is open"
                time.sleep(0.05)
            t_send = time.monotonic()
            ok(api.send(sid, script(
                {"tools": [{"name": "read_file", "args": {"path": f"big{i}.txt"}} for i in range(FILES)]},
                {"text": "read them all"})))
            api.wait_type(sid, "tool.call", after=start, timeout=30)  # the big turn is under way: now another's
            other_s = small_turn(api, other, "a small turn")
            measured("streams.other_session_turn_s", other_s)
            assert reader.done.wait(60), f"the normal reader got {len(reader.seqs)} events, then nothing"
            reader_s = time.monotonic() - t_send
            measured("streams.normal_reader_all_s", reader_s)
            # Idle readers are dropped: their buffer overflowed, or their socket stalled a send.
            t1 = time.monotonic()
            while metric(streams, "cox_event_streams_dropped_total") < IDLE_READERS * 0.9:
                if time.monotonic() - t1 > 40:
                    break
                time.sleep(0.5)
            measured("streams.drops_after_turn_s", time.monotonic() - t1)
            sampler.stop.set()
            sampler.join(10)
            # A dropped reader's connection is closed (aborted): reading it ends, at once.
            closed = 0
            for s in idle[:5]:
                s.settimeout(5)
                with contextlib.suppress(ConnectionResetError):
                    while s.recv(65536):
                        pass
                closed += 1
            assert closed == 5
        finally:
            for s in idle:
                s.close()
        assert not reader.error, reader.error
        evs = api.all_events(sid)
        end = next(e["seq"] for e in evs if e["type"] == "turn.end" and e["seq"] > start)
        want = [e["seq"] for e in evs if start < e["seq"] <= end]
        assert reader.seqs == want, (f"the normal reader got {len(reader.seqs)} events "
                                     f"{reader.seqs[:3]}..{reader.seqs[-3:]}, want {want[0]}..{want[-1]}")
        assert reader_s < 20, f"the normal reader had every event {reader_s:.1f}s after the send"
        # Not held up by the slow readers: within 3 s, or, on a machine busy with more than this
        # test (CI runs lanes side by side), within 10 times the same turn alone a moment before.
        assert other_s < max(3.0, 10 * floor_s), (f"another session's turn took {other_s:.1f}s "
                                                  f"({floor_s:.2f}s alone before the slow readers)")
        bad = [h for h in sampler.health if h != 200]
        assert not bad, f"/healthz answered {bad} ({len(bad)} of {len(sampler.health)}): {sampler.unhealthy}"
        peak = max(sampler.rss) / 2**20
        measured("streams.gateway_rss_peak_mb", peak)
        assert peak < base_rss + 200, f"the gateway's RSS reached {peak:.0f} MB (from {base_rss:.0f} MB)"
        dropped = metric(streams, "cox_event_streams_dropped_total")
        measured("streams.dropped", dropped)
        assert dropped >= IDLE_READERS * 0.9, f"only {dropped} of {IDLE_READERS} idle readers were dropped"
        logged = [r for r in records(streams, "gateway") if r.get("event") == "stream.dropped"]
        assert len(logged) >= IDLE_READERS * 0.9, f"{len(logged)} stream.dropped lines in the gateway's log"
        # Nothing of the idle readers is left: every stream and session subscription is closed.
        t2 = time.monotonic()
        while metric(streams, "cox_event_streams") > before or metric(streams, "cox_event_subscriptions") > 0:
            assert time.monotonic() - t2 < 20, "the dropped streams are closed"
            time.sleep(0.2)


def test_a_principal_has_at_most_max_streams_per_principal(streams: Stack) -> None:
    limit = 250
    with streams.client(timeout=60) as api, streams.client(token=OTHER_TOKEN) as other:
        sid = api.create("streams-limit")["id"]
        socks = [idle_reader(streams.port, sid) for _ in range(limit)]
        try:
            t0 = time.monotonic()
            while metric(streams, "cox_event_streams") < limit:
                assert time.monotonic() - t0 < 30, "the readers' streams are open"
                time.sleep(0.2)
            r = api.http.get(f"/v1/sessions/{sid}/events", params={"after": 0})
            assert r.status_code == 429, r.text[:300]
            assert r.json()["error"] == "too_many_streams" and str(limit) in r.json()["detail"], r.text
            r = api.http.get(f"/v1/sessions/{sid}/events", params={"format": "json", "wait": 1})
            assert r.status_code == 429 and r.json()["error"] == "too_many_streams", r.text[:300]
            assert api.http.get(f"/v1/sessions/{sid}/events", params={"format": "json"}).status_code == 200
            # another principal is not limited by this one's streams
            osid = other.create("streams-limit-other")["id"]
            with other.http.stream("GET", f"/v1/sessions/{osid}/events") as r2:
                assert r2.status_code == 200
        finally:
            for s in socks[:10]:
                s.close()
        # a closed stream gives its place back
        t1 = time.monotonic()
        while True:
            r = api.http.get(f"/v1/sessions/{sid}/events", params={"format": "json", "wait": 0.1})
            if r.status_code == 200:
                break
            assert time.monotonic() - t1 < 20, r.text
            time.sleep(0.2)
        for s in socks[10:]:
            s.close()


# ---------------------------------------------------------------------------------------------
# 6. cox up restarts the NATS and Redis servers it started: same port, data and credentials.

def listen_port(p: psutil.Process) -> int:
    ports: list[int] = [c.laddr.port for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    assert ports, f"{p.name()} listens on no port"
    return min(ports)


def server_child(up: CoxUp, binary: str) -> psutil.Process | None:
    assert up.proc is not None
    for p in psutil.Process(up.proc.pid).children():
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and p.name() == binary:
                return p
    return None


def test_cox_up_restarts_its_nats_and_redis_killed_with_sigkill(tmp_path: Path) -> None:
    with cox_up(tmp_path / "up", runners=1) as up, up.client() as api:
        sid = api.create("servers")["id"]
        # A turn that runs through the kill, and a message queued behind it: both answered 202.
        first = ok(api.send(sid, script({"delay_ms": 4000, "text": "slow"}, {"text": "first done"})))
        api.wait_type(sid, "turn.start", message_id=first["message_id"], timeout=30)
        queued = ok(api.send(sid, script({"tools": [{"name": "write_file", "args": {"path": "q.txt", "content": "q"}}]},
                                         {"text": "queued done"}), mode="queue"))
        assert queued["disposition"] == "queued", queued
        old = {b: server_child(up, b) for b in ("redis-server", "nats-server")}
        ports = {b: listen_port(p) for b, p in old.items() if p is not None}
        assert len(ports) == 2, old
        pids = {b: p.pid for b, p in old.items() if p is not None}
        for p in old.values():
            assert p is not None
            p.kill()
        t0 = time.monotonic()
        back: dict[str, float] = {}
        while len(back) < 2:
            assert time.monotonic() - t0 < 30, f"not restarted within 30 s: {set(ports) - set(back)}"
            for b, port in ports.items():
                p = server_child(up, b)
                if b not in back and p is not None and p.pid != pids[b]:
                    with contextlib.suppress(AssertionError, psutil.Error):
                        if listen_port(p) == port:
                            back[b] = time.monotonic() - t0
            time.sleep(0.05)
        for b, s in back.items():
            measured(f"cox_up.{b}_back_s", s)
        said = {r["server"]: r for r in up.said() if r.get("event") == "server.restarted"}
        assert set(said) == {"nats", "redis"}, up.said()[-10:]
        assert said["redis"]["port"] == ports["redis-server"] and said["nats"]["port"] == ports["nats-server"]
        assert any(r.get("event") == "server.exited" and r.get("code") == -9 for r in up.said())
        # What was answered 202 before the kill runs; a send after it works.
        qs = api.wait_type(sid, "turn.start", message_id=queued["message_id"], timeout=60)
        end = api.wait_type(sid, "turn.end", turn_id=qs["turn_id"], timeout=60)
        assert end["outcome"] == "completed", end
        measured("cox_up.queued_done_after_kill_s", time.monotonic() - t0)
        assert (up.root / "servers" / "q.txt").read_text() == "q"
        after = ok(api.send(sid, "after the restart"))
        st = api.wait_type(sid, "turn.start", message_id=after["message_id"], timeout=30)
        assert api.wait_type(sid, "turn.end", turn_id=st["turn_id"], timeout=30)["outcome"] == "completed"
        measured("cox_up.send_after_done_s", time.monotonic() - t0)
