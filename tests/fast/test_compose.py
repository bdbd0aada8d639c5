"""docker-compose.yml is a valid compose document naming every service (no engine needed), and its
servers admit only coxswain: the users and rights of ``coxswain.access``, passwords from the
environment with no default."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from coxswain import access, subjects

ROOT = Path(__file__).resolve().parents[2]


def _schema() -> dict[str, Any]:
    # The official compose-spec schema, taken by ./dev out of the docker-compose 1.29.2 wheel.
    path = Path(sys.prefix) / "share" / "compose-spec.json"
    assert path.is_file(), f"{path} is missing: run ./dev setup"
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


def test_compose_file_is_valid_and_names_every_service() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    jsonschema.Draft7Validator(_schema()).validate(doc)
    services = doc["services"]
    for name in ("nats", "redis", "gateway", "turn-runner", "guard", "judge", "versions"):
        assert name in services, name
    runner = services["turn-runner"]
    assert "container_name" not in runner and "ports" not in runner, "--scale turn-runner=N must work"
    assert "appendfsync" in " ".join(map(str, services["redis"]["command"]))
    assert "always" in " ".join(map(str, services["redis"]["command"]))
    nats_conf = (ROOT / "deploy" / "nats.conf").read_text()
    assert "sync_interval: always" in nats_conf
    for name in ("gateway", "turn-runner", "guard", "judge", "versions"):
        assert services[name].get("build") or services[name].get("image"), name


def _var(user: str) -> str:
    """The variable holding ``user``'s password (the same on NATS and Redis)."""
    return "COX_" + user.upper().replace("-", "_") + "_PASSWORD"


def _bare(text: str) -> str:
    """``${VAR:?message}`` -> ``${VAR}``."""
    return re.sub(r"\$\{([A-Z0-9_]+):\?[^}]*\}", r"${\1}", text)


def test_compose_servers_admit_only_coxswain_with_passwords_from_the_environment() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    refs = re.findall(r"\$\{([A-Z0-9_]+)([^}]*)\}", text)
    secrets = [(name, mod) for name, mod in refs if name == "COX_TOKEN" or name.endswith("_PASSWORD")]
    assert secrets and all(mod.startswith(":?") for _, mod in secrets), "every secret is required: no default"
    # The rest are settings with defaults: the official images, the port, the workspaces volume.
    assert {name for name, mod in refs if not mod.startswith(":?")} == {
        "COX_IMAGE", "COX_BASE_IMAGE", "COX_NATS_IMAGE", "COX_REDIS_IMAGE", "COX_PORT", "COX_WORKSPACES"}
    doc = yaml.safe_load(text)
    services = doc["services"]

    # NATS: deploy/nats.conf holds access's users, passwords from the nats container's environment.
    nats_conf = (ROOT / "deploy" / "nats.conf").read_text()
    assert access.nats_authorization({u: "$" + _var(u) for u in access.NATS_USERS}) in nats_conf, (
        "deploy/nats.conf no longer matches coxswain.access: regenerate its authorization block")
    nats_env = services["nats"]["environment"]
    assert {k: _bare(v) for k, v in nats_env.items()} == {_var(u): "${" + _var(u) + "}" for u in access.NATS_USERS}

    # Redis: the --user arguments are access's users, passwords from the environment.
    cmd = [_bare(str(x)) for x in services["redis"]["command"]]
    users = cmd[cmd.index("--user"):]
    assert users == access.redis_user_args({u: ">${" + _var(u) + "}" for u in access.REDIS_USERS})

    # Each service logs in as itself, to Redis only when it uses it.
    for name in subjects.SERVICES:
        env = {k: _bare(str(v)) for k, v in services[name]["environment"].items()}
        assert env["COX_NATS_USER"] == name and env["COX_NATS_PASSWORD"] == "${" + _var(name) + "}", name
        if name in access.REDIS_USERS:
            assert env["COX_REDIS_USER"] == name and env["COX_REDIS_PASSWORD"] == "${" + _var(name) + "}", name
        else:
            assert "COX_REDIS_USER" not in env and "COX_REDIS_PASSWORD" not in env, name

    readme = (ROOT / "README.md").read_text()
    for var in {v for v, _ in refs}:
        assert var in readme, f"README does not document {var}"


def test_the_image_installs_exactly_the_dependencies_of_pyproject() -> None:
    """The Dockerfile's dependency layer is keyed on deploy/images/requirements.txt, not on
    pyproject.toml (so a dev extra or a tool setting rebuilds nothing): the two must agree."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    want = project["project"]["dependencies"] + project["build-system"]["requires"]
    lines = (ROOT / "deploy" / "images" / "requirements.txt").read_text().splitlines()
    have = [line for line in lines if line.strip() and not line.startswith("#")]
    assert have == want, "deploy/images/requirements.txt differs from pyproject.toml's dependencies: regenerate it"
