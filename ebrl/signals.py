"""The signals that stop a run, and what the driver does with them.

Three signals end a run early: SIGTERM (Slurm preemption, ``scancel``, ``scontrol requeue``),
SIGINT (Ctrl-C) and SIGUSR2 (Submitit's time-limit warning, ``--signal=USR2@<delay>``). While a
run trains, the first of them raises :class:`Preempted` in the driver's main thread, so the run
stops where it is, keeps its checkpoint and progress, and marks its MLflow run KILLED. Once the
run is shutting down (its outputs are being written) a signal is only recorded: a finished run
stays FINISHED whatever arrives then, and a second signal never interrupts the first one's
clean-up.

After the clean-up, :meth:`Preempted.redeliver` hands the signal to whoever handled it before the
run (Submitit's handler requeues the job on USR2), then ends the process by that signal with the
default action, the exit status Slurm and Submitit expect of a preempted job (128 + signal
number; no result file, so Submitit keeps waiting for the requeued attempt).

Libraries that install their own handlers (``ray.init`` replaces SIGTERM's with one that calls
``sys.exit``) are wrapped in :func:`keep_handlers`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)

#: the stop signals this process has received (while a :class:`StopSignals` was active)
_received: list[int] = []


def stopping() -> bool:
    """Whether this process is being stopped by a signal: its shutdown should be quick (under
    Slurm every process of the job got the signal too, Ray's included)."""
    return bool(_received)


class Preempted(BaseException):
    """A stop signal arrived while the run trained: stop, keep everything, resume later.

    A ``BaseException`` (like ``KeyboardInterrupt``): no ``except Exception`` on the way up may
    swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signal.Signals(signum).name}")
        self.signum = int(signum)
        #: the handler that was in force before the run's (restored when the run ends)
        self.previous: Any = signal.SIG_DFL

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return (Preempted, (self.signum,))

    def redeliver(self) -> None:
        """Pass the signal on to the previous handler, then end the process by it.

        Never returns. SIGINT without a previous handler exits with status 130 (Ctrl-C).
        """
        prev = self.previous
        if callable(prev) and prev is not signal.default_int_handler:
            try:  # Submitit: USR2 -> checkpoint + requeue (then it exits itself)
                prev(self.signum, None)
            except SystemExit:
                raise
            except Exception as e:  # a broken handler must not keep a preempted job alive
                log.warning("the previous %s handler failed: %s", self, e)
        if self.signum == signal.SIGINT:
            sys.exit(128 + self.signum)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(self.signum, signal.SIG_DFL)
        os.kill(os.getpid(), self.signum)
        sys.exit(128 + self.signum)  # only reached if the default action did not end us


class StopSignals:
    """While active, the stop signals raise :class:`Preempted` in the main thread.

    ``with StopSignals() as stop:`` arms the handlers; :meth:`disarm` makes later signals be
    only recorded (in ``received``); leaving the block restores the previous handlers. Outside
    the main thread (where Python delivers no signals) it does nothing.
    """

    def __init__(self) -> None:
        self.armed = False
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}
        self._deferring = False
        self._held: int | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in STOP_SIGNALS:
            self._previous[s] = signal.signal(s, self._handler)
        self.armed = True
        return self

    def __exit__(self, *exc: object) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()
        self.armed = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        _received.append(signum)
        if not self.armed:
            log.warning("%s during shutdown: recorded, the shutdown goes on", _name(signum))
            return
        if self._deferring:  # raised when the block that must not be cut ends
            if self._held is None:
                self._held = signum
            return
        self.armed = False  # one Preempted per run: a second signal never cuts the clean-up
        p = Preempted(signum)
        p.previous = self._previous.get(signum, signal.SIG_DFL)
        raise p

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A block a stop signal must not cut in two: one arriving inside it is raised as
        :class:`Preempted` when the block ends (the driver's record of an update, which goes
        to MLflow, ``metrics.jsonl`` and ``progress.json``: a signal between the first and the
        last would leave an update logged that the resumed run counts as never logged)."""
        if self._deferring:
            yield
            return
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        held, self._held = self._held, None
        if held is not None and self.armed:
            self.armed = False
            p = Preempted(held)
            p.previous = self._previous.get(held, signal.SIG_DFL)
            raise p

    def disarm(self) -> None:
        """From now on signals are recorded, not raised (the run is shutting down)."""
        self.armed = False

    def preempted(self) -> Preempted | None:
        """The first signal received, as the exception to redeliver (None: none arrived)."""
        if not self.received:
            return None
        p = Preempted(self.received[0])
        p.previous = self._previous.get(self.received[0], signal.SIG_DFL)
        return p


@contextlib.contextmanager
def keep_handlers() -> Iterator[None]:
    """Restore the stop signals' Python handlers after the block (``ray.init`` replaces
    SIGTERM's with one that calls ``sys.exit``, which would end a run as FAILED)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved: dict[int, Callable | int | None] = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in saved.items():
            if h is not None and signal.getsignal(s) is not h:
                signal.signal(s, h)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
