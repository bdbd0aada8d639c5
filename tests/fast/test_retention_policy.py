"""The retention rule on its own: young enough OR among the newest keep_per_file of the file; 0 = no limit."""

from __future__ import annotations

import time

from cox_versions.retention import DAY_S, Policy, kept_ids
from cox_versions.store import Record
from coxswain.ids import id_time, new_id

NOW = 1_800_000_000.0


def rec(vid: str, path: str, days_old: float) -> Record:
    return Record(version_id=vid, sid="s", path=path, store="absent", sha256=None, size=0,
                  created=NOW - days_old * DAY_S, reason="write")


RECORDS = [rec("v_a1", "a", 40), rec("v_a2", "a", 20), rec("v_a3", "a", 5), rec("v_a4", "a", 1),
           rec("v_b1", "b", 90), rec("v_c1", "c", 30), rec("v_c2", "c", 30)]


def test_a_version_is_kept_by_either_rule() -> None:
    assert kept_ids(RECORDS, Policy(keep_days=10, keep_per_file=1), NOW) == {"v_a3", "v_a4", "v_b1", "v_c2"}
    assert kept_ids(RECORDS, Policy(keep_days=30, keep_per_file=1), NOW) == {
        "v_a2", "v_a3", "v_a4", "v_b1", "v_c1", "v_c2"}
    assert kept_ids(RECORDS, Policy(keep_days=2, keep_per_file=2), NOW) == {
        "v_a3", "v_a4", "v_b1", "v_c1", "v_c2"}


def test_zero_means_no_limit_so_everything_is_kept() -> None:
    every = {r.version_id for r in RECORDS}
    assert kept_ids(RECORDS, Policy(keep_days=0, keep_per_file=1), NOW) == every
    assert kept_ids(RECORDS, Policy(keep_days=1, keep_per_file=0), NOW) == every


def test_a_version_id_says_when_it_was_made() -> None:
    t = id_time(new_id("v"))
    assert t is not None and abs(t - time.time()) < 5
    assert id_time("nounderscore") is None and id_time("v_short") is None and id_time("v_!!!!!!!!!x") is None
