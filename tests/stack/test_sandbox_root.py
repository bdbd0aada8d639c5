"""A sandboxed process never runs with a privileged uid (issue 21, item 1): real stacks, real bubblewrap.

Run as root (CI, ``./dev up`` on most machines) every command, ``!command``, hook and MCP stdio
server runs as ``[sandbox] user`` (``cox-sandbox``); run as another user, as that user in its own
user namespace. Either way: uid not 0, no capability, ``no_new_privs``, ``/proc/sys`` read-only,
nothing left setuid or setgid on the host, descriptors 0-2 only, the system ``PATH``; and
ordinary work (git, venv + pip, make, cc, the runner's own writes changed by a later command)
still works.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from coxswain import sandbox_user
from tests.support import MCP_SERVERS
from tests.support.checks import of_type
from tests.support.flow import result, run_allowing
from tests.support.stack import Api, Stack, script, stack_fixture, tool

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (./dev installs it: apt-get install bubblewrap)")

ROOT = os.geteuid() == 0
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
BURST = "/proc/sys/kernel/printk_ratelimit_burst"
CORE = "/proc/sys/kernel/core_pattern"
TINY = MCP_SERVERS / "tiny.py"

CONFIG = f"""[approval]
commands = "allow"

[sandbox]
extra_ro = {json.dumps(sorted({str(Path(sys.executable).resolve().parents[1]), str(Path(sys.prefix)),
                               str(MCP_SERVERS)}))}

