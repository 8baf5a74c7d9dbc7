"""Any environment of RLinf's env registry as one ebrl :class:`~ebrl.envs.base.Env`.

RLinf (the system EBRL extends) wraps its simulators (ManiSkill, LIBERO, RoboCasa, ...) behind
one contract: ``get_env_cls(env_type, cfg)`` gives the class; an instance is built as
``cls(cfg, num_envs, seed_offset, total_num_processes, worker_info)`` and holds ``num_envs``
envs; ``reset()`` returns ``(obs, infos)``; ``step(actions [N, A], auto_reset=False)`` returns
``(obs, reward [N], terminations [N], truncations [N], infos)``, with ``infos["success"]`` where
the task defines it; observations are a dict whose ``"states"`` entry is the flat state
``[N, O]`` (images and the task's instruction ride beside it).

:class:`RLinfEnv` builds one such instance with ``num_envs=1`` per ebrl env and steps it action
by action (``auto_reset=False``), so ebrl's :class:`~ebrl.envs.base.EnvGroup` keeps its own
contract: an env stops at the step its episode ends, inside a chunk, and resets itself with
ebrl's seed. RLinf's ``chunk_step`` applies the whole chunk and reports the episode's end only
at the chunk's last column, which would hide where inside a chunk the episode ended; the
adapter uses ``step`` for that reason.

:class:`RLinfVecEnvGroup` is the vectorised form (``simulator.vectorized=true``: RLinf's GPU
ManiSkill with many envs in one instance): one instance for all of an env worker's envs.

``step_mode=chunk`` (with ``vectorized=true``) is for classes that only speak RLinf's chunk
contract: BEHAVIOR (OmniGibson), whose ``BehaviorEnv`` has ``chunk_step`` and a ``reset()`` of
every env but no ``step``. A chunk is then one ``chunk_step(actions [N, K, A])``; RLinf reports an
episode's end at the chunk's last column, so in this mode episodes end at chunk boundaries (as
RLinf itself trains on them), ebrl's time limit included. A class whose ``reset`` cannot reset
some envs only resets all of them: the envs whose episodes were cut that way end truncated.

What it does not cover, plainly: image observations (ebrl's policies take the flat state; the
images are dropped).

``registry`` names another ``get_env_cls`` (a dotted path or a callable): the tests use one
that returns a CPU fake with RLinf's contract.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from ebrl.envs.base import EnvSpec, StepResult

#: RLinf's env types whose class takes the common constructor (cfg, num_envs, seed_offset,
#: total_num_processes, worker_info) and that ebrl builds
COMMON_CONSTRUCTOR = (
    "maniskill", "libero", "robocasa", "metaworld", "calvin", "robotwin", "behavior",
)  # fmt: skip
#: env types whose class reads its env worker's place in RLinf's worker group (``worker_info``)
#: and the worker's env count (``cfg.total_num_envs``): BEHAVIOR sizes its shared subprocess
#: pool from them. ebrl's env worker is a group of one: ``group_world_size=1``.
NEEDS_WORKER_INFO = ("behavior",)
#: how a group steps its instance: ``step`` (one ``step`` per action) or ``chunk`` (one
#: ``chunk_step`` per chunk: RLinf's chunk contract, episode ends at chunk boundaries)
STEP_MODES = ("step", "chunk")

GetEnvCls = Callable[[str, Any], type]


def rlinf_registry(registry: str | GetEnvCls | None = None) -> GetEnvCls:
    """RLinf's ``get_env_cls`` (or the one ``registry`` names); a clear error without RLinf."""
    from ebrl.external import rlinf_entry

    return rlinf_entry(
        registry,
        "rlinf.envs",
        "get_env_cls",
        "simulator",
        "a simulator ebrl steps itself (simulator=pushcube, simulator=libero)",
    )


