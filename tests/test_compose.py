"""docker-compose.yml is a valid compose document naming every service (no engine needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _schema() -> dict:  # type: ignore[type-arg]
    # The official compose-spec schema, taken by ./dev out of the docker-compose 1.29.2 wheel.
    path = Path(sys.prefix) / "share" / "compose-spec.json"
    assert path.is_file(), f"{path} is missing: run ./dev setup"
    return json.loads(path.read_text())


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
