"""Every command runs in a bubblewrap sandbox: what a command can and cannot touch.

Real stacks, real bubblewrap, real sockets. Most tests use ``commands = "allow"`` so that policy
lets everything through and only the sandbox stands between the command and the machine: that
is the point (the sandbox must hold even when a command is allowed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.checks import finished, last_seq, of_type
from tests.support.flow import answer, result, run_allowing, run_turn
from tests.support.stack import Api, Stack, running, script, stack_fixture, tool

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (./dev installs it: apt-get install bubblewrap)")

ALLOW = '[approval]\ncommands = "allow"\n'
sandboxed = stack_fixture("sandboxed", runners=2, config=ALLOW)


@pytest.fixture
def sapi(sandboxed: Stack) -> Iterator[Api]:
    with sandboxed.client() as client:
        yield client


def commands(*cmds: str | dict[str, Any]) -> str:
    """A script that runs each command in turn (a dict is a full ``run_command`` argument set)."""
    calls = [tool("run_command", **(c if isinstance(c, dict) else {"command": c})) for c in cmds]
    return script({"text": "Running.", "tools": calls}, {"text": "Done."})


def outputs(evs: list[dict[str, Any]]) -> list[str]:
    """The ``tool.result`` outputs of the turn's ``run_command`` calls, in order."""
    ids = [e["call_id"] for e in evs if e["type"] == "tool.call" and e["name"] == "run_command"]
    return [result(evs, i)["output"] for i in ids]


def connect(port: int) -> str:
    return (f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), 3); "
            f"print('got', s.recv(64).decode())\"")


def proxied(port: int) -> str:
    """Ask the command's egress proxy (its own 127.0.0.1:3128) for the host's loopback listener."""
    return (f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', 3128), 3); "
            f"s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\n\\r\\n'); "
            f"print('proxy said', s.recv(300).decode())\"")


