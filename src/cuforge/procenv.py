"""Environments for subprocesses that run user code: secrets removed, nothing else surprising."""

from __future__ import annotations

import os
import re

# Names that carry credentials. Matched case-insensitively against the whole variable name.
_SECRET = re.compile(
    r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|PRIVATE_?KEY|SESSION_?KEY|ACCESS_?KEY)",
    re.IGNORECASE,
)
_SECRET_EXACT = {"AWS_ACCESS_KEY_ID", "GOOGLE_APPLICATION_CREDENTIALS", "NETRC", "SSH_AUTH_SOCK"}


def is_secret_name(name: str) -> bool:
    return name.upper() in _SECRET_EXACT or bool(_SECRET.search(name))


def scrubbed_env(extra: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment without credentials, plus `extra`."""
    env = {k: v for k, v in (base if base is not None else os.environ).items() if not is_secret_name(k)}
    env.update(extra or {})
    return env


def secret_names_present(base: dict[str, str] | None = None) -> list[str]:
    return sorted(k for k in (base if base is not None else os.environ) if is_secret_name(k))
