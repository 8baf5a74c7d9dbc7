"""Where workers run: Ray actors (one process each, any node of a Ray cluster) or threads.

Both backends give the same handle: ``open()`` (build the stage, return the inbox address and
whatever else the worker reports), ``start(peers)`` (enter the loop), ``poll()`` (None while
running; raises what the worker raised, or a clear error if its process died), ``stop()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import Future
from typing import Any, Protocol

from ebrl.signals import stopping

log = logging.getLogger(__name__)


class WorkerDied(RuntimeError):
    """The worker's process is gone (killed, out of memory, segfault in a simulator)."""


class Handle(Protocol):
    name: str

    def open(self) -> Any: ...
    def start(self, *args: Any) -> None: ...
    def poll(self) -> bool: ...
    def stop(self) -> None: ...


class Backend(Protocol):
    def spawn(
        self,
        name: str,
        cls: type,
        *args: Any,
        resources: dict | None = None,
        options: dict | None = None,
    ) -> Handle: ...
    def shutdown(self) -> None: ...


# --- in-process -------------------------------------------------------------------------------
class ThreadHandle:
    def __init__(self, name: str, obj: Any) -> None:
        self.name, self.obj = name, obj
        self.future: Future = Future()
        self.thread: threading.Thread | None = None

    def open(self) -> Any:
        return self.obj.open()

    def start(self, *args: Any) -> None:
        def body() -> None:
            try:
                self.obj.run(*args)
                self.future.set_result(None)
            except BaseException as e:  # delivered to the driver through poll()
                self.future.set_exception(e)

        self.thread = threading.Thread(target=body, name=f"ebrl-{self.name}", daemon=True)
        self.thread.start()

    def poll(self) -> bool:
        """True once the loop has returned; re-raises its exception."""
        if not self.future.done():
            return False
        self.future.result()
        return True

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=10)


class InProcessBackend:
    """Every worker a thread of this process: for tests and debugging (pdb works)."""

    def spawn(
        self,
        name: str,
        cls: type,
        *args: Any,
        resources: dict | None = None,
        options: dict | None = None,
    ) -> ThreadHandle:
        """``resources`` and ``options`` (Ray placement) mean nothing to a thread: ignored."""
        return ThreadHandle(name, cls(*args))

    def shutdown(self) -> None:
        pass


# --- Ray --------------------------------------------------------------------------------------
class RayHandle:
    def __init__(self, name: str, actor: Any) -> None:
        import ray

        self._ray = ray
        self.name, self.actor = name, actor
        self.ref = None

    def open(self) -> Any:
        return self._ray.get(self.actor.open.remote())

    def start(self, *args: Any) -> None:
        self.ref = self.actor.run.remote(*args)

    def poll(self) -> bool:
        ray = self._ray
        if self.ref is None:
            return False
        done, _ = ray.wait([self.ref], timeout=0)
        if not done:
            return False
        try:
            ray.get(self.ref)
        except ray.exceptions.RayActorError as e:
            raise WorkerDied(f"the process of worker '{self.name}' died: {e}") from None
        except ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause() from None
        return True

    def kill(self) -> None:
        """End the actor's process now (a hung worker); :meth:`poll` then reports it dead."""
        self._ray.kill(self.actor, no_restart=True)

    def stop(self) -> None:
        try:
            if self.ref is not None:
                self._ray.wait([self.ref], timeout=5)
        finally:
            self._ray.kill(self.actor, no_restart=True)


