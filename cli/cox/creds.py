"""Credentials for the servers coxswain starts: a random password per user on NATS and Redis.

``cox up`` generates them at every start, keeps them in ``.cox/credentials.json`` (mode 0600;
``admin`` is there for an operator's ``nats``/``redis-cli``) and hands each service only its own
user through ``COX_NATS_USER``/``COX_NATS_PASSWORD`` and ``COX_REDIS_USER``/``COX_REDIS_PASSWORD``.
The users and what each may do are :mod:`coxswain.access`.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from coxswain import access


def _password() -> str:
    return secrets.token_urlsafe(24)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600 from the first byte)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)  # an older file of the same name kept its mode through O_CREAT
    os.replace(tmp, path)


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) a folder only its owner can enter (0700)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def private_append(path: Path) -> int:
    """An fd appending to ``path``, created 0600 (an older file is made 0600 too)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


@dataclass(frozen=True)
class Credentials:
    nats: Mapping[str, str]
    """user -> password for every one of ``access.NATS_USERS``"""
    redis: Mapping[str, str]
    """user -> password for every one of ``access.REDIS_USERS``"""

    @classmethod
    def generate(cls) -> Credentials:
        return cls(nats={u: _password() for u in access.NATS_USERS},
                   redis={u: _password() for u in access.REDIS_USERS})

    @classmethod
    def load(cls, path: Path) -> Credentials:
        data = json.loads(Path(path).read_text())
        creds = cls(nats=dict(data["nats"]), redis=dict(data["redis"]))
        missing = [f"nats:{u}" for u in access.NATS_USERS if not creds.nats.get(u)]
        missing += [f"redis:{u}" for u in access.REDIS_USERS if not creds.redis.get(u)]
        if missing:
            raise ValueError(f"{path} has no password for {', '.join(missing)}")
        return creds

    def save(self, path: Path) -> None:
        write_private(path, json.dumps({"nats": dict(self.nats), "redis": dict(self.redis)}, indent=2) + "\n")

    def nats_env(self, service: str) -> dict[str, str]:
        """The variables that make ``service`` connect to NATS as its own user."""
        return {"COX_NATS_USER": service, "COX_NATS_PASSWORD": self.nats[service]}

    def redis_env(self, service: str) -> dict[str, str]:
        """The same for Redis; nothing for a service that has no Redis user (guard, judge)."""
        if service not in self.redis or service == access.ADMIN:
            return {}
        return {"COX_REDIS_USER": service, "COX_REDIS_PASSWORD": self.redis[service]}

    def service_env(self, service: str) -> dict[str, str]:
        return {**self.nats_env(service), **self.redis_env(service)}

    def passwords(self) -> set[str]:
        """Every password here (a test looks for them in log files)."""
        return set(self.nats.values()) | set(self.redis.values())


def nats_admin_url(url: str, creds: Credentials) -> str:
    return _with_user(url, access.ADMIN, creds.nats[access.ADMIN])


def redis_admin_url(url: str, creds: Credentials) -> str:
    return _with_user(url, access.ADMIN, creds.redis[access.ADMIN])


def _with_user(url: str, user: str, password: str) -> str:
    """``url`` with ``user:password@`` (for clients that take only a URL). Never log it.

    A comma-separated list (the nodes of a NATS cluster) gets the user on every URL."""
    if "," in url:
        return ",".join(_with_user(u.strip(), user, password) for u in url.split(",") if u.strip())
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{rest}"
