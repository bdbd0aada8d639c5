"""Resource limits per command, hook and MCP stdio server (``[sandbox]`` ``max_processes``,
``memory_mb``, ``cpu_seconds``, ``file_mb``; docs/design.md "Resource limits").

The kernel enforces them; this module only sets them up, notices that one was reached, kills
the whole tree and says which:

- **cgroups**, where the machine lets this process make them: every command gets a cgroup of its
  own in each hierarchy, created *under this runner's own cgroup* (read from ``/proc/self/cgroup``)
  so the limits of whatever contains the runner still apply. v1 (separate hierarchies, as on this
  project's CI VM): ``pids.max``, ``memory.limit_in_bytes`` (+ ``memsw``), ``cpu.shares`` below the
  runner's, cpuacct for the CPU time of the whole tree, the freezer to kill it. v2 (one unified
  hierarchy): ``pids.max``, ``memory.max``, ``memory.swap.max``, ``cpu.weight``, ``cgroup.kill``;
  the runner moves itself into a leaf child of its cgroup first, so it may enable the controllers
  for its command cgroups (the "no internal processes" rule).
- **rlimits**, always (util-linux ``prlimit``): ``RLIMIT_FSIZE`` (``file_mb``), ``RLIMIT_CPU``
  (``cpu_seconds``, per process), ``RLIMIT_CORE`` 0, ``RLIMIT_NOFILE``; ``RLIMIT_NPROC`` only where
  the pids cgroup is off (it counts every process of the user, so with one sandbox user for all
  sessions it would let one session's fork bomb refuse another's forks; without cgroups it is set
  to the user's processes at the start plus ``max_processes``). Never ``RLIMIT_AS`` (runtimes that
  reserve address space, such as the JVM, Go and V8, break under it).

The process joins its cgroups before it runs anything: the argv of the sandbox is prefixed with
``/bin/sh -c JOIN sh N procs... prlimit ... -- <argv>`` (the cgroup paths are positional
arguments, never interpolated into the script), which writes its own pid into each
``cgroup.procs``, then execs ``prlimit``, which execs the sandbox. Prepending keeps the join ahead
of any later privilege drop in the sandbox's own argv. A join that fails stops the command (exit
125): a command never runs unbounded where the limits were set up.

Noticing a limit: a short timer (:data:`POLL_S`) reads ``pids.events`` (fork refused at
``pids.max``), the OOM kill count (``memory.oom_control`` / ``memory.events``) and the CPU time
used (cpuacct / ``cpu.stat``); RLIMIT_FSIZE and RLIMIT_CPU show in the exit status (SIGXFSZ,
SIGXCPU) or the message of a program that ignores SIGXFSZ. A limit reached kills the whole
cgroup (v2 ``cgroup.kill``; v1 freeze, SIGKILL every member, thaw), as do Stop and a time-out,
and the cgroup is removed after.

Without a cgroup it may write (not root, no delegation) the rlimits still apply and the status
(``/healthz`` via the runner's health, the runner's start log) says ``cgroups: off`` and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import shutil
import signal
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coxswain.config import SandboxConfig

POLL_S = 0.1
"""How often a running command's cgroup counters are read."""
KILL_WAIT_S = 3.0
CPU_SHARES = 512
"""v1 ``cpu.shares`` of a command (the runner has the default 1024): under contention the runner
gets at least twice a command's CPU, so one command cannot starve it."""
CPU_WEIGHT = 50
"""v2 ``cpu.weight`` of a command (default 100), for the same reason."""
NOFILE = 65536
"""RLIMIT_NOFILE of a command (lowered to the runner's own hard limit when that is lower)."""
CPU_GRACE_S = 5
"""RLIMIT_CPU: SIGXCPU at ``cpu_seconds``, SIGKILL this much later."""
V1_CONTROLLERS = ("pids", "memory", "cpu", "cpuacct", "freezer")
V2_CONTROLLERS = ("pids", "memory", "cpu")
JOIN = ('n=$1; shift; while [ "$n" -gt 0 ]; do '
        'echo $$ > "$1" || { echo "coxswain: the command could not join its cgroup" >&2; exit 125; }; '
        'shift; n=$((n-1)); done; exec "$@"')