def _first(x: Any) -> Any:
    """Element 0 of a batched value (a tensor, an array, a list or a scalar)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    return arr.reshape(-1)[0] if arr.size else False


def _build(
    env_type: str,
    env_cfg: Mapping[str, Any],
    registry: str | GetEnvCls | None,
    num_envs: int,
    seed_offset: int,
) -> Any:
    """An instance of RLinf's class for ``env_type`` holding ``num_envs`` envs, built with
    RLinf's common constructor from a copy of ``env_cfg`` (``auto_reset`` off: ebrl resets)."""
    from omegaconf import OmegaConf

    get_env_cls = rlinf_registry(registry)
    if env_type == "maniskill":  # SAPIEN needs a Vulkan driver before its first env
        from ebrl.envs.vulkan import ensure_vulkan

        ensure_vulkan()
    cfg = OmegaConf.create(
        OmegaConf.to_container(env_cfg, resolve=True)
        if OmegaConf.is_config(env_cfg)
        else dict(env_cfg)
    )
    cfg.auto_reset = False  # ebrl resets each env itself, with its own seeds
    if "init_params" in cfg:
        cfg.init_params.num_envs = num_envs
    worker_info = None
    if env_type in NEEDS_WORKER_INFO:
        cfg.total_num_envs = num_envs
        worker_info = SimpleNamespace(rank=0, world_size=1, group_world_size=1)
    try:
        cls = get_env_cls(env_type, cfg)
    except ImportError as e:  # the simulator RLinf wraps is not installed
        raise RuntimeError(
            f"RLinf env type {env_type!r} needs a package this interpreter cannot import "
            f"({e}); install the simulator in the venv that runs RLinf"
        ) from e
    if registry is None and env_type not in COMMON_CONSTRUCTOR:
        raise RuntimeError(
            f"RLinf env type {env_type!r} ({cls.__name__}) does not take RLinf's common "
            "constructor (cfg, num_envs, seed_offset, total_num_processes, worker_info), so "
            "ebrl cannot build it; types it can: " + ", ".join(COMMON_CONSTRUCTOR)
        )
    return cls(cfg, num_envs, int(seed_offset), 1, worker_info)


def _preflight(env_type: str, node: Mapping[str, Any]) -> None:
    """What the simulator node says it needs, checked before RLinf builds anything (validate()
    checks it earlier; a direct build gets the same answer): a usable GPU, and the simulator
    package RLinf's class wraps."""
    import importlib.util

    name = node.get("name") or env_type
    if node.get("requires_gpu"):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                f"simulator={name} runs only on an NVIDIA GPU and torch sees none here "
                "(torch.cuda.is_available() is False): run it on a GPU node; on CPU use "
                "simulator=pushcube or simulator=rlinf_maniskill"
            )
    package = node.get("sim_package")
    if package and importlib.util.find_spec(package) is None:
        raise RuntimeError(
            f"simulator={name}: RLinf's {env_type!r} env needs the Python package "
            f"'{package}', which this interpreter cannot import: "
            f"{node.get('sim_install') or 'install it'} (in the venv that runs RLinf)"
        )


def _states(obs: Any, n: int, obs_key: str, env_type: str) -> np.ndarray:  # -> [n, O] float32
    """The flat states of an RLinf observation dict, copied (RLinf may update them in place)."""
    if not isinstance(obs, Mapping) or obs_key not in obs:
        have = sorted(obs) if isinstance(obs, Mapping) else type(obs).__name__
        raise KeyError(
            f"RLinf env type {env_type!r}: its observation has no {obs_key!r} entry (it has "
            f"{have}); set the simulator's obs_key, or its RLinf wrap_obs_mode so that the "
            "state is returned"
        )
    x = obs[obs_key]
    arr = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
    return np.array(arr.reshape(n, -1), dtype=np.float32, copy=True)


def _action_dim(env: Any, env_type: str) -> int:
    """The action size an RLinf instance exposes (its own or its wrapped gym env's space)."""
    for owner in (env, getattr(env, "env", None)):
        for name in ("single_action_space", "action_space"):
            space = getattr(getattr(owner, "unwrapped", owner), name, None)
            shape = getattr(space, "shape", None)
            if shape:
                return int(shape[-1])
    raise RuntimeError(
        f"RLinf env type {env_type!r}: its class exposes no action space; set the "
        "simulator's action_dim"
    )


def _close(env: Any) -> None:
    """Close an RLinf instance (or the gym env it wraps, when it has no close of its own)."""
    for owner in (env, getattr(env, "env", None)):
        close = getattr(owner, "close", None)
        if callable(close):
            close()
            return


