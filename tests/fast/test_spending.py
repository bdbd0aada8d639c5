"""The daily budgets' arithmetic (cox_runner.spending; docs/api.md, "Budgets"), without a server."""

from __future__ import annotations

import json

from cox_runner import spending
from coxswain.config import LimitsConfig
from coxswain.session_view import spent_on

LIMITS = LimitsConfig(session_spend=0.10, principal_spend=1.0, warn_at=0.5)


def test_a_session_s_own_spend_limit_replaces_the_configured_budget() -> None:
    assert spending.session_limit({}, LIMITS) == (0.10, False)
    assert spending.session_limit({"spend_limit": "0.5"}, LIMITS) == (0.5, True)
    assert not spending.active({}, LimitsConfig())
    assert spending.active({"spend_limit": "0"}, LimitsConfig()), "an admin's budget applies without a config one"


def test_the_spend_of_another_day_counts_nothing() -> None:
    info = {"spend_day": "100", "spend_today": "0.07"}
    assert spent_on(info, 100) == 0.07
    assert spent_on(info, 101) == 0.0


def test_reached_names_the_first_budget_reached_and_its_words() -> None:
    today = spending.Today(day=7, session=0.11, principal=0.2)
    hit = spending.reached(today, {}, LIMITS)
    assert hit is not None and hit.budget == spending.SESSION and hit.limit == 0.10
    assert "[limits] session_spend" in hit.detail and "$0.1100" in hit.detail
    pause = json.loads(hit.pause())
    assert pause == {"budget": "session_spend", "limit": 0.1, "spent": 0.11, "day": 7, "detail": hit.detail}
    own = spending.reached(today, {"spend_limit": "0.11"}, LIMITS)
    assert own is not None and "its spend_limit" in own.detail, "0.11 of 0.11 is reached"
    assert spending.reached(today, {"spend_limit": "0.2"}, LIMITS) is None
    broke = spending.reached(spending.Today(day=7, session=0.0, principal=1.0), {}, LIMITS)
    assert broke is not None and broke.budget == spending.PRINCIPAL and "principal_spend" in broke.detail


def test_a_warning_once_per_budget_and_day() -> None:
    info: dict[str, str] = {}
    due, _ = spending.warnings_due(spending.Today(day=7, session=0.04, principal=0.1), info, LIMITS)
    assert due == [] and "spend_warned" not in info
    due, marked = spending.warnings_due(spending.Today(day=7, session=0.06, principal=0.6), info, LIMITS)
    assert [w.budget for w in due] == ["session_spend", "principal_spend"] and info["spend_warned"] == marked
    again, _ = spending.warnings_due(spending.Today(day=7, session=0.08, principal=0.7), info, LIMITS)
    assert again == []
    tomorrow, _ = spending.warnings_due(spending.Today(day=8, session=0.06, principal=0.1), info, LIMITS)
    assert [w.budget for w in tomorrow] == ["session_spend"]
    reached, _ = spending.warnings_due(spending.Today(day=9, session=0.2, principal=0.1), {}, LIMITS)
    assert reached == [], "a budget reached is not warned of: it ends the turn"


def test_the_spend_ops_of_one_call() -> None:
    assert spending.spend_of([("hset", "", "x", "1"), ("spend", "", "", "0.25"), ("spend", "", "", "0.5")]) == 0.75
