"""Content that looks like a credential, found with detect-secrets (Yelp's maintained detector).

Every detect-secrets plugin is used except three that flag ordinary code: the two high-entropy
string plugins (any long identifier or hash) and the public-IP one. Where a line assigns a value
to a secret keyword (the KeywordDetector's own list: ``password``, ``api_key``, ``secret`` ...),
the value is measured with the entropy plugin's own Shannon entropy and limit, so
``aws_secret_access_key = wJalr...`` is found without quotes around it.

Scanning every line of a large file with ``scan_line`` costs about 1 ms a line (every plugin
runs on it). So the text is first searched, as one string, with each plugin's *own* regular
expressions (a regex detector's ``denylist``, the keyword detector's keyword list); a plugin
reports nothing on a line its regexes do not match, so this index loses nothing, and no pattern
here is hand-written. Then each plugin scans only the lines its regexes matched.

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
from detect_secrets.settings import get_plugins, get_settings

NOISY = frozenset({"Base64 High Entropy String", "Hex High Entropy String", "Public IP (ipv4)"})
KEYED = "High Entropy String assigned to a secret keyword"
MAX_LINE = 4000
"""Lines longer than this (minified code, data) are scanned in pieces of this size."""
MAX_CHARS = 8_000_000

_lock = threading.Lock()
_index: list[tuple[str, re.Pattern[str]]] | None = None
KEYWORD_PLUGIN = "KeywordDetector"
_keyword = re.compile("|".join(keyword.DENYLIST))
"""Searched in the lowercased text (the list is lowercase): ten times faster than IGNORECASE."""
_assigned = re.compile("(?:" + keyword.DENYLIST_REGEX + r")\w*[\]'\"]{0,2}\s*(?::=|=>|=|:)\s*[\"'`]?"
                       r"(?P<value>[^\s\"'`,;()]{16,})", re.IGNORECASE)
_entropy = Base64HighEntropyString()


def _configure(names: Iterable[str]) -> None:
    """Exactly these plugins (detect-secrets' own ``configure_plugins`` only adds)."""
    settings = get_settings()
    settings.plugins.clear()
    settings.configure_plugins([{"name": n} for n in names])


def _specific() -> list[str]:
    mapping: dict[str, type] = get_mapping_from_secret_type_to_class()
    return [cls.__name__ for kind, cls in mapping.items() if kind not in NOISY]


def _build_index() -> list[tuple[str, re.Pattern[str]]]:
    names = _specific()
    _configure(names)
    pats: list[tuple[str, re.Pattern[str]]] = [(KEYWORD_PLUGIN, _keyword)]
    for plugin in get_plugins():
        if isinstance(plugin, RegexBasedDetector):
            pats.extend((type(plugin).__name__, p) for p in plugin.denylist)
        elif type(plugin).__name__ != KEYWORD_PLUGIN:
            raise RuntimeError(f"detect-secrets plugin {type(plugin).__name__} has no regex to index by")
    return pats


def _candidates(text: str, index: list[tuple[str, re.Pattern[str]]]) -> tuple[dict[str, set[int]], list[int]]:
    """For each plugin, the numbers of the lines its regexes match; and the line starts."""
    starts = [0]
    starts.extend(m.end() for m in re.finditer("\n", text))
    lowered = text.lower()
    by_plugin: dict[str, set[int]] = {}
    for name, pat in index:
        if pat is _keyword:
            found = pat.finditer(lowered) if len(lowered) == len(text) else \
                re.compile(pat.pattern, re.IGNORECASE).finditer(text)
        else:
            found = pat.finditer(text)
        lines = {bisect.bisect_right(starts, m.start()) - 1 for m in found}
        if lines:
            by_plugin.setdefault(name, set()).update(lines)
    return by_plugin, starts


def find(text: str) -> list[str]:
    """The kinds of credential that ``text`` seems to hold (empty when none)."""
    global _index
    text = text[:MAX_CHARS]
    kinds: list[str] = []
    with _lock:
        if _index is None:
            _index = _build_index()
        by_plugin, starts = _candidates(text, _index)

        def line(n: int) -> str:
            end = starts[n + 1] - 1 if n + 1 < len(starts) else len(text)
            return text[starts[n]:end]

        for name, numbers in by_plugin.items():
            _configure([name])
            for n in sorted(numbers):
                _scan(line(n), kinds)
        _configure(_specific())
        if KEYED not in kinds and any(_keyed(line(n)) for n in sorted(by_plugin.get(KEYWORD_PLUGIN, ()))):
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