class RLinfEnv:
    """One env of RLinf's registry (``env_type``), built by RLinf's own class.

    Args:
        env_type: RLinf's env type (``maniskill``, ``libero``, ``robocasa``, ...).
        env_cfg: RLinf's env config for it (the ``env.train`` node of an RLinf run: e.g.
            ``init_params``, ``seed``, ``group_size``, ``wrap_obs_mode``); ``auto_reset`` is
            forced off (ebrl resets), ``num_envs`` is 1.
        max_episode_steps: the time limit ebrl enforces (RLinf's own fires too, where set).
        env_id: this env's global id: RLinf's ``seed_offset``.
        obs_key: the observation entry that is the flat state.
        action_dim: the action size, where the class does not expose an action space.
        action_low, action_high: the action box (actions are clipped to it).
        registry: another ``get_env_cls`` (dotted path or callable); None: RLinf's.
        **_node: the rest of the config node (name, package, install: what ``validate`` reads).

    Raises:
        RuntimeError: RLinf (or the registry) is missing, or the env type's class takes
            another constructor.
        KeyError: the observation has no ``obs_key`` entry.
    """

    def __init__(
        self,
        *,
        env_type: str,
        env_cfg: Mapping[str, Any],
        max_episode_steps: int,
        env_id: int = 0,
        obs_key: str = "states",
        action_dim: int | None = None,
        action_low: float = -1.0,
        action_high: float = 1.0,
        registry: str | GetEnvCls | None = None,
        **_node: Any,
    ) -> None:
        self.env_type = env_type
        self.obs_key = obs_key
        self.max_episode_steps = int(max_episode_steps)
        _preflight(env_type, _node)
        self.env = _build(env_type, env_cfg, registry, 1, env_id)
        reset = inspect.signature(self.env.reset).parameters
        self._seeded = "seed" in reset
        self._options = "options" in reset
        obs = self._reset(None)
        self.action_low = np.float32(action_low)
        self.action_high = np.float32(action_high)
        adim = action_dim if action_dim is not None else _action_dim(self.env, env_type)
        self.spec = EnvSpec(
            obs_dim=int(obs.shape[0]),
            action_dim=int(adim),
            max_episode_steps=self.max_episode_steps,
            action_low=float(action_low),
            action_high=float(action_high),
        )
        self._t = 0

    def _reset(self, seed: int | None) -> np.ndarray:
        kwargs: dict[str, Any] = {}
        if seed is not None and self._seeded:
            kwargs["seed"] = int(seed)
            if self._options:  # RLinf's ManiSkill env replaces the seed when options is None
                kwargs["options"] = {}
        obs, _ = self.env.reset(**kwargs)
        return _states(obs, 1, self.obs_key, self.env_type)[0]

    def reset(self, seed: int) -> np.ndarray:  # -> [O] float32
        """A new episode; with a class whose ``reset`` takes a seed, the seed decides it
        (otherwise the class draws its initial states itself, e.g. LIBERO's fixed states)."""
        self._t = 0
        return self._reset(seed)

    def step(self, action: np.ndarray) -> StepResult:  # action: [A]
        import torch

        a = np.clip(np.asarray(action, dtype=np.float32), self.action_low, self.action_high)
        obs, reward, terminated, truncated, infos = self.env.step(
            torch.from_numpy(a[None]), auto_reset=False
        )
        self._t += 1
        success = infos.get("success", False) if isinstance(infos, Mapping) else False
        return StepResult(
            obs=_states(obs, 1, self.obs_key, self.env_type)[0],
            reward=float(_first(reward)),
            terminated=bool(_first(terminated)),
            truncated=bool(_first(truncated)) or self._t >= self.max_episode_steps,
            success=bool(_first(success)),
        )

    def close(self) -> None:
        _close(self.env)


