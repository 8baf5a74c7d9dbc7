"""A Ray cluster over a Slurm job's tasks, on a real Slurm (issue 16): EBRL jobs of 2 tasks
submitted through ``ebrl.launch`` (launcher=slurm, Submitit). On this single-node Slurm the two
tasks share the machine (``launcher.nodes=1 launcher.tasks_per_node=2``), as two nodes' tasks
would each have their own: task 0 starts the Ray head and trains, task 1 joins it as a second Ray
node.

* A run places its env workers on both Ray nodes, is stopped once while it trains (``scontrol
  requeue``: SIGTERM to every process; or SIGUSR2, Submitit's time-limit warning, after which
  task 0 requeues the job itself), starts the cluster again, resumes, finishes, and leaves no Ray
  process behind, after either attempt.
* A run whose env worker fails: Slurm records the job FAILED, task 1 leaves when the head's
  cluster ends, no Ray process is left.

Needs a Slurm that answers ``sinfo`` (``make test-slurm`` starts one); skipped otherwise. Each
job takes the node's 2 CPUs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from ..conftest import TINY
from .test_slurm_requeue import _iterations, _slurm_unreachable, _squeue, _tail

mlflow = pytest.importorskip("mlflow")

pytestmark = pytest.mark.slurm

ITERATIONS = 30
DELAY_S = 0.03
#: updates the first attempt makes before it is stopped
BEFORE_STOP = 3
#: set in the launcher's environment; sbatch passes it to the job's tasks, and every Ray process
#: they start inherits it: how this test tells its own Ray processes from anyone else's
TAG = "EBRL_MULTINODE_TEST_TAG"
#: "Ray cluster up in 18.7 s, 2 nodes: task 0 (head) 10.0.0.1/1a2b3c4d 1 CPUs 0 GPUs; ..."
UP = re.compile(r"Ray cluster up in ([\d.]+) s, (\d+) nodes: (.*)")


def is_ray(cmd: str) -> bool:
    """A Ray process: ``ray start``, the GCS, a raylet, an agent, a worker (``ray::...``)."""
    return cmd.startswith("ray::") or "site-packages/ray/" in cmd or "ray.scripts.scripts" in cmd


def ray_pids(tag: str, temp_dir: str | None) -> dict[int, str]:
    """pid -> command of every Ray process this job started (by the tag in its environment,
    or its session folder on its command line)."""
    out = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if not is_ray(cmd):
                continue
            if (temp_dir and f"{temp_dir}/" in cmd) or p.environ().get(TAG) == tag:
                out[p.info["pid"]] = cmd[:120]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def placement_nodes(text: str) -> dict[str, set[str]]:
    """role -> the node ids (the ``id8`` of ``address/id8``) of ``placement.txt``'s rows."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3 and cols[0] in ("sim", "gen", "learner"):
            out.setdefault(cols[0], set()).add(cols[2].split("/")[-1])
    return out


def cluster_ids(line: str) -> set[str]:
    return set(re.findall(r"/([0-9a-f]{8}) ", line + " "))


