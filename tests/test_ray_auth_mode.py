"""Which Ray authentication mode ``python -m ebrl.train`` runs with (issue 42).

The run says ``RAY_AUTH_MODE=token`` only where it starts Ray itself
(``scheduler.ray_address=local``): there Ray 2.60 would turn token authentication on by itself
and warn that it did. A driver that joins a cluster takes that cluster's mode: the user's own
``RAY_AUTH_*``, or Ray's default; a token forced on it is refused by a cluster without one.
Ray reads the mode when it is imported, so it is decided in ``main`` before any run starts.
"""

from __future__ import annotations

import sys

import pytest

import ebrl.train
from ebrl.config import ConfigError


def mode_seen_by_the_run(monkeypatch, tmp_path, *overrides: str) -> str | None:
    """``RAY_AUTH_MODE`` as ``ebrl.train.train`` sees it when ``main`` runs with
    ``overrides`` (the run itself is replaced by a recorder that stops it)."""
    seen: dict[str, str | None] = {}

    def record(cfg):
        import os

        seen["mode"] = os.environ.get("RAY_AUTH_MODE")
        raise ConfigError("recorded")  # main turns it into exit code 2, no run

    monkeypatch.setattr(ebrl.train, "train", record)
    monkeypatch.chdir(tmp_path)
    argv = ["ebrl.train", *overrides, f"hydra.run.dir={tmp_path / 'h'}"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        ebrl.train.main()
    assert e.value.code == 2
    return seen["mode"]


def no_mode(monkeypatch) -> None:
    """RAY_AUTH_MODE unset, as a user has it; whatever ``main`` sets is undone after the test
    (set first so that monkeypatch restores the variable's absence)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "unset-by-the-test")
    monkeypatch.delenv("RAY_AUTH_MODE")


def test_a_run_that_starts_its_own_ray_says_token(monkeypatch, tmp_path):
    no_mode(monkeypatch)
    assert mode_seen_by_the_run(monkeypatch, tmp_path, "scheduler=ebrl") == "token"


def test_a_driver_joining_a_cluster_takes_the_clusters_mode(monkeypatch, tmp_path):
    no_mode(monkeypatch)
    mode = mode_seen_by_the_run(
        monkeypatch, tmp_path, "scheduler=ebrl", "scheduler.ray_address=10.0.0.7:6379"
    )
    assert mode is None  # Ray's default: no token sent to a cluster that has none


@pytest.mark.parametrize("address", ["local", "10.0.0.7:6379"])
def test_the_users_own_mode_is_kept(monkeypatch, tmp_path, address):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    mode = mode_seen_by_the_run(
        monkeypatch, tmp_path, "scheduler=ebrl", f"scheduler.ray_address={address}"
    )
    assert mode == "disabled"