class RayBackend:
    """Workers as Ray actors; joins the cluster at ``address`` or starts a local one.

    Args:
        address: ``"local"`` starts a private Ray instance (never joins a running one by
            accident); ``"auto"`` or ``ray://host:port`` join a cluster.
        num_cpus: logical CPUs for a local instance (default: this machine's).
        num_gpus: GPUs for a local instance (default: Ray detects them); the driver passes
            those NVML shows it where a role asks for a GPU.
    """

    #: how long :meth:`shutdown` waits for ``ray.shutdown`` once a stop signal arrived: Slurm
    #: signals every process of a job, Ray's too, and ray.shutdown then waits ~8 s on its dead
    #: GCS; a preempted job has better uses for its grace period (the watchdog ends what is
    #: left when the driver exits)
    shutdown_timeout_s = 3.0
    #: tries at starting a local Ray node (address ``local``) that timed out starting
    local_start_attempts = 3

    def __init__(
        self, address: str = "local", num_cpus: int | None = None, num_gpus: int | None = None
    ) -> None:
        import ray

        from ebrl.runtime.watchdog import Watchdog
        from ebrl.signals import keep_handlers

        self._ray = ray
        self._started = False
        self._watchdog: Watchdog | None = None
        if not ray.is_initialized():
            # the driver's MPS daemon (a private one: its pipe directory) reaches GPU stages
            keep = ("VK_ICD_FILENAMES", "OMP_WAIT_POLICY", "EBRL_COMMIT", "CUDA_MPS_PIPE_DIRECTORY")
            env = {"env_vars": {k: v for k, v in os.environ.items() if k in keep}}
            # a local instance is this driver's to clean up, even if the driver is SIGKILLed
            self._watchdog = Watchdog() if address == "local" else None
            try:
                for attempt in range(1, self.local_start_attempts + 1):
                    try:
                        with keep_handlers():  # Ray's SIGTERM handler would end a run FAILED
                            ray.init(
                                address=address,
                                include_dashboard=False,
                                # joining a cluster: its nodes say what they have
                                num_cpus=(num_cpus or os.cpu_count())
                                if address == "local"
                                else None,
                                num_gpus=num_gpus if address == "local" else None,
                                log_to_driver=True,
                                logging_level=logging.WARNING,
                                runtime_env=env,
                            )
                        break
                    except Exception as e:
                        # Ray waits a fixed 30 s for a new local node's raylet; on a loaded
                        # machine that can pass: start it afresh (a joined cluster's own error
                        # is the user's to see)
                        slow = "timed out during startup" in str(e)
                        if address != "local" or not slow or attempt == self.local_start_attempts:
                            raise
                        log.warning(
                            "Ray's local node did not start (%s); attempt %d", e, attempt + 1
                        )
                        ray.shutdown()
            except BaseException:
                if self._watchdog is not None:
                    self._watchdog.stop()
                raise
            self._started = True
        self.handles: list[RayHandle] = []

    def spawn(
        self,
        name: str,
        cls: type,
        *args: Any,
        resources: dict | None = None,
        options: dict | None = None,
    ) -> RayHandle:
        """Start ``cls(*args)`` as an actor.

        Args:
            resources: Ray custom resources (``scheduler.resources`` of the worker's role).
            options: more Ray actor options (``ebrl.runtime.placement_ray.ray_options``: node
                affinity, ``num_gpus``, ``runtime_env``), merged over the defaults
                ``num_cpus=0, max_restarts=0``; their ``resources`` are merged with
                ``resources`` (``options`` wins a clash). An actor's ``runtime_env.env_vars``
                are merged by Ray with the job's (``VK_ICD_FILENAMES`` ... stay).
        """
        # num_cpus=0: placement and pinning are the resource manager's job, not Ray's CPU slots
        opts: dict[str, Any] = {"num_cpus": 0, "name": None, "max_restarts": 0}
        extra = dict(options or {})
        merged = {**(resources or {}), **(extra.pop("resources", None) or {})}
        opts.update(extra)
        if merged:
            opts["resources"] = merged
        actor = self._ray.remote(cls).options(**opts).remote(*args)
        h = RayHandle(name, actor)
        self.handles.append(h)
        return h

    def shutdown(self) -> None:
        for h in self.handles:
            with contextlib.suppress(Exception):  # already dead
                self._ray.kill(h.actor, no_restart=True)
        self.handles.clear()
        if self._started:
            self._started = False
            if not stopping():
                self._ray.shutdown()
            elif not self._bounded_ray_shutdown():
                # expected, not a fault: the stop signal reached Ray's processes too (Slurm
                # signals every process of the job)
                log.info(
                    "Ray did not shut down within %.0f s of a stop signal; the orphan watchdog "
                    "ends its processes when this process exits",
                    self.shutdown_timeout_s,
                )
                return
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    def _bounded_ray_shutdown(self) -> bool:
        """``ray.shutdown`` for at most ``shutdown_timeout_s``; whether it finished."""
        done = threading.Thread(target=self._ray.shutdown, daemon=True, name="ray-down")
        done.start()
        done.join(timeout=self.shutdown_timeout_s)
        return not done.is_alive()
