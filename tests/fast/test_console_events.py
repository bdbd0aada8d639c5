"""Every event type the log can hold has a deliberate rendering in the web console.

``static/js/rendering.js`` names, for each type of ``docs/events.schema.json``, where the console
shows it (or ``"none"``); ``static/js/state.js`` has a handler for each type that is shown. A new
event type added to ``coxswain.events`` without a rendering fails here, before any browser runs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "services/gateway/cox_gateway/static/js"


def schema_types() -> set[str]:
    schema = json.loads((ROOT / "docs/events.schema.json").read_text())
    return set(schema["discriminator"]["mapping"])


def rendering() -> dict[str, str]:
    text = (JS / "rendering.js").read_text()
    m = re.search(r"// BEGIN RENDERING\nexport const RENDERING = (\{.*?\});\n// END RENDERING", text, re.S)
    assert m, "rendering.js lost its BEGIN/END RENDERING block"
    table: dict[str, str] = json.loads(m.group(1))
    return table


def handled() -> set[str]:
    """The event types state.js's HANDLERS table has a method for (``"type"(m, ev)``)."""
    text = (JS / "state.js").read_text()
    body = text[text.index("const HANDLERS = {"):]
    names = set(re.findall(r'^  "([a-z]+(?:\.[a-z]+)*)"\(m, ev\)', body, re.M))
    if "[TURN_END](m, ev)" in body:
        names.add("turn.end")
    return names


def test_every_event_type_of_the_schema_has_a_rendering() -> None:
    table = rendering()
    missing = schema_types() - set(table)
    assert not missing, f"event types with no rendering in static/js/rendering.js: {sorted(missing)}"
    unknown = set(table) - schema_types()
    assert not unknown, f"rendering.js names types the schema does not have: {sorted(unknown)}"
    assert all(isinstance(v, str) and v.strip() for v in table.values())


def test_every_shown_type_has_a_handler_and_usage_folds_into_the_status_line() -> None:
    table = rendering()
    shown = {t for t, how in table.items() if how != "none"}
    assert shown - handled() == set(), f"shown but not handled in state.js: {sorted(shown - handled())}"
    assert handled() - set(table) == set(), f"handled but not in rendering.js: {sorted(handled() - set(table))}"
    assert table["usage"].startswith("turn status line")
    # The archiver's bookkeeping is deliberately not shown.
    assert table["session.archived"] == table["session.restored"] == "none"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_usage_adds_to_the_turn_and_unknown_or_silent_types_print_nothing(tmp_path: Path) -> None:
    probe = tmp_path / "probe.mjs"
    probe.write_text(f"""
import * as st from {json.dumps((JS / "state.js").as_uri())};
const m = new st.SessionModel("s_1");
let seq = 0;
const ev = (type, f) => m.apply({{type, seq: ++seq, sid: "s_1", turn_id: "t1", ts: 1000, ...f}});
ev("turn.start", {{model: "m"}});
ev("assistant.msg", {{text: "hi", usage: {{input_tokens: 10, output_tokens: 5}}}});
ev("usage", {{purpose: "turn", model: "m", input_tokens: 10, output_tokens: 5, cost: 0}});
ev("usage", {{purpose: "judge", model: "m", input_tokens: 100, output_tokens: 1, cost: 0}});
const before = m.items.length;
ev("session.archived", {{idle_ms: 5}});
ev("something.new", {{}});
ev("usage", {{purpose: "title", model: "m", input_tokens: 3, output_tokens: 1, cost: 0}});
console.log(JSON.stringify({{tokens: m.turn.input + m.turn.output, extra: m.turn.extra,
  added: m.items.length - before, unrendered: m.unrendered,
  notes: m.items.filter((i) => i.kind === "note").map((i) => i.text)}}));
""")
    run = subprocess.run(["node", str(probe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["tokens"] == 15 + 101 + 4, out  # the turn's own request once, then judge and title
    assert out["extra"] == {"judge": 101, "title": 4}
    assert out["added"] == 0 and out["unrendered"] == 1
    assert not any("usage" in n for n in out["notes"]), out["notes"]
