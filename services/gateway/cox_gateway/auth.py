"""Bearer-token authentication: a token names a principal; every /v1 call needs one."""

from __future__ import annotations

import hmac

from fastapi import Request

from coxswain.errors import Unauthorized


class Auth:
    def __init__(self, tokens: dict[str, str]) -> None:
        if not tokens:
            raise ValueError("no API token is configured (cox up --token, COX_TOKEN or [auth] tokens)")
        self.tokens = [(t.encode(), p) for t, p in tokens.items()]

    def principal(self, request: Request) -> str:
        return self.principal_of(request.headers.get("authorization", ""))

    def principal_of(self, header: str) -> str:
        """The principal an ``Authorization`` header's bearer token names (401 otherwise)."""
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("send Authorization: Bearer <token>")
        given = token.strip().encode()
        found = None
        for tok, principal in self.tokens:
            if hmac.compare_digest(tok, given):
                found = principal
        if found is None:
            raise Unauthorized("unknown token")
        return found
