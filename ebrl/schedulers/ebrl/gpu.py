"""What an EBRL run does to its GPUs, driver side: each role's SM quota, where the roles go,
the MPS daemons (or MIG instances) that enforce the quotas, Algorithm 1's re-splits while the
run goes, and what every GPU role's process saw.

The decisions are :mod:`ebrl.resources.sharing`'s (the split, the re-split, the MIG choice,
what is refused), and while the run goes the run's controller
(:class:`~ebrl.resources.controller.RunController`) decides when to re-split; the machine is
changed by :mod:`ebrl.resources.mps` (the daemons), :mod:`ebrl.runtime.placement_ray` (Ray's
options, each role's environment) and :meth:`GpuFabric.requota` (a role restarted with its new
quota). This module holds one run's state between them, so that the engine
(:mod:`ebrl.schedulers.ebrl.scheduler`) calls :meth:`GpuFabric.set_quotas` and
:meth:`~GpuFabric.place` before the workers start, :meth:`~GpuFabric.record_env` once they are
up, connects :meth:`~GpuFabric.requota` to the controller, and :meth:`~GpuFabric.stop_mps` at
the end.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ebrl.resources import sharing
from ebrl.resources.apply import MPS_CONTROL
from ebrl.resources.mps import ClusterMPS, mig_gpus
from ebrl.runtime.backend import RayBackend
from ebrl.runtime.placement import Placement, describe, place
from ebrl.runtime.placement_asks import Ask, role_asks
from ebrl.runtime.placement_nodes import cluster_nodes
from ebrl.runtime.placement_ray import NOSET_CUDA, ray_options, record_role_env
from ebrl.schedulers.ebrl.wiring import Roles, gen_name, learner_name, sim_name

if TYPE_CHECKING:
    from ebrl.schedulers.ebrl.restarts import Restarts

log = logging.getLogger(__name__)


@dataclass
class GpuFabric:
    """One run's GPUs: the scheduler's GPU keys and what the run decided and started.

    Args:
        gen_gpus: each generator replica's GPU share (``scheduler.gen_gpus``).
        learner_gpus: each learner rank's GPU share (``scheduler.learner_gpus``).
        resources: Ray custom resources per role (``scheduler.resources``).
        mps_control: the MPS control binary each node runs.
        device: where the roles with a GPU share compute (``scheduler.device``).
    """

    gen_gpus: float = 0.0
    learner_gpus: float = 0.0
    resources: dict[str, dict[str, float]] | None = None
    mps_control: str = MPS_CONTROL
    device: str | None = None
    #: how the roles are to share a GPU (``resources.gpu_sharing``: auto, mps, mig, time_sliced)
    asked: str = "auto"
    #: each role's SM quota in force (role -> percent; None: the role has whole GPUs or none)
    quotas: dict[str, int | None] = field(default_factory=dict)
    #: how the quotas were chosen (pinned, Algorithm 1, the shares)
    split: sharing.SplitDecision | None = None
    #: how the run's GPUs were shared; None: no role had a GPU
    sharing: sharing.Sharing | None = None
    #: where each role went (:meth:`place`)
    placed: list[Placement] = field(default_factory=list)
    #: the run's MPS daemons (:meth:`start_mps`), while it runs
    mps: ClusterMPS | None = None
    #: node id -> its GPUs in MIG mode where no MPS daemon serves it
    _mig_nodes: dict[str, Any] = field(default_factory=dict)
    #: whether ``sharing`` went to MLflow (:meth:`unlogged_params`)
    _sharing_logged: bool = False
    #: when the fabric was made, at the run's start: a minutes budget counts from there
    started: float = field(default_factory=lambda: time.perf_counter())

    def device_of(self, role: str) -> str:
        """Where a role's stage computes: a GPU when it asks for a share of one (``device``:
        another place for them all)."""
        if getattr(self, f"{role}_gpus", 0.0) <= 0:
            return "cpu"
        return self.device or "cuda"

    # --- before the workers start ----------------------------------------------------------
    def set_quotas(
        self, cfg: Any, gen_batch: int = 1, train_samples: int = 1
    ) -> dict[str, int | None]:
        """Each role's SM quota for this run, kept as ``quotas`` and its decision as
        ``split``: ``resources.gen_sm_pct`` / ``train_sm_pct`` where pinned, else Algorithm 1
        on ``resources.gpu_profile`` where the generator and the learner share a GPU, else
        each role's GPU share (``sharing.decide_split``). The pinned values were checked before
        any work (``ebrl.train``, ``sharing.check_quotas``).

        Args:
            cfg: the run's config.
            gen_batch: the generator's batch (envs per call) Algorithm 1 sizes for.
            train_samples: the decisions a learner rank trains on per update.
        """
        node = (cfg.get("resources") if cfg is not None else None) or {}
        self.asked = str(node.get("gpu_sharing") or "auto")
        self.split = sharing.decide_split(
            self.gen_gpus,
            self.learner_gpus,
            node.get("gen_sm_pct"),
            node.get("train_sm_pct"),
            profile=node.get("gpu_profile"),
            gen_batch=gen_batch,
            train_samples=train_samples,
        )
        self.quotas = self.split.quotas
        return self.quotas

    def place(
        self, roles: Roles, backend: Any, run_dir: Path | None = None, groups: dict | None = None
    ) -> dict[str, dict]:
        """Where each worker runs (Ray actor options by worker name; none in-process): env
        workers on the node of the replica they feed, replicas and learner ranks with the GPU
        shares they ask for (``ebrl.runtime.placement``), each role with an SM quota given it
        and its node's MPS pipe directory (:meth:`start_mps`). Logged, written to the run
        folder's ``placement.txt``, and kept as ``placed``. ``groups``: role -> its node
        group (``placement.groups``), checked against the cluster before any worker starts."""
        self.placed = []
        if not isinstance(backend, RayBackend):
            return {}
        sched = {"sim_workers": len(roles.sims), "gen_replicas": roles.replicas}
        sched |= {"learner_ranks": roles.ranks, "resources": self.resources}
        sched |= {"gen_gpus": self.gen_gpus, "learner_gpus": self.learner_gpus}
        asks = role_asks(sched, groups)  # as the dry run places them (ebrl.launch)
        keys = {"gen": "scale.gen_gpus", "learner": "scale.learner_gpus"}
        self.placed = place(asks, cluster_nodes(), gpu_setting=keys)
        quotas = self.quotas or sharing.quotas(self.gen_gpus, self.learner_gpus)
        quota = {p.ask: quotas.get(p.role) for p in self.placed if p.ask.gpus > 0}
        # the nodes whose GPUs roles share (MPS daemons there, or MIG instances)
        shared = {p.node.node_id: p.node.address for p in self.placed if quota.get(p.ask)}
        if self.asked == sharing.Sharing.time_sliced:  # as asked: no quota anywhere
            quota = dict.fromkeys(quota)
        per_gpu: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for p in self.placed:
            if quota.get(p.ask) is not None:
                for slot in p.gpu_slots:
                    per_gpu.setdefault((p.node.short, slot), []).append((p.ask.name, quota[p.ask]))
        if over := sharing.over_subscribed(per_gpu):
            raise ValueError(
                f"SM quotas past 100% of a GPU ({'; '.join(over)}): lower "
                "resources.gen_sm_pct / train_sm_pct, or the GPU shares (scale.gen_gpus, "
                "scale.learner_gpus) so fewer roles share a GPU"
            )
        table = describe(self.placed, sm_pct=quota)
        log.info("placement:\n%s", table)
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "placement.txt").write_text(table + "\n")
        pipes = self.start_mps(shared)
        mig = self._mig_devices(quota)
        if self.asked == sharing.Sharing.mig and (
            left := [p.ask.name for p in self.placed if quota.get(p.ask) and p.ask not in mig]
        ):
            raise ValueError(
                f"resources.gpu_sharing=mig, but no free MIG instance is left for "
                f"{', '.join(left)}: make one more instance per role on each GPU "
                "(nvidia-smi mig -cgi <profiles> -C), or resources.gpu_sharing=auto"
            )
        names = {"sim": sim_name, "gen": gen_name, "learner": learner_name}
        out = {}
        for p in self.placed:
            opts = ray_options(
                p,
                mps=p.ask not in mig and self.asked != sharing.Sharing.time_sliced,
                sm_pct=quota.get(p.ask),
                mps_pipe=pipes.get(p.node.node_id),
            )
            if p.ask in mig:  # its MIG instance; Ray must not set the GPU index over it
                env = {"CUDA_VISIBLE_DEVICES": mig[p.ask].uuid, NOSET_CUDA: "1"}
                opts["runtime_env"] = {"env_vars": env}
                log.info("MIG: %s on %s (%d SMs, its quota %s%%)", p.ask.name, mig[p.ask].uuid,
                         mig[p.ask].sms, quota.get(p.ask))  # fmt: skip
            out[names[p.ask.role](p.ask.index)] = opts
        return out

    def _mig_devices(self, quota: dict[Ask, int | None]) -> dict[Ask, Any]:
        """Where no MPS daemon serves a node and its GPU is in MIG mode: each GPU role there
        with a quota gets the MIG instance closest to it (``sharing.mig_choice``)."""
        out: dict[Ask, Any] = {}
        taken: set[str] = set()  # Ray nodes of one machine see the same instances
        for node_id, gpus in self._mig_nodes.items():
            by_index = {g.index: g for g in gpus}
            roles: dict[int, list[tuple[str, int]]] = {}
            asks: dict[str, Ask] = {}
            for p in self.placed:
                pct, slot = quota.get(p.ask), (p.gpu_slots or (-1,))[0]
                if p.node.node_id == node_id and pct and slot in by_index:
                    roles.setdefault(slot, []).append((p.ask.name, pct))
                    asks[p.ask.name] = p.ask
            for slot, on_gpu in roles.items():
                got = sharing.mig_choice(by_index[slot], on_gpu, taken)
                for worker, inst in got.items():
                    out[asks[worker]] = inst
                if left := [w for w, _ in on_gpu if w not in got]:
                    log.warning(
                        "MIG: no free instance on GPU %d for %s: add MIG instances "
                        "(nvidia-smi mig -cgi ... -C)",
                        slot,
                        ", ".join(left),
                    )
        return out

    def start_mps(self, nodes: dict[str, str]) -> dict[str, str]:
        """An MPS control daemon, started or joined, on each of ``nodes`` (node id -> address:
        those that host a role with an SM quota): one small Ray actor pinned to each machine
        (``ebrl.resources.mps``), stopped after the roles (:meth:`stop_mps`), and by its keeper
        if the driver dies. Sets ``sharing``. With ``resources.gpu_sharing=auto``, a node no
        daemon serves uses its GPU's MIG instances, else its roles time-slice the GPU (warned
        once: what to install or enable); ``mps`` and ``mig`` stop the run where they cannot
        serve (:meth:`_refuse_unserved`); ``mig`` starts no daemon, ``time_sliced`` nothing.

        Returns:
            node id -> the pipe directory of the daemon serving it.
        """
        gpu_roles = any(p.ask.gpus > 0 for p in self.placed)
        self._set_sharing(sharing.Sharing.whole if gpu_roles else None)
        self._mig_nodes = {}
        if not nodes:
            return {}
        if self.asked == sharing.Sharing.time_sliced:
            log.info("GPU shares time-sliced, as asked (resources.gpu_sharing=time_sliced): "
                     "no MPS daemon, no quotas")  # fmt: skip
            self._set_sharing(sharing.Sharing.time_sliced)
            return {}
        self.mps = ClusterMPS(self.mps_control)
        mig: dict[str, Any] = {}
        try:
            states = self.mps.start(nodes, daemon=self.asked != sharing.Sharing.mig)
            mig = self._mig_nodes = mig_gpus(states)  # MIG serves where no daemon does
            bare = {s for n, s in states.items() if not s.serves and n not in mig}
            missing = [s.why + " and its GPU has no MIG instances" for s in bare]
        except Exception as e:  # an actor that could not start: the run goes on, time-sliced
            states = {}
            missing = [f"the MPS keepers did not start ({type(e).__name__}: {e})"]
        self._refuse_unserved(nodes, states, missing)
        if missing:
            self._set_sharing(sharing.Sharing.time_sliced)
            why = "; ".join(missing)
            log.warning(sharing.time_sliced_warning(why, self.gen_gpus, self.learner_gpus))
        else:
            self._set_sharing(sharing.Sharing.mig if mig else sharing.Sharing.mps)
        return self.mps.pipes()

    def _refuse_unserved(
        self, nodes: dict[str, str], states: dict[str, Any], missing: list[str]
    ) -> None:
        """Stop the run, before any worker starts, where the way of sharing it asked for
        (``resources.gpu_sharing=mps`` or ``mig``) cannot serve a node; ``auto`` goes on."""
        if self.asked == sharing.Sharing.mps:
            unserved = [s.why for s in states.values() if not s.serves] or missing
            if unserved:
                raise ValueError(
                    f"resources.gpu_sharing=mps, but {'; '.join(sorted(set(unserved)))}: "
                    "install the NVIDIA driver's MPS tools (nvidia-cuda-mps-control on PATH on "
                    "every GPU node), or set resources.gpu_sharing=auto (MIG, else time-sliced)"
                )
        elif self.asked == sharing.Sharing.mig:
            bare = sorted({nodes[n] for n in nodes if n not in self._mig_nodes})
            if bare:
                raise ValueError(
                    f"resources.gpu_sharing=mig, but the GPUs of {', '.join(bare) or 'the nodes'}"
                    " are not in MIG mode or have no MIG instances: enable MIG and make an "
                    "instance per role (nvidia-smi -i <gpu> -mig 1; nvidia-smi mig -cgi "
                    "<profiles> -C), or set resources.gpu_sharing=auto"
                )

    def _set_sharing(self, how: sharing.Sharing | None) -> None:
        """How the GPUs are shared; logged with the next report (:meth:`unlogged_params`)."""
        self.sharing = how
        self._sharing_logged = False

    def stop_mps(self) -> None:
        """Quit the daemons this run started (after their clients, the roles, are gone)."""
        if self.mps is not None:
            self.mps.stop()
            self.mps = None

    # --- once the workers are up -------------------------------------------------------------
    def record_env(self, handles: list, run_dir: Path | None) -> None:
        """Each GPU role's process reports the sharing variables it runs with (its SM quota,
        its MPS pipe directory, its GPUs); logged and appended to the run folder's
        ``gpu_env.jsonl``: what every role got, read from inside it."""
        rows = []
        for h in handles:
            actor = getattr(h, "actor", None)
            if actor is None:
                continue
            try:
                rows.append({"worker": h.name, **record_role_env(actor)})
            except Exception as e:  # a record must never stop a run
                log.warning("%s: its GPU environment could not be read (%s)", h.name, e)
        for row in rows:
            log.info("GPU role %s", row)
        if rows and run_dir is not None:
            with open(run_dir / "gpu_env.jsonl", "a") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")

    def sm_resplitter(self, cfg: Any) -> sharing.SMResplitter | None:
        """Algorithm 1 at run time over the shared GPU's SMs, where it chose the starting split
        (``resources.gpu_profile``, unpinned) and MPS enforces it; None elsewhere (pinned
        quotas stay; without MPS a quota is not enforced). The run's controller feeds it
        (:meth:`~ebrl.resources.controller.RunController.split_sms`) and this fabric applies
        what it decides (:meth:`requota`)."""
        if (
            self.split is None
            or self.split.how != sharing.ALGORITHM1
            or self.sharing != sharing.Sharing.mps
        ):
            return None
        from ebrl.resources.allotment import ResourceSettings, scaled_patience

        node = cfg.get("resources") or {}
        settings = ResourceSettings.from_config(node)
        inputs = self.split.inputs
        return sharing.SMResplitter(
            str(node.get("gpu_profile")),
            int(inputs["gen_batch"]),
            int(inputs["train_samples"]),
            settings.rebalance_threshold,
            scaled_patience(settings.rebalance_patience, cfg),
        )

    # --- while the run goes ------------------------------------------------------------------
    def requota(
        self, new: dict[str, int], restarts: Restarts, handles: list, run_dir: Path | None
    ) -> dict[str, int]:
        """Put a re-split's SM quotas in force: the generator replicas are restarted with
        their new quota (:meth:`Restarts.requota`: an MPS client's quota is fixed when its
        CUDA context is made), each new process's environment recorded (:meth:`record_env`).
        The learner keeps its cap (its optimiser state lives in its process): a cap is a
        limit, not a reservation, so a lower generator cap gives it the SMs up to its own.

        Returns:
            the quotas in force (role -> percent).
        """

        def opened(h: Any) -> None:  # its CUDA context is made, with the new quota
            self.record_env([h], run_dir)  # read inside it, before it runs its loop

        for i in range(restarts.roles.replicas):
            restarts.requota(gen_name(i), new["gen"], handles, opened)
        # in force: the new process acts for its env workers, with the newest weights
        self.quotas = {**self.quotas, "gen": new["gen"]}
        log.info("GPU quotas in force: generator %d%% (restarted), learner keeps its %s%% cap "
                 "until it restarts", new["gen"], self.quotas.get("learner"))  # fmt: skip
        return {k: int(v) for k, v in self.quotas.items() if v is not None}

    def unlogged_params(self) -> dict[str, str]:
        """The MLflow params decided since the last call (how the GPUs were shared, how the
        SMs were split), once each."""
        out: dict[str, str] = {}
        if self.sharing is not None and not self._sharing_logged:
            out[sharing.TAG] = str(self.sharing)
            if self.asked != "auto":
                out[f"{sharing.TAG}_asked"] = self.asked
            quotas = self.sharing not in (sharing.Sharing.whole, sharing.Sharing.time_sliced)
            if self.split is not None and (quotas or self.asked == "auto"):
                out.update(self.split.params())  # and how the SMs were split
            self._sharing_logged = True
        return out
