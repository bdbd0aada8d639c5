"""The reference in docs/ stays true to the code.

Without a server: docs/events.schema.json is what ``python -m coxswain.schema`` generates; every
event type (with its fields), tool (with its arguments), error code and configuration key in the
code is in docs/api.md, and docs/api.md names no event type, tool or configuration key the code
does not have; every link between the docs and the README points at a file in the repository.

With a running stack: the endpoints docs/api.md lists (its ``### METHOD /path`` headings) are
exactly the routes in the gateway's ``/openapi.json``, and the events of a real turn validate
against docs/events.schema.json.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import BaseModel

from coxswain import errors, events, schema
from coxswain.config import Settings
from tests.support.stack import Api, Stack, script, tool

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
API_MD = DOCS / "api.md"
ENDPOINT = re.compile(r"^### (GET|POST|PUT|PATCH|DELETE) (/\S*)\s*$", re.MULTILINE)
COMMON_FIELDS = {"seq", "sid", "turn_id", "ts", "type"}


def api_text() -> str:
    return API_MD.read_text(encoding="utf-8")


def documented_routes() -> set[tuple[str, str]]:
    return {(m, p) for m, p in ENDPOINT.findall(api_text())}


def table_row(text: str, name: str) -> str | None:
    """The table row of docs/api.md whose first cell is `name` (in backticks)."""
    for line in text.splitlines():
        if line.startswith(f"| `{name}` |"):
            return line
    return None


def config_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every key of the settings, dotted as docs/api.md writes them (``limits.soft.tool_calls``,
    ``model.providers[].name``)."""
    for name, field in model.model_fields.items():
        ann = field.annotation
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from config_keys(ann, f"{prefix}{name}.")
        elif typing.get_origin(ann) is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            yield from config_keys(args[0], f"{prefix}{name}[].")
        else:
            yield prefix + name


def event_models() -> dict[str, type[BaseModel]]:
    union = typing.get_args(events.Event)[0]
    members = typing.get_args(union) if isinstance(union, types.UnionType) or typing.get_origin(union) else (union,)
    return {m.model_fields["type"].default: m for m in members}


# ---------------------------------------------------------------- no server


def test_the_committed_event_schema_is_what_the_code_generates() -> None:
    committed = (DOCS / "events.schema.json").read_text(encoding="utf-8")
    assert committed == schema.render(), (
        "docs/events.schema.json is stale: run `python -m coxswain.schema > docs/events.schema.json`")


def test_the_event_schema_covers_every_event_type() -> None:
    s = schema.events_schema()
    jsonschema.Draft202012Validator.check_schema(s)
    assert set(s["discriminator"]["mapping"]) == set(events.EVENT_TYPES)


def test_every_event_type_and_its_fields_are_in_api_md() -> None:
    text = api_text()
    models = event_models()
    assert set(models) == set(events.EVENT_TYPES)
    for name, model in models.items():
        row = table_row(text, name)
        assert row is not None, f"event type {name} has no row in docs/api.md (Events)"
        for field in set(model.model_fields) - COMMON_FIELDS:
            assert f"`{field}`" in row, f"field {field} of {name} is missing from its row in docs/api.md"


def test_api_md_documents_no_event_type_the_code_lacks() -> None:
    section = api_text().split("## Events", 1)[1].split("## Reading events", 1)[0]
    rows = set(re.findall(r"^\| `([a-z_]+\.[a-z_.]+|observed)` \|", section, re.MULTILINE))
    assert rows <= set(events.EVENT_TYPES), f"documented but not in events.py: {rows - set(events.EVENT_TYPES)}"


def test_every_outcome_skip_reason_and_actor_is_in_api_md() -> None:
    text = api_text()
    for lit in (events.Outcome, events.SkipReason, events.Actor, events.Via):
        for value in typing.get_args(lit):
            assert f"`{value}`" in text, f"{value} is missing from docs/api.md"