@contextlib.contextmanager
def listener() -> Iterator[int]:
    """A TCP listener on the host's loopback that greets every connection."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello-from-host")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        done.set()
        t.join(2)
        srv.close()


def test_a_command_cannot_read_write_or_see_outside_its_workspace(sandboxed: Stack, sapi: Api) -> None:
    outside = sandboxed.tmp / f"planted-{uuid.uuid4().hex[:6]}.txt"
    outside.write_text("PLANTED-SECRET")
    other = sapi.create("sbx-other")
    (Path(other["workspace"]) / "private.txt").write_text("OTHER-PRIVATE")
    s = sapi.create("sbx-mine")
    sid, ws = s["id"], Path(s["workspace"])
    cox_state = sandboxed.tmp / "coxswain.toml"  # the stack's own config, like .cox/ state
    host_tmp = Path("/tmp") / f"cox-escape-{uuid.uuid4().hex[:8]}"
    rel_up = os.path.relpath(outside, ws)
    evs = run_allowing(sapi, sid, commands(
        f"cat {outside}",
        f"cat {rel_up}",
        f"ln -s {outside} link.txt && cat link.txt",
        "cat ../sbx-other/private.txt; ls ..",
        f"cat {cox_state}",
        f"echo escaped > {host_tmp}; echo escaped > {sandboxed.tmp}/written.txt",
        "ls -a ~ /root /home 2>&1; cat /etc/shadow /etc/gshadow 2>&1 | head -c 300",
        "ls /proc | grep -c '^[0-9]'; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c '^COX_'",
    ))
    out = outputs(evs)
    assert len(out) == 8, out
    procs, cox_vars = out[7].split()[-2:]
    assert int(procs) <= 4, f"only the command's own processes are visible: {out[7]}"
    assert cox_vars == "0", "no process a command can see holds the runner's credentials"
    for text in out[:5]:
        assert "PLANTED-SECRET" not in text and "OTHER-PRIVATE" not in text and "[approval]" not in text, text
        assert "No such file" in text, text
    assert out[3].splitlines()[-1] == "sbx-mine", f"another workspace must not even be listed: {out[3]}"
    assert not host_tmp.exists(), "a write to /tmp must land in the sandbox's private /tmp"
    assert not (sandboxed.tmp / "written.txt").exists()
    assert "root:" not in out[6] and "/root" in out[6] and "No such file" in out[6], out[6]
    assert (ws / "link.txt").is_symlink(), "the link itself was made inside the workspace"
    assert outside.read_text() == "PLANTED-SECRET"


def test_a_command_reaches_neither_the_host_loopback_nor_the_stacks_servers(sandboxed: Stack, sapi: Api) -> None:
    s = sapi.create("sbx-net")
    nats_port = urlsplit(sandboxed.nats.url).port
    redis_port = urlsplit(sandboxed.redis.url).port
    with listener() as port:
        evs = run_allowing(sapi, s["id"], commands(connect(port), connect(nats_port), connect(redis_port),
                                               {"command": connect(port), "network": False}))
        with socket.create_connection(("127.0.0.1", port), 3) as c:  # the listener itself works
            assert c.recv(64) == b"hello-from-host"
    for text in outputs(evs):
        assert "got" not in text, text
        assert "ConnectionRefusedError" in text or "Network is unreachable" in text or "OSError" in text, text


def test_the_network_is_a_recorded_permission_asked_once_per_session(tmp_path: Path) -> None:
    """A command that asks for the network is a security confirm with the judge's view; "always"
    makes it standing (in the log and the session object). Granted, it still has its own network
    namespace: the host's loopback listener is reached neither directly nor through the egress
    proxy, whose refusal is a ``network.request`` event."""
    with running(tmp_path, runners=1) as st, st.client() as api, listener() as port:
        s = api.create("sbx-grant")
        sid = s["id"]
        assert s["sandbox"] == {"mode": "bwrap", "network": "off"}
        # Read-only and sandboxed without network: the rules judge may allow it unasked.
        evs = run_turn(api, sid, commands("cat /etc/hostname"))
        assert of_type(evs, "approval.pending") == []
        after = last_seq(api, sid)
        granted = f"{connect(port)}; {proxied(port)}"
        assert api.send(sid, commands({"command": granted, "network": True},
                                      {"command": granted, "network": True})).status_code == 202
        pending = api.wait_type(sid, "approval.pending", after=after)
        assert pending["security"] is True and "network" in pending["reason"]
        assert pending["judge"] is not None, "the person sees the judge's view"
        answer(api, sid, pending["approval_id"], "allow", scope="session")
        # The second call still goes to the judge for the command itself: python is not read-only.
        second = api.wait_type(sid, "approval.pending", after=pending["seq"])
        assert second["security"] is False, "the network is granted; only the command is asked"
        answer(api, sid, second["approval_id"], "allow")
        _, evs = finished(api, sid, after=after)
        out = outputs([e for e in evs if e["seq"] > after])
        assert len(out) == 2 and all("got hello-from-host" not in o and "proxy said HTTP/1.1 403" in o
                                     and "loopback" in o for o in out), out
        net = [e for e in evs if e["type"] == "network.request" and e["seq"] > after]
        assert [(e["host"], e["port"], e["allowed"]) for e in net] == [("127.0.0.1", port, False)] * 2, net
        resolved = [e for e in evs if e["type"] == "approval.resolved" and e["approval_id"] == pending["approval_id"]]
        assert resolved and resolved[0]["scope"] == "session"
        view = api.session(sid)
        assert "network" in view["standing"] and view["sandbox"]["network"] == "session"
        # The same read-only command with the network is not allowed unasked.
        after = last_seq(api, sid)
        api.send(sid, commands({"command": "cat /etc/hostname", "network": True}))
        third = api.wait_type(sid, "approval.pending", after=after)
        assert third["judge"]["verdict"] == "refuse" and "network" in third["judge"]["reason"]
        answer(api, sid, third["approval_id"], "deny")
        finished(api, sid, after=after)


def test_config_network_goes_through_the_proxy_not_to_the_host(tmp_path: Path) -> None:
    """``[sandbox] network = true`` grants every command the proxy, never the host's network."""
    with running(tmp_path, runners=1, config=ALLOW + "[sandbox]\nnetwork = true\n") as st, st.client() as api, \
            listener() as port:
        s = api.create("sbx-config-net")
        assert s["sandbox"]["network"] == "on"
        evs = run_turn(api, s["id"], commands(connect(port), proxied(port)))
        direct, via_proxy = outputs(evs)
        assert "got" not in direct and ("ConnectionRefusedError" in direct or "unreachable" in direct), direct
        assert "proxy said HTTP/1.1 403" in via_proxy and "hello-from-host" not in via_proxy, via_proxy
        (net,) = of_type(evs, "network.request")
        assert net["allowed"] is False and net["host"] == "127.0.0.1" and net["port"] == port


