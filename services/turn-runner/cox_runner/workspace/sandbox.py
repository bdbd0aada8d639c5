"""The command sandbox: every command runs inside bubblewrap (``[sandbox] mode = "bwrap"``).

What a sandboxed command sees:

- its workspace, read-write, at its own path (the versions store folder inside it read-only);
- the system (``/usr`` and the ``/bin``, ``/lib*``, ``/sbin`` links or folders) read-only, and
  ``/etc`` read-only with every entry other users may not read hidden (``/etc/shadow``, host
  keys, ...): hidden folders are empty, hidden files cannot be opened;
- a private ``/tmp``, its own ``/proc`` (its own process namespace; an empty one with
  ``[sandbox] proc = "none"``) and a minimal ``/dev``;
- nothing else: no home folder, no other workspace, no ``.cox/`` state, no project checkout;
- no network (its own network namespace: not even the host's loopback, so neither the stack's
  Redis nor its NATS). Granted the network, it keeps that namespace and reaches the network only
  through coxswain's egress proxy (:mod:`cox_runner.workspace.egress`: one Unix socket bound in, a
  forwarder on its own ``127.0.0.1``, the proxy variables set), which refuses non-public
  addresses and records every connection. While a session has programs (a root runner), its
  processes without the network share one namespace of the session's own instead
  (:class:`NetNs`: a loopback, nothing else, never the host's), entered before bwrap;
- no capabilities, ``no_new_privs``, its own session (no terminal to inject into), and it dies
  with the runner (``--die-with-parent``); the runner kills the whole tree on Stop or a time-out;
- never a privileged uid. A runner that is not root runs bwrap unprivileged: the sandbox is a
  user namespace of the runner's own user. A root runner makes the namespaces (bwrap as root,
  without a user namespace, keeping only :data:`~cox_runner.workspace.bwrap.ROOT_CAPS` for its last steps) and the
  last step inside, util-linux's ``setpriv``, becomes ``[sandbox] user`` (``cox-sandbox``), an
  unprivileged host user: real, effective and saved uid and gid, no supplementary group, no
  capability (permitted, effective, inheritable, ambient and bounding sets empty),
  ``no_new_privs``. bwrap runs as root rather than as that user because bwrap resolves every
  bind source by path (even ``--bind-fd``), and a workspace under a folder only root may enter
  (``/root``, pytest's ``/tmp/pytest-of-root``) could not be mounted by the sandbox user;
- ``/proc/sys`` read-only (its own bind), ``/proc/sysrq-trigger`` absent, the rest of ``/proc``
  root's (the sandbox user may not write it);
- nothing setuid or setgid left behind: :mod:`coxswain.sandbox_user` walks the workspace after
  every sandboxed process (and, as root, hands to the sandbox user whatever the runner or
  anyone else left there that is not its, before the first process of a drive).

The environment is the scrubbed one :func:`cox_runner.workspace.tools.command_env` builds (``PATH`` the
system folders only); only descriptors 0-2 are inherited.

Fail closed: when bwrap is missing or cannot make its namespaces, :meth:`Sandbox.argv` raises
:class:`SandboxUnavailable` and the command is refused; it never runs bare. ``mode = "none"``
is the explicit way to run bare; the runner logs it loudly at start and ``/healthz`` and the
session object show it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coxswain import safefs, sandbox_user
from coxswain.config import SandboxConfig
from coxswain.sandbox_user import Owner, SandboxUserMissing

from ..errors import SandboxUnavailable
from . import egress as egress_mod
from .bwrap import Bwrap

PROBE_TIMEOUT_S = 10.0
PROBE_SCRIPT = ('printf "uid=%s gid=%s\\n" "$(id -u)" "$(id -g)"; '
                '[ -w /proc/sys/kernel/core_pattern ] && echo proc-sys-writable; '
                'if [ -r /proc/self/status ]; then grep -E "^(CapEff|CapBnd|NoNewPrivs):" /proc/self/status; '
                # [sandbox] proc = "none" (a container): no /proc to read; setpriv asks the kernel
                'else setpriv --dump 2>/dev/null | sed -n "s/^no_new_privs: */NoNewPrivs: /p"; fi; true')
MAX_SETTLED = 10_000
CLOSE_FDS = ('if [ -d /proc/self/fd ]; then fds=(/proc/self/fd/*); fds=("${fds[@]##*/}"); '
             'else fds=($(seq 3 1023)); fi; '
             'for n in "${fds[@]}"; do case $n in 0|1|2) ;; *) exec {n}>&-;; esac; done; exec "$@"')
"""The first step of every sandboxed program: only descriptors 0-2 go on. The runner's event loop
(uvloop) leaves the originals of the three it hands a child open in it; nothing else on the way
(setpriv, bwrap) closes descriptors either."""


@dataclass
class SandboxStatus:
    mode: str
    available: bool
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "available": self.available, **({"reason": self.reason} if self.reason else {})}


class Sandbox:
    """Builds the argv of a command for the configured mode; probes that bwrap works."""

    def __init__(self, cfg: SandboxConfig, store_dir: str) -> None:
        self.cfg = cfg
        self.store_dir = store_dir
        self._status: SandboxStatus | None = None
        self._setpriv = shutil.which("setpriv")
        """util-linux's setpriv: bwrap is started through it with ``--pdeathsig KILL``, so the whole
        sandbox dies with this process even if it is killed with SIGKILL (bwrap's own
        ``--die-with-parent`` then takes its children down)."""
        self.bwrap = Bwrap(cfg, store_dir, self._setpriv)
        """bubblewrap's command line (bwrap.py)."""
        self.egress = egress_mod.Egress(cfg)
        """The runner's egress proxy: a granted command's only way out."""
        self._owner: Owner | None = None
        self._settled: set[str] = set()
        """Workspaces walked in this drive (the first sandboxed process of a drive walks first)."""

    @property
    def dropping(self) -> bool:
        """Sandboxed processes run as ``[sandbox] user``: confined, and this process is root."""
        return self.confined and sandbox_user.dropping()

    def owner(self) -> Owner:
        """The sandbox user (looked up once); raises :class:`SandboxUnavailable` when it is missing."""
        if self._owner is None:
            try:
                self._owner = sandbox_user.lookup(self.cfg.user)
                self.egress.sandbox_uid = self._owner.uid  # it connects to the proxy's socket
            except SandboxUserMissing as exc:
                raise SandboxUnavailable(str(exc)) from None
        return self._owner

    def _drop(self) -> list[str]:
        """The last step inside a root bwrap: become the sandbox user for good (nothing when not root)."""
        return self.bwrap.drop(self.owner()) if self.dropping else []

    def _bwrap(self, program: str, workspace: Path, egress: str | None, netns: int | None = None,
               info_fd: int | None = None) -> list[str]:
        return self.bwrap.argv(program, workspace, egress, self.dropping, netns, info_fd)

    @property
    def shares_net(self) -> bool:
        """A session's commands and programs share a network namespace of its own
        (:class:`NetNs`): confined, as root (joining one needs CAP_SYS_ADMIN, which only the
        root runner has before it drops to the sandbox user)."""
        return self.dropping

    async def open_netns(self, workspace: Path, box_argv: Any) -> NetNs:
        """Start a session's network namespace: a bwrap like any command's (its own loopback, no
        other interface) whose only process sleeps as the sandbox user; its namespace is held
        by a descriptor, which later commands enter (:meth:`argv` with ``netns``). ``box_argv``
        puts the holder in its limits box (the orphan reaper's, should the runner die)."""
        program = self._program()
        if program is None:
            raise SandboxUnavailable(self._missing().reason)
        if not self.shares_net:
            raise SandboxUnavailable("only a root runner shares a session's network namespace")
        drop = self._drop()
        r, w = os.pipe()
        try:
            argv = box_argv([*self._bwrap(program, workspace, None, info_fd=w), "--", *drop,
                             "/bin/bash", "-c", CLOSE_FDS, "cox-sandbox", "sleep", "infinity"])
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=str(workspace), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, start_new_session=True, pass_fds=(w,),
                env={"PATH": "/usr/bin:/bin"})
        finally:
            os.close(w)
        try:
            told = await asyncio.wait_for(asyncio.to_thread(_read_info, r), PROBE_TIMEOUT_S)
            fd = os.open(f"/proc/{int(told['child-pid'])}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, TimeoutError, ValueError, KeyError) as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise SandboxUnavailable(f"the session's network namespace did not start: {exc!r}") from None
        finally:
            os.close(r)
        if os.fstat(fd).st_ino == os.stat("/proc/self/ns/net").st_ino:  # never the host's
            os.close(fd)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise SandboxUnavailable("the session's network namespace is the host's: refused")
        return NetNs(fd, proc)

    def networked(self, network: bool) -> bool:
        """Whether a command asked with ``network`` goes through the egress proxy."""
        return self.confined and (network or self.cfg.network)

    @property
    def mode(self) -> str:
        return self.cfg.mode

    @property
    def confined(self) -> bool:
        """Commands run through bwrap."""
        return self.cfg.mode == "bwrap"

    @property
    def needs_preexec(self) -> bool:
        """Whether the spawn itself must tie the command to this process (``PR_SET_PDEATHSIG`` in a
        ``preexec_fn``, which forces a fork of this large process). Not when ``setpriv`` can do it
        on the way: it execs bwrap (or, unconfined, bash) with the death signal set, and spawning
        stays cheap (the bench's bare floor went from ~12 to ~21 ms per ``true`` with the hook)."""
        return self._setpriv is None

    def status(self) -> SandboxStatus:
        if self.cfg.mode == "none":
            return SandboxStatus("none", True, "commands run without a sandbox ([sandbox] mode = \"none\")")
        return self._status or SandboxStatus("bwrap", False, "not probed yet")

    def _program(self) -> str | None:
        return shutil.which(self.cfg.bwrap)

    def _missing(self) -> SandboxStatus:
        """bwrap is not to be found: recorded as the sandbox's status."""
        self._status = SandboxStatus("bwrap", False, f"{self.cfg.bwrap!r} was not found in PATH "
                                                     "(install the bubblewrap package)")
        return self._status

    def argv(self, workspace: Path, command: str, network: bool, *, egress: str | None = None,
             offline: bool = False, netns: int | None = None) -> list[str]:
        """The argv that runs ``command`` with bash in ``workspace``; raises when it cannot be confined.
        Granted the network (``network`` or ``[sandbox] network``), ``egress`` is the proxy socket
        of :meth:`cox_runner.workspace.egress.Egress.grant` (without one it is refused). ``offline`` (a
        hook): no network whatever ``[sandbox] network`` says. ``netns``: the session's own network
        namespace (:class:`NetNs`) to run in, for a command without the network."""
        shell = ["/bin/bash", "-c", command]
        if self.cfg.mode == "none":
            return self._dies_with_runner(shell)
        return self._confined(workspace, shell, network and not offline, None if offline else egress, offline,
                              netns=netns)

    def wrap(self, workspace: Path, argv: list[str], network: bool, *, egress: str | None = None) -> list[str]:
        """The argv that runs the program ``argv`` (a stdio MCP server) confined like a command,
        in ``workspace``; raises when it cannot be confined (never runs it bare). Unconfined
        (``mode = "none"``) it still dies with the runner when ``setpriv`` is there."""
        if self.cfg.mode == "none":
            return self._dies_with_runner(argv)
        return self._confined(workspace, argv, network, egress)

    def _dies_with_runner(self, argv: list[str]) -> list[str]:
        """Unconfined ``argv`` started through setpriv with the death signal, where setpriv is
        (else the spawn's ``preexec_fn`` sets it: :attr:`needs_preexec`)."""
        return [self._setpriv, "--pdeathsig", "KILL", "--", *argv] if self._setpriv else list(argv)

    def _confined(self, workspace: Path, argv: list[str], network: bool, egress: str | None = None,
                  offline: bool = False, netns: int | None = None) -> list[str]:
        """``argv`` under bubblewrap in ``workspace``; raises when it cannot be confined."""
        program = self._program()
        if program is None:
            raise SandboxUnavailable(self._missing().reason)
        if self._status is not None and not self._status.available:
            raise SandboxUnavailable(self._status.reason)
        if self.dropping and self._setpriv is None:
            raise SandboxUnavailable("util-linux's setpriv is needed to drop privilege (the runner is root)")
        drop = self._drop()
        _ensure_store(workspace, self.store_dir)
        network = not offline and (network or self.cfg.network)
        if network:
            if egress is None:
                raise SandboxUnavailable("the network goes through coxswain's egress proxy, which was not "
                                         "started for this command")
            python = egress_mod.forwarder_python()
            if python is None:
                raise SandboxUnavailable("a command granted the network needs python3 in the system folders "
                                         f"({', '.join(egress_mod.PYTHONS)}) for its proxy forwarder")
            argv = egress_mod.wrapped(python, argv)
            netns = None  # granted the network: a namespace of its own (its forwarder serves it alone)
        return [*self._bwrap(program, workspace, egress if network else None, netns), "--", *drop,
                "/bin/bash", "-c", CLOSE_FDS, "cox-sandbox", *argv]

    async def probe(self) -> SandboxStatus:
        """Start a small script in the sandbox once (in a scratch folder): bwrap present, its
        namespaces allowed, and the process unprivileged for real (as root: running as the sandbox
        user; never uid 0, ``/proc/sys`` not writable, no capability, ``no_new_privs``)."""
        if self.cfg.mode == "none":
            return self.status()
        program = self._program()
        if program is None:
            return self._missing()
        self._owner = None  # looked up afresh: the user may have been created since
        try:
            drop = self._drop()
            if self.dropping and self._setpriv is None:
                raise SandboxUnavailable("util-linux's setpriv is needed to drop privilege (the runner is root)")
        except SandboxUnavailable as exc:
            self._status = SandboxStatus("bwrap", False, f"cannot drop privilege: {exc.detail}")
            return self._status
        with tempfile.TemporaryDirectory(prefix="cox-sandbox-probe-") as scratch:
            if self._owner is not None:
                os.chown(scratch, self._owner.uid, self._owner.gid)
            argv = [*self._bwrap(program, Path(scratch), None), "--", *drop, "/bin/sh", "-c", PROBE_SCRIPT]
            try:
                proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                            stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.PIPE)
                out, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                self._status = SandboxStatus("bwrap", False, f"bwrap could not start: {exc}")
                return self._status
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip()[-300:] or f"exit code {proc.returncode}"
            if "mount proc" in why:
                why += (" (a container whose /proc Docker masks: run it with systempaths=unconfined, "
                        "or set [sandbox] proc = \"none\")")
            self._status = SandboxStatus("bwrap", False, f"bwrap cannot make its namespaces here: {why}")
            return self._status
        unprivileged = self._unprivileged(out.decode(errors="replace"))
        self._status = SandboxStatus("bwrap", True) if unprivileged is None else \
            SandboxStatus("bwrap", False, f"the sandbox did not drop privilege: {unprivileged}")
        return self._status

    def _unprivileged(self, report: str) -> str | None:
        """Why the probe's report shows a privileged process, or None when it is not."""
        facts: dict[str, str] = {}
        for line in report.splitlines():
            for word in line.split():
                if "=" in word:
                    k, _, v = word.partition("=")
                    facts[k] = v
            if ":" in line:
                k, _, v = line.partition(":")
                facts[k.strip()] = v.strip()
        uid = facts.get("uid", "")
        if not uid.isdigit() or int(uid) == 0:
            return f"it ran as uid {uid or '?'}"
        if self._owner is not None and int(uid) != self._owner.uid:
            return f"it ran as uid {uid}, not as the sandbox user {self._owner.name!r}"
        if "proc-sys-writable" in report:
            return "/proc/sys is writable in it"
        if facts.get("CapEff", "0").strip("0") or (self.dropping and facts.get("CapBnd", "0").strip("0")):
            return "it kept capabilities"
        if facts.get("NoNewPrivs") != "1":
            return "no_new_privs is not set in it"
        return None

    async def ready(self) -> None:
        """Before a command: probe again while the sandbox is known not to work (it may have been
        installed or allowed since), so a fixed machine needs no restart."""
        if self.cfg.mode != "none" and (self._status is None or not self._status.available):
            await self.probe()

    async def prepare(self, workspace: Path) -> None:
        """Before a sandboxed process in ``workspace``: :meth:`ready`, and as root, the workspace
        handed to the sandbox user once per drive (the runner's and the versions service's own
        writes are the sandbox user's already; :meth:`settle` after each process keeps it so)."""
        await self.ready()
        if not self.dropping:
            return
        key = str(workspace)
        if key in self._settled:
            return
        await self.settle(workspace)
        if len(self._settled) >= MAX_SETTLED:
            self._settled.clear()
        self._settled.add(key)

    def forget(self, workspace: Path) -> None:
        """The drive in ``workspace`` ended: the next one walks it again before its first process."""
        self._settled.discard(str(workspace))

    async def settle(self, workspace: Path) -> sandbox_user.Settled | None:
        """After a sandboxed process (and before the first of a drive): no setuid/setgid bit left in
        the workspace, and as root everything in it the sandbox user's. Finished even if the
        caller is cancelled (Stop during a command)."""
        if not self.confined:
            return None
        owner = self._owner if self.dropping else None
        if self.dropping and owner is None:
            return None  # no sandbox user: nothing could have run
        work = asyncio.ensure_future(asyncio.to_thread(_settle, workspace, self.store_dir, owner))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(work, 30)
            raise