def test_every_tool_and_its_arguments_are_in_api_md() -> None:
    from cox_runner.workspace.tooldefs import TOOLS

    text = api_text()
    for t in TOOLS:
        row = table_row(text, t.name)
        assert row is not None, f"tool {t.name} has no row in docs/api.md (Tools)"
        for arg in t.parameters_json_schema["properties"]:
            assert f"`{arg}`" in row, f"argument {arg} of {t.name} is missing from its row in docs/api.md"
    section = text.split("## Tools the model has", 1)[1].split("## The script model", 1)[0]
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE))
    assert rows == {t.name for t in TOOLS}


def test_every_error_code_is_in_api_md() -> None:
    from cox_gateway.errors import STATUS_CODES

    text = api_text()
    codes = {cls.code: cls.status for cls in errors._BY_CODE.values()} | {errors.CoxError.code: 500}
    for code, status in codes.items():
        row = table_row(text, code)
        assert row is not None and f"| {status} |" in row, f"error {code} ({status}) is missing from docs/api.md"
    for status, code in STATUS_CODES.items():
        if status == 400:
            continue  # the gateway answers every 400 as bad_json (cox_gateway.errors.install)
        row = table_row(text, code)
        assert row is not None and f"| {status} |" in row, f"HTTP error {code} ({status}) is missing"


def test_every_config_key_is_in_api_md_and_no_other() -> None:
    text = api_text()
    keys = set(config_keys(Settings))
    assert "sandbox.mode" in keys and "model.providers[].name" in keys and "limits.soft.spend" in keys
    for key in keys:
        assert table_row(text, key) is not None, f"config key {key} has no row in docs/api.md (Configuration)"
    section = text.split("## Configuration", 1)[1]
    rows = set(re.findall(r"^\| `([a-z_.\[\]]+)` \|", section, re.MULTILINE))
    assert rows <= keys, f"documented but not in config.py: {rows - keys}"


def test_links_in_the_docs_and_readme_stay_in_the_repository() -> None:
    for path in (ROOT / "README.md", *DOCS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"^[a-z]+://", target):
                continue
            resolved = (path.parent / target).resolve()
            assert resolved.is_relative_to(ROOT.resolve()), f"{path.name} links outside the repository: {target}"
            assert resolved.exists(), f"{path.name} links to {target}, which does not exist"


def test_endpoint_headings_are_well_formed() -> None:
    headings = [line for line in api_text().splitlines() if line.startswith("### ") and " /" in line]
    assert headings and all(ENDPOINT.match(h) for h in headings), headings
    assert len(documented_routes()) == len(headings), "an endpoint is documented twice"


# ---------------------------------------------------------------- a running stack


def test_api_md_lists_exactly_the_routes_of_openapi(api: Api) -> None:
    r = api.http.get("/openapi.json")
    assert r.status_code == 200, r.text
    served = {(method.upper(), path) for path, ops in r.json()["paths"].items() for method in ops}
    documented = documented_routes()
    assert served - documented == set(), f"served but not in docs/api.md: {sorted(served - documented)}"
    assert documented - served == set(), f"in docs/api.md but not served: {sorted(documented - served)}"


def test_the_events_of_a_real_turn_fit_the_schema(stack: Stack, api: Api) -> None:
    validator = jsonschema.Draft202012Validator(json.loads((DOCS / "events.schema.json").read_text()))
    s = api.create("docs-schema")
    text = script(
        {"text": "Planning.", "tools": [tool("plan_write", steps=["write", "say"])]},
        {"tools": [tool("write_file", path="a.txt", content="one\n"), tool("plan_step", step=1)]},
        {"tools": [tool("respond", text="written"), tool("read_file", path="a.txt")]},
        {"text": "Done."},
    )
    assert api.send(s["id"], text).status_code == 202
    api.wait_type(s["id"], "turn.end")
    assert api.http.patch(f"/v1/sessions/{s['id']}", json={"title": "renamed", "dont_ask": True}).status_code == 200
    evs: list[dict[str, Any]] = api.all_events(s["id"])
    seen = {e["type"] for e in evs}
    assert {"session.created", "session.updated", "title.set", "user.msg", "turn.start", "plan.write",
            "plan.step", "version.kept", "file.written", "agent.message", "turn.end"} <= seen, seen
    for e in evs:
        problems = [err.message for err in validator.iter_errors(e)]
        assert not problems, f"{e['type']} does not fit docs/events.schema.json: {problems}"
