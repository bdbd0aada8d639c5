"""``./dev bench --compare [FILE]``: this run's ratios beside a committed full run's.

Every figure is matched by section and name. A ratio is value / floor (for a throughput, floor /
value), so larger is worse on every row but the peer's, where the ratio is ours / theirs and
whether larger is worse depends on the unit (a rate: better; a time, CPU or memory: worse). A row
whose ratio grew by more than :data:`GREW` is a regression and listed first, unless the two
runs' ranges of it meet (a latency figure is the median of repeats, ``ratio_spread`` their lowest
and highest: a change inside them is the host's noise as far as two runs can tell); so is a row of
a figure the other run had that this one lost (a phase that failed). Values do not compare across
machines, ratios do better (the floors are measured in the same run) but not fully: the floors
are mostly the servers' and the kernel's work, ours mostly Python's, and a machine slower at
running Python moves our ratios with no change of ours (from an Intel Xeon to an AMD EPYC host:
1.12x -> 1.71x CPU per turn at S=100 for the same code). So the comparison first says whether
the machine differs, and how the interpreter's floor (``python``: the same pure-Python work per
op) moved: with it, a regression can be told from a slower interpreter.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GREW = 0.20
"""A ratio more than 20% larger than the committed run's is a regression."""
RATES = ("/s",)


def is_peer(section: str) -> bool:
    """A peer's rows: ``peer`` (LangGraph's, the name committed runs know it by) or ``peer <name>``."""
    return section == "peer" or section.startswith("peer ")


def last_committed(results: Path = HERE / "results") -> Path | None:
    """The full run (``<date>.json``, no suffix) most recently committed to git: by the commit
    that added it, not by its name, since a VM's clock can jump back between runs (a run committed
    last was once named hours before the one it followed). Outside git: the newest by name."""
    def full(paths: list[str]) -> list[str]:
        return [p for p in paths if p.endswith(".json") and "-" not in Path(p).stem]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=results, capture_output=True, text=True, check=True).stdout

    try:
        top = Path(git("rev-parse", "--show-toplevel").strip())
        added = git("log", "--diff-filter=A", "--format=", "--name-only", "--", ".").split()  # paths from top
        tracked = set(git("ls-files", "--full-name", ".").split())
    except (OSError, subprocess.CalledProcessError):
        names = sorted(full([p.name for p in results.glob("*.json")]))
        return results / names[-1] if names else None
    newest = next((p for p in full(added) if p in tracked), None)  # newest commit first; still in the tree
    return top / newest if newest else None


def _worse(row: dict[str, Any], before: float, now: float) -> float:
    """How much worse ``now`` is than ``before`` as a fraction (negative: better)."""
    if before == 0:
        return 0.0
    change = now / before - 1
    if is_peer(row["section"]) and any(row.get("unit", "").endswith(r) for r in RATES):
        return -change  # ours / theirs of a rate: larger is better
    return change


SAME_NAME_DRIFT = 0.3
"""The interpreter floor's change past which two runs under one CPU name are called different
machines (a quiet rerun on one host moves it by a few percent)."""


SERVER_FLOORS = ("nats_rr", "js_publish", "redis_cas", "send_chain")
"""Floors of the C servers (and the chain through them) whose p50 says how the host moved."""
FLOORS_MOVED = 0.15
"""A server floor's change past which the two runs' ratios are said to mix the host's change with
ours: two full runs of one commit an hour apart on one VM saw the floors move up to 20%, and a
day apart the same code's send moved 17-23%."""


def floors_change(now: dict[str, Any], then: dict[str, Any]) -> dict[str, float]:
    """now / then - 1 of each server floor's p50 measured in both runs (positive: slower now)."""
    def p50(res: dict[str, Any], kind: str) -> float | None:
        v = (((res.get("floors") or {}).get(kind) or {}).get("ms") or {}).get("p50")
        return float(v) if isinstance(v, (int, float)) and v > 0 else None

    out: dict[str, float] = {}
    for kind in SERVER_FLOORS:
        a, b = p50(now, kind), p50(then, kind)
        if a is not None and b is not None:
            out[kind] = round(a / b - 1, 3)
    return out


