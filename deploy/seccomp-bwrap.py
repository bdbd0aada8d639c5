#!/usr/bin/env python3
"""Writes deploy/seccomp-bwrap.json: Docker's default seccomp profile plus what bubblewrap needs.

The turn-runner runs every command in a bubblewrap sandbox, which makes user, mount, pid, net,
ipc and uts namespaces. Docker's default profile allows those syscalls only to containers with
CAP_SYS_ADMIN, and the runner has no capability at all (``cap_drop: [ALL]``). This profile is
the default one with exactly these allowed besides, each found necessary by taking it away
(bwrap then fails, with the message beside it):

- ``clone``, ``unshare``: new namespaces ("No permissions to create new namespace", "unshare user ns")
- ``mount``: the sandbox's own mounts ("Failed to make / slave")
- ``umount2``: dropping the container's root inside the sandbox ("unmount old root")
- ``pivot_root``: entering the sandbox's root ("pivot_root")
- ``sethostname``: ``--hostname sandbox`` in its own uts namespace ("Can't set hostname")

All of them act only inside the namespaces the unprivileged user makes: the kernel still refuses
them on the container's own mounts and hostname (no capability there).

The default profile is read from Debian's golang-github-docker-docker-dev, the source of the
docker.io engine package (``apt-get download`` it; nothing is installed), or from a file given
as the first argument. Run it again when the engine's default profile changes.
"""

from __future__ import annotations

import io
import json
import pathlib
import subprocess
import sys
import tarfile
import tempfile

BWRAP_SYSCALLS = ["clone", "mount", "pivot_root", "sethostname", "umount2", "unshare"]
MEMBER = "./usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json"
OUT = pathlib.Path(__file__).with_name("seccomp-bwrap.json")


def default_profile() -> tuple[dict, str]:
    if len(sys.argv) > 1:
        return json.loads(pathlib.Path(sys.argv[1]).read_text()), sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", "-q", "golang-github-docker-docker-dev"], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL)
        deb = next(pathlib.Path(tmp).glob("*.deb"))
        data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.extractfile(MEMBER)
            assert member is not None
            return json.load(member), deb.name


def main() -> None:
    profile, source = default_profile()
    profile["syscalls"].append({
        "names": BWRAP_SYSCALLS,
        "action": "SCMP_ACT_ALLOW",
        "args": [],
        "comment": f"coxswain: bubblewrap's namespaces without CAP_SYS_ADMIN (deploy/seccomp-bwrap.py; from {source})",
        "includes": {},
        "excludes": {},
    })
    OUT.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"wrote {OUT} from {source}")


if __name__ == "__main__":
    main()
