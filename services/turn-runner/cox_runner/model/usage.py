"""What one model response used and cost: the fields of a ``usage`` event (docs/api.md, Events).

Tokens are pydantic-ai's (``input_tokens`` counts every input token, cache reads and writes
included; ``cache_read_tokens``/``cache_write_tokens`` are the parts of it served from or written
to the provider's prompt cache). The cost in USD: the provider's configured prices
(``input_price``, ``output_price``, ``cache_read_price``, ``cache_write_price``, USD per million
tokens; an unset cache price counts as ``input_price``), else pydantic-ai's price data
(genai-prices, ``response.cost()``) for a model it knows, else 0.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.messages import ModelResponse

from coxswain.config import ProviderConfig

UNPRICED_MODELS = frozenset({"", "script"})
"""Model names never priced from genai-prices' data (the built-in script model)."""


def configured_cost(provider: ProviderConfig, input_tokens: int, output_tokens: int,
                    cache_read_tokens: int = 0, cache_write_tokens: int = 0) -> float:
    """USD by the provider's configured prices (per million tokens)."""
    ip = provider.input_price or 0.0
    op = provider.output_price or 0.0
    crp = provider.cache_read_price if provider.cache_read_price is not None else ip
    cwp = provider.cache_write_price if provider.cache_write_price is not None else ip
    plain = max(0, input_tokens - cache_read_tokens - cache_write_tokens)
    return (plain * ip + cache_read_tokens * crp + cache_write_tokens * cwp + output_tokens * op) / 1_000_000


def priced(provider: ProviderConfig | None) -> bool:
    """Whether the provider has any price of its own (else genai-prices' data is asked)."""
    return provider is not None and any(
        p is not None for p in (provider.input_price, provider.output_price,
                                provider.cache_read_price, provider.cache_write_price))


def response_cost(response: ModelResponse, provider: ProviderConfig | None) -> float:
    """USD this response cost (see the module's docstring)."""
    u = response.usage
    if provider is not None and priced(provider):
        return configured_cost(provider, u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens)
    if (response.model_name or "") in UNPRICED_MODELS:
        return 0.0
    known = getattr(u, "cost", None)
    if known is not None:
        return float(known)
    try:
        return float(response.cost().total_price)
    except Exception:  # noqa: BLE001 - a model genai-prices does not know costs nothing we can count
        return 0.0


def usage_of(response: ModelResponse, provider: ProviderConfig | None) -> dict[str, Any]:
    """``{input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost}`` of one
    response: the fields of a ``usage`` event besides ``purpose`` and ``model``. ``cost`` is USD,
    rounded to 8 places (0 when unknown)."""
    u = response.usage
    return {
        "input_tokens": int(u.input_tokens),
        "output_tokens": int(u.output_tokens),
        "cache_read_tokens": int(u.cache_read_tokens),
        "cache_write_tokens": int(u.cache_write_tokens),
        "cost": round(response_cost(response, provider), 8),
    }


def totals_ops(u: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The ``cox_emit`` ops that add one request's usage to the session's running totals
    (``usage_*`` fields of the session hash; the session object's ``usage``) and its cost to the
    session's spend of the day (``spend``)."""
    ops = [("hincrby", "", f"usage_{k}", str(int(u[k])))
           for k in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")]
    ops += [("hincrbyfloat", "", "usage_cost", repr(float(u["cost"]))), ("hincrby", "", "usage_requests", "1")]
    if float(u["cost"]) > 0:  # the session's spend of the day (its daily budget, docs/api.md "Budgets")
        ops.append(("spend", "", "", repr(float(u["cost"]))))
    return ops


def spend_cost(prices: tuple[float, float] | None, response: ModelResponse) -> float:
    """USD a response counts against the turn's spend: configured (input, output) prices, else
    genai-prices' data, else zero (unknown; the script model costs nothing)."""
    u = response.usage
    if prices is not None:
        return float((u.input_tokens * prices[0] + u.output_tokens * prices[1]) / 1_000_000)
    if response.model_name in (None, "", "script"):
        return 0.0
    try:
        return float(response.cost().total_price)
    except Exception:  # noqa: BLE001 - a model genai-prices does not know costs nothing we can count
        return 0.0
