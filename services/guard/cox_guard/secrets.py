"""Content that looks like a credential, found with detect-secrets (Yelp's maintained detector).

detect-secrets' high-entropy plugins flag ordinary words when fed single lines, so only its
specific detectors count here (AWS keys, private keys, GitHub/Slack/Stripe tokens, JWTs,
"password = ..." keywords, ...). A cheap pre-filter keeps scanning fast on large files: only
lines that hint at a credential go through the detector.
"""

from __future__ import annotations

import re

from detect_secrets.core.scan import scan_line
from detect_secrets.settings import default_settings

NOISY = frozenset({"Base64 High Entropy String", "Hex High Entropy String"})
HINT = re.compile(
    r"(?i)(key|secret|token|passw|pwd|auth|bearer|credential|BEGIN [A-Z ]*PRIVATE|AKIA|ASIA|ghp_|gho_|"
    r"github_pat_|xox[abposr]-|sk_live|rk_live|eyJ[A-Za-z0-9_-]{8,}\.|AIza|-----BEGIN)"
)
MAX_LINES = 20_000


def find(text: str) -> list[str]:
    """The kinds of credential that ``text`` seems to hold (empty when none)."""
    kinds: list[str] = []
    with default_settings():
        for i, line in enumerate(text.splitlines()):
            if i >= MAX_LINES:
                break
            if len(line) > 4000 or not HINT.search(line):
                continue
            for secret in scan_line(line):
                if secret.type not in NOISY and secret.type not in kinds:
                    kinds.append(secret.type)
    return kinds
