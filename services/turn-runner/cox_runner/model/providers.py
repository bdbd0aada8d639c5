"""Models a session can choose: the built-in ``script`` model and real providers via pydantic-ai.

A provider is a ``[[model.providers]]`` entry in the TOML config, for example::

    [[model.providers]]
    name = "local-qwen"          # what a session's ``model`` names
    kind = "openai"              # any OpenAI-compatible server: vLLM, llama.cpp, Ollama, OpenRouter
    base_url = "http://127.0.0.1:8000/v1"
    model = "Qwen2.5-Coder-7B-Instruct"
    api_key_env = "LOCAL_KEY"    # optional; the key is read from this variable

    [[model.providers]]
    name = "claude"
    kind = "anthropic"
    model = "claude-sonnet-4-5"
    api_key_env = "ANTHROPIC_API_KEY"
    input_price = 3.0            # optional: USD per million tokens, for the spend limit
    output_price = 15.0

    [[model.providers]]
    name = "script-priced"       # the built-in script model under another name, with prices
    kind = "script"
    input_price = 1.0
    output_price = 1.0

The provider SDKs' own retries are off (``max_retries=0``): the turn loop retries what is worth
retrying itself (:mod:`cox_runner.model.retry`), so each retry is a ``model.retry`` event, Stop ends a
backoff at once, and ``[model] retries`` is the one number that counts.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from coxswain.config import ModelConfig, ProviderConfig
from coxswain.errors import NotAccepting

if TYPE_CHECKING:
    from pydantic_ai.models import Model
    from pydantic_ai.settings import ModelSettings


class Models:
    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self._by_name: dict[str, ProviderConfig] = {p.name: p for p in cfg.providers}
        self._cache: dict[str, Model] = {}
        self._lock = asyncio.Lock()

    def names(self) -> set[str]:
        return {"script", *self._by_name}

    def prices(self, name: str) -> tuple[float, float] | None:
        """Configured (input, output) USD per million tokens, or None to ask genai-prices."""
        p = self._by_name.get(name)
        if p is None or (p.input_price is None and p.output_price is None):
            return None
        return (p.input_price or 0.0, p.output_price or 0.0)

    def window(self, name: str) -> int | None:
        """The model's context window in tokens (None: unknown, so never compacted automatically)."""
        if name == "script":
            return self.cfg.script.context_window
        p = self._by_name.get(name)
        if p is None:
            return None
        if p.context_window is not None:
            return p.context_window
        return self.cfg.script.context_window if p.kind == "script" else None

    def takes_images(self, name: str) -> bool:
        """Whether image attachments may go to this model (``vision`` on its provider entry; the
        built-in script model takes anything and ignores it)."""
        p = self._by_name.get(name)
        if p is None:
            return name == "script"
        return p.kind == "script" or p.takes_images()

    def get(self, name: str) -> Model:
        """The model, built once. Building may import a provider SDK and load price data (seconds):
        call :meth:`load` first from async code so that happens off the event loop."""
        if name in self._cache:
            return self._cache[name]
        model = self._build(name)
        self._cache[name] = model
        return model

    async def load(self, name: str) -> Model:
        """:meth:`get` without blocking the event loop (a blocked loop misses lease renewals)."""
        if name in self._cache:
            return self._cache[name]
        async with self._lock:
            if name not in self._cache:
                self._cache[name] = await asyncio.to_thread(self._build, name)
        return self._cache[name]

    def settings(self, name: str) -> ModelSettings | None:
        p = self._by_name.get(name)
        if p is None:
            return None
        s: dict[str, Any] = {}
        if p.max_tokens is not None:
            s["max_tokens"] = p.max_tokens
        if p.temperature is not None:
            s["temperature"] = p.temperature
        return cast("ModelSettings", s) if s else None  # a TypedDict: the dict itself

    def _build(self, name: str) -> Model:
        # pydantic-ai and a provider's SDK are imported here, by the first turn that uses the
        # model (load: off the loop), not by a runner that ran none (#23: an idle runner's size).
        from .script_model import ScriptModel

        if name == "script":
            return ScriptModel()
        p = self._by_name.get(name)
        if p is None:
            raise NotAccepting(f"model {name!r} is not configured")
        if p.kind == "script":
            return ScriptModel()
        key = p.key()
        if p.kind == "openai":
            from openai import AsyncOpenAI
            from pydantic_ai.models.openai import OpenAIChatModel
            from pydantic_ai.providers.openai import OpenAIProvider

            client = AsyncOpenAI(base_url=p.base_url, api_key=key or "none", max_retries=0)
            return OpenAIChatModel(p.model, provider=OpenAIProvider(openai_client=client))
        from anthropic import AsyncAnthropic
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        aclient = AsyncAnthropic(api_key=key, base_url=p.base_url, max_retries=0)
        return AnthropicModel(p.model, provider=AnthropicProvider(anthropic_client=aclient))