"""The prefix's script: ``$1`` paths to join follow, then the argv to exec."""
UNITS = {"max_processes": "processes at once", "memory_mb": "MB", "cpu_seconds": "s of CPU",
         "file_mb": "MB per file", "workspace_mb": "MB added", "workspace_files": "files"}
FSIZE_SIGNAL_MESSAGE = re.compile(rb"File size limit exceeded")
"""What bash prints when a child of it died of SIGXFSZ (the command itself may go on)."""
FSIZE_ERROR_MESSAGE = re.compile(rb"File too large|EFBIG")
"""What a program that ignores SIGXFSZ (Python does) reports for EFBIG; counted on a failing exit."""


def describe(limit: str, cfg: SandboxConfig) -> str:
    """``max_processes ([sandbox] max_processes = 1024 processes at once)``."""
    return f"{limit} ([sandbox] {limit} = {getattr(cfg, limit)} {UNITS.get(limit, '')})".replace(" )", ")")


def killed_note(limit: str, cfg: SandboxConfig, what: str = "command") -> str:
    """The line a result ends with: the limit, and that the kernel (or the runner) stopped it."""
    how = "the write was refused" if limit == "file_mb" else "it was killed"
    return f"[stopped at a sandbox limit: the {what} passed {describe(limit, cfg)}; {how}]"


@dataclass
class LimitsStatus:
    cgroups: str
    """``v1``, ``v2`` or ``off``."""
    controllers: list[str] = field(default_factory=list)
    reason: str = ""
    rlimits: bool = True

    def as_dict(self, cfg: SandboxConfig) -> dict[str, Any]:
        out: dict[str, Any] = {"cgroups": self.cgroups, "rlimits": self.rlimits}
        if self.controllers:
            out["controllers"] = self.controllers
        if self.reason:
            out["reason"] = self.reason
        out["max_processes"] = cfg.max_processes
        out["memory_mb"] = cfg.memory_mb
        out["cpu_seconds"] = cfg.cpu_seconds
        out["file_mb"] = cfg.file_mb
        out["workspace_mb"] = cfg.workspace_mb
        out["workspace_files"] = cfg.workspace_files
        return out


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _read(path: Path) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _field(text: str, key: str) -> int:
    """``key N`` in a flat-keyed cgroup file (``pids.events``, ``memory.events``, ``cpu.stat``)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per v1 controller, and ``""`` for the v2 (unified) one."""
    out: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if ctrls == "":
            out[""] = path
        for c in ctrls.split(","):
            if c:
                out[c] = path
    return out


def _mounts() -> dict[str, Path]:
    """Mount point per v1 controller, and ``""`` for cgroup2."""
    out: dict[str, Path] = {}
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        mnt = Path(fields[4].replace("\\040", " "))
        if rest[0] == "cgroup2":
            out.setdefault("", mnt)
        elif rest[0] == "cgroup":
            for opt in rest[2].split(","):
                if opt in V1_CONTROLLERS:
                    out.setdefault(opt, mnt)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _user_processes(uid: int) -> int:
    n = 0
    with contextlib.suppress(OSError):
        for e in os.scandir("/proc"):
            if e.name.isdigit():
                with contextlib.suppress(OSError):
                    if e.stat(follow_symlinks=False).st_uid == uid:
                        n += 1
    return n