class MultiTaskJob:
    """The launcher (a background process) and the 2-task Slurm job it submitted."""

    def __init__(self, tmp: Path, name: str, extra: list[str]):
        self.name, self.sweep, self.store = name, tmp / "sweep", tmp / "mlflow"
        self.run = self.sweep / "0"
        self.log = tmp / "launcher.log"
        self.tag = uuid.uuid4().hex
        self.jid: str | None = None
        self.temp_dir: str | None = None
        over = [o for o in TINY if not o.startswith("budget.iterations")]
        cmd = [
            sys.executable,
            "-m",
            "ebrl.launch",
            "smoke",
            "launcher=slurm",
            "launcher.nodes=1",
            "launcher.tasks_per_node=2",  # two tasks, two Ray nodes, one machine
            "launcher.cpus_per_task=1",  # 2 x 1 of the node's 2 CPUs
            "seed=0",
            "scheduler=ebrl",
            "scheduler.backend=ray",
            "scheduler.sim_workers=2",
            "scheduler.gen_replicas=2",  # spread over the nodes; each env worker follows its own
            *over,
            f"simulator.delay_s={DELAY_S}",
            f"budget.iterations={ITERATIONS}",
            f"tracking.store={self.store}",
            f"tracking.experiment={name}",
            *extra,
            "--out",
            str(self.sweep),
        ]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, TAG: self.tag},
        )

    def t(self) -> float:
        return time.monotonic() - self.t0

    def task_log(self, task: int) -> str:
        """Task ``task``'s Submitit output, every attempt (Submitit appends)."""
        logs = sorted((self.sweep / ".submitit").glob(f"*/*_{task}_log.out"))
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def clusters(self) -> list[tuple[str, str, str]]:
        """(seconds to start, nodes, nodes' description) of each attempt's cluster."""
        head = self.task_log(0)
        if self.temp_dir is None and (m := re.search(r"temp dir (\S+?)\)", head)):
            self.temp_dir = m[1]
        return UP.findall(head)

    def logs(self, n: int = 6000) -> str:
        parts = [_tail(self.log, n)]
        sub = self.sweep / ".submitit"
        if sub.exists():
            parts += [_tail(f, n) for f in sorted(sub.glob("*/*_log.*"))]
        return "\n".join(p for p in parts if p)

    def state(self) -> str | None:
        q = _squeue(self.name)
        return q[1] if q else None

    def wait(self, what: str, cond, timeout: float, launcher_may_end: bool = False):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = cond()
            if got:
                return got
            if self.proc.poll() is not None and not launcher_may_end:
                pytest.fail(f"the launcher exited ({self.proc.returncode}) while waiting for "
                            f"{what}\n" + self.logs())  # fmt: skip
            time.sleep(0.5)
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n" + self.logs())

    def no_ray_left(self, timeout: float) -> float:
        """Seconds until no Ray process of this job is left; fails after ``timeout``."""
        t0 = time.monotonic()
        while ray_pids(self.tag, self.temp_dir) and time.monotonic() - t0 < timeout:
            time.sleep(1)
        left = ray_pids(self.tag, self.temp_dir)
        assert not left, f"Ray processes of job {self.jid} left: {left}\n{self.logs()}"
        return time.monotonic() - t0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.jid is not None and _squeue(self.name) is not None:
            subprocess.run(["scancel", "--full", self.jid], timeout=30, check=False)


@pytest.fixture(scope="module")
def slurm() -> None:
    reason = _slurm_unreachable()
    if reason:
        pytest.skip(f"Slurm not reachable: {reason}")
    cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout
    if int(cpus.split()[0]) < 2:
        pytest.skip(f"the node has {cpus.strip()} CPU(s); a job of 2 tasks x 1 CPU needs 2")


