"""Structured logging: one JSON object per line on stderr (``cox up`` files it per service)."""

from __future__ import annotations

import logging
import sys
from typing import Any

# structlog imports rich whenever it is installed (for a console renderer's tracebacks and pretty
# printing): 7.5 MB and ~50 ms of import in every service, which logs JSON and renders nothing for
# a console (rich is installed for the CLI's tables). Its import of rich fails while structlog is
# imported, so those optional parts stay off; a rich imported already (the CLI's) is left alone.
# tests/fast/test_runner_footprint.py holds it (#23: an idle runner's size).
_WITHOUT_RICH = "rich" not in sys.modules and "structlog" not in sys.modules
if _WITHOUT_RICH:
    sys.modules["rich"] = None  # type: ignore[assignment]
try:
    import structlog
finally:
    if _WITHOUT_RICH:
        del sys.modules["rich"]


def setup(service: str, level: str = "info") -> None:
    """Configure structlog and the stdlib root logger for this process, once."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=lvl, format="%(message)s", force=True)
    for noisy in ("uvicorn.access", "httpx", "httpcore", "openai", "anthropic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        # One write a line (PrintLogger's print wrote the line and its newline apart: two
        # syscalls a line, six a turn on a runner).
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


def get(name: str | None = None, **bound: Any) -> Any:
    log = structlog.get_logger(name) if name else structlog.get_logger()
    return log.bind(**bound) if bound else log



def redact_url(url: str) -> str:
    """``url`` fit for a log line: the password of ``user:pass@`` (or a lone token) is ``***``.

    A comma-separated list of URLs is redacted one by one; an ``@`` anywhere after the scheme
    counts as the end of the user part, so an unescaped one never leaves a password behind.
    """
    if "," in url:
        return ",".join(redact_url(part) for part in url.split(","))
    scheme, sep, rest = url.rpartition("://")
    userinfo, at, hostport = rest.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"
    return f"{scheme}{sep}{shown}@{hostport}"
