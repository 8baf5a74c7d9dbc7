"""What every config module shares: the error a bad configuration raises, and small helpers."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the fix."""


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _option(node: Any, fallback: str) -> str:
    return str(getattr(node, "name", None) or fallback)


#: how to get RLinf, for the nodes that build through its registries
RLINF_INSTALL = (
    "RLinf runs in its own venv: `make test-rlinf` builds .venv-rlinf (pip install -e "
    "'.[rlinf]'); run ebrl from that interpreter"
)