class Box:
    """One command's cgroups (possibly none) and rlimits: the argv prefix, the watch, the kill."""

    def __init__(self, limiter: Limiter, dirs: dict[str, Path], kind: str) -> None:
        self.limiter = limiter
        self.cfg = limiter.cfg
        self.dirs = dirs
        """Controller -> this box's cgroup folder (v2: ``""`` -> the one folder)."""
        self.kind = kind
        self.limit: str | None = None
        self.removed = False

    @property
    def v2(self) -> bool:
        return "" in self.dirs

    def _procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def argv(self, inner: list[str]) -> list[str]:
        """``inner`` prefixed with the cgroup join and the rlimits."""
        out: list[str] = []
        procs = self._procs_files()
        if procs:
            out += ["/bin/sh", "-c", JOIN, "sh", str(len(procs)), *procs]
        out += self.limiter.prlimit(self.kind, pids_cgroup="pids" in self.dirs or self.v2)
        return [*out, *inner]

    def _dir(self, ctrl: str) -> Path | None:
        return self.dirs.get("") if self.v2 else self.dirs.get(ctrl)

    def cpu_seconds_used(self) -> float | None:
        if self.v2:
            stat_file = self.dirs[""] / "cpu.stat"
            return _field(_read(stat_file), "usage_usec") / 1e6 if stat_file.exists() else None
        acct = self.dirs.get("cpuacct")
        if acct is None:
            return None
        raw = _read(acct / "cpuacct.usage").strip()
        return int(raw) / 1e9 if raw.isdigit() else None

    def exceeded(self) -> str | None:
        """The limit the kernel enforced in this box, if one was reached (pids, memory, CPU time)."""
        cfg = self.cfg
        d = self._dir("pids")
        if d is not None and cfg.max_processes and _field(_read(d / "pids.events"), "max") > 0:
            return "max_processes"
        d = self._dir("memory")
        if d is not None and cfg.memory_mb:
            events = _read(d / ("memory.events" if self.v2 else "memory.oom_control"))
            if _field(events, "oom_kill") > 0:
                return "memory_mb"
        if cfg.cpu_seconds and self.kind != "mcp":
            used = self.cpu_seconds_used()
            if used is not None and used >= cfg.cpu_seconds:
                return "cpu_seconds"
        return None

    def note_exit(self, code: int | None, output: bytes = b"") -> str | None:
        """The limit an exit shows (rlimits only), when no cgroup counter named one."""
        if self.cfg.file_mb and (code in (128 + signal.SIGXFSZ, -signal.SIGXFSZ)
                                 or FSIZE_SIGNAL_MESSAGE.search(output)
                                 or (code != 0 and FSIZE_ERROR_MESSAGE.search(output))):
            return "file_mb"
        if code in (128 + signal.SIGXCPU, -signal.SIGXCPU) and self.cfg.cpu_seconds:
            return "cpu_seconds"
        return None

    def members(self) -> list[int]:
        pids: set[int] = set()
        for f in self._procs_files():
            for line in _read(Path(f)).split():
                if line.isdigit():
                    pids.add(int(line))
        return sorted(pids)

    def kill(self) -> None:
        """SIGKILL every process in the box (blocking, bounded); a fork bomb cannot outrun it."""
        if not self.dirs or self.removed:
            return
        if self.v2:
            d = self.dirs[""]
            if (d / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    _write(d / "cgroup.kill", "1")
                self._wait_empty()
                return
        freezer = self._dir("freezer") if not self.v2 else self.dirs[""]
        freeze_file = None if freezer is None else freezer / ("cgroup.freeze" if self.v2 else "freezer.state")
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:
            if freeze_file is not None:
                with contextlib.suppress(OSError):
                    _write(freeze_file, "1" if self.v2 else "FROZEN")
                self._wait_frozen(freeze_file)
            pids = self.members()
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if freeze_file is not None:
                with contextlib.suppress(OSError):
                    _write(freeze_file, "0" if self.v2 else "THAWED")
            if not pids:
                return
            time.sleep(0.01)

    def _wait_frozen(self, freeze_file: Path) -> None:
        if self.v2:
            return  # cgroup.events "frozen 1"; the kill loop repeats anyway
        end = time.monotonic() + 0.5
        while time.monotonic() < end and _read(freeze_file).strip() == "FREEZING":
            time.sleep(0.005)

    def _wait_empty(self) -> None:
        end = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < end and self.members():
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill what is left and remove the cgroups (retried later by the limiter if busy)."""
        if self.removed:
            return
        self.kill()
        self.removed = True
        for d in set(self.dirs.values()):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                self.limiter.leftover.add(d)

    async def watch(self) -> str:
        """Return (after killing the box) the first limit the kernel reports reached."""
        import asyncio

        while True:
            await asyncio.sleep(POLL_S)
            limit = self.exceeded()
            if limit is not None:
                self.limit = limit
                await asyncio.to_thread(self.kill)
                return limit

    async def close(self) -> None:
        import asyncio

        await asyncio.shield(asyncio.to_thread(self.remove))


class Limiter:
    """This runner's limits: probes the cgroups once, then makes a :class:`Box` per command."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self._status: LimitsStatus | None = None
        self._bases: dict[str, Path] = {}
        """Controller -> the runner's own cgroup folder, where command cgroups are made."""
        self._n = 0
        self.leftover: set[Path] = set()
        self._prlimit = shutil.which("prlimit")
        self.prefix = f"cox-{os.getpid()}-"

    def status(self) -> LimitsStatus:
        if self._status is None:
            self.probe()
        assert self._status is not None
        return self._status

    # ---------------------------------------------------------------- probe
    def probe(self) -> LimitsStatus:
        rl = self._prlimit is not None
        try:
            st = self._probe_v1() or self._probe_v2()
        except OSError as exc:  # pragma: no cover - a host whose cgroupfs misbehaves
            st = LimitsStatus("off", reason=f"cgroups could not be set up: {exc.strerror}")
        st.rlimits = rl
        if not rl:
            st.reason = (st.reason + "; " if st.reason else "") + "prlimit (util-linux) not found: no rlimits"
        self._status = st
        self._sweep()
        return st

    def _probe_v1(self) -> LimitsStatus | None:
        own, mounts = _own_cgroups(), _mounts()
        have = [c for c in V1_CONTROLLERS if c in mounts and c in own]
        if not have:
            return None
        bases: dict[str, Path] = {}
        why: list[str] = []
        for c in have:
            base = mounts[c] / own[c].lstrip("/")
            test = base / f"{self.prefix}probe"
            try:
                test.mkdir(exist_ok=True)
                test.rmdir()
            except OSError as exc:
                why.append(f"{c}: {exc.strerror}")
                continue
            bases[c] = base
        if not bases:
            return LimitsStatus("off", reason="no cgroup this process may create (" + "; ".join(why) + ")")
        self._bases = bases
        missing = [c for c in ("pids", "memory") if c not in bases]
        reason = f"without {', '.join(missing)}" if missing else ""
        return LimitsStatus("v1", sorted(bases), reason)

    def _probe_v2(self) -> LimitsStatus:
        own, mounts = _own_cgroups(), _mounts()
        if "" not in mounts or "" not in own:
            return LimitsStatus("off", reason="no cgroup filesystem")
        base = mounts[""] / own[""].lstrip("/")
        avail = _read(base / "cgroup.controllers").split()
        want = [c for c in V2_CONTROLLERS if c in avail]
        if not want:
            return LimitsStatus("off", reason="no cgroup controller is delegated to this process's cgroup")
        enabled = set(_read(base / "cgroup.subtree_control").split())
        if not set(want) <= enabled:
            try:
                self._enable_v2(base, [c for c in want if c not in enabled])
            except OSError as exc:
                return LimitsStatus("off", reason=f"cannot enable cgroup controllers here: {exc.strerror}")
        test = base / f"{self.prefix}probe"
        try:
            test.mkdir(exist_ok=True)
            test.rmdir()
        except OSError as exc:
            return LimitsStatus("off", reason=f"cannot create a cgroup: {exc.strerror}")
        self._bases = {"": base}
        return LimitsStatus("v2", want)

    def _enable_v2(self, base: Path, ctrls: list[str]) -> None:
        """Enable ``ctrls`` for children of ``base``; a cgroup with processes cannot, so this
        process first moves into a leaf child (``<base>/cox-runner-<pid>``)."""
        line = " ".join(f"+{c}" for c in ctrls)
        try:
            _write(base / "cgroup.subtree_control", line)
            return
        except OSError as exc:
            if exc.errno != 16:  # EBUSY: processes in base
                raise
        leaf = base / f"cox-runner-{os.getpid()}"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(os.getpid()))
        _write(base / "cgroup.subtree_control", line)

    def _sweep(self) -> int:
        """Kill what is left in the command cgroups of a dead runner of this host, and remove
        them: a runner killed -9 leaves its command running when the kernel's death signal does
        not reach it (a process whose credentials changed loses its PDEATHSIG). Every second
        (:meth:`reap`) and at start; answers how many processes it killed."""
        killed = 0
        for base in set(self._bases.values()):
            with contextlib.suppress(OSError):
                for e in os.scandir(base):
                    m = re.fullmatch(r"cox-(\d+)-.*", e.name)
                    if m and e.is_dir() and int(m[1]) != os.getpid() and not _alive(int(m[1])):
                        for _ in range(50):
                            pids = [int(x) for x in _read(Path(e.path) / "cgroup.procs").split() if x.isdigit()]
                            if not pids:
                                break
                            for pid in pids:
                                with contextlib.suppress(OSError):
                                    os.kill(pid, signal.SIGKILL)
                                    killed += 1
                            time.sleep(0.01)
                        with contextlib.suppress(OSError):
                            os.rmdir(e.path)
        return killed

    async def reap(self) -> None:
        """The runner's periodic sweep of dead runners' command cgroups (see :meth:`_sweep`)."""
        if self._status is not None and self._status.cgroups != "off":
            await asyncio.to_thread(self._sweep)

    # ---------------------------------------------------------------- boxes
    def box(self, kind: str = "cmd") -> Box:
        """A new box: cgroups made and limited (none when cgroups are off)."""
        st = self.status()
        for d in list(self.leftover):
            with contextlib.suppress(OSError):
                os.rmdir(d)
                self.leftover.discard(d)
        if st.cgroups == "off":
            return Box(self, {}, kind)
        self._n += 1
        name = f"{self.prefix}{kind}{self._n}"
        dirs: dict[str, Path] = {}
        made: list[Path] = []
        try:
            for c, base in self._bases.items():
                d = base / name
                d.mkdir()
                made.append(d)
                dirs[c] = d
                self._configure(c, d, kind)
        except OSError:
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        return Box(self, dirs, kind)

    def _configure(self, ctrl: str, d: Path, kind: str) -> None:
        cfg = self.cfg
        mem = cfg.memory_mb * 1024 * 1024
        if ctrl == "":
            avail = set(_read(d / "cgroup.controllers").split())
            if "pids" in avail and cfg.max_processes:
                _write(d / "pids.max", str(cfg.max_processes))
            if "memory" in avail and mem:
                _write(d / "memory.max", str(mem))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swap.max", "0")
            if "cpu" in avail:
                with contextlib.suppress(OSError):
                    _write(d / "cpu.weight", str(CPU_WEIGHT))
        elif ctrl == "pids" and cfg.max_processes:
            _write(d / "pids.max", str(cfg.max_processes))
        elif ctrl == "memory" and mem:
            _write(d / "memory.limit_in_bytes", str(mem))
            if (d / "memory.memsw.limit_in_bytes").exists():
                with contextlib.suppress(OSError):
                    _write(d / "memory.memsw.limit_in_bytes", str(mem))
        elif ctrl == "cpu":
            with contextlib.suppress(OSError):
                _write(d / "cpu.shares", str(CPU_SHARES))

    def prlimit(self, kind: str, pids_cgroup: bool) -> list[str]:
        """``prlimit --core=0 --nofile=... --fsize=... --cpu=... [--nproc=...] --`` (or nothing)."""
        if self._prlimit is None:
            return []
        cfg = self.cfg
        args = [self._prlimit, "--core=0"]

        def capped(res: int, want: int) -> int:
            hard = resource.getrlimit(res)[1]
            return want if hard == resource.RLIM_INFINITY else min(want, hard)

        args.append(f"--nofile={capped(resource.RLIMIT_NOFILE, NOFILE)}")
        if cfg.file_mb:
            args.append(f"--fsize={capped(resource.RLIMIT_FSIZE, cfg.file_mb * 1024 * 1024)}")
        if cfg.cpu_seconds and kind != "mcp":
            hard = capped(resource.RLIMIT_CPU, cfg.cpu_seconds + CPU_GRACE_S)
            args.append(f"--cpu={min(cfg.cpu_seconds, hard)}:{hard}")
        if cfg.max_processes and not pids_cgroup and os.getuid() != 0:
            # Per user, not per command: the user's processes now plus this command's allowance.
            want = _user_processes(os.getuid()) + cfg.max_processes
            args.append(f"--nproc={capped(resource.RLIMIT_NPROC, want)}")
        return [*args, "--"]


_LIMITERS: weakref.WeakKeyDictionary[Any, Limiter] = weakref.WeakKeyDictionary()


def of(sandbox: Any) -> Limiter:
    """The limiter that goes with a :class:`~cox_runner.workspace.sandbox.Sandbox` (one per runner)."""
    lim = _LIMITERS.get(sandbox)
    if lim is None or lim.cfg is not sandbox.cfg:
        lim = _LIMITERS[sandbox] = Limiter(sandbox.cfg)
    return lim
