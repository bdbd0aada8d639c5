"""The gateway answers as its own ``/openapi.json`` says: schemathesis generates requests from the
live document of a running stack and checks every answer against it.

Schemathesis's engine (what ``schemathesis run`` drives) runs its examples, coverage and fuzzing
phases: valid and invalid bodies, queries, paths and headers, other methods, no token. The seed is
fixed, there is no example database and fuzzing makes at most ``MAX_EXAMPLES`` cases an
operation, so a run is the same every time and bounded by its number of cases, not by a clock
(with ``max-time`` set, fuzzing repeats until the time is spent); it takes some 30 s, and the
test's timeout stops a run that hangs. Any failure of any check fails the test: a status, content
type, header or body the document does not declare, a 5xx, an invalid request accepted, an
``Allow`` that does not list the path's methods, a request without the token answered. (Its
pytest plugin is not used: its lazy schema, needed for a URL known only once the stack runs,
reads ``Node._nodeid``, which pytest 9.2 no longer has.)

Every check runs except these, which cannot apply to this API:

- ``use_after_free`` and ``ensure_resource_availability`` (and the stateful phase) follow OpenAPI
  links from a create to a read or delete of the same resource; the document declares no links
  and no session is deleted over HTTP.
- ``positive_data_acceptance`` is off for ``POST /v1/sessions`` and ``PATCH /v1/sessions/{sid}``
  alone: whether a model or workspace name is accepted depends on the configuration and on the
  files under the root (an unknown model, a path outside the root or on the credential denylist
  are 422 ``invalid``), which JSON Schema cannot say. Invalid data must still be refused there
  (``negative_data_rejection``).
- ``allow_header_conformance`` is off for ``PUT /v1/sessions/{sid}/queue/order`` alone: that URL
  is also ``DELETE /v1/sessions/{sid}/queue/{mid}`` with ``mid = "order"``, so its ``Allow`` is
  truly ``DELETE, PUT``; schemathesis reads the methods of one template only.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import pytest
import schemathesis
from schemathesis.engine import Status, events, from_schema

from tests.support.stack import TOKEN, Stack, stack_fixture

SEED = 20_250_101
MAX_EXAMPLES = 60
SEMANTIC = [("POST", "/v1/sessions"), ("PATCH", "/v1/sessions/{sid}")]
"""Operations whose valid-looking input may be refused for what the schema cannot say (above)."""
SHADOWED = [("PUT", "/v1/sessions/{sid}/queue/order")]
"""Paths another template matches too: ``DELETE .../queue/{mid}`` takes ``.../queue/order``."""

stack = stack_fixture("openapi", runners=1)


def config() -> schemathesis.Config:
    return schemathesis.Config.from_dict({
        "seed": SEED,
        "headers": {"Authorization": f"Bearer {TOKEN}"},
        "request-timeout": 10,
        "max-stream-events": 3,
        "workers": 1,
        "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
        "phases": {"stateful": {"enabled": False}},
        "checks": {"enabled": True, "use_after_free": {"enabled": False},
                   "ensure_resource_availability": {"enabled": False}},
        "operations": [
            *({"include-method": m, "include-path": p, "checks": {"positive_data_acceptance": {"enabled": False}}}
              for m, p in SEMANTIC),
            *({"include-method": m, "include-path": p, "checks": {"allow_header_conformance": {"enabled": False}}}
              for m, p in SHADOWED),
        ],
    })


@dataclass(frozen=True)
class Found:
    operation: str
    check: str
    title: str
    message: str
    curl: str


def run(url: str) -> tuple[list[Found], list[str], Counter[str], events.EngineFinished]:
    """Every distinct failure, the errors, and how many cases each phase generated."""
    schema = schemathesis.openapi.from_url(url, config=config())
    found: dict[tuple[str, str, str], Found] = {}
    errors: list[str] = []
    cases: Counter[str] = Counter()
    finished: events.EngineFinished | None = None
    for event in from_schema(schema).execute():
        if isinstance(event, (events.ScenarioFinished, events.FuzzScenarioFinished)):
            cases[str(getattr(event, "phase", "fuzzing"))] += len(event.recorder.cases)
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        f = check.failure_info.failure
                        key = (event.recorder.label, check.name, f.title)
                        found.setdefault(key, Found(event.recorder.label, check.name, f.title, f.message,
                                                    check.failure_info.code_sample))
        elif isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {event.value!r}")
        elif isinstance(event, events.FatalError):
            raise event.exception
        elif isinstance(event, events.EngineFinished):
            finished = event
    assert finished is not None
    return list(found.values()), errors, cases, finished


def requests_answered(stack: Stack) -> int:
    text = httpx.get(f"{stack.url}/metrics", timeout=10).text
    return int(sum(float(v) for v in re.findall(r"^cox_http_requests_total\{.*\} (\S+)$", text, re.MULTILINE)))


@pytest.mark.timeout(180)
def test_the_gateway_answers_as_its_openapi_document_says(stack: Stack) -> None:
    with stack.client() as api:
        api.create("openapi")  # the caller's list holds a real session, whose body is checked too
    before, start = requests_answered(stack), time.monotonic()
    found, errors, cases, finished = run(f"{stack.url}/openapi.json")
    took = time.monotonic() - start
    answered = requests_answered(stack) - before
    print(f"\nschemathesis: {cases.total()} cases ({dict(cases)}), {answered} requests answered, "
          f"{len(found)} failures, {len(errors)} errors in {took:.1f}s ({finished.stop_reason})")
    report = "\n\n".join(f"{f.operation} [{f.check}] {f.title}\n{f.message}\n{f.curl}" for f in found)
    assert not errors, "\n".join(errors)
    assert not found, f"{len(found)} failures of the OpenAPI document:\n\n{report}"
    assert answered > 500 and cases.total() > 500, (answered, cases)  # it did test, and through the gateway