def check_placement(job: MultiTaskJob, attempt: int, cluster: tuple[str, str, str]) -> dict:
    """The attempt's env workers ran on both of its cluster's nodes; what was seen."""
    placed = (job.run / "placement.txt").read_text()
    print(f"\n[attempt {attempt}] placement.txt:\n{placed}")
    nodes = placement_nodes(placed)
    assert cluster[1] == "2", cluster
    assert len(nodes["sim"]) == 2, placed  # env workers on both Ray nodes
    assert nodes["sim"] == cluster_ids(cluster[2]), (nodes, cluster)  # task 0's and task 1's
    return {
        "attempt": attempt,
        "cluster_up_s": float(cluster[0]),
        "cluster": cluster[2],
        "sim_nodes": sorted(nodes["sim"]),
        "gen_nodes": sorted(nodes["gen"]),
        "learner_nodes": sorted(nodes["learner"]),
    }


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("stop", ["requeue", "usr2"])
def test_a_two_task_job_runs_on_a_ray_cluster_of_both_and_resumes_after_a_stop(
    slurm, tmp_path, stop
):
    name = f"ebrl-multinode-{stop}-{uuid.uuid4().hex[:6]}"
    job = MultiTaskJob(tmp_path, name, [])
    seen: list[dict] = []
    try:
        job.jid = job.wait("the job in squeue", lambda: _squeue(name), 180)[0]
        job.wait("attempt 1 RUNNING", lambda: job.state() == "RUNNING", 600)
        t_run = job.t()
        job.wait(f"{BEFORE_STOP} updates", lambda: _iterations(job.run / "progress.json")
                 >= BEFORE_STOP, 600)  # fmt: skip
        (cluster,) = job.clusters()
        seen.append(check_placement(job, 1, cluster) | {"running_at_s": round(t_run, 1)})
        assert "Ray node started" in job.task_log(1), job.logs()

        at = _iterations(job.run / "progress.json")
        if stop == "requeue":  # preemption: Slurm SIGTERMs every process, then requeues
            cmd = ["scontrol", "requeue", job.jid]
        else:  # the time-limit warning (--signal=USR2@...) to every process of the job's steps
            cmd = ["scancel", "--signal=USR2", job.jid]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        t_stop = job.t()
        job.wait("PENDING (requeued)", lambda: job.state() == "PENDING", 300)
        t_pend = job.t()
        gone = job.no_ray_left(90)  # nothing of the first attempt outlives it, on either node
        seen[0] |= {"updates_at_stop": at, "pending_after_s": round(t_pend - t_stop, 1),
                    "ray_gone_after_s": round(t_pend - t_stop + gone, 1)}  # fmt: skip

        job.wait("attempt 2 RUNNING", lambda: job.state() == "RUNNING", 600)
        t_run2 = job.t()
        job.wait("the launcher to return", lambda: job.proc.poll() is not None, 900)
        assert job.proc.returncode == 0, job.logs()
        clusters = job.clusters()
        assert len(clusters) == 2, job.logs()  # the cluster, started again
        timing = {"running_at_s": round(t_run2, 1), "finished_at_s": round(job.t(), 1)}
        seen.append(check_placement(job, 2, clusters[1]) | timing)
        worker_log = job.task_log(1)
        left = re.findall(r"task 1: left \((.*?)\) after", worker_log)
        resumed = re.findall(r"resuming from \S+ at update (\d+)", job.logs(10**7))
        seen.append({"task 1 left": left, "resumed at update": resumed})
        # the last attempt's task 1 left because the head's cluster ended; it never trained
        assert left and left[-1] == "the head's cluster ended", worker_log[-4000:]
        assert "run folder:" not in worker_log and resumed, job.logs()
        seen.append({"ray gone after the job (s)": round(job.no_ray_left(60), 1)})
    finally:
        print(f"\n[{stop}] Slurm job {job.jid}, 2 tasks on one node, {job.t():.0f} s in all:")
        for s in seen:
            print("  " + json.dumps(s))
        job.stop()

    summary = json.loads((job.run / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["iterations"] == ITERATIONS, summary
    assert "ray_address: auto" in (job.run / "config.yaml").read_text()
    client = mlflow.tracking.MlflowClient(f"sqlite:///{job.store / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    runs = [r for r in client.search_runs([exp.experiment_id])
            if r.data.tags.get("run_kind") != "sweep"]  # fmt: skip
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", runs  # one run, both attempts
    assert runs[0].data.tags.get("resumed") == "true"
    print(f"[{stop}] one MLflow run {runs[0].info.run_id}: FINISHED, resumed, {ITERATIONS} updates")


@pytest.mark.timeout(900)
def test_a_failing_two_task_job_fails_in_slurm_and_leaves_no_ray(slurm, tmp_path):
    name = f"ebrl-multinode-fail-{uuid.uuid4().hex[:6]}"
    job = MultiTaskJob(tmp_path, name, ["simulator.fail_after_steps=12"])
    try:
        job.jid = job.wait("the job in squeue", lambda: _squeue(name), 180)[0]
        job.proc.wait(timeout=600)
        job.clusters()
        show = subprocess.run(["scontrol", "show", "job", job.jid], capture_output=True,
                              text=True, timeout=30).stdout  # fmt: skip
        gone = job.no_ray_left(60)
        text = job.logs(10**6)
    finally:
        job.stop()
    state = re.search(r"JobState=(\S+)", show)
    left = re.findall(r"task 1: left \((.*?)\) after", job.task_log(1))
    print(f"\n[failing job] Slurm job {job.jid}: JobState={state and state[1]}, launcher exit "
          f"{job.proc.returncode}, task 1 left: {left}, Ray gone {gone:.0f} s after")  # fmt: skip
    assert job.proc.returncode != 0 and "injected failure" in text, text
    assert state is not None and state[1] == "FAILED", show
    assert left == ["the head's cluster ended"], job.task_log(1)
