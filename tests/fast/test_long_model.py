"""Long turns, the model side, without a server or a network: which provider failures are retried
and after how long (fake exceptions of the shapes pydantic-ai and the SDKs raise), usage and cost
of a response, the new config keys and event types."""

from __future__ import annotations

import email.utils
import time
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_ai import exceptions as pe
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.usage import RequestUsage

from cox_runner.model import retry, usage
from coxswain import events
from coxswain.config import ModelConfig, ProviderConfig, Settings

# ---------------------------------------------------------------- what is retryable


def http(status: int, category: Any = None, headers: dict[str, str] | None = None) -> pe.ModelHTTPError:
    return pe.ModelHTTPError.for_category(category, status_code=status, model_name="m", headers=headers)


class SdkStatusError(Exception):
    """The shape of openai/anthropic ``APIStatusError``: ``status_code`` and ``response.headers``."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        super().__init__(f"Error code: {status}")
        self.status_code = status
        self.response = type("Response", (), {"headers": headers})()


def test_rate_limits_server_errors_and_broken_connections_are_retryable() -> None:
    import httpx

    for exc in (http(429, pe.ModelRateLimitError), http(500, pe.ModelServerError), http(502), http(503),
                http(529, pe.ModelOverloadedError), http(408), pe.ModelConnectionError("m", "reset", phase="read"),
                pe.ModelTimeoutError("m", "timed out"), httpx.ConnectError("refused"), httpx.ReadTimeout("slow"),
                ConnectionResetError(), SdkStatusError(503, {})):
        assert retry.retryable(exc), exc


def test_rejections_quota_and_everything_else_are_not() -> None:
    for exc in (http(400), http(401, pe.ModelAuthenticationError), http(404, pe.ModelNotFoundError),
                http(400, pe.ModelContextWindowExceededError), http(422, pe.ModelRequestRejectedError),
                http(429, pe.ModelQuotaExceededError), pe.UnexpectedModelBehavior("bad"), ValueError("x"),
                TimeoutError(), SdkStatusError(401, {})):
        assert not retry.retryable(exc), exc


def test_the_sdks_connection_errors_are_retryable() -> None:
    import anthropic
    import httpx2  # the HTTP client both SDKs are built on
    import openai

    request = httpx2.Request("POST", "http://x")
    for mod in (openai, anthropic):
        assert retry.retryable(mod.APIConnectionError(request=request))
        assert retry.retryable(mod.APITimeoutError(request=request))


# ---------------------------------------------------------------- how long to wait


def test_retry_after_in_seconds_milliseconds_and_as_an_http_date() -> None:
    assert retry.parse_retry_after({"retry-after": "7"}) == 7.0
    assert retry.parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 12, usegmt=True)
    assert retry.parse_retry_after({"retry-after": date}, now=now) == pytest.approx(12.0)
    assert retry.parse_retry_after({"retry-after": email.utils.formatdate(now - 5, usegmt=True)}, now=now) == 0.0
    assert retry.parse_retry_after({"retry-after": "soon"}) is None
    assert retry.parse_retry_after({}) is None
    assert retry.retry_after(http(429, pe.ModelRateLimitError, {"Retry-After": "3"})) == 3.0
    assert retry.retry_after(SdkStatusError(429, {"Retry-After": "4"})) == 4.0


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    assert [retry.backoff(n, 30.0, rng=lambda: 1.0) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert retry.backoff(3, 30.0, rng=lambda: 0.0) == 0.0
    assert retry.backoff(3, 30.0, rng=lambda: 0.5) == 2.0
    assert retry.backoff(10_000, 30.0, rng=lambda: 1.0) == 30.0


def test_a_provider_asking_for_longer_than_the_cap_is_not_waited_for() -> None:
    exc = http(429, pe.ModelRateLimitError, {"retry-after": "120"})
    assert retry.delay(exc, 1, 30.0) is None
    assert retry.delay(exc, 1, 200.0) == 120.0


class Calls:
    def __init__(self, *failures: BaseException, result: str = "ok") -> None:
        self.failures = list(failures)
        self.result = result
        self.count = 0

    async def __call__(self) -> str:
        self.count += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.result


class Recorder:
    def __init__(self) -> None:
        self.retries: list[tuple[int, float, BaseException]] = []
        self.slept: list[float] = []

    async def on_retry(self, attempt: int, delay: float, error: BaseException) -> None:
        assert len(self.slept) == len(self.retries), "on_retry comes before its wait"
        self.retries.append((attempt, delay, error))

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


async def test_with_retries_retries_then_succeeds_reporting_each_retry() -> None:
    first, second = http(503, pe.ModelUnavailableError), pe.ModelConnectionError("m", "reset")
    call, rec = Calls(first, second), Recorder()
    out = await retry.with_retries(call, on_retry=rec.on_retry, sleep=rec.sleep, retries=4, max_s=30.0,
                                   rng=lambda: 1.0)
    assert out == "ok" and call.count == 3
    assert rec.retries == [(1, 1.0, first), (2, 2.0, second)] and rec.slept == [1.0, 2.0]


async def test_with_retries_waits_what_retry_after_says() -> None:
    err = http(429, pe.ModelRateLimitError, {"Retry-After": "7"})
    call, rec = Calls(err), Recorder()
    assert await retry.with_retries(call, on_retry=rec.on_retry, sleep=rec.sleep, rng=lambda: 0.0) == "ok"
    assert rec.slept == [7.0] and rec.retries[0][:2] == (1, 7.0)
    date = email.utils.formatdate(time.time() + 10, usegmt=True)
    call2, rec2 = Calls(SdkStatusError(503, {"Retry-After": date})), Recorder()
    await retry.with_retries(call2, on_retry=rec2.on_retry, sleep=rec2.sleep)
    assert 8.0 <= rec2.slept[0] <= 10.0


async def test_a_non_retryable_error_is_raised_at_once() -> None:
    for err in (http(400, pe.ModelRequestRejectedError), http(429, pe.ModelQuotaExceededError), KeyError("bug"),
                http(429, pe.ModelRateLimitError, {"retry-after": "600"})):
        call, rec = Calls(err), Recorder()
        with pytest.raises(type(err)) as info:
            await retry.with_retries(call, on_retry=rec.on_retry, sleep=rec.sleep)
        assert info.value is err and call.count == 1 and rec.retries == [] and rec.slept == []


async def test_the_last_failure_is_raised_after_the_retries() -> None:
    errs = [http(500, pe.ModelServerError) for _ in range(4)]
    call, rec = Calls(*errs), Recorder()
    with pytest.raises(pe.ModelHTTPError) as info:
        await retry.with_retries(call, on_retry=rec.on_retry, sleep=rec.sleep, retries=2, rng=lambda: 1.0)
    assert info.value is errs[2] and call.count == 3 and [a for a, _, _ in rec.retries] == [1, 2]
    none, rec0 = Calls(http(500, pe.ModelServerError)), Recorder()
    with pytest.raises(pe.ModelHTTPError):
        await retry.with_retries(none, on_retry=rec0.on_retry, sleep=rec0.sleep, retries=0)
    assert none.count == 1


async def test_an_interrupted_wait_ends_the_retries() -> None:
    class Stopped(Exception):
        pass

    async def stop(_: float) -> None:
        raise Stopped

    async def noted(*_: object) -> None:
        return None

    call = Calls(http(503, pe.ModelUnavailableError), http(503, pe.ModelUnavailableError))
    with pytest.raises(Stopped):
        await retry.with_retries(call, on_retry=noted, sleep=stop)
    assert call.count == 1


def test_describe_is_one_short_line() -> None:
    text = retry.describe(http(429, pe.ModelRateLimitError))
    assert text.startswith("ModelRateLimitError (HTTP 429): ") and "\n" not in text
    assert len(retry.describe(ValueError("x" * 1000))) == 300


# ---------------------------------------------------------------- usage and cost


def response(model: str = "some-model", *, input_tokens: int = 0, output_tokens: int = 0,
             cache_read_tokens: int = 0, cache_write_tokens: int = 0) -> ModelResponse:
    u = RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens,
                     cache_read_tokens=cache_read_tokens, cache_write_tokens=cache_write_tokens)
    return ModelResponse(parts=[TextPart("hi")], usage=u, model_name=model)


def test_usage_with_configured_prices_counts_cache_tokens_at_their_prices() -> None:
    r = response(input_tokens=1000, output_tokens=200, cache_read_tokens=600, cache_write_tokens=100)
    p = ProviderConfig(name="p", input_price=3.0, output_price=15.0, cache_read_price=0.3, cache_write_price=3.75)
    assert usage.usage_of(r, p) == {"input_tokens": 1000, "output_tokens": 200, "cache_read_tokens": 600,
                                    "cache_write_tokens": 100, "cost": 0.004455}
    # 300 plain input * 3 + 600 read * 0.3 + 100 written * 3.75 + 200 output * 15, per million
    plain = ProviderConfig(name="p", input_price=3.0, output_price=15.0)
    assert usage.usage_of(r, plain)["cost"] == pytest.approx((1000 * 3 + 200 * 15) / 1e6)


def test_usage_without_prices_asks_genai_prices_else_zero() -> None:
    known = response("gpt-4o", input_tokens=1_000_000, output_tokens=0)
    known.provider_name = "openai"
    expected = float(known.cost().total_price)
    assert expected > 0
    assert usage.usage_of(known, None)["cost"] == pytest.approx(expected)
    assert usage.usage_of(response("no-such-model-xyz", input_tokens=10, output_tokens=5), None)["cost"] == 0.0
    assert usage.usage_of(response("script", input_tokens=10, output_tokens=5), None)["cost"] == 0.0
    priced_script = ProviderConfig(name="s", kind="script", input_price=1.0, output_price=1.0)
    assert usage.usage_of(response("script", input_tokens=10, output_tokens=5), priced_script)["cost"] == 1.5e-05


def test_a_usage_event_takes_the_fields_usage_of_gives() -> None:
    fields = usage.usage_of(response(input_tokens=5, output_tokens=2), None)
    ev = events.Usage(sid="s_1", turn_id="t_1", purpose="turn", model="some-model", **fields)
    parsed = events.parse(events.body(ev))
    assert isinstance(parsed, events.Usage) and parsed.input_tokens == 5 and parsed.cost == 0.0


# ---------------------------------------------------------------- config and events


def test_the_new_config_keys_and_their_defaults() -> None:
    s = Settings()
    assert (s.limits.warn_at, s.limits.compact_at) == (0.8, 0.8)
    assert (s.model.retries, s.model.retry_max_s, s.model.compactor) == (4, 30.0, None)
    assert s.model.script.context_window == 200_000
    p = ProviderConfig(name="p")
    assert (p.cache_read_price, p.cache_write_price, p.context_window) == (None, None, None)


def test_context_windows_and_the_compactor_name() -> None:
    cfg = ModelConfig(providers=[ProviderConfig(name="big", context_window=1_000_000),
                                 ProviderConfig(name="unknown"), ProviderConfig(name="fake", kind="script")],
                      script={"context_window": 5000}, compactor="big")
    assert [cfg.context_window(n) for n in ("script", "big", "unknown", "fake", "nope")] == \
        [5000, 1_000_000, None, 5000, None]
    assert ModelConfig(compactor="script").compactor == "script"
    with pytest.raises(ValidationError, match="compactor"):
        ModelConfig(compactor="nope")
    with pytest.raises(ValidationError):
        ModelConfig(retries=-1)


def test_the_script_context_window_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COX_MODEL__SCRIPT__CONTEXT_WINDOW", "1234")
    monkeypatch.setenv("COX_LIMITS__WARN_AT", "0.5")
    s = Settings()
    assert s.model.script.context_window == 1234 and s.limits.warn_at == 0.5


def test_the_new_events_parse_from_their_bodies() -> None:
    for ev in (events.LimitWarning(sid="s", turn_id="t", limit="tokens", value=80.0, of=100.0),
               events.ModelRetry(sid="s", turn_id="t", attempt=1, delay_s=0.5, error="HTTP 429"),
               events.ContextCompacted(sid="s", turn_id="t", before_tokens=900, after_tokens=100,
                                       summary="done so far", through_seq=42),
               events.Usage(sid="s", purpose="title", model="m", input_tokens=1, output_tokens=1)):
        parsed = events.parse(events.body(ev))
        assert type(parsed) is type(ev) and parsed.model_dump() == ev.model_dump()
    assert {"usage", "model.retry", "limit.warning", "context.compacted"} <= events.EVENT_TYPES


def test_a_refusal_for_length_is_told_apart_from_other_errors() -> None:
    too_long = pe.ModelHTTPError(400, "m", body={"error": {"code": "context_length_exceeded",
                                                            "message": "maximum context length is 8192 tokens"}})
    assert retry.too_long(too_long) and not retry.retryable(too_long)
    assert retry.too_long(pe.ModelHTTPError(400, "m", body={"error": {"message": "prompt is too long: 250000"}}))
    assert not retry.too_long(pe.ModelHTTPError(400, "m", body={"error": {"message": "invalid tool schema"}}))
    assert not retry.too_long(pe.ModelHTTPError(429, "m", body={"error": {"message": "context length busy"}}))
