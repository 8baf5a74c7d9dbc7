"""Liveness on EBRL's workers: the heartbeats that find a hung worker, and the Stop that ends them.

Who watches whom:

* every worker beats: :class:`HeartbeatSender`, a daemon thread with a connection of its own,
  sends the driver a :class:`Beat` every ``Schedule.heartbeat_s``
  (``scheduler.hang_timeout_s / 10``, at most 1 s) until the worker leaves its loop;
* the driver keeps a clock per worker, :class:`HeartbeatMonitor`: a worker silent for
  ``scheduler.hang_timeout_s`` is hung (a frozen process, or native code holding the GIL); the
  driver's relay kills it, and it is replaced as a dead one is, or stops the run;
* the driver ends the workers with :func:`stop_workers`: one :class:`Stop` each (every worker
  loop leaves at its Stop), then the backend stops the handles;
* the driver itself is watched by its orphan watchdog (:mod:`ebrl.runtime.watchdog`), a process
  of its own over a pipe: when the driver dies without stopping it, it ends what the driver
  started. It lives in ``ebrl.runtime`` because the Slurm cluster's nodes keep one too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from typing import Any

from ebrl.runtime.channel import Address, Outbox
from ebrl.schedulers.ebrl.messages import Beat, Stop


class HeartbeatSender:
    """A worker's beat: from :meth:`start` to :meth:`stop`, a :class:`Beat` to the driver every
    ``period`` seconds from a daemon thread (so a worker busy in its loop still beats, and one
    frozen as a whole does not). ``period`` None or 0: no beat."""

    def __init__(self, worker: str, driver: Address, authkey: bytes, period: float | None) -> None:
        self.worker, self.driver, self.authkey, self.period = worker, driver, authkey, period
        self._stop = threading.Event()

    def start(self) -> HeartbeatSender:
        if self.period:
            name = f"ebrl-beat-{self.worker}"
            threading.Thread(target=self._beat, daemon=True, name=name).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _beat(self) -> None:
        try:
            out = Outbox(self.driver, self.authkey)
            while not self._stop.wait(self.period):
                out.send(Beat(self.worker))
            out.close()
        except OSError:  # the driver is gone: nothing to tell
            return


class HeartbeatMonitor:
    """When each worker was last heard from (its :class:`Beat`), and which have gone silent.

    A handle's clock starts when it is first seen here (its process may take a while to build
    its stage before it beats); a handle already reported hung is not reported again. Silence
    is only counted while the driver reads its inbox: after the driver itself was busy elsewhere
    (starting a replacement worker takes seconds) every clock restarts, since beats sent
    meanwhile were not read yet.

    Args:
        timeout_s: silence that makes a worker hung (None: never).
        handles: the run's worker handles (replacements are appended to the same list).
    """

    #: the driver checks every ~0.5 s; a longer gap means it was away
    AWAY_S = 2.0

    def __init__(self, timeout_s: float | None, handles: list) -> None:
        self.timeout_s = timeout_s
        self.handles = handles
        self.last: dict[str, float] = {}
        self.reported: set[int] = set()
        self.checked = time.monotonic()

    def seen(self, worker: str) -> None:
        self.last[worker] = time.monotonic()

    def hung(self) -> list[tuple[Any, float]]:
        """(handle, seconds silent) of each worker newly found hung."""
        if not self.timeout_s:
            return []
        now, out = time.monotonic(), []
        if now - self.checked > self.AWAY_S:
            self.last = dict.fromkeys(self.last, now)
        self.checked = now
        for h in self.handles:
            if id(h) in self.reported:
                continue
            last = self.last.setdefault(h.name, now)
            if now - last > self.timeout_s:
                self.reported.add(id(h))
                out.append((h, now - last))
        return out


def stop_workers(inboxes: Iterable[Address], authkey: bytes, within_s: float = 2.0) -> None:
    """Send :class:`Stop` to every inbox, each from a thread of its own, for at most
    ``within_s`` in all: connecting to a hung worker's inbox (a frozen process) never completes
    its handshake, and a dead worker cannot be told; the caller then stops the handles."""

    def tell(addr: Address) -> None:
        with contextlib.suppress(Exception):
            out = Outbox(addr, authkey, retries=1)
            out.send(Stop())
            out.close()

    tellers = [threading.Thread(target=tell, args=(a,), daemon=True) for a in inboxes]
    for t in tellers:
        t.start()
    deadline = time.monotonic() + within_s
    for t in tellers:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
