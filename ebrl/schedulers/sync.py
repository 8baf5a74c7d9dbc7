"""The synchronous scheduler: rollout in lock step, then train, then sync weights.

The simplest correct schedule and the reference every other scheduler is compared with. Per
iteration: T rounds of (generate for all envs -> each env group executes its chunks), then one
update on the segment, then the generator loads the new weights. Nothing overlaps, so every
transition is acted by the current learner version (staleness 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ebrl.rollout import EpisodeStats, SegmentBuilder
from ebrl.schedulers.base import IterationReport, RunContext, cat_obs
from ebrl.types import Observation, Transition


@dataclass
class SyncScheduler:
    """Lock-step rollout then training, in the calling process."""

    def run(self, ctx: RunContext) -> Iterator[IterationReport]:
        st = ctx.build_local()
        ledger = ctx.step_ledger("driver")
        builder = SegmentBuilder(st.env_ids, ctx.decisions_per_env, ledger)
        episodes = EpisodeStats()
        try:
            yield from self._loop(st, ctx, builder, episodes)
        finally:
            for s in st.sims:
                s.close()
            if ledger is not None:
                ledger.close()

    def _loop(self, st, ctx: RunContext, builder: SegmentBuilder, episodes: EpisodeStats):
        tl = ctx.timeline
        with tl.span("sim", "sim"):
            obs = cat_obs([s.reset() for s in st.sims])
        it = 0
        while True:
            for _ in range(ctx.decisions_per_env):
                with tl.span("gen", "gen", batch=len(obs)):
                    chunk = st.gen.generate(obs)
                nexts, start = [], 0
                for g, s in enumerate(st.sims):
                    n = len(s.env_ids)
                    part = chunk.rows(start, start + n)
                    with tl.span("sim", f"sim{g}", batch=n):
                        out = s.step(part)
                    builder.add(Transition.join(obs.rows(start, start + n), part, out))
                    episodes.update(out)
                    nexts.append(Observation(obs=out.next_obs, env_ids=out.env_ids))
                    start += n
                obs = cat_obs(nexts)
            seg = builder.pop()
            with tl.span("train", "learner", steps=seg.num_steps):
                metrics = st.train.train(seg)
            with tl.span("sync", "learner"):
                st.gen.load(*st.train.weights())
            metrics.update(episodes.drain())
            for s in st.sims:  # each env's step latency (P50/P99 of its last steps)
                metrics.update(s.gauges())
            yield IterationReport(iteration=it, env_steps=seg.num_steps, metrics=metrics)
            it += 1
