"""The step ledger: what the env workers collected, held against what the learner trained.

A step counts as trained iff the segment it landed in was trained by a learner version of its
attempt (segment ``i`` of an attempt that started at version ``s`` is trained by ``s + i``); a
dead env worker's steps from the segment its replacement starts at are superseded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import torch

from ebrl.ledger import StepLedger, account, attempt_dir, writer_path
from ebrl.rollout import SegmentBuilder
from ebrl.types import Transition


def _write(path, first, lines):
    led = StepLedger(path, first)
    for d in lines:
        led.add(d)
    led.close()


def test_account_splits_each_attempt_at_the_version_the_next_one_started_at(tmp_path):
    a0 = attempt_dir(tmp_path, 0)
    # two env workers; the attempt trained 2 updates (the next starts at version 2): segments
    # 0 and 1 trained, segment 2 (in flight at the stop) discarded
    _write(writer_path(a0, "sim0"), 0, [{0: 10}, {0: 6, 1: 4}, {1: 12}, {2: 7}])
    _write(writer_path(a0, "sim1"), 0, [{0: 16}, {1: 16}, {2: 3}])
    a1 = attempt_dir(tmp_path, 2)
    # sim0 died in segment 1 of the second attempt; its replacement starts there again
    _write(writer_path(a1, "sim0", 0), 0, [{0: 16}, {1: 5}])
    _write(writer_path(a1, "sim0", 1), 1, [{1: 16}, {2: 2}])
    _write(writer_path(a1, "sim1"), 0, [{0: 16}, {1: 16}, {2: 9}])
    acc = account(tmp_path, final_version=4)  # the second attempt trained 2 more updates
    assert acc.by_attempt[0] == (74, 64, 10)
    assert acc.by_attempt[1] == (80, 64, 16)  # 5 superseded + 2 + 9 past the last update
    assert (acc.collected, acc.trained, acc.discarded, acc.superseded) == (154, 128, 26, 5)


def test_a_torn_last_line_and_an_attempt_that_collected_nothing(tmp_path):
    a0 = attempt_dir(tmp_path, 0)
    path = writer_path(a0, "driver")
    _write(path, 0, [{0: 8}, {1: 8}])
    with path.open("a") as f:
        f.write("2:")  # the writer was killed in the middle of a line
    attempt_dir(tmp_path, 1)  # a requeued attempt stopped before any worker started
    acc = account(tmp_path, final_version=1)
    assert acc.by_attempt == [(16, 8, 8), (0, 0, 0)]


def test_lines_reach_the_file_even_when_the_writer_is_killed(tmp_path):
    """os.write on an O_APPEND file: a SIGKILLed process loses nothing it recorded."""
    path = writer_path(attempt_dir(tmp_path, 0), "sim0")
    code = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from ebrl.ledger import StepLedger
        led = StepLedger(Path({str(path)!r}), 0)
        for i in range(100):
            led.add({{i // 10: 3}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ}, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    acc = account(tmp_path, final_version=5)  # segments 0-4 of 0-9 trained
    assert acc.collected == 300 and acc.trained == 150


def _tr(env_ids, steps):
    b = len(env_ids)
    z = torch.zeros(b)
    return Transition(
        obs=torch.zeros(b, 1),
        actions=torch.zeros(b, 1, 1),
        logprob=z,
        value=z,
        reward=torch.zeros(b, 1),
        n_steps=torch.tensor(steps, dtype=torch.int64),
        terminated=torch.zeros(b, dtype=torch.bool),
        truncated=torch.zeros(b, dtype=torch.bool),
        success=torch.zeros(b, dtype=torch.bool),
        final_obs=torch.zeros(b, 1),
        episode_id=torch.zeros(b, dtype=torch.int64),
        episode_step=torch.zeros(b, dtype=torch.int64),
        env_ids=torch.tensor(env_ids, dtype=torch.int64),
        policy_version=torch.zeros(b, dtype=torch.int64),
    )


def test_the_builder_records_each_decision_under_its_own_envs_segment(tmp_path):
    """Envs run ahead of each other (step level): env 1's third decision lands in segment 1
    while env 0 is still in segment 0; a replacement's segments count from its first."""
    path = writer_path(tmp_path, "sim0", 1)
    led = StepLedger(path, first_segment=3)
    b = SegmentBuilder([0, 1], decisions_per_env=2, ledger=led)
    b.add(_tr([0, 1], [4, 4]))
    b.add(_tr([1], [2]))
    b.add(_tr([1], [4]))  # env 1: segment 3 + 1
    b.add(_tr([0, 1], [1, 3]))
    led.close()
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"first_segment": 3}
    assert lines[1:] == ["3:8", "3:2", "4:4", "3:1 4:3"]
