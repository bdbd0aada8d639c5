"""bubblewrap's command line for a sandboxed process (the mounts, namespaces and capabilities
:mod:`cox_runner.workspace.sandbox` describes), and the entries of ``/etc`` it hides.

``dropping`` (the runner is root and drops to ``[sandbox] user``) is the sandbox's to say; this
only builds the argv for it.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from coxswain.config import SandboxConfig
from coxswain.sandbox_user import Owner

from ..errors import SandboxUnavailable
from . import egress as egress_mod

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Read-only as they are on the host; on a merged-/usr system most are links into /usr."""
ALWAYS_HIDDEN = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers",
                 "/etc/sudoers.d", "/etc/ssh", "/etc/ssl/private", "/etc/security/opasswd")
"""Hidden even when readable: a runner that is not root would see them only where the host is
misconfigured, and then they are still not a command's business."""
MAX_ETC_ENTRIES = 20_000
ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_DAC_OVERRIDE")
"""What a root bwrap keeps for its last steps (``--chdir`` into a workspace that is the sandbox
user's, then the inner setpriv), which setpriv drops with every other before the command runs."""
ROOT_NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")
"""A root bwrap's namespaces: all of ``--unshare-all`` but the user namespace (whose uid 0 would be
the host's root, and in which the sandbox user would have no uid)."""


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


class Bwrap:
    def __init__(self, cfg: SandboxConfig, store_dir: str, setpriv: str | None) -> None:
        self.cfg = cfg
        self.store_dir = store_dir
        self.setpriv = setpriv
        """util-linux's setpriv (see :class:`~cox_runner.workspace.sandbox.Sandbox`), or None."""
        self._base: dict[bool, list[str]] = {}

    def system_args(self, dropping: bool, share_net: bool = False) -> list[str]:
        """The mounts, namespaces and capabilities of every sandbox. ``share_net`` (a root bwrap
        only, started by :meth:`join_net` inside a session's own network namespace): no new
        network namespace, so the process stays in that one (never the host's)."""
        if share_net and not dropping:
            raise SandboxUnavailable("only a root runner joins a session's network namespace")
        cached = self._base.get(share_net)
        if cached is not None:
            return cached
        args = ["--die-with-parent", "--new-session"]
        if dropping:
            spaces = [n for n in ROOT_NAMESPACES if not (share_net and n == "--unshare-net")]
            args += [*spaces, "--cap-drop", "ALL"]
            for cap in ROOT_CAPS:
                args += ["--cap-add", cap]
        else:
            args += ["--unshare-all", "--cap-drop", "ALL"]
        args += ["--hostname", "sandbox"]
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
        # /proc/sys read-only whoever the process is (sysctls write to the host's kernel).
        args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"] if self.cfg.proc == "own" \
            else ["--dir", "/proc"]
        if dropping:  # the sandbox user's scratch folders are everyone's, as on a host
            args += ["--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm", "--perms", "1777", "--tmpfs", "/tmp",
                     "--perms", "1777", "--tmpfs", "/var/tmp", "--tmpfs", "/run"]
        else:
            args += ["--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "--tmpfs", "/run"]
        for p in self.cfg.extra_ro:
            args += [*self.parents(str(p), dropping), "--ro-bind-try", str(p), str(p)]
        for p in self.cfg.extra_rw:
            args += [*self.parents(str(p), dropping), "--bind-try", str(p), str(p)]
        self._base[share_net] = args
        return args

    def parents(self, path: str, dropping: bool) -> list[str]:
        """As root, the folders bwrap makes above a mount point in the sandbox are root's and 0700
        (the sandbox user could not reach its workspace by path): they are made 0755 first."""
        if not dropping:
            return []
        out: list[str] = []
        parts = [p for p in os.path.normpath(path).split("/") if p]
        for i in range(1, len(parts)):
            top = "/" + "/".join(parts[:i])
            if top in SYSTEM_DIRS or top in ("/etc", "/proc", "/dev") or top.startswith(("/usr/", "/etc/", "/proc/")):
                continue
            out += ["--dir", top]
        return out

    def lead(self, program: str, dropping: bool) -> list[str]:
        """What starts bwrap: setpriv with the death signal (and ``no_new_privs`` for an
        unprivileged bwrap that is not setuid: nothing it runs gains a privilege by exec)."""
        if not self.setpriv:
            return []
        nnp = [] if dropping or _setuid(program) else ["--no-new-privs"]
        return [self.setpriv, "--pdeathsig", "KILL", *nnp, "--"]

    def join_net(self, netns: int) -> list[str]:
        """What enters the session's network namespace (the descriptor ``netns``, passed to the
        child) before bwrap starts: util-linux's nsenter, as root (it needs CAP_SYS_ADMIN)."""
        nsenter = shutil.which("nsenter")
        if nsenter is None or not nsenter.startswith(("/usr/", "/bin/", "/sbin/")):
            raise SandboxUnavailable("util-linux's nsenter is needed in the system folders to share a session's "
                                     "network namespace")
        return [nsenter, f"--net=/proc/self/fd/{netns}", "--"]

    def drop(self, owner: Owner) -> list[str]:
        """The last step inside a root bwrap: become the sandbox user (``owner``) for good."""
        inner = self.setpriv
        if inner is None or not inner.startswith(("/usr/", "/bin/", "/sbin/")):
            raise SandboxUnavailable("util-linux's setpriv is needed in the system folders to drop privilege "
                                     "(the runner is root); install util-linux")
        return [inner, f"--reuid={owner.uid}", f"--regid={owner.gid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"]

    def argv(self, program: str, workspace: Path, egress: str | None, dropping: bool,
             netns: int | None = None, info_fd: int | None = None) -> list[str]:
        """bwrap's argv for ``workspace``; ``egress``: the proxy socket of a granted command (its
        network namespace stays its own: never ``--share-net``). ``netns``: a descriptor of the
        session's own network namespace (:class:`~cox_runner.workspace.sandbox.NetNs`) to run in
        instead of a new one (root only; never with ``egress``). ``info_fd``: bwrap tells the
        pid of its child there."""
        if netns is not None and egress is not None:
            raise SandboxUnavailable("a command granted the network keeps a network namespace of its own")
        ws = str(workspace)
        lead = self.lead(program, dropping)
        if netns is not None:
            lead = [*self.join_net(netns), *lead]
        info = ["--info-fd", str(info_fd)] if info_fd is not None else []
        argv = [*lead, program, *info, *self.system_args(dropping, share_net=netns is not None),
                *self.parents(ws, dropping), "--bind", ws, ws]
        store = workspace / self.store_dir
        if store.is_dir() and not store.is_symlink():
            argv += ["--ro-bind", str(store), str(store)]
        if egress is not None:
            argv += egress_mod.bwrap_args(egress)
        return [*argv, "--chdir", ws]


def _setuid(program: str) -> bool:
    try:
        return bool(os.stat(program).st_mode & stat.S_ISUID)
    except OSError:
        return False
