"""Turning a stream of decisions into training segments, and episode statistics.

Schedulers hand every completed decision to a :class:`SegmentBuilder`; it keeps one queue per env
and emits a rectangular :class:`~ebrl.types.Segment` once every env has T decisions queued. Envs
may run ahead of each other (asynchronous schedulers): their extra decisions wait for the next
segment, in order, never mixed with another env's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ebrl.ledger import StepLedger
from ebrl.types import ChunkOutcome, Segment, Transition


class SegmentBuilder:
    """Per-env queues of transitions -> segments of T decisions per env.

    Args:
        env_ids: all global env ids the segments cover, in the order of the segment's N axis.
        decisions_per_env: T.
        ledger: where every decision's env steps are recorded under the segment of the attempt
            it lands in (``ebrl.ledger``; None: not recorded). Segments count from the
            ledger's ``first_segment``.
    """

    def __init__(
        self, env_ids: list[int], decisions_per_env: int, ledger: StepLedger | None = None
    ) -> None:
        if decisions_per_env < 1:
            raise ValueError("decisions_per_env must be >= 1")
        self.env_ids = [int(e) for e in env_ids]
        self.T = decisions_per_env
        self._queues: dict[int, deque[Transition]] = {e: deque() for e in self.env_ids}
        self.ledger = ledger
        self._added = dict.fromkeys(self.env_ids, 0)  # decisions queued so far, per env

    def add(self, tr: Transition) -> None:
        """Queue a batch of decisions (any subset of envs, one decision per env)."""
        steps: dict[int, int] = {}
        first = self.ledger.first_segment if self.ledger is not None else 0
        for row, (e, n) in enumerate(zip(tr.env_ids.tolist(), tr.n_steps.tolist(), strict=True)):
            q = self._queues.get(e)
            if q is None:
                raise KeyError(f"SegmentBuilder: env id {e} is not part of this run")
            q.append(tr.rows(row, row + 1))
            seg = first + self._added[e] // self.T
            self._added[e] += 1
            steps[seg] = steps.get(seg, 0) + int(n)
        if self.ledger is not None:
            self.ledger.add(steps)

    def queued(self, env_id: int) -> int:
        return len(self._queues[env_id])

    def min_queued(self) -> int:
        return min(len(q) for q in self._queues.values())

    def ready(self) -> bool:
        return self.min_queued() >= self.T

    def pop(self) -> Segment:
        """The next segment: the oldest T decisions of every env."""
        if not self.ready():
            raise RuntimeError("SegmentBuilder.pop: not every env has T decisions yet")
        rows = []
        for _ in range(self.T):
            step = [self._queues[e].popleft() for e in self.env_ids]
            rows.append(Transition.cat(step))
        return Segment.stack(rows)


@dataclass
class EpisodeStats:
    """Running episode statistics from chunk outcomes (success = solved at any step)."""

    _ret: dict[int, float] = field(default_factory=dict)
    _len: dict[int, int] = field(default_factory=dict)
    _succ: dict[int, bool] = field(default_factory=dict)
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)

    def update(self, out: ChunkOutcome) -> None:
        rew = out.reward.sum(dim=1).tolist()
        for e, r, n, s, d in zip(
            out.env_ids.tolist(),
            rew,
            out.n_steps.tolist(),
            out.success.tolist(),
            out.done.tolist(),
            strict=True,
        ):
            self._ret[e] = self._ret.get(e, 0.0) + r
            self._len[e] = self._len.get(e, 0) + n
            self._succ[e] = self._succ.get(e, False) or s
            if d:
                self.returns.append(self._ret.pop(e))
                self.lengths.append(self._len.pop(e))
                self.successes.append(self._succ.pop(e))

    def take(self) -> dict[str, list]:
        """The raw per-episode lists since the last take (for merging across workers)."""
        out = {"returns": self.returns, "lengths": self.lengths, "successes": self.successes}
        self.returns, self.lengths, self.successes = [], [], []
        return out

    def drain(self) -> dict[str, float]:
        """Metrics over the episodes finished since the last drain (empty if none)."""
        return self.merge([self.take()])

    @staticmethod
    def merge(parts: list[dict[str, list]]) -> dict[str, float]:
        """Metrics over the episodes of several :meth:`take` results (empty if none)."""
        rets = [r for p in parts for r in p["returns"]]
        if not rets:
            return {}
        lens = [x for p in parts for x in p["lengths"]]
        succ = [x for p in parts for x in p["successes"]]
        n = len(rets)
        return {
            "env/episodes": float(n),
            "env/success_rate": sum(succ) / n,
            "env/return": sum(rets) / n,
            "env/episode_len": sum(lens) / n,
        }