[[mcp.servers]]
name = "tiny"
command = {json.dumps([sys.executable, str(TINY)])}
read_only_tools = ["echo", "write"]
timeout_s = 60
"""
stack = stack_fixture("sandbox-root", runners=1, config=CONFIG)


def sandbox_uid() -> int:
    """The uid a sandboxed process must have on the host."""
    return pwd.getpwnam("cox-sandbox").pw_uid if ROOT else os.getuid()


def commands(*cmds: str | dict[str, Any]) -> str:
    calls = [tool("run_command", **(c if isinstance(c, dict) else {"command": c})) for c in cmds]
    return script({"text": "Running.", "tools": calls}, {"text": "Done."})


def outputs(evs: list[dict[str, Any]]) -> list[str]:
    ids = [e["call_id"] for e in evs if e["type"] == "tool.call" and e["name"] == "run_command"]
    return [result(evs, i)["output"] for i in ids]


def make_wheel(folder: Path) -> None:
    """A wheel of a tiny pure-Python package, written by hand (no build tool, no network)."""
    import base64
    import hashlib
    import zipfile

    folder.mkdir(parents=True)
    files = {
        "tinypkg/__init__.py": b"ANSWER = 42\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinypkg-1.0.dist-info/RECORD,,")
    with zipfile.ZipFile(folder / "tinypkg-1.0-py3-none-any.whl", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("tinypkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")


def host_file(ws: Path, name: str) -> os.stat_result:
    return os.lstat(ws / name)


def not_special(st: os.stat_result) -> bool:
    return not st.st_mode & (stat.S_ISUID | stat.S_ISGID)


@pytest.fixture
def api(stack: Stack) -> Any:
    with stack.client() as client:
        yield client


def test_a_command_is_no_privileged_user_and_cannot_write_the_hosts_kernel_settings(stack: Stack, api: Api) -> None:
    burst, core = Path(BURST).read_text(), Path(CORE).read_text()
    s = api.create("root-proc")
    evs = run_allowing(api, s["id"], commands(
        "cat /proc/self/uid_map; id -u; id -g; id -G; grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status",
        f"echo 11 > {BURST}; echo 'burst exit '$?",
        f"echo '|/bin/sh -c id' > {CORE}; echo 'core exit '$?; sysctl -w kernel.core_pattern=x 2>&1",
        "echo h > /proc/sysrq-trigger; echo 'sysrq exit '$?",
        # What a process started by the command holds (sleep opens nothing of its own).
        "sleep 3 & sleep 0.3; ls /proc/$!/fd | tr '\\n' ' '; kill $!; echo; echo PATH=$PATH",
        "touch made-here",
    ))
    out = outputs(evs)
    ident = out[0].splitlines()
    assert "0 0 1" not in " ".join(out[0].split()[2:5]), out[0]
    uid, gid, groups = ident[2], ident[3], ident[4]
    assert uid == str(sandbox_uid()) and uid != "0", out[0]
    assert gid != "0" and "0" not in groups.split(), out[0]
    caps = dict(line.split(":\t") for line in ident[5:] if ":\t" in line)
    assert all(int(caps[k], 16) == 0 for k in ("CapEff", "CapPrm", "CapAmb")), caps
    if ROOT:
        assert int(caps["CapBnd"], 16) == 0, caps
    assert caps["NoNewPrivs"] == "1", caps
    assert "burst exit 1" in out[1] and "burst exit 0" not in out[1], out[1]
    assert "core exit 1" in out[2], out[2]
    assert "sysrq exit 0" not in out[3], out[3]
    assert Path(BURST).read_text() == burst and Path(CORE).read_text() == core, "the host's kernel settings changed"
    fds, path = out[4].splitlines()[1:3]
    assert fds.split() == ["0", "1", "2"], f"only descriptors 0-2 are inherited: {fds}"
    assert path == f"PATH={SYSTEM_PATH}", path
    st = host_file(Path(s["workspace"]), "made-here")
    assert st.st_uid == sandbox_uid() and st.st_uid != 0


def test_nothing_made_in_the_sandbox_stays_setuid_on_the_host(stack: Stack, api: Api) -> None:
    s = api.create("root-suid")
    ws = Path(s["workspace"])
    evs = run_allowing(api, s["id"], commands(
        "cp /bin/sh x; chmod u+s,g+s x; ls -l x",
        "mkdir -p deep/a/b/c && install -m 6755 /bin/sh deep/a/b/c/y && mkdir sg && chmod g+s sg && ls -l deep/a/b/c/y",
        "cp /bin/sh hard && chmod 4755 hard && ln hard hard2",
        {"command": "cp /bin/sh late; chmod u+s late; sleep 30", "timeout_s": 2},
    ))
    out = outputs(evs)
    assert "rws" in out[0] and "rws" in out[1], out  # it did make them, inside
    assert "timed out" in out[3], out[3]
    for name in ("x", "deep/a/b/c/y", "sg", "hard", "hard2", "late"):
        st = host_file(ws, name)
        assert not_special(st), f"{name} is {stat.filemode(st.st_mode)} on the host"
        assert st.st_uid != 0 and st.st_uid == sandbox_uid(), f"{name} belongs to uid {st.st_uid}"


def test_a_hook_planted_by_a_repository_gets_no_privilege(stack: Stack, api: Api) -> None:
    """A repository that arrives with ``.coxswain/hooks.json``: its hook runs the first time a person
    sends a message, unasked. It must be as unprivileged as any command."""
    burst = Path(BURST).read_text()
    ws = stack.root / "root-hook"
    (ws / ".coxswain").mkdir(parents=True)
    hook = (f"id -u > hook-uid.txt; echo 11 > {BURST}; echo $? > hook-burst.txt; "
            "cp /bin/sh hx; chmod u+s,g+s hx; sleep 3 & sleep 0.3; ls /proc/$!/fd | tr '\\n' ' ' > hook-fds.txt; kill $!")
    (ws / ".coxswain" / "hooks.json").write_text(json.dumps({"hooks": {"UserPromptSubmit": [
        {"hooks": [{"type": "command", "command": hook}]}]}}))
    sid = api.create("root-hook")["id"]
    evs = run_allowing(api, sid, script({"text": "Hello."}))
    assert of_type(evs, "hook.decision"), "the planted hook ran"
    assert (ws / "hook-uid.txt").read_text().strip() == str(sandbox_uid()) != "0"
    assert (ws / "hook-burst.txt").read_text().strip() != "0"
    assert Path(BURST).read_text() == burst
    assert (ws / "hook-fds.txt").read_text().split() == ["0", "1", "2"]
    st = host_file(ws, "hx")
    assert not_special(st) and st.st_uid == sandbox_uid() != 0, stat.filemode(st.st_mode)


def test_an_mcp_stdio_server_runs_unprivileged_and_leaves_nothing_setuid(stack: Stack, api: Api) -> None:
    s = api.create("root-mcp")
    ws = Path(s["workspace"])
    evs = run_allowing(api, s["id"], script(
        {"text": "Writing.", "tools": [tool("tiny__write", path="by-mcp.txt", content="from the server")]},
        {"text": "Done."}))
    res = [e for e in evs if e["type"] == "tool.result"]
    assert res and res[0]["ok"], res[0].get("output")
    st = host_file(ws, "by-mcp.txt")
    assert st.st_uid == sandbox_uid() != 0, "the MCP server ran as the sandbox user"


def test_ordinary_work_runs_as_the_sandbox_user(stack: Stack, api: Api) -> None:
    s = api.create("root-work")
    sid, ws = s["id"], Path(s["workspace"])
    make_wheel(ws / "wheels")
    (ws / "Makefile").write_text("hello: hello.c\n\tcc -o hello hello.c\n")
    (ws / "hello.c").write_text('#include <stdio.h>\nint main(void) { puts("hello from cc"); return 0; }\n')
    git = "git -c user.email=a@b -c user.name=t"
    evs = run_allowing(api, sid, script(
        {"text": "Writing.", "tools": [tool("write_file", path="notes/runner.txt", content="by the runner\n")]},
        {"text": "Working.", "tools": [tool("run_command", command=c, timeout_s=300) for c in (
            f"git init -q . && {git} add hello.c Makefile && {git} commit -qm first && git branch topic && "
            f"git checkout -q topic && echo '// change' >> hello.c && {git} commit -qam second && git log --oneline | wc -l"
            " && git status --short | head -3",
            "python3 -m venv v && v/bin/pip install -q --no-index --find-links wheels tinypkg && "
            "v/bin/python -c 'import tinypkg; print(\"pip ok\", tinypkg.ANSWER)'",
            "make -s && ./hello",
            "echo 'by a command' >> notes/runner.txt && cat notes/runner.txt",
        )]},
        {"text": "Done."}), timeout=400)
    out = outputs(evs)
    assert len(out) == 4, out
    assert out[0].startswith("exit code 0") and "2" in out[0].split("\n")[1], out[0]
    assert "dubious" not in out[0]
    assert out[1].startswith("exit code 0") and "pip ok 42" in out[1], out[1]
    assert out[2].startswith("exit code 0") and "hello from cc" in out[2], out[2]
    assert out[3].startswith("exit code 0") and "by a command" in out[3], out[3]
    assert (ws / "notes/runner.txt").read_text() == "by the runner\nby a command\n"
    assert host_file(ws, "notes/runner.txt").st_uid == sandbox_uid()
    assert host_file(ws, "notes").st_uid == sandbox_uid()
    # The versions service still keeps what commands change (its shadow repo under .coxswain, root's).
    written = {e["path"] for e in evs if e["type"] == "file.written" and e.get("via") == "command"}
    assert "hello.c" in written and "notes/runner.txt" in written, written
    store = ws / ".coxswain"
    assert store.is_dir() and (os.lstat(store).st_uid == os.geteuid())
    kept = [e for e in api.all_events(sid) if e["type"] == "version.kept" and e["path"] == "notes/runner.txt"]
    r = api.http.post(f"/v1/sessions/{sid}/versions/{kept[-1]['version_id']}/restore")
    assert r.status_code == 200, r.text
    assert host_file(ws, "notes/runner.txt").st_uid == sandbox_uid(), "a restored file is the sandbox user's"


# ---------------------------------------------------------------------------------- unit level


def test_settle_hands_the_workspace_over_and_strips_setuid_without_following_links(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".coxswain").mkdir(parents=True)
    (ws / ".coxswain" / "kept").write_text("store")
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f").write_text("f")
    os.chmod(ws / "a" / "b" / "f", 0o6755)
    os.chmod(ws / "a", 0o2755)
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    os.chmod(outside, 0o4755)
    os.symlink(outside, ws / "link")
    os.link(outside, ws / "hardlink")  # a link made on the host to a host file: never given away
    owner = sandbox_user.lookup("cox-sandbox") if ROOT else None
    done = sandbox_user.settle(ws, ".coxswain", owner)
    assert not_special(os.lstat(ws / "a" / "b" / "f")) and not_special(os.lstat(ws / "a"))
    assert os.lstat(outside).st_uid == os.geteuid(), "a link's target (outside) is never given away"
    if ROOT:  # a root file hard-linked in is left alone (as a user, the file is the runner's own anyway)
        assert os.lstat(outside).st_mode & stat.S_ISUID, "a hard-linked host file is never changed"
        assert "hardlink" in done.linked
    if ROOT:
        assert owner is not None
        for p in (ws, ws / "a", ws / "a" / "b", ws / "a" / "b" / "f", ws / "link"):
            assert os.lstat(p).st_uid == owner.uid, p
        assert os.lstat(ws / ".coxswain").st_uid == 0 and os.lstat(ws / ".coxswain" / "kept").st_uid == 0
    again = sandbox_user.settle(ws, ".coxswain", owner)
    assert again.chowned == 0 and again.stripped == 0


def test_settle_closes_a_folder_too_deep_to_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_user, "MAX_DEPTH", 3)
    ws = tmp_path / "ws"
    deep = ws / "1" / "2" / "3" / "4" / "5"
    deep.mkdir(parents=True)
    (deep / "s").write_text("x")
    os.chmod(deep / "s", 0o4755)
    done = sandbox_user.settle(ws, ".coxswain", None)
    assert done.closed == ["4"]
    assert stat.S_IMODE(os.lstat(ws / "1" / "2" / "3" / "4").st_mode) == 0
    os.chmod(ws / "1" / "2" / "3" / "4", 0o755)  # let tmp_path be removed


@pytest.mark.skipif(not ROOT, reason="the sandbox user is only used by a root runner")
def test_a_root_runner_without_the_sandbox_user_refuses_commands(tmp_path: Path) -> None:
    from tests.support.flow import run_turn
    from tests.support.stack import running

    with running(tmp_path, runners=1, config='[approval]\ncommands = "allow"\n[sandbox]\nuser = "cox-nobody-here"\n') \
            as st, st.client() as api:
        import httpx

        health = httpx.get(st.url + "/healthz", timeout=5).json()
        sandbox = health["services"]["turn-runner"]["detail"]["sandbox"]
        assert sandbox["available"] is False and "cox-nobody-here" in sandbox["reason"], sandbox
        s = api.create("no-user")
        evs = run_turn(api, s["id"], commands("/bin/touch ran.txt"))
        assert outputs(evs)[0].startswith("Refused: the command sandbox is unavailable"), outputs(evs)
        assert not (Path(s["workspace"]) / "ran.txt").exists()