def test_ordinary_work_in_the_workspace_works_and_is_versioned(sandboxed: Stack, sapi: Api) -> None:
    s = sapi.create("sbx-work")
    sid, ws = s["id"], Path(s["workspace"])
    evs = run_allowing(sapi, sid, commands(
        "mkdir -p src/pkg && printf 'print(6*7)\\n' > src/pkg/main.py && python3 src/pkg/main.py",
        "git init -q . && git -c user.email=a@b -c user.name=t add src && "
        "git -c user.email=a@b -c user.name=t commit -qm first && git log --oneline | wc -l",
        "echo scratch > /tmp/x && cat /tmp/x && echo changed >> src/pkg/main.py",
    ))
    out = outputs(evs)
    assert out[0].startswith("exit code 0") and "42" in out[0], out[0]
    assert out[1].startswith("exit code 0") and out[1].rstrip().endswith("1"), out[1]
    assert "scratch" in out[2]
    assert (ws / "src/pkg/main.py").read_text() == "print(6*7)\nchanged\n"
    assert (ws / ".git/HEAD").exists()
    written = {e["path"] for e in evs if e["type"] == "file.written" and e.get("via") == "command"}
    assert "src/pkg/main.py" in written, written
    # A command cannot touch the versions store inside its workspace.
    evs = run_allowing(sapi, sid, commands("touch .coxswain/planted; rm -rf .coxswain; ls -d .coxswain"))
    assert "Read-only file system" in outputs(evs)[0] or "Device or resource busy" in outputs(evs)[0]
    assert (ws / ".coxswain").is_dir() and not (ws / ".coxswain/planted").exists()