class NetNs:
    """A session's own network namespace (:meth:`Sandbox.open_netns`): its holder process and a
    descriptor of the namespace. Closed when the session's last program ends; a command running
    in it keeps the namespace alive until it exits."""

    def __init__(self, fd: int, proc: asyncio.subprocess.Process) -> None:
        self.fd = fd
        self.proc = proc

    @property
    def alive(self) -> bool:
        return self.fd >= 0 and self.proc.returncode is None

    async def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.proc.wait(), 5)


def _read_info(fd: int) -> dict[str, Any]:
    """bwrap's ``--info-fd`` JSON (its child's pid), read until the object is whole."""
    import json

    data = b""
    while b"}" not in data:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    out = json.loads(data.decode())
    if not isinstance(out, dict):
        raise ValueError("bwrap's info is not an object")
    return out


def _settle(workspace: Path, store_dir: str, owner: Owner | None) -> sandbox_user.Settled | None:
    try:
        return sandbox_user.settle(workspace, store_dir, owner)
    except OSError:  # the workspace is gone (or not a folder): nothing to settle
        return None


def _ensure_store(workspace: Path, store_dir: str) -> None:
    """The versions store folder exists before the command, so it can be mounted read-only
    (a command could otherwise create it and plant content in it)."""
    with safefs.open_dir(workspace, store_dir, create=True):
        pass
