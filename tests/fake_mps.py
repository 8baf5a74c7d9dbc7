"""A fake ``nvidia-cuda-mps-control`` for the MPS tests (tests/test_resources_apply.py,
tests/test_gpu_fake.py, tests/test_ebrl_mps.py): ``-d`` forks a daemon that makes its control
pipe in ``CUDA_MPS_PIPE_DIRECTORY`` and lives until SIGTERM, as the real one; a client's
``quit`` on stdin ends it (unless ``FAKE_MPS_IGNORE_QUIT`` is set: a daemon that will not quit);
``get_server_list`` answers the daemon's pid (its stand-in server), ``get_client_list`` nothing
(no CUDA client can reach it).
Where ``FAKE_MPS_LOG`` names a file, each start and quit is appended to it, with the daemon's
pid and pipe directory."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

SCRIPT = r"""
import os, signal, subprocess, sys, time

pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
log = os.environ.get("FAKE_MPS_LOG")
pidfile = os.path.join(pipe, "fake-daemon.pid")
args = sys.argv[1:]


def record(line):
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")


if args[:1] == ["--serve"]:  # the daemon itself: lives until SIGTERM
    open(os.path.join(pipe, "control"), "w").close()
    while True:
        time.sleep(0.1)
elif args == ["-d"]:  # like the real one: fork a daemon and return
    p = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with open(pidfile, "w") as f:
        f.write(str(p.pid))
    record(f"start {p.pid} {pipe}")
else:  # a client: read commands
    for line in sys.stdin:
        if line.strip() == "quit" and not os.environ.get("FAKE_MPS_IGNORE_QUIT"):
            record(f"quit {pipe}")
            os.kill(int(open(pidfile).read()), signal.SIGTERM)
        elif line.strip() == "get_server_list" and os.path.exists(pidfile):
            print(open(pidfile).read().strip())  # the daemon stands in for its one server
        # get_client_list <pid>: no answer: no CUDA client can connect to this daemon
"""


def write_control(bin_dir: Path) -> Path:
    """The fake control binary, executable, as ``bin_dir/nvidia-cuda-mps-control``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nvidia-cuda-mps-control"
    path.write_text(f"#!{sys.executable}\n{SCRIPT}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path
