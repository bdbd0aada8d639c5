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
  through coxswain's egress proxy (:mod:`cox_runner.egress`: one Unix socket bound in, a
  forwarder on its own ``127.0.0.1``, the proxy variables set), which refuses non-public
  addresses and records every connection;
- no capabilities, its own session (no terminal to inject into), and it dies with the runner
  (``--die-with-parent``); the runner kills the whole tree on Stop or a time-out.

The environment is the scrubbed one :func:`cox_runner.tools.command_env` builds.

Fail closed: when bwrap is missing or cannot make its namespaces, :meth:`Sandbox.argv` raises
:class:`SandboxUnavailable` and the command is refused; it never runs bare. ``mode = "none"``
is the explicit way to run bare; the runner logs it loudly at start and ``/healthz`` and the
session object show it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coxswain import safefs
from coxswain.config import SandboxConfig

from . import egress as egress_mod
from .errors import SandboxUnavailable

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Read-only as they are on the host; on a merged-/usr system most are links into /usr."""
ALWAYS_HIDDEN = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers",
                 "/etc/sudoers.d", "/etc/ssh", "/etc/ssl/private", "/etc/security/opasswd")
"""Hidden even when readable: a runner that is not root would see them only where the host is
misconfigured, and then they are still not a command's business."""
MAX_ETC_ENTRIES = 20_000
PROBE_TIMEOUT_S = 10.0


@dataclass
class SandboxStatus:
    mode: str
    available: bool
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "available": self.available, **({"reason": self.reason} if self.reason else {})}


def hidden_in_etc(etc: str = "/etc") -> tuple[list[str], list[str]]:
    """Folders and files under ``etc`` that other users may not read (plus :data:`ALWAYS_HIDDEN`).

    Links are not followed (a link's target is judged where it lives). A hidden folder's
    contents are not walked: the folder is replaced by an empty one.
    """
    dirs: list[str] = []
    files: list[str] = []
    count = 0
    for top, subdirs, names in os.walk(etc, followlinks=False):
        keep: list[str] = []
        for d in subdirs:
            path = os.path.join(top, d)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            if path in ALWAYS_HIDDEN or not st.st_mode & stat.S_IROTH or not st.st_mode & stat.S_IXOTH:
                dirs.append(path)
            else:
                keep.append(d)
        subdirs[:] = keep
        for n in names:
            count += 1
            if count > MAX_ETC_ENTRIES:
                break
            path = os.path.join(top, n)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            if path in ALWAYS_HIDDEN or not st.st_mode & stat.S_IROTH:
                files.append(path)
    return dirs, files


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
        self._base: list[str] | None = None
        self.egress = egress_mod.Egress(cfg)
        """The runner's egress proxy: a granted command's only way out."""

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
        on the way to bwrap: it execs bwrap with the death signal set, and spawning stays cheap."""
        return not self.confined or self._setpriv is None

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

    def _system_args(self) -> list[str]:
        if self._base is not None:
            return self._base
        args = ["--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL",
                "--hostname", "sandbox"]
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        args += ["--ro-bind", "/etc", "/etc"]
        dirs, files = hidden_in_etc()
        for d in dirs:
            args += ["--tmpfs", d]
        for f in files:
            args += ["--ro-bind", "/dev/null", f]
        args += ["--proc", "/proc"] if self.cfg.proc == "own" else ["--dir", "/proc"]
        args += ["--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "--tmpfs", "/run"]
        for p in self.cfg.extra_ro:
            args += ["--ro-bind-try", str(p), str(p)]
        for p in self.cfg.extra_rw:
            args += ["--bind-try", str(p), str(p)]
        self._base = args
        return args

    def _bwrap(self, program: str, workspace: Path, egress: str | None) -> list[str]:
        """bwrap's argv for ``workspace``; ``egress``: the proxy socket of a granted command (its
        network namespace stays its own: never ``--share-net``)."""
        ws = str(workspace)
        lead = [self._setpriv, "--pdeathsig", "KILL", "--"] if self._setpriv else []
        argv = [*lead, program, *self._system_args(), "--bind", ws, ws]
        store = workspace / self.store_dir
        if store.is_dir() and not store.is_symlink():
            argv += ["--ro-bind", str(store), str(store)]
        if egress is not None:
            argv += egress_mod.bwrap_args(egress)
        return [*argv, "--chdir", ws]

    def argv(self, workspace: Path, command: str, network: bool, *, egress: str | None = None,
             offline: bool = False) -> list[str]:
        """The argv that runs ``command`` with bash in ``workspace``; raises when it cannot be confined.
        Granted the network (``network`` or ``[sandbox] network``), ``egress`` is the proxy socket
        of :meth:`cox_runner.egress.Egress.grant` (without one it is refused). ``offline`` (a
        hook): no network whatever ``[sandbox] network`` says."""
        shell = ["/bin/bash", "-c", command]
        if self.cfg.mode == "none":
            return shell
        return self._confined(workspace, shell, network and not offline, None if offline else egress, offline)

    def wrap(self, workspace: Path, argv: list[str], network: bool, *, egress: str | None = None) -> list[str]:
        """The argv that runs the program ``argv`` (a stdio MCP server) confined like a command,
        in ``workspace``; raises when it cannot be confined (never runs it bare). Unconfined
        (``mode = "none"``) it still dies with the runner when ``setpriv`` is there."""
        if self.cfg.mode == "none":
            return [self._setpriv, "--pdeathsig", "KILL", "--", *argv] if self._setpriv else list(argv)
        return self._confined(workspace, argv, network, egress)

    def _confined(self, workspace: Path, argv: list[str], network: bool, egress: str | None = None,
                  offline: bool = False) -> list[str]:
        """``argv`` under bubblewrap in ``workspace``; raises when it cannot be confined."""
        program = self._program()
        if program is None:
            raise SandboxUnavailable(self._missing().reason)
        if self._status is not None and not self._status.available:
            raise SandboxUnavailable(self._status.reason)
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
        return [*self._bwrap(program, workspace, egress if network else None), "--", *argv]

    async def probe(self) -> SandboxStatus:
        """Start ``true`` in the sandbox once (in a scratch folder): bwrap present and its
        namespaces allowed."""
        if self.cfg.mode == "none":
            return self.status()
        program = self._program()
        if program is None:
            return self._missing()
        with tempfile.TemporaryDirectory(prefix="cox-sandbox-probe-") as scratch:
            argv = [*self._bwrap(program, Path(scratch), None), "--", "/bin/true"]
            try:
                proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                            stdout=asyncio.subprocess.DEVNULL,
                                                            stderr=asyncio.subprocess.PIPE)
                _, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                self._status = SandboxStatus("bwrap", False, f"bwrap could not start: {exc}")
                return self._status
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip()[-300:] or f"exit code {proc.returncode}"
            if "mount proc" in why:
                why += (" (a container whose /proc Docker masks: run it with systempaths=unconfined, "
                        "or set [sandbox] proc = \"none\")")
            self._status = SandboxStatus("bwrap", False, f"bwrap cannot make its namespaces here: {why}")
        else:
            self._status = SandboxStatus("bwrap", True)
        return self._status

    async def ready(self) -> None:
        """Before a command: probe again while the sandbox is known not to work (it may have been
        installed or allowed since), so a fixed machine needs no restart."""
        if self.cfg.mode != "none" and (self._status is None or not self._status.available):
            await self.probe()


def _ensure_store(workspace: Path, store_dir: str) -> None:
    """The versions store folder exists before the command, so it can be mounted read-only
    (a command could otherwise create it and plant content in it)."""
    with safefs.open_dir(workspace, store_dir, create=True):
        pass
