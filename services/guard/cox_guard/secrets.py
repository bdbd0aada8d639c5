"""Content that looks like a credential, found with detect-secrets (Yelp's maintained detector).

Every detect-secrets plugin is used except three that flag ordinary code: the two high-entropy
string plugins (any long identifier or hash) and the public-IP one. Where a line assigns a value
to a secret keyword (the KeywordDetector's own list: ``password``, ``api_key``, ``secret`` ...),
the value is measured with the entropy plugin's own Shannon entropy and limit, so
``aws_secret_access_key = wJalr...`` is found without quotes around it.

Scanning every line of a large file with ``scan_line`` costs about 150 µs a line. So the text is
first searched, as one string, with the plugins' *own* regular expressions (each regex
detector's ``denylist`` and the keyword detector's keyword pattern); only lines where one of them
matches are scanned. A plugin reports nothing on a line its regexes do not match, so this index
loses nothing, and no pattern here is hand-written.

detect-secrets keeps its settings in process-global state, so scans are serialised by a lock
(the guard scans large writes in a thread).
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Iterable

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.core.scan import scan_line
from detect_secrets.plugins import keyword
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
from detect_secrets.settings import configure_settings_from_baseline, get_plugins

NOISY = frozenset({"Base64 High Entropy String", "Hex High Entropy String", "Public IP (ipv4)"})
KEYED = "High Entropy String assigned to a secret keyword"
MAX_LINE = 4000
"""Lines longer than this (minified code, data) are scanned in pieces of this size."""
MAX_CHARS = 8_000_000

_lock = threading.Lock()
_index: list[re.Pattern[str]] | None = None
_keyword = re.compile("|".join(keyword.DENYLIST))
"""Searched in the lowercased text (the list is lowercase): ten times faster than IGNORECASE."""
_assigned = re.compile("(?:" + keyword.DENYLIST_REGEX + r")\w*[\]'\"]{0,2}\s*(?::=|=>|=|:)\s*[\"'`]?"
                       r"(?P<value>[^\s\"'`,;()]{16,})", re.IGNORECASE)
_entropy = Base64HighEntropyString()


def _configure(names: Iterable[str]) -> None:
    configure_settings_from_baseline({"plugins_used": [{"name": n} for n in names]})
    get_plugins.cache_clear()


def _specific() -> list[str]:
    mapping: dict[str, type] = get_mapping_from_secret_type_to_class()
    return [cls.__name__ for kind, cls in mapping.items() if kind not in NOISY]


def _build_index() -> list[re.Pattern[str]]:
    _configure(_specific())
    pats: list[re.Pattern[str]] = [_keyword]
    for plugin in get_plugins():
        if isinstance(plugin, RegexBasedDetector):
            pats.extend(plugin.denylist)
    return pats


def _candidate_lines(text: str, pats: list[re.Pattern[str]]) -> tuple[list[int], set[int], list[int]]:
    starts = [0]
    starts.extend(m.end() for m in re.finditer("\n", text))
    lines: set[int] = set()
    keyword_lines: set[int] = set()
    lowered = text.lower()
    for pat in pats:
        if pat is _keyword and len(lowered) == len(text):
            found = pat.finditer(lowered)
        elif pat is _keyword:
            found = re.compile(pat.pattern, re.IGNORECASE).finditer(text)
        else:
            found = pat.finditer(text)
        for m in found:
            n = bisect.bisect_right(starts, m.start()) - 1
            lines.add(n)
            if pat is _keyword:
                keyword_lines.add(n)
    return sorted(lines), keyword_lines, starts


def find(text: str) -> list[str]:
    """The kinds of credential that ``text`` seems to hold (empty when none)."""
    global _index
    text = text[:MAX_CHARS]
    kinds: list[str] = []
    with _lock:
        if _index is None:
            _index = _build_index()
        lines, keyword_lines, starts = _candidate_lines(text, _index)
        if not lines:
            return kinds
        _configure(_specific())
        chosen: list[tuple[int, str]] = []
        for n in lines:
            end = starts[n + 1] - 1 if n + 1 < len(starts) else len(text)
            chosen.append((n, text[starts[n]:end]))
        for _, line in chosen:
            _scan(line, kinds)
        if KEYED not in kinds and any(_keyed(line) for n, line in chosen if n in keyword_lines):
            kinds.append(KEYED)
    return kinds


def _scan(line: str, kinds: list[str]) -> None:
    for i in range(0, max(1, len(line)), MAX_LINE):
        for secret in scan_line(line[i:i + MAX_LINE]):
            if secret.type not in NOISY and secret.type not in kinds:
                kinds.append(secret.type)


def _keyed(line: str) -> bool:
    """A value assigned to a secret keyword whose entropy passes the base64 plugin's limit."""
    for m in _assigned.finditer(line[:MAX_LINE]):
        if _entropy.calculate_shannon_entropy(m.group("value")) > _entropy.entropy_limit:
            return True
    return False
