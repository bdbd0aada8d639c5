"""``cox up`` as a user runs it: ready line, the printed curl, restarts, and a clean SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from cox.servers import free_port
from tests.support.stack import Api


def _start(tmp: Path, *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COX_", "NATS_URL", "REDIS_URL"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cox", "up", *args], cwd=tmp, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:  # closed at cox up's end of output, not by the garbage collector
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))

    def drain() -> None:
        assert proc.stderr is not None
        with proc.stderr:
            proc.stderr.read()

    threading.Thread(target=pump, daemon=True).start()
    threading.Thread(target=drain, daemon=True).start()
    return proc, lines


def _sid_in(curl: str) -> str:
    """The session id in the example curl ``cox up`` prints."""
    m = re.search(r"/v1/sessions/([A-Za-z0-9_-]+)/messages", curl)
    assert m, f"no session in {curl!r}"
    return m.group(1)


def _wait_line(lines: list[str], prefix: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in lines:
            if line.startswith(prefix):
                return line
        time.sleep(0.05)
    raise AssertionError(f"no {prefix!r} line within {timeout}s; got {lines}")


def test_cox_up_runs_the_printed_curl_restarts_a_dead_service_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    proc, lines = _start(tmp_path, "--port", str(port), "--runners", "2")
    try:
        ready = _wait_line(lines, "ready:", 90)
        assert ready == f"ready: http://127.0.0.1:{port}"
        token = _wait_line(lines, "token:", 5).split(": ", 1)[1]
        assert (tmp_path / ".cox" / "token").read_text().strip() == token
        curl = _wait_line(lines, "  curl -s -X POST", 5).strip()
        out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
        assert json.loads(out.stdout)["disposition"] == "started", out.stdout + out.stderr
        sid = _sid_in(curl)
        with Api(f"http://127.0.0.1:{port}", token) as api:
            end = api.wait_type(sid, "turn.end", timeout=30)
            assert end["outcome"] == "completed"
        assert (tmp_path / "workspaces" / "demo" / "notes" / "hello.txt").exists()
        for name in ("gateway", "guard", "judge", "versions", "turn-runner-1", "turn-runner-2"):
            assert (tmp_path / ".cox" / "logs" / f"{name}.log").exists()

        # A service that dies is restarted and the system answers again.
        me = psutil.Process(proc.pid)
        guard = next(p for p in me.children(recursive=True) if "cox_guard" in " ".join(p.cmdline()))
        guard.kill()
        deadline = time.monotonic() + 30
        healthy_again = False
        time.sleep(0.5)
        while time.monotonic() < deadline:
            r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            if r.status_code == 200:
                healthy_again = True
                break
            time.sleep(0.2)
        assert healthy_again
        assert any("cox_guard" in " ".join(p.cmdline()) and p.pid != guard.pid for p in me.children(recursive=True))

        family = [proc.pid] + [p.pid for p in me.children(recursive=True)]
        assert len(family) >= 1 + 2 + 6, "nats, redis and six services"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0
    time.sleep(0.5)
    alive = [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes left behind: {alive}"


def test_cox_up_refuses_a_missing_config(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "cox", "up", "--config", "nope.toml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "config file not found" in r.stderr


@pytest.mark.parametrize("value", ["0", "-1", "3601"])
def test_cox_up_refuses_a_ready_timeout_out_of_range(tmp_path: Path, value: str) -> None:
    r = subprocess.run([sys.executable, "-m", "cox", "up", f"--ready-timeout={value}", "--no-demo"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "--ready-timeout must be more than 0 and at most 3600 seconds" in r.stderr
    assert not (tmp_path / ".cox").exists(), "nothing started, nothing written"


def test_cox_up_not_ready_in_time_exits_1_says_what_healthz_said_and_leaves_nothing(tmp_path: Path) -> None:
    # 10 ms after the forks: the gateway cannot be listening yet, let alone have every service answer.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COX_", "NATS_URL", "REDIS_URL"))}
    proc = subprocess.Popen([sys.executable, "-m", "cox", "up", "--port", str(free_port()), "--no-demo",
                             "--ready-timeout=0.01"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    family = [proc.pid]
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "ready:" not in out
    assert "did not become ready within 0.01 s (/healthz: " in err
    said = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    nr = [r for r in said if r["event"] == "not_ready"]
    assert len(nr) == 1 and nr[0]["waited_s"] == 0.01 and nr[0]["healthz"], nr
    assert nr[0]["logs"] == str(tmp_path / ".cox" / "logs")
    alive = [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(tmp_path) in " ".join(p.info["cmdline"] or [])], "a child of it left running"


@pytest.mark.cluster
def test_cox_up_cluster_runs_a_turn_on_clustered_redis_and_nats_and_stops_cleanly(tmp_path: Path) -> None:
    """``cox up --cluster``: the whole system on a Redis Cluster (3 + 3) and a 3-node NATS cluster."""
    port = free_port()
    proc, lines = _start(tmp_path, "--port", str(port), "--runners", "2", "--cluster")
    family: list[int] = []
    try:
        assert _wait_line(lines, "ready:", 150) == f"ready: http://127.0.0.1:{port}"
        me = psutil.Process(proc.pid)
        kids = [" ".join(p.cmdline()) for p in me.children()]
        assert sum("redis-server" in c for c in kids) == 6, kids
        assert sum("nats-server" in c for c in kids) == 3, kids
        curl = _wait_line(lines, "  curl -s -X POST", 5).strip()
        out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
        assert json.loads(out.stdout)["disposition"] == "started", out.stdout + out.stderr
        sid = _sid_in(curl)
        token = _wait_line(lines, "token:", 5).split(": ", 1)[1]
        with Api(f"http://127.0.0.1:{port}", token) as api:
            assert api.wait_type(sid, "turn.end", timeout=60)["outcome"] == "completed"
        assert (tmp_path / "workspaces" / "demo" / "notes" / "hello.txt").exists()
        family = [proc.pid] + [p.pid for p in me.children(recursive=True)]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(90)
    assert code == 0
    time.sleep(0.5)
    alive = [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes left behind: {alive}"


def _modes(state: Path) -> dict[str, int]:
    """Every folder and file under ``state`` (links left out) with its permission bits."""
    out = {".": state.stat().st_mode & 0o7777}
    for dirpath, dirnames, filenames in os.walk(state):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if not p.is_symlink():
                out[str(p.relative_to(state))] = st.st_mode & 0o7777
    return out


def test_a_second_cox_up_on_one_state_folder_refuses_and_the_state_is_private(tmp_path: Path) -> None:
    """Issue 21, item 7: the state folder and everything in it 0700/0600, an older world-readable
    one made private at start; a second ``cox up`` on it exits non-zero at once naming the folder
    and ``--state``, and the first keeps serving (a turn runs after)."""
    state = tmp_path / ".cox"
    (state / "logs").mkdir(parents=True)
    os.chmod(state, 0o755)
    os.chmod(state / "logs", 0o755)
    old = state / "logs" / "gateway.log"
    old.write_text("an older run's log\n")
    os.chmod(old, 0o644)
    port = free_port()
    proc, lines = _start(tmp_path, "--port", str(port), "--runners", "1")
    try:
        _wait_line(lines, "ready:", 90)
        token = _wait_line(lines, "token:", 5).split(": ", 1)[1]
        curl = _wait_line(lines, "  curl -s -X POST", 5).strip()

        t0 = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "cox", "up", "--port", str(free_port()), "--no-demo"],
                                cwd=tmp_path, env={k: v for k, v in os.environ.items() if not k.startswith("COX_")},
                                capture_output=True, text=True, timeout=60)
        assert second.returncode != 0, second
        assert time.monotonic() - t0 < 20, "refused at once, not after starting anything"
        assert str(state) in second.stderr and "--state" in second.stderr, second.stderr
        assert "ready:" not in second.stdout

        # the first still serves: healthy, and a turn runs to its end
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
        assert json.loads(out.stdout)["disposition"] == "started", out.stdout + out.stderr
        sid = _sid_in(curl)
        with Api(f"http://127.0.0.1:{port}", token) as api:
            assert api.wait_type(sid, "turn.end", timeout=30)["outcome"] == "completed"

        modes = _modes(state)
        for must in ("credentials.json", "token", "lock", "logs/gateway.log", "logs/turn-runner-1.log",
                     "redis/redis.log", "nats/nats.conf", "nats/nats.log", "nats/jetstream"):
            assert must in modes, (must, sorted(modes))
        aof = [k for k in modes if k.startswith("redis/") and ".aof" in k]
        store = [k for k in modes if k.startswith("nats/jetstream/") and Path(state / k).is_file()]
        assert aof and store, sorted(modes)
        loose = {k: oct(m) for k, m in modes.items()
                 if m != (0o700 if (state / k).is_dir() else 0o600)}
        assert not loose, loose
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0
