"""A local Ray node that times out starting (Ray waits a fixed 30 s for its raylet; a loaded
machine can pass that) is started afresh, not the end of the run."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from ebrl.runtime.backend import RayBackend  # noqa: E402

SLOW = Exception(
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


class _Init:
    """ray.init that fails the first ``fails`` calls as a slow raylet does."""

    def __init__(self, fails: int, error: Exception = SLOW) -> None:
        self.fails, self.calls, self.shutdowns, self.error = fails, 0, 0, error

    def init(self, **kwargs) -> None:
        self.calls += 1
        if self.calls <= self.fails:
            raise self.error

    def shutdown(self) -> None:
        self.shutdowns += 1


def _patch(monkeypatch, fake: _Init) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake.init)
    monkeypatch.setattr(ray, "shutdown", fake.shutdown)


def test_a_local_node_that_timed_out_starting_is_started_again(monkeypatch):
    fake = _Init(fails=1)
    _patch(monkeypatch, fake)
    backend = RayBackend(address="local", num_cpus=1)
    assert fake.calls == 2 and fake.shutdowns == 1 and backend._started
    backend._watchdog.stop()


def test_it_gives_up_after_the_last_attempt(monkeypatch):
    fake = _Init(fails=RayBackend.local_start_attempts)
    _patch(monkeypatch, fake)
    with pytest.raises(Exception, match="timed out during startup"):
        RayBackend(address="local", num_cpus=1)
    assert fake.calls == RayBackend.local_start_attempts


def test_other_errors_and_joined_clusters_are_not_retried(monkeypatch):
    fake = _Init(fails=1, error=ValueError("bad runtime_env"))
    _patch(monkeypatch, fake)
    with pytest.raises(ValueError, match="bad runtime_env"):
        RayBackend(address="local", num_cpus=1)
    assert fake.calls == 1
    fake = _Init(fails=1)
    _patch(monkeypatch, fake)
    with pytest.raises(Exception, match="timed out during startup"):
        RayBackend(address="10.0.0.1:6379")
    assert fake.calls == 1
