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

What it does not cover, plainly: image observations (ebrl's policies take the flat state; the
images are dropped), and classes without RLinf's common constructor (BEHAVIOR's subprocess
pool).

``registry`` names another ``get_env_cls`` (a dotted path or a callable): the tests use one
that returns a CPU fake with RLinf's contract.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ebrl.envs.base import EnvSpec, StepResult

#: RLinf's env types whose class takes the common constructor (cfg, num_envs, seed_offset,
#: total_num_processes, worker_info); BEHAVIOR's takes a subprocess pool's arguments instead
COMMON_CONSTRUCTOR = ("maniskill", "libero", "robocasa", "metaworld", "calvin", "robotwin")

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
    return cls(cfg, num_envs, int(seed_offset), 1, None)


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
    RLinf's GPU ManiSkill and the other envs whose class steps many envs in one call.

    It has :class:`~ebrl.envs.base.EnvGroup`'s surface (``reset``, ``observe``, ``step_chunk``,
    ``step_latency``, ``close``, ``spec``, ``env_ids``, ``sim_seconds``) with one constraint a
    vectorised simulator imposes: a chunk steps every env of the group together, so
    ``step_chunk`` takes chunks for all of them and ``step_one`` (EBRL's step level) is refused.
    Each of the K actions is one ``step(actions [N, A], auto_reset=False)``; an env whose episode
    ends inside the chunk keeps receiving the rest of its chunk (the instance cannot pause one
    env), but those steps are neither counted nor returned: its outcome stops at the step its
    episode ended, as in an ``EnvGroup``. The envs that ended are reset together at the chunk's
    end (``reset(seed=[...], options={"env_idx": ...})``, each with ebrl's seed for its next
    episode; the seed list covers every env of the instance, as ManiSkill expects).

    Args:
        env_ids: the global ids of this worker's envs (the instance's envs, in order).
        seed, reset_group_size, stream: as :class:`~ebrl.envs.base.EnvGroup`'s.
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
        n = len(env_ids)
        self.env = _build(env_type, env_cfg, registry, n, env_ids[0])
        self.env_type, self.obs_key = env_type, obs_key
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
        self._obs = _states(self._reset_rows(np.arange(n)), n, self.obs_key, self.env_type)
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

    def _reset_rows(self, rows: np.ndarray) -> Any:
        """Reset ``rows`` (all of them: a fresh start) with ebrl's seeds; the observation of
        every env of the instance. The seed list always has one seed per env of the instance
        (the others keep their episode's): ManiSkill replaces its whole per-env seed array
        with it, also on a partial reset (``options["env_idx"]``)."""
        import torch

        self._seed_now[rows] = self._seeds(rows)
        options: dict[str, Any] = {}
        if len(rows) < len(self):
            options["env_idx"] = torch.as_tensor(rows, dtype=torch.int64)
        obs, _ = self.env.reset(seed=[int(x) for x in self._seed_now], options=options)
        return obs

    def reset(self):
        import torch

        t0 = time.perf_counter()
        self.episode_id[:] = 0
        self.episode_step[:] = 0
        self._obs = _states(
            self._reset_rows(np.arange(len(self))), len(self), self.obs_key, self.env_type
        )
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

    def step_chunk(self, chunk):
        import torch

        from ebrl.envs.base import LATENCY_WINDOW, _Outcome

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
        live = np.ones(n, dtype=bool)
        t0 = time.perf_counter()
        for j in range(k):
            ts = time.perf_counter()
            obs, reward, term, trunc, infos = self.env.step(
                torch.from_numpy(np.ascontiguousarray(actions[:, j])), auto_reset=False
            )
            self._lat[self._lat_steps % LATENCY_WINDOW] = time.perf_counter() - ts
            self._lat_steps += 1
            states = _states(obs, n, self.obs_key, self.env_type)
            r = _as_np(reward, n, np.float32)
            te, tr = _as_np(term, n, bool), _as_np(trunc, n, bool)
            su = _as_np(
                infos.get("success", False) if isinstance(infos, Mapping) else False, n, bool
            )
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
        done = out.terminated | out.truncated
        self.episode_step += out.n_steps
        nxt = out.final_obs.copy()
        if done.any():
            rows = np.flatnonzero(done)
            self.episode_id[rows] += 1
            self.episode_step[rows] = 0
            nxt[rows] = _states(self._reset_rows(rows), n, self.obs_key, self.env_type)[rows]
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


def _as_np(x: Any, n: int, dtype: Any) -> np.ndarray:
    """A batched value (tensor, array, list or scalar) as an ``[n]`` array of ``dtype``."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=dtype).reshape(-1)
    return np.broadcast_to(arr, (n,)).copy() if arr.size == 1 else arr[:n].copy()
