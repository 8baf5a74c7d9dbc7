"""The orphan watchdog: a SIGKILLed driver's processes and shared memory do not outlive it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

DRIVER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    from multiprocessing import shared_memory
    from ebrl.runtime.watchdog import Watchdog, shm_prefix
    import os
    dog = Watchdog()
    # a child that ignores SIGTERM, as Ray's agents do
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
    shm = shared_memory.SharedMemory(name=shm_prefix(os.getpid()) + "t", create=True, size=64)
    from multiprocessing import resource_tracker
    resource_tracker.unregister(shm._name, "shared_memory")  # as if the tracker were gone too
    print(child.pid, dog.proc.pid, flush=True)
    if sys.argv[1] == "stop":
        time.sleep(1.0)
        dog.stop()
        print(dog.proc.returncode, flush=True)
        child.kill()
        shm.unlink()
    else:
        time.sleep(300)
    """
)


def start(mode: str):
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE, text=True)
    child, dog = map(int, proc.stdout.readline().split())
    return proc, child, dog


def test_a_killed_drivers_children_and_segments_are_ended():
    proc, child, dog = start("kill")
    time.sleep(1.5)  # the watchdog has seen the child
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and (psutil.pid_exists(child) or psutil.pid_exists(dog)):
        time.sleep(0.2)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
    assert not psutil.pid_exists(dog) or psutil.Process(dog).status() == "zombie"
    assert not list(Path("/dev/shm").glob(f"ebrl_{proc.pid}_*"))


def test_a_driver_that_cleans_up_stops_its_watchdog_quietly():
    proc, _child, dog = start("stop")
    assert proc.stdout.readline().strip() == "0"  # the watchdog exited on "stop", ending nothing
    proc.wait(timeout=30)
    assert not psutil.pid_exists(dog) or psutil.Process(dog).status() == "zombie"
