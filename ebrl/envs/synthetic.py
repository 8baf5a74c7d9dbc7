"""A synthetic simulator with a controlled per-step cost, for scheduler studies.

:class:`SyntheticCostEnv` simulates no robot and no physics engine. Its task is a point mass
reaching a target in ``dim`` dimensions, kept deliberately easy so PPO learns it in minutes; what
it models faithfully is the *time* a simulator step takes: each step spends a random duration drawn
from a lognormal distribution with a chosen mean and tail (P99/mean), either busy on the CPU or
asleep. That lets schedulers be compared under known, adjustable simulator costs, straggler tails
and slowdowns injected mid-run, and episode lengths that shrink as a policy improves.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ebrl.envs.base import EnvSpec, StepResult

#: standard normal 99th percentile, Phi^{-1}(0.99)
Z99 = 2.3263478740408408


def lognormal_sigma(tail_ratio: float) -> float:
    """Log-space sigma of a lognormal whose P99/mean equals ``tail_ratio``.

    For a lognormal, ``P99 / mean = exp(z99 * s - s^2 / 2)``. It grows with ``s`` up to
    ``s = z99`` (ratio ~14.96), so ``tail_ratio`` must lie in ``[1, exp(z99^2 / 2))``; of the two
    roots we take the smaller, on the increasing branch, where a heavier tail means a larger ``s``.

    Raises:
        ValueError: ``tail_ratio`` outside the reachable range.
    """
    max_ratio = math.exp(Z99 * Z99 / 2)
    if not 1.0 <= tail_ratio < max_ratio:
        raise ValueError(f"tail_ratio must be in [1, {max_ratio:.2f}), got {tail_ratio}")
    return Z99 - math.sqrt(Z99 * Z99 - 2.0 * math.log(tail_ratio))


def sample_step_costs(
    rng: np.random.Generator, mean_s: float, tail_ratio: float, n: int = 1
) -> np.ndarray:  # -> [n] float64 seconds
    """Draw ``n`` step durations with mean ``mean_s`` and P99/mean ``tail_ratio``."""
    if mean_s <= 0.0:
        return np.zeros(n)
    s = lognormal_sigma(tail_ratio)
    mu = math.log(mean_s) - s * s / 2  # so that E[X] = exp(mu + s^2/2) = mean_s
    return rng.lognormal(mu, s, size=n)


def spend(seconds: float, mode: str) -> None:
    """Spend ``seconds`` of wall-clock time, busy on the CPU (``"burn"``) or asleep (``"sleep"``).

    A sleep overshoots by the OS timer slack (about 0.1 ms per call measured on a Linux VM), so
    sleep mode runs slightly slower than the charged cost; burn mode is accurate to microseconds.
    """
    if seconds <= 0.0:
        return
    if mode == "sleep":
        time.sleep(seconds)
        return
    # Spin rather than sleep: a CPU-bound simulator occupies a core, which is what makes
    # co-locating simulation with other stages costly; a sleep would hide that contention.
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class SyntheticCostEnv:
    """Point-mass reaching with a lognormal per-step cost (a synthetic stand-in, no real physics).

    Dynamics: ``vel <- damping * vel + gain * clip(a[:dim], -1, 1)``,
    ``pos <- clip(pos + vel, -1, 1)``. Observation ``[pos, target, vel]`` (``O = 3 * dim``), so a
    linear policy solves it. Success (and termination) when ``|pos - target| < success_tol``;
    truncation at the episode's length.

    Reward, dense in the distance ``d``:
      * ``reward="neg_distance"`` (default): ``-tanh(reward_k * d)`` in ``(-1, 0]``, the negative
        distance squashed to unit magnitude. Every step costs, so reaching the target (which ends
        the episode) quickly is optimal.
      * ``reward="unit"``: ``1 - tanh(reward_k * d)`` in ``(0, 1]``, ManiSkill's
        ``normalized_dense`` convention. Caveat: with termination on success, hovering just outside
        the tolerance earns more than succeeding, so a learner may avoid success late in training.

    Cost: each ``step`` spends a duration with mean ``step_cost_ms * cost_scale`` and
    P99/mean ``tail_ratio``, drawn from a cost RNG re-seeded at every ``reset(seed)`` so a run is
    reproducible; ``reset`` itself costs nothing. An injected slowdown: once the env has taken
    ``slowdown_after_steps`` steps (counted over all its episodes), every further step costs
    ``slowdown_factor`` times as much.

    Episode length of the env's n-th episode (n counts resets, from 0): linear from
    ``episode_steps_start`` to ``episode_steps_end`` over ``shrink_episodes`` episodes, then flat.

    Args:
        dim: dimensions of the point mass.
        action_dim: action size; must be >= ``dim`` (actions beyond ``dim`` are ignored).
        step_cost_ms: mean wall-clock milliseconds per step (at ``cost_scale=1``).
        tail_ratio: P99 / mean of the step cost (1.5 was measured for ManiSkill on CPU).
        cost_mode: ``"burn"`` (busy-wait on a CPU core) or ``"sleep"``.
        cost_scale: multiplier on the mean cost; change at run time with :meth:`set_cost_scale`.
        episode_steps_start: episode length at episode 0.
        episode_steps_end: episode length after ``shrink_episodes`` episodes (None: no shrink).
        shrink_episodes: episodes over which the length moves from start to end (0: no shrink).
        success_tol: distance to the target that counts as reached.
        damping: velocity retained per step.
        gain: velocity added per unit action.
        reward: ``"neg_distance"`` or ``"unit"`` (see above).
        reward_k: slope of the distance shaping.
        slowdown_after_steps: steps after which the slowdown starts (None: never).
        slowdown_factor: multiplier on the mean step cost from then on.
    """

    def __init__(
        self,
        *,
        dim: int = 4,
        action_dim: int = 4,
        step_cost_ms: float = 1.2,
        tail_ratio: float = 1.5,
        cost_mode: str = "burn",
        cost_scale: float = 1.0,
        episode_steps_start: int = 50,
        episode_steps_end: int | None = None,
        shrink_episodes: int = 0,
        success_tol: float = 0.15,
        damping: float = 0.5,
        gain: float = 0.2,
        reward: str = "neg_distance",
        reward_k: float = 2.0,
        slowdown_after_steps: int | None = None,
        slowdown_factor: float = 1.0,
    ) -> None:
        if action_dim < dim:
            raise ValueError(f"action_dim ({action_dim}) must be >= dim ({dim})")
        cost_mode = str(getattr(cost_mode, "value", cost_mode))  # accept a str Enum from configs
        if cost_mode not in ("burn", "sleep"):
            raise ValueError(f"cost_mode must be 'burn' or 'sleep', got {cost_mode!r}")
        if reward not in ("neg_distance", "unit"):
            raise ValueError(f"reward must be 'neg_distance' or 'unit', got {reward!r}")
        end = episode_steps_start if episode_steps_end is None else episode_steps_end
        if min(episode_steps_start, end) < 1:
            raise ValueError("episode lengths must be >= 1")
        lognormal_sigma(tail_ratio)  # validate early, not at the first step
        if slowdown_factor < 0 or (slowdown_after_steps is not None and slowdown_after_steps < 0):
            raise ValueError(
                f"slowdown_factor={slowdown_factor} and slowdown_after_steps="
                f"{slowdown_after_steps} must be >= 0"
            )
        self.dim = dim
        self.step_cost_s = step_cost_ms / 1000.0
        self.tail_ratio = tail_ratio
        self.cost_mode = cost_mode
        self.cost_scale = float(cost_scale)
        self.episode_steps_start = episode_steps_start
        self.episode_steps_end = end
        self.shrink_episodes = shrink_episodes
        self.success_tol = success_tol
        self.damping = damping
        self.gain = gain
        self.reward = reward
        self.reward_k = reward_k
        self.slowdown_after_steps = slowdown_after_steps
        self.slowdown_factor = float(slowdown_factor)
        #: steps taken since construction, over all episodes
        self.steps = 0
        self.spec = EnvSpec(
            obs_dim=3 * dim,
            action_dim=action_dim,
            max_episode_steps=max(episode_steps_start, end),
        )
        #: episodes started so far (the n of the current episode is episodes - 1)
        self.episodes = 0
        #: seconds spent on step costs since construction (what the cost model charged)
        self.cost_seconds = 0.0
        self._pos = np.zeros(dim, np.float32)  # [dim]
        self._target = np.zeros(dim, np.float32)  # [dim]
        self._vel = np.zeros(dim, np.float32)  # [dim]
        self._t = 0
        self._len = episode_steps_start
        self._cost_rng = np.random.default_rng(0)

    def set_cost_scale(self, x: float) -> None:
        """Scale the mean step cost by ``x`` from the next step on (e.g. to inject a slowdown)."""
        if x < 0:
            raise ValueError(f"cost scale must be >= 0, got {x}")
        self.cost_scale = float(x)

    @property
    def slowed(self) -> bool:
        """Whether the injected slowdown is in force."""
        return self.slowdown_after_steps is not None and self.steps >= self.slowdown_after_steps

    def episode_length(self, n: int) -> int:
        """Length of the env's n-th episode (n from 0)."""
        if self.shrink_episodes <= 0:
            return self.episode_steps_start
        frac = min(n / self.shrink_episodes, 1.0)
        span = self.episode_steps_end - self.episode_steps_start
        return max(1, round(self.episode_steps_start + frac * span))

    def _obs(self) -> np.ndarray:  # -> [3 * dim] float32
        return np.concatenate([self._pos, self._target, self._vel]).astype(np.float32)

    def _distance(self) -> float:
        return float(np.linalg.norm(self._pos - self._target))

    def reset(self, seed: int) -> np.ndarray:  # -> [O] float32
        """Start a new episode from a seed; same seed, same start, target and cost sequence."""
        # Two independent streams from one seed: the task state and the step costs, so changing
        # the cost settings never changes the trajectories.
        task_rng = np.random.default_rng([int(seed), 0])
        self._cost_rng = np.random.default_rng([int(seed), 1])
        self._pos = task_rng.uniform(-1.0, 1.0, self.dim).astype(np.float32)
        self._target = task_rng.uniform(-0.8, 0.8, self.dim).astype(np.float32)
        self._vel = np.zeros(self.dim, np.float32)
        self._t = 0
        self._len = self.episode_length(self.episodes)
        self.episodes += 1
        return self._obs()

    def step(self, action: np.ndarray) -> StepResult:  # action: [A]
        """Move the point mass one step and spend this step's simulated cost."""
        mean = self.step_cost_s * self.cost_scale
        if self.slowed:
            mean *= self.slowdown_factor
        self.steps += 1
        cost = float(sample_step_costs(self._cost_rng, mean, self.tail_ratio)[0])
        spend(cost, self.cost_mode)
        self.cost_seconds += cost
        a = np.clip(np.asarray(action, np.float32)[: self.dim], -1.0, 1.0)  # [dim]
        self._vel = (self.damping * self._vel + self.gain * a).astype(np.float32)
        self._pos = np.clip(self._pos + self._vel, -1.0, 1.0).astype(np.float32)
        self._t += 1
        d = self._distance()
        shaped = math.tanh(self.reward_k * d)
        success = d < self.success_tol
        return StepResult(
            obs=self._obs(),
            reward=-shaped if self.reward == "neg_distance" else 1.0 - shaped,
            terminated=success,
            truncated=(not success) and self._t >= self._len,
            success=success,
        )

    def close(self) -> None:
        """Nothing to release."""
