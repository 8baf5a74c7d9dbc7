"""Who reacts to what on EBRL's workers, and their liveness: the handler tables, the heartbeat
a worker sends, the driver's clock that finds a hung one, and the Stop that ends them all."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from ebrl.runtime.channel import Inbox, new_authkey
from ebrl.schedulers.ebrl import messages as msg
from ebrl.schedulers.ebrl.env_worker import EnvWorker
from ebrl.schedulers.ebrl.gen_worker import GenWorker
from ebrl.schedulers.ebrl.heartbeat import HeartbeatMonitor, HeartbeatSender, stop_workers
from ebrl.schedulers.ebrl.learner_worker import LearnerWorker

#: the traffic diagram (ebrl/schedulers/ebrl/wiring.py), read at the receiving end
RECEIVES = {
    EnvWorker: {msg.Go, msg.Rewire, msg.Reshape},
    GenWorker: {msg.Ready, msg.Hello, msg.Resync, msg.Weights, msg.Reshape, msg.Resources},
    LearnerWorker: {msg.Part, msg.Lost, msg.Reconnect, msg.Resources},
}


@pytest.mark.parametrize("cls", list(RECEIVES), ids=lambda c: c.__name__)
def test_each_worker_handles_what_the_diagram_sends_it_with_a_method_of_its_own(cls):
    assert set(cls.handlers) == RECEIVES[cls]
    for kind, name in cls.handlers.items():
        assert callable(getattr(cls, name, None)), f"{cls.__name__}: {kind.__name__} -> {name}"


def test_a_worker_stops_at_stop_and_handles_nothing_after_it():
    env = EnvWorker.__new__(EnvWorker)  # the dispatch only: no stage, no sockets
    env.step_level = False
    shape = msg.Reshape([[0]], True, 1)
    assert env._handle([shape]) is False and env.step_level is True
    env.step_level = False
    assert env._handle([msg.Stop(), shape]) is True
    assert env.step_level is False  # the Reshape after the Stop was not handled
    assert env._handle([msg.Beat("driver")]) is False  # no handler: dropped, as before


def test_a_worker_beats_until_stopped_and_never_without_a_period():
    authkey = new_authkey()
    inbox = Inbox(authkey)
    try:
        beat = HeartbeatSender("sim0", inbox.address, authkey, period=0.05).start()
        got: list = []
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            got += inbox.recv(timeout=0.2)
        assert len(got) >= 3 and all(m == msg.Beat("sim0") for m in got)
        beat.stop()
        time.sleep(0.2)
        inbox.recv(timeout=0.1)  # a beat in flight at the stop
        assert inbox.recv(timeout=0.3) == []
        HeartbeatSender("sim1", inbox.address, authkey, period=None).start()
        assert inbox.recv(timeout=0.3) == []
    finally:
        inbox.close()


def test_a_silent_worker_is_reported_hung_once_and_not_after_the_driver_was_away(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    sim, gen = SimpleNamespace(name="sim0"), SimpleNamespace(name="gen")
    beats = HeartbeatMonitor(timeout_s=3.0, handles=[sim, gen])
    assert beats.hung() == []  # the clocks start when first seen
    for _ in range(8):  # the driver checks every 0.5 s; only gen beats
        now[0] += 0.5
        beats.seen("gen")
        hung = beats.hung()
        if hung:
            break
    assert hung == [(sim, pytest.approx(3.5))]
    now[0] += 0.5
    assert beats.hung() == []  # reported once
    now[0] += 10.0  # the driver was busy elsewhere (starting a replacement)
    beats.seen("sim0")
    assert beats.hung() == []  # gen's beats meanwhile were not read yet: its clock restarts
    assert HeartbeatMonitor(timeout_s=None, handles=[sim]).hung() == []


def test_stop_reaches_every_inbox_and_a_dead_one_costs_at_most_the_limit():
    authkey = new_authkey()
    inboxes = [Inbox(authkey) for _ in range(2)]
    dead = Inbox(authkey)
    gone = dead.address
    dead.close()
    try:
        t0 = time.monotonic()
        stop_workers([i.address for i in inboxes] + [gone], authkey, within_s=1.0)
        assert time.monotonic() - t0 < 1.5
        for i in inboxes:
            assert i.recv(timeout=2.0) == [msg.Stop()]
    finally:
        for i in inboxes:
            i.close()
