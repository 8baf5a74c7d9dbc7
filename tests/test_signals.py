"""A stop signal inside the driver's record of an update waits for the record to end."""

from __future__ import annotations

import os
import signal

import pytest

from ebrl.signals import Preempted, StopSignals


def test_a_signal_inside_a_deferred_block_is_raised_when_the_block_ends():
    done = []
    with StopSignals() as stop, pytest.raises(Preempted) as caught:
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGUSR2)
            done.append("logged")  # not cut: the signal is held
            done.append("saved")
        done.append("after")  # never reached: raised at the block's end
    assert done == ["logged", "saved"]
    assert caught.value.signum == signal.SIGUSR2
    assert stop.received == [signal.SIGUSR2]


def test_outside_a_deferred_block_a_signal_raises_at_once_and_a_second_is_only_recorded():
    with StopSignals() as stop:
        with pytest.raises(Preempted):
            os.kill(os.getpid(), signal.SIGUSR2)
            raise AssertionError("not reached")
        # the run is cleaning up: a later signal, even inside a deferred block, never raises
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.received == [signal.SIGUSR2, signal.SIGUSR2]


def test_a_deferred_block_without_a_signal_changes_nothing():
    with StopSignals() as stop:
        with stop.deferred():
            pass
        assert stop.armed and stop.received == []