def _sandboxed_procs(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def _wait_gone(marker: str, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    left = _sandboxed_procs(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _sandboxed_procs(marker)
    return left


def test_stop_kills_the_whole_sandboxed_tree(sandboxed: Stack, sapi: Api) -> None:
    s = sapi.create("sbx-stop")
    sid = s["id"]
    marker = str(900000 + int(uuid.uuid4().int % 90000))
    after = last_seq(sapi, sid)
    sapi.send(sid, commands(f"(sleep {marker} &) ; bash -c 'sleep {marker}' & sleep {marker}"))
    sapi.wait_type(sid, "tool.call", after=after)
    deadline = time.monotonic() + 10
    while len(_sandboxed_procs(f"sleep {marker}")) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_sandboxed_procs(f"sleep {marker}")) >= 3
    assert sapi.http.post(f"/v1/sessions/{sid}/stop").status_code == 200
    assert _wait_gone(f"sleep {marker}") == [], "a sandboxed command outlived Stop"


@pytest.mark.faults  # a runner killed: waits for its lease to lapse (the faults lane, drill leases)
def test_kill_9_of_the_runner_kills_its_sandboxed_tree(tmp_path: Path) -> None:
    with running(tmp_path, runners=1, config=ALLOW) as st, st.client() as api:
        s = api.create("sbx-kill")
        marker = str(800000 + int(uuid.uuid4().int % 90000))
        api.send(s["id"], commands(f"(sleep {marker} &) ; sleep {marker}"))
        deadline = time.monotonic() + 15
        while len(_sandboxed_procs(f"sleep {marker}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_sandboxed_procs(f"sleep {marker}")) >= 2
        st.procs["turn-runner-1"].send_signal(signal.SIGKILL)
        st.procs["turn-runner-1"].wait(10)
        assert _wait_gone(f"sleep {marker}") == [], "a sandboxed command outlived its runner"
        assert _sandboxed_procs("bwrap") == [] or all(f"sleep {marker}" not in p for p in _sandboxed_procs("bwrap"))


def test_without_bwrap_commands_are_refused_never_run_bare(tmp_path: Path) -> None:
    empty = tmp_path / "no-bwrap-bin"
    empty.mkdir()
    with running(tmp_path / "s", runners=1, config=ALLOW, runner_env={"PATH": str(empty)}) as st, \
            st.client() as api:
        health = httpx.get(st.url + "/healthz", timeout=5).json()
        sandbox = health["services"]["turn-runner"]["detail"]["sandbox"]
        assert sandbox["available"] is False and "bwrap" in sandbox["reason"]
        s = api.create("sbx-none")
        ws = Path(s["workspace"])
        evs = run_turn(api, s["id"], commands("/bin/touch ran-bare.txt"))
        res = outputs(evs)[0]
        assert res.startswith("Refused: the command sandbox is unavailable"), res
        refusal = [e for e in evs if e["type"] == "policy.decision" and e["actor"] == "sandbox"]
        assert refusal and refusal[0]["verdict"] == "refuse"
        assert not (ws / "ran-bare.txt").exists()
        # A person's !command is refused the same way.
        r = api.http.post(f"/v1/sessions/{s['id']}/observe", json={"command": "/bin/touch op-bare.txt"})
        assert r.status_code == 202
        obs = api.wait_type(s["id"], "observed")
        assert obs["output"].startswith("Refused: the command sandbox is unavailable")
        assert not (ws / "op-bare.txt").exists()


def test_mode_none_runs_bare_and_says_so(tmp_path: Path) -> None:
    with running(tmp_path, runners=1, config=ALLOW + '[sandbox]\nmode = "none"\n') as st, st.client() as api:
        health = httpx.get(st.url + "/healthz", timeout=5).json()
        assert health["sandbox"]["mode"] == "none" and "WITHOUT a sandbox" in health["sandbox"]["warning"]
        assert health["services"]["turn-runner"]["detail"]["sandbox"]["mode"] == "none"
        assert "sandbox.off" in st.log("turn-runner-1")
        s = api.create("sbx-bare")
        assert s["sandbox"] == {"mode": "none", "network": "off"}
        marker = tmp_path / "outside.txt"
        evs = run_turn(api, s["id"], commands(f"echo bare > {marker}"))
        assert outputs(evs)[0].startswith("exit code 0")
        assert marker.read_text() == "bare\n"


def test_a_persons_command_runs_in_the_sandbox_and_is_versioned(sandboxed: Stack, sapi: Api) -> None:
    s = sapi.create("sbx-observe")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "notes.txt").write_text("before\n")
    outside = sandboxed.tmp / "op-planted.txt"
    outside.write_text("OP-SECRET")
    r = sapi.http.post(f"/v1/sessions/{sid}/observe",
                       json={"command": f"cat {outside}; echo after > notes.txt; echo new > made.txt"})
    assert r.status_code == 202, r.text
    obs = sapi.wait_type(sid, "observed")
    assert "OP-SECRET" not in obs["output"] and "No such file" in obs["output"]
    evs = sapi.all_events(sid)
    written = {e["path"]: e for e in evs if e["type"] == "file.written" and e["seq"] < obs["seq"]}
    assert set(written) == {"notes.txt", "made.txt"}, written
    assert all(e["via"] == "command" for e in written.values())
    kept = [e for e in evs if e["type"] == "version.kept" and e["path"] == "notes.txt"]
    assert kept
    # The kept version is the content before the command: restore puts it back.
    r = sapi.http.post(f"/v1/sessions/{sid}/versions/{kept[0]['version_id']}/restore")
    assert r.status_code == 200, r.text
    assert (ws / "notes.txt").read_text() == "before\n"
    assert not sapi.session(sid)["busy"]
