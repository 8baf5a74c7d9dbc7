"""Moving a running EBRL run to a new shape (G, the step level, M and its cap, the threads).

The resource manager decides when (the shape trials, then the shape watch:
:class:`~ebrl.resources.controller.RunController`); the engine (``scheduler.py``) connects it to
:func:`reshape`, which tells the running workers. Nothing restarts: each replica and env worker
switches between two batches (their ``Reshape`` handlers), and a worker that later replaces a
dead one starts with the new shape (``Restarts.plan`` keeps it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

from ebrl.resources.model import Shape
from ebrl.resources.model import split_groups as env_groups
from ebrl.runtime.channel import Outbox
from ebrl.schedulers.ebrl.messages import Reshape, Resources
from ebrl.schedulers.ebrl.restarts import Restarts
from ebrl.schedulers.ebrl.wiring import DRIVER

log = logging.getLogger(__name__)


def reshape(new: Shape, restarts: Restarts) -> None:
    """Send ``new`` to every replica and env worker (they switch between two batches), and
    its threads, where they differ from the running ones, to the replica and the learner
    ranks; new processes start with it too."""
    plan = dataclasses.replace(
        restarts.plan,
        groups=env_groups(restarts.plan.workers, new.groups),
        step_level=new.step_level,
        batch_min=new.batch_min,
        batch_max=new.batch_max,
    )
    shape = Reshape(plan.groups, new.step_level, new.batch_min, new.batch_max)
    sends: dict[str, list[Any]] = {
        name: [shape] for name in restarts.book if name != DRIVER and not name.startswith("learner")
    }
    if new.threads is not None and plan.train_resources is not None:
        # one replica (the search runs with one); seq 0: not one of Algorithm 1's moves
        gen = dataclasses.replace(plan.gen_resources[0], seq=0, threads=new.threads[0])
        train = dataclasses.replace(plan.train_resources, seq=0, threads=new.threads[1])
        if (gen.threads, train.threads) != (
            plan.gen_resources[0].threads,
            plan.train_resources.threads,
        ):
            for name in restarts.book:
                if name.startswith(("gen", "learner")):
                    split = gen if name.startswith("gen") else train
                    sends.setdefault(name, []).append(Resources(0, split.threads, split.cores))
            plan = dataclasses.replace(plan, gen_resources=(gen,), train_resources=train)
    restarts.plan = plan
    log.info("shape: running %s", new.describe())
    for name, msgs in sends.items():
        with contextlib.suppress(OSError):  # a dead worker's replacement starts with it
            out = Outbox(restarts.book[name], restarts.authkey, retries=5)
            for m in msgs:
                out.send(m)
            out.close()
