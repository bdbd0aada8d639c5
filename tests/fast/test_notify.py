"""Webhook signatures, delivery ids, backoff and the ``[[notify.webhooks]]`` config (no server)."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from pydantic import ValidationError

from coxswain import notify
from coxswain.config import NotifyConfig, Settings

BODY = b'{"seq":7,"sid":"s_1","type":"turn.end","outcome":"completed"}'


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    want = hmac.new(b"k3y", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert notify.sign("k3y", 1700000000, BODY) == "sha256=" + want
    assert notify.sign(b"k3y", "1700000000", BODY) == "sha256=" + want


def test_verify_accepts_its_own_signature_and_refuses_any_change() -> None:
    sig = notify.sign("k3y", 1700000000, BODY)
    assert notify.verify("k3y", "1700000000", BODY, sig, now=1700000010)
    assert not notify.verify("other", "1700000000", BODY, sig, now=1700000010), "another secret"
    assert not notify.verify("k3y", "1700000000", BODY.replace(b"7", b"8"), sig, now=1700000010), "another body"
    assert not notify.verify("k3y", "1700000001", BODY, sig, now=1700000010), "another timestamp"
    assert not notify.verify("k3y", "1700000000", BODY, sig.upper(), now=1700000010)
    assert not notify.verify("k3y", "not-a-number", BODY, sig, now=1700000010)


def test_verify_refuses_a_signature_older_or_newer_than_the_tolerance() -> None:
    sig = notify.sign("k3y", 1700000000, BODY)
    assert notify.verify("k3y", "1700000000", BODY, sig, now=1700000000 + 300)
    assert not notify.verify("k3y", "1700000000", BODY, sig, now=1700000000 + 301)
    assert not notify.verify("k3y", "1700000000", BODY, sig, now=1700000000 - 301)
    assert notify.verify("k3y", "1700000000", BODY, sig, tolerance_s=10_000, now=1700009000)


def test_the_docs_snippet_verifies_what_the_notifier_signs() -> None:
    # the function docs/api.md shows receivers, copied: it must agree with notify.sign
    def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
        ts = headers["X-Cox-Timestamp"]
        mac = hmac.new(secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest("sha256=" + mac, headers["X-Cox-Signature"])

    headers = {"X-Cox-Timestamp": "1700000000", "X-Cox-Signature": notify.sign("k3y", 1700000000, BODY)}
    assert verify("k3y", headers, BODY)
    assert not verify("k3y", headers, BODY + b" ")


def test_delivery_ids_and_consumer_names() -> None:
    assert notify.delivery_id(42, "ops") == "42-ops"
    assert notify.consumer_name("ops") == "cox-notify-ops"
    name = notify.default_name("https://hooks.example/T0/B0/secret-token")
    assert notify.NAME_RE.match(name) and "secret" not in name
    assert name == notify.default_name("https://hooks.example/T0/B0/secret-token"), "stable"


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [notify.backoff_s(a, 1.0, 10.0) for a in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert notify.backoff_s(10_000, 0.5, 300.0) == 300.0


def test_a_webhook_needs_a_url_events_and_exactly_one_secret() -> None:
    ok = NotifyConfig.model_validate({"webhooks": [{"url": "https://x.example/h", "events": ["turn.end"],
                                                    "secret": "hush-9f2c", "name": "ops"}]})
    hook = ok.webhooks[0]
    assert hook.label == "ops" and hook.key() == "hush-9f2c"
    assert "hush" not in repr(hook) and "hush" not in str(ok.model_dump()), "the secret is never shown"
    bad = [
        {"url": "ftp://x", "events": ["turn.end"], "secret": "s"},
        {"url": "https://x", "events": [], "secret": "s"},
        {"url": "https://x", "events": ["user.msg"], "secret": "s"},
        {"url": "https://x", "events": ["turn.end"]},
        {"url": "https://x", "events": ["turn.end"], "secret": "s", "secret_env": "V"},
        {"url": "https://x", "events": ["turn.end"], "secret": "s", "name": "a.b"},
        {"url": "https://x", "events": ["turn.end"], "secret": "s", "colour": "red"},
    ]
    for entry in bad:
        with pytest.raises(ValidationError):
            NotifyConfig.model_validate({"webhooks": [entry]})
    with pytest.raises(ValidationError, match="must differ"):
        NotifyConfig.model_validate({"webhooks": [{"url": "https://a", "events": ["turn.end"], "secret": "s", "name": "x"},
                                                  {"url": "https://b", "events": ["turn.end"], "secret": "s", "name": "x"}]})


def test_a_secret_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", "from-env")
    cfg = NotifyConfig.model_validate({"webhooks": [{"url": "https://x.example", "events": ["approval.pending"],
                                                     "secret_env": "HOOK_SECRET"}]})
    hook = cfg.webhooks[0]
    assert hook.key() == "from-env"
    assert hook.label == notify.default_name("https://x.example")
    monkeypatch.delenv("HOOK_SECRET")
    assert hook.key() is None


def test_settings_have_no_webhooks_by_default() -> None:
    s = Settings()
    assert s.notify.webhooks == [] and s.notify.max_attempts >= 1