class RLinfVecEnvGroup:
    """The envs of one env worker as ONE vectorised RLinf instance (``num_envs = len(env_ids)``):
    RLinf's GPU ManiSkill, BEHAVIOR, and the other envs whose class steps many envs in one call.

    It has :class:`~ebrl.envs.base.EnvGroup`'s surface (``reset``, ``observe``, ``step_chunk``,
    ``step_latency``, ``close``, ``spec``, ``env_ids``, ``sim_seconds``) with one constraint a
    vectorised simulator imposes: a chunk steps every env of the group together, so
    ``step_chunk`` takes chunks for all of them and ``step_one`` (EBRL's step level) is refused.

    ``step_mode="step"``: each of the K actions is one ``step(actions [N, A], auto_reset=False)``;
    an env whose episode ends inside the chunk keeps receiving the rest of its chunk (the
    instance cannot pause one env), but those steps are neither counted nor returned: its outcome
    stops at the step its episode ended, as in an ``EnvGroup``. ``step_mode="chunk"``: the chunk
    is one ``chunk_step(actions [N, K, A])`` (RLinf's chunk contract), whose episode ends come at
    the chunk's last column: every env's outcome has K steps, and an episode ends at the end of
    the chunk in which RLinf or ebrl's time limit ends it.

    The envs that ended are reset together at the chunk's end, as the class allows:
    ``reset(seed=[...], options={"env_idx": ...})`` (ManiSkill; each with ebrl's seed for its next
    episode, the list covering every env of the instance, as ManiSkill expects), ``reset(env_idx=
    ...)`` (RoboCasa: its own initial states), or ``reset()`` of every env (BEHAVIOR): the envs
    that had not ended then end truncated, their episodes cut by the reset.

    Args:
        env_ids: the global ids of this worker's envs (the instance's envs, in order).
        seed, reset_group_size, stream: as :class:`~ebrl.envs.base.EnvGroup`'s.
        step_mode: ``step`` or ``chunk`` (above).
        everything else: as :class:`RLinfEnv`'s.
    """

    def __init__(
        self,
        *,
        env_ids: list[int],
        seed: int,
        env_type: str,
        env_cfg: Mapping[str, Any],
        max_episode_steps: int,
        reset_group_size: int = 1,
        stream: int = 0,
        step_mode: str = "step",
        obs_key: str = "states",
        action_dim: int | None = None,
        action_low: float = -1.0,
        action_high: float = 1.0,
        registry: str | GetEnvCls | None = None,
        **_node: Any,
    ) -> None:
        import torch

        from ebrl.envs.base import LATENCY_WINDOW

        if not env_ids:
            raise ValueError("RLinfVecEnvGroup: need at least one env id")
        if step_mode not in STEP_MODES:
            raise ValueError(f"simulator.step_mode={step_mode!r}: choose {' or '.join(STEP_MODES)}")
        n = len(env_ids)
        _preflight(env_type, _node)
        self.env = _build(env_type, env_cfg, registry, n, env_ids[0])
        self.env_type, self.obs_key, self.step_mode = env_type, obs_key, step_mode
        if step_mode == "chunk" and not callable(getattr(self.env, "chunk_step", None)):
            raise RuntimeError(
                f"simulator.step_mode=chunk: RLinf env type {env_type!r} "
                f"({type(self.env).__name__}) has no chunk_step; use step_mode=step"
            )
        params = inspect.signature(self.env.reset).parameters
        #: how the class resets some envs: options["env_idx"] + seeds, env_idx, or all of them
        self._reset_kind = (
            "options" if "options" in params and "seed" in params
            else "env_idx" if "env_idx" in params
            else "all"
        )  # fmt: skip
        self.env_ids = torch.as_tensor(env_ids, dtype=torch.int64)
        self._local = {int(g): i for i, g in enumerate(env_ids)}
        self.seed, self.stream = seed, stream
        self.reset_group_size = max(1, reset_group_size)
        self.max_episode_steps = int(max_episode_steps)
        self.low, self.high = np.float32(action_low), np.float32(action_high)
        self.episode_id = np.zeros(n, dtype=np.int64)
        self.episode_step = np.zeros(n, dtype=np.int64)
        self.sim_seconds = 0.0
        self._lat = np.zeros(LATENCY_WINDOW, dtype=np.float64)  # one instance: one latency
        self._lat_steps = 0
        self._seed_now = np.zeros(n, dtype=np.int64)  # each env's current episode seed
        obs, _ = self._reset_rows(np.arange(n))
        self._obs = _states(obs, n, self.obs_key, self.env_type)
        adim = action_dim if action_dim is not None else _action_dim(self.env, env_type)
        self.spec = EnvSpec(
            obs_dim=int(self._obs.shape[1]),
            action_dim=int(adim),
            max_episode_steps=self.max_episode_steps,
            action_low=float(action_low),
            action_high=float(action_high),
        )

    def __len__(self) -> int:
        return int(self.env_ids.shape[0])

    def _seeds(self, rows: np.ndarray) -> list[int]:
        from ebrl.envs.base import reset_seed

        return [
            reset_seed(
                self.seed,
                int(self.env_ids[i]) // self.reset_group_size,
                int(self.episode_id[i]),
                self.stream,
            )
            for i in rows
        ]

    def _reset_rows(self, rows: np.ndarray) -> tuple[Any, np.ndarray]:
        """Reset ``rows`` (all of them: a fresh start); the observation of every env of the
        instance and the rows the class really reset (every row, for a class that can only
        reset all). With seeds, the seed list always has one seed per env of the instance (the
        others keep their episode's): ManiSkill replaces its whole per-env seed array with it,
        also on a partial reset (``options["env_idx"]``)."""
        import torch

        n = len(self)
        if self._reset_kind == "all" or (len(rows) == n and self._reset_kind == "env_idx"):
            obs, _ = self.env.reset()
            return obs, np.arange(n)
        if self._reset_kind == "env_idx":
            obs, _ = self.env.reset(env_idx=[int(r) for r in rows])
            return obs, rows
        self._seed_now[rows] = self._seeds(rows)
        options: dict[str, Any] = {}
        if len(rows) < n:
            options["env_idx"] = torch.as_tensor(rows, dtype=torch.int64)
        obs, _ = self.env.reset(seed=[int(x) for x in self._seed_now], options=options)
        return obs, rows

    def reset(self):
        import torch

        t0 = time.perf_counter()
        self.episode_id[:] = 0
        self.episode_step[:] = 0
        obs, _ = self._reset_rows(np.arange(len(self)))
        self._obs = _states(obs, len(self), self.obs_key, self.env_type)
        self.sim_seconds += time.perf_counter() - t0
        return torch.from_numpy(self._obs.copy())

    def observe(self, env_ids=None):
        import torch

        idx = np.arange(len(self)) if env_ids is None else [self._local[int(g)] for g in env_ids]
        return torch.from_numpy(self._obs[idx].copy())

    def step_one(self, env_id: int, actions: np.ndarray):
        raise RuntimeError(
            f"simulator: RLinf env type {self.env_type!r} is vectorised (one instance steps all "
            f"{len(self)} envs of a worker together): EBRL's step level cannot step one env; "
            "set scheduler.step_level=false (and scheduler.pipeline=false)"
        )

    def _record_latency(self, seconds: float, steps: int = 1) -> None:
        from ebrl.envs.base import LATENCY_WINDOW

        for _ in range(steps):
            self._lat[self._lat_steps % LATENCY_WINDOW] = seconds / steps
            self._lat_steps += 1

    def _by_step(self, actions: np.ndarray, out: Any) -> None:
        """Fill ``out`` with one ``step`` per action; an env stops counting where it ended."""
        import torch

        n, k, _ = actions.shape
        live = np.ones(n, dtype=bool)
        for j in range(k):
            ts = time.perf_counter()
            obs, reward, term, trunc, infos = self.env.step(
                torch.from_numpy(np.ascontiguousarray(actions[:, j])), auto_reset=False
            )
            self._record_latency(time.perf_counter() - ts)
            states = _states(obs, n, self.obs_key, self.env_type)
            r = _as_np(reward, n, np.float32)
            te, tr = _as_np(term, n, bool), _as_np(trunc, n, bool)
            su = _success(infos, n)
            steps = self.episode_step + out.n_steps + 1
            tr = tr | (steps >= self.max_episode_steps)
            out.reward[live, j] = r[live]
            out.success[live] |= su[live]
            out.final_obs[live] = states[live]
            ended = live & (te | tr)
            out.terminated[ended] = te[ended]
            out.truncated[ended] = tr[ended] & ~te[ended]
            out.n_steps[live] += 1
            live &= ~ended
            if not live.any():
                break

    def _by_chunk(self, actions: np.ndarray, out: Any) -> None:
        """Fill ``out`` with one ``chunk_step``: K steps for every env, ends at the last one."""
        import torch

        n, k, _ = actions.shape
        ts = time.perf_counter()
        obs_list, reward, term, trunc, infos_list = self.env.chunk_step(
            torch.from_numpy(np.ascontiguousarray(actions))
        )
        self._record_latency(time.perf_counter() - ts, k)
        out.reward[:] = _as_2d(reward, n, k, np.float32)
        te = _as_2d(term, n, k, bool).any(axis=1)
        tr = _as_2d(trunc, n, k, bool).any(axis=1)
        tr |= self.episode_step + k >= self.max_episode_steps
        for infos in infos_list:
            out.success |= _success(infos, n)
        out.final_obs[:] = _states(obs_list[-1], n, self.obs_key, self.env_type)
        out.terminated[:] = te
        out.truncated[:] = tr & ~te
        out.n_steps[:] = k

    def step_chunk(self, chunk):
        from ebrl.envs.base import _Outcome

        ids = [int(g) for g in chunk.env_ids]
        if ids != [int(g) for g in self.env_ids]:
            raise RuntimeError(
                f"simulator: RLinf env type {self.env_type!r} is vectorised: a chunk must step "
                f"every env of the worker ({len(self)}) together, got {len(ids)} of them "
                "(env-group pipelining or the step level): set scheduler.pipeline=false and "
                "scheduler.step_level=false"
            )
        actions = np.clip(chunk.actions.detach().cpu().numpy(), self.low, self.high)
        n, k, _ = actions.shape
        out = _Outcome.empty(n, k, self.spec.obs_dim)
        out.episode_id[:] = self.episode_id
        out.episode_step[:] = self.episode_step
        t0 = time.perf_counter()
        (self._by_chunk if self.step_mode == "chunk" else self._by_step)(actions, out)
        done = out.terminated | out.truncated
        self.episode_step += out.n_steps
        nxt = out.final_obs.copy()
        if done.any():
            self.episode_id[done] += 1  # the reset seeds are the next episodes'
            obs, rows = self._reset_rows(np.flatnonzero(done))
            cut = np.zeros(n, dtype=bool)
            cut[rows] = ~done[rows]  # reset with the others, their episodes cut short
            out.truncated[cut] = True
            self.episode_id[cut] += 1
            done |= cut
            self.episode_step[done] = 0
            nxt[rows] = _states(obs, n, self.obs_key, self.env_type)[rows]
        self._obs = nxt
        out.next_obs[:] = nxt
        self.sim_seconds += time.perf_counter() - t0
        return out.to_outcome(chunk.env_ids)

    def step_latency(self) -> dict[int, tuple[float, float, int]]:
        """One instance steps every env at once: each env reports the instance's latency."""
        if not self._lat_steps:
            return {}
        lat = self._lat[: min(self._lat_steps, len(self._lat))]
        p50, p99 = np.percentile(lat, (50, 99))
        return {int(g): (float(p50), float(p99), int(self._lat_steps)) for g in self.env_ids}

    def close(self) -> None:
        _close(self.env)


def _as_2d(x: Any, n: int, k: int, dtype: Any) -> np.ndarray:
    """A chunk's per-step value (tensor or array ``[n, k]``) as an ``[n, k]`` array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype).reshape(n, k).copy()


def _success(infos: Any, n: int) -> np.ndarray:
    """Each env's success in one step's infos: ``infos["success"]`` (ManiSkill, LIBERO) or
    ``infos["episode"]["success_once"]`` (BEHAVIOR's metrics); False where neither is given."""
    if not isinstance(infos, Mapping):
        return np.zeros(n, dtype=bool)
    if "success" in infos:
        return _as_np(infos["success"], n, bool)
    episode = infos.get("episode")
    if isinstance(episode, Mapping) and "success_once" in episode:
        return _as_np(episode["success_once"], n, bool)
    return np.zeros(n, dtype=bool)


def _as_np(x: Any, n: int, dtype: Any) -> np.ndarray:
    """A batched value (tensor, array, list or scalar) as an ``[n]`` array of ``dtype``."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=dtype).reshape(-1)
    return np.broadcast_to(arr, (n,)).copy() if arr.size == 1 else arr[:n].copy()
