"""``./dev bench --compare``: which ratios count as grown, across the rows' kinds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import compare


def row(section: str, figure: str, ratio: float, unit: str = "ms") -> dict[str, object]:
    return {"section": section, "figure": figure, "ratio": ratio, "unit": unit, "value": 1, "floor": 1}


def test_a_ratio_grown_past_twenty_percent_is_a_regression_and_one_within_is_not() -> None:
    before = {"rows": [row("send", "p50", 2.0), row("tool calls", "per call", 2.0), row("lead", "p50", 2.0)]}
    now = [row("send", "p50", 2.5), row("tool calls", "per call", 2.3), row("lead", "p50", 1.0)]
    cmp = compare.compare(now, before, "then.json")
    assert [(r["figure"], r["change"]) for r in cmp["regressions"]] == [("p50", 0.25)]
    assert [r["regressed"] for r in cmp["rows"]] == [True, False, False]
    assert cmp["rows"][2]["change"] == -0.5
    text = "\n".join(compare.markdown(cmp))
    assert "1 ratio(s) grew by more than 20%" in text and "send / p50: 2 -> 2.5 (+25% worse)" in text


def test_a_peer_rate_is_better_larger_and_a_peer_cost_worse_larger() -> None:
    before = {"rows": [row("peer", "S=10 runs/s", 4.0, "runs/s"), row("peer", "S=10 CPU per run", 0.5, "ms")]}
    now = [row("peer", "S=10 runs/s", 2.0, "runs/s"), row("peer", "S=10 CPU per run", 0.9, "ms")]
    cmp = compare.compare(now, before, "then.json")
    assert [r["figure"] for r in cmp["regressions"]] == ["S=10 runs/s", "S=10 CPU per run"]
    faster = compare.compare([row("peer", "S=10 runs/s", 8.0, "runs/s")], before, "then.json")
    assert not faster["rows"][0]["regressed"]


def test_a_figure_lost_from_a_measured_section_counts_and_an_unmeasured_section_is_only_named() -> None:
    before = {"rows": [row("sweep", "S=10 turns/s", 1.2), row("sweep", "S=100 turns/s", 1.3),
                       row("peer", "S=10 runs/s", 4.0, "runs/s")]}
    cmp = compare.compare([row("sweep", "S=10 turns/s", 1.2)], before, "then.json")
    assert [(r["figure"], r["ratio"]) for r in cmp["regressions"]] == [("S=100 turns/s", None)]
    assert cmp["not_measured"] == ["peer"]
    assert "Not measured in this run: peer." in "\n".join(compare.markdown(cmp))


def test_the_default_is_the_newest_committed_full_run_and_a_bad_file_is_refused(tmp_path: Path) -> None:
    last = compare.last_committed()
    assert last is not None and last.exists() and "-" not in last.stem
    assert compare.load(last)["counts"]["name"] == "full"
    (tmp_path / "x.json").write_text(json.dumps({"no": "rows"}))
    with pytest.raises(ValueError, match="not a bench result"):
        compare.load(tmp_path / "x.json")
    with pytest.raises(ValueError, match="not a bench result"):
        compare.load(tmp_path / "missing.json")


def test_a_run_of_some_phases_is_never_named_as_a_full_run(tmp_path: Path) -> None:
    """``--only`` with full counts once wrote ``<date>.json``, the name ``--compare`` takes for the
    last full run: a later comparison would have set a whole run beside two phases."""
    from bench import report

    last = compare.last_committed()
    assert last is not None
    res = compare.load(last)
    res["meta"]["date"] = "2026-12-04T11:09:30"
    partial, _ = report.write(json.loads(json.dumps(res)), tmp_path, None, partial=True)
    whole, _ = report.write(json.loads(json.dumps(res)), tmp_path, None)
    quick, _ = report.write({**json.loads(json.dumps(res)), "counts": {**res["counts"], "name": "quick"}}, tmp_path,
                            None, partial=True)
    assert (partial.name, whole.name, quick.name) == ("20261204T110930-only.json", "20261204T110930.json",
                                                      "20261204T110930-quick.json")
