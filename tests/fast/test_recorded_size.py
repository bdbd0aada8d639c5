"""A message text is refused (413) before it is accepted when it could not be recorded
(``coxswain.events.check_text``); a short text is let through without being counted, so the
bound on what one character can take must hold for every character."""

from __future__ import annotations

import json

import pytest

from coxswain.errors import TooLarge
from coxswain.events import MAX_TEXT_BYTES, RECORDED_MAX_PER_CHAR, check_text, recorded_size

WIDEST = ["\x01", "\x7f", "\x00", '"', "\\", "/", "\n", "\t", "a", "é", "✓", "\U0001f600", "\ud800"]
"""Characters of every kind recorded_size counts: control, escaped, ASCII, 2-, 3- and 4-byte UTF-8, a lone surrogate."""


@pytest.mark.parametrize("ch", WIDEST)
def test_no_character_takes_more_than_the_bound(ch: str) -> None:
    assert recorded_size(ch) <= RECORDED_MAX_PER_CHAR
    if ch != "\ud800":  # (json cannot write a lone surrogate as UTF-8)
        # what the Redis library's cjson writes, less the quotes: never more than recorded_size says
        assert len(json.dumps(ch, ensure_ascii=False).encode("utf-8")) - 2 <= recorded_size(ch)


@pytest.mark.parametrize("ch", ["\x01", "\x7f"])
def test_a_text_of_the_widest_characters_is_refused_exactly_past_the_limit(ch: str) -> None:
    fits = MAX_TEXT_BYTES // RECORDED_MAX_PER_CHAR
    check_text(ch * fits)  # let through uncounted: it cannot be over
    over = ch * (fits + 1)
    if recorded_size(over) > MAX_TEXT_BYTES:
        with pytest.raises(TooLarge):
            check_text(over)
    with pytest.raises(TooLarge):
        check_text(ch * (MAX_TEXT_BYTES // RECORDED_MAX_PER_CHAR * 2))


def test_a_long_text_that_fits_when_counted_is_taken() -> None:
    check_text("a" * MAX_TEXT_BYTES)  # past the uncounted bound, counted, and it fits
    with pytest.raises(TooLarge):
        check_text("a" * (MAX_TEXT_BYTES + 1))