def machine(now: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """The two runs' machines (CPU model, cores) and the interpreter's floor (CPU µs per op of
    the ``python`` floor) in each; ``python_change`` is now / then - 1 (positive: slower here)."""
    def cpu(res: dict[str, Any], with_id: bool = True) -> str:
        m = res.get("meta") or {}
        named = str(m.get("cpu", "?"))
        if with_id and m.get("cpu_id"):
            named += f" ({m['cpu_id']})"
        return f"{named} x {m.get('cores', '?')}"

    def py(res: dict[str, Any]) -> float | None:
        v = ((res.get("floors") or {}).get("python") or {}).get("client_cpu_us")
        return float(v) if isinstance(v, (int, float)) else None

    p_now, p_then = py(now), py(then)
    # Family and model where both runs have them (runs before they were kept have the name only).
    both = bool((now.get("meta") or {}).get("cpu_id") and (then.get("meta") or {}).get("cpu_id"))
    same = cpu(now, both) == cpu(then, both)
    if same and p_now and p_then and abs(p_now / p_then - 1) > SAME_NAME_DRIFT:
        same = False  # one name, another CPU: a VM's "AMD EPYC" was two generations apart here
    return {"now": cpu(now), "then": cpu(then), "same": same,
            "python_us_now": p_now, "python_us_then": p_then,
            "python_change": round(p_now / p_then - 1, 3) if p_now and p_then else None,
            "floors_change": floors_change(now, then)}


def _range(row: dict[str, Any], ratio: float) -> tuple[float, float]:
    """The ratios a row's repeats gave, lowest and highest (``ratio_spread``; the ratio alone
    for a figure measured once)."""
    got = row.get("ratio_spread")
    if isinstance(got, list) and len(got) == 2 and all(isinstance(x, (int, float)) for x in got):
        return float(min(got)), float(max(got))
    return ratio, ratio


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two runs' ranges of a ratio meet: a change that one run's own repeats span is
    not told apart from the host's noise, whatever the medians say."""
    return a[0] <= b[1] and b[0] <= a[1]


def compare(rows: list[dict[str, Any]], other: dict[str, Any], name: str,
            res: dict[str, Any] | None = None) -> dict[str, Any]:
    """This run's ``rows`` against ``other`` (a result loaded by :func:`load`); ``res``, this
    run's whole result, for the machine note."""
    before = {(r["section"], r["figure"]): r for r in other.get("rows") or []}
    lines: list[dict[str, Any]] = []
    for r in rows:
        b = before.pop((r["section"], r["figure"]), None)
        now, was = r.get("ratio"), (b or {}).get("ratio")
        entry = {"section": r["section"], "figure": r["figure"], "ratio": now, "before": was, "change": None,
                 "regressed": False}
        if isinstance(now, (int, float)) and isinstance(was, (int, float)):
            worse = _worse(r, was, now)
            entry["change"] = round(worse, 3)
            entry["regressed"] = worse > GREW
            if entry["regressed"] and overlaps(_range(r, now), _range(b or {}, was)):
                entry["regressed"], entry["within_spread"] = False, True
        lines.append(entry)
    # A figure of a section this run measured but without it: a phase failed or lost a row. A
    # section this run did not measure at all (--only, no --peer) is only named.
    measured = {r["section"] for r in rows}
    lost = [{"section": s, "figure": f, "ratio": None, "before": b.get("ratio"), "change": None, "regressed": True}
            for (s, f), b in before.items() if s in measured and isinstance(b.get("ratio"), (int, float))]
    skipped = sorted({s for s, _ in before} - measured)
    return {"against": name, "threshold": GREW, "machine": machine(res or {}, other), "rows": lines, "lost": lost,
            "not_measured": skipped, "regressions": [x for x in lines if x["regressed"]] + lost,
            "within_spread": [x for x in lines if x.get("within_spread")]}


def markdown(cmp: dict[str, Any]) -> list[str]:
    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))

    regs = cmp["regressions"]
    out = [f"## Against {cmp['against']}", ""]
    m = cmp.get("machine")
    if m:
        py = ("the interpreter's floor (`python`) was not measured in both runs" if m["python_change"] is None else
              f"the interpreter's floor (`python`) {fmt(m['python_us_then'])} -> {fmt(m['python_us_now'])} µs/op "
              f"({m['python_change'] * 100:+.0f}%)")
        out += [(f"Same machine ({m['now']}); " if m["same"] else
                 f"**A different machine**: {m['then']} then, {m['now']} now; ratios of our Python-heavy work move "
                 f"with the interpreter's speed, the servers' floors less; ") + py + ".", ""]
        moved = m.get("floors_change") or {}
        if moved:
            listed = ", ".join(f"{k} {v * 100:+.0f}%" for k, v in moved.items())
            if any(abs(v) > FLOORS_MOVED for v in moved.values()):
                out += [f"**The servers' floors moved** between the two runs ({listed}): the host changed under "
                        "the same name, and a ratio's change mixes its change with ours. An interleaved A/B of the "
                        "two commits on one host tells them apart (bench/ANALYSIS.md).", ""]
            else:
                out += [f"The servers' floors (p50): {listed}.", ""]
    out += [(f"**{len(regs)} ratio(s) grew by more than {int(cmp['threshold'] * 100)}%** (worse):" if regs else
             f"No ratio grew by more than {int(cmp['threshold'] * 100)}%."), ""]
    for x in regs:
        what = "gone from this run" if x["ratio"] is None else f"{fmt(x['before'])} -> {fmt(x['ratio'])} " \
                                                               f"({x['change'] * 100:+.0f}% worse)"
        out.append(f"- {x['section']} / {x['figure']}: {what}")
    if inside := cmp.get("within_spread"):
        out += ["", f"Grew by more than {int(cmp['threshold'] * 100)}% but inside the spread of the repeats (the two "
                "runs' ranges of the ratio meet; not counted):", ""]
        out += [f"- {x['section']} / {x['figure']}: {fmt(x['before'])} -> {fmt(x['ratio'])} "
                f"({x['change'] * 100:+.0f}%)" for x in inside]
    if cmp["not_measured"]:
        out += ["", "Not measured in this run: " + ", ".join(cmp["not_measured"]) + "."]
    out += ["", "| section | figure | ratio now | ratio then | worse by |", "|---|---|---|---|---|"]
    for x in cmp["rows"]:
        ch = "-" if x["change"] is None else f"{x['change'] * 100:+.0f}%"
        out.append(f"| {x['section']} | {x['figure']} | {fmt(x['ratio'])} | {fmt(x['before'])} | "
                   f"{ch}{' **regressed**' if x['regressed'] else ' (inside the spread)' if x.get('within_spread') else ''} |")
    out.append("")
    return out


def load(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--compare {path}: not a bench result ({exc})") from exc
    if not isinstance(data.get("rows"), list):
        raise ValueError(f"--compare {path}: not a bench result (no rows)")
    return data
