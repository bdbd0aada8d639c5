"""Retrying a failed model request: which failures are worth another try, and how long to wait.

Retried: rate limits (HTTP 429, not an exhausted quota), server errors (5xx, and 408/409 as the
provider SDKs treat them), a provider that is unavailable or overloaded, timeouts and broken
connections. Not retried: a request the provider rejected (400, 401, 403, 404, 422, a context
window exceeded: sending it again unchanged cannot succeed), an exhausted quota, anything else,
and the turn's own control flow (Stop, a lost lease, cancellation: those are not model failures).
A bare :class:`TimeoutError` is not retried either: it is what the loop's own deadline
(``asyncio.wait_for``) raises; a provider's timeout arrives as pydantic-ai's
``ModelTimeoutError``/``ModelRequestTimeout`` or the SDK's/httpx's timeout exception.

The wait before retry ``n`` (from 1) is full-jitter exponential backoff,
``uniform(0, min(max_s, base_s * 2**(n-1)))``, unless the provider said how long to wait
(``retry-after-ms`` or ``Retry-After`` in seconds or as an HTTP date): then exactly that. A
provider that asks for longer than ``[model] retry_max_s`` is not waited for: the error is
raised at once.

pydantic-ai's adapters classify provider errors into :mod:`pydantic_ai.exceptions` categories
(``ModelRateLimitError``, ``ModelServerError``, ``ModelConnectionError``, ...; an HTTP one is also
a ``ModelHTTPError`` with ``status_code`` and ``headers``); the SDKs' own exceptions
(``openai.APIStatusError``/``APIConnectionError``, the same in ``anthropic``) and httpx's
transport errors are recognised too, in case one escapes unwrapped.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from pydantic_ai import exceptions as pe

T = TypeVar("T")

BASE_S = 1.0
"""The first backoff's ceiling; each retry doubles it, up to ``retry_max_s``."""
RETRY_STATUS = frozenset({408, 409, 429})
"""Statuses below 500 worth retrying: request timeout, conflict (as the SDKs retry it), rate limit."""

_RETRY_CATEGORIES: tuple[type[BaseException], ...] = (
    pe.ModelRateLimitError, pe.ModelUnavailableError, pe.ModelServerError, pe.ModelConnectionError,
    pe.ModelRequestTimeout,
)
_NEVER_CATEGORIES: tuple[type[BaseException], ...] = (pe.ModelQuotaExceededError, pe.ModelRequestRejectedError)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection and timeout exceptions of the HTTP stack and of the provider SDKs imported so
    far. Looked up in ``sys.modules``, never imported here: an SDK that is not loaded raised
    nothing, and importing anthropic and openai up front cost every runner ~1.1 s of CPU at start
    (most of its import time) for a script model that uses neither."""
    out: list[type[BaseException]] = [ConnectionError]
    for module, names in (("httpx", ("TransportError",)), ("httpx2", ("TransportError",)),
                          ("openai", ("APIConnectionError",)), ("anthropic", ("APIConnectionError",))):
        mod = sys.modules.get(module)
        if mod is not None:
            out.extend(getattr(mod, n) for n in names if hasattr(mod, n))
    return tuple(out)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an error carries (pydantic-ai's ``ModelHTTPError``, an SDK status error)."""
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def headers_of(exc: BaseException) -> Mapping[str, str] | None:
    """Response headers an error carries, keys lowercased: its own ``headers`` (pydantic-ai), its
    ``response.headers`` (openai/anthropic), or those of the SDK error it was raised from."""
    for e in (exc, exc.__cause__):
        if e is None:
            continue
        headers = getattr(e, "headers", None)
        if headers is None:
            headers = getattr(getattr(e, "response", None), "headers", None)
        if headers is not None:
            try:
                return {str(k).lower(): str(v) for k, v in dict(headers).items()}
            except (TypeError, ValueError):
                continue
    return None


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds, or an HTTP date;
    ``now`` is the epoch time it is measured from). None when absent or unreadable."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            ms = float(raw_ms)
        except ValueError:
            ms = -1.0
        if 0 <= ms < float("inf"):
            return ms / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, seconds)
    return seconds if 0 <= seconds < float("inf") else None


def retry_after(exc: BaseException, now: float | None = None) -> float | None:
    """How long the provider asked to wait, if it said: the headers first, then what
    pydantic-ai read into ``retry_after`` (headers it no longer has, or an error body)."""
    from_headers = parse_retry_after(headers_of(exc), now)
    if from_headers is not None:
        return from_headers
    value = getattr(exc, "retry_after", None)
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf"):
        return float(value)
    return None


def retryable(exc: BaseException) -> bool:
    """Whether sending the same request again may succeed (see the module's docstring)."""
    if not isinstance(exc, Exception):
        return False  # cancellation, exit: never a model failure
    if isinstance(exc, _NEVER_CATEGORIES):
        return False
    if isinstance(exc, _RETRY_CATEGORIES):
        return True
    status = status_of(exc)
    if status is not None:
        return status in RETRY_STATUS or 500 <= status <= 599
    return isinstance(exc, _transport_errors())


def backoff(attempt: int, max_s: float, base_s: float = BASE_S, rng: Callable[[], float] = random.random) -> float:
    """Full jitter: a uniform wait in ``[0, min(max_s, base_s * 2**(attempt-1))]``."""
    ceiling = min(max_s, base_s * (1 << min(max(attempt - 1, 0), 62)))
    return rng() * ceiling


def delay(exc: BaseException, attempt: int, max_s: float, *, rng: Callable[[], float] = random.random,
          now: float | None = None) -> float | None:
    """Seconds to wait before retry ``attempt`` (from 1) after ``exc``, or None: do not retry
    (the provider asked for longer than ``max_s``)."""
    asked = retry_after(exc, now)
    if asked is not None:
        return asked if asked <= max_s else None
    return backoff(attempt, max_s, rng=rng)


def describe(exc: BaseException, limit: int = 300) -> str:
    """A short line for a ``model.retry`` event: the kind, the status, the message."""
    status = status_of(exc)
    text = str(exc) or type(exc).__name__
    head = f"{type(exc).__name__}" + (f" (HTTP {status})" if status is not None else "")
    line = f"{head}: {text}".replace("\n", " ")
    return line if len(line) <= limit else line[: limit - 3] + "..."


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    on_retry: Callable[[int, float, BaseException], Awaitable[Any]],
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    retries: int = 4,
    max_s: float = 30.0,
    rng: Callable[[], float] = random.random,
) -> T:
    """``await call()``; when it fails with a retryable error, wait and call again, at most
    ``retries`` more times. ``on_retry(attempt, delay_s, error)`` is awaited before each wait
    (attempt 1 is the first retry); ``sleep`` waits (an interruptible one ends a backoff at once
    by raising). A non-retryable error, and the last one, is raised as it is."""
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            attempt += 1
            if attempt > retries or not retryable(exc):
                raise
            wait = delay(exc, attempt, max_s, rng=rng)
            if wait is None:
                raise
            await on_retry(attempt, wait, exc)
            await sleep(wait)


TOO_LONG_MARKS = ("context_length_exceeded", "maximum context length", "context length", "prompt is too long",
                  "too many tokens", "input is too long")


def too_long(exc: BaseException) -> bool:
    """Whether a provider refused the request for being over the model's context window (a 400
    or 413 that says so): worth one compaction and a retry, never a plain retry."""
    if status_of(exc) not in (400, 413):
        return False
    text = f"{exc} {getattr(exc, 'body', '')}".lower()
    return any(mark in text for mark in TOO_LONG_MARKS)
