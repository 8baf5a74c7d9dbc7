"""A discrete-event model of the EBRL engine's schedule: predicted throughput of a shape, of a
scheduler, of a machine.

The resource manager uses it to choose the run's shape (env groups G, step-level orchestration
and its batch M) before the workers start (``ebrl.resources.shape``); the capacity planner
(``ebrl.plan``) plays every scheduler on machines the run is not on with it. It plays the
engine's own rules, not an approximation of them:

- every env worker steps the units it was sent one after the other (a lock-step unit is the
  worker's share of a group; at the step level, one env);
- each generator replica acts on one batch at a time, picked by the engine's rule
  (:func:`pick`: whole groups in order in lock step; the first M eligible envs, or whoever is
  ready once the oldest has waited the timeout, at the step level);
- the staleness gate (:func:`admits`): an env may act for segment ``s`` once the replica's
  policy version is ``>= s - k``;
- the learner trains segment ``u`` once every env worker has handed it over.

Time is shared the way an operating system shares cores (and a GPU its SMs): every running job
asks each pool it runs on for some capacity (a physics step 1 core, a sleeping simulator about
0, a generator call its threads' busy cores or its GPU share), and when the jobs ask for more
than a pool has, each runs slower in proportion (processor sharing). The costs come from a
short profile of the run's own stages (``StageCosts``) or a profile file (``ebrl.plan``); the
model predicts env steps per second, the staleness of the decisions, each stage's busy time and
bubbles, and the schedule itself as timeline spans.

Modules: ``rules`` (the engine's rules, shared with it), ``machine`` (pools and processor
sharing), ``types`` (what the model is given and predicts), ``engine`` (the schedule),
``search`` (candidates, ranking, choice, effective cores). ``native`` compiles ``machine`` and
``engine`` with mypyc (``make setup``), about 2x faster with the same answers, and keeps a build
that no longer matches the sources unused.
"""

# ruff: noqa: E402 (the guard decides which files the imports below load, so it runs first)
from ebrl.resources.model.native import guard

#: whether the mypyc-compiled modules answer (``python -m ebrl.resources.model status``)
COMPILED = guard()

from ebrl.resources.model.engine import Played, gen_track, play, simulate
from ebrl.resources.model.machine import Machine, ModelSpan, StageCall
from ebrl.resources.model.rules import (
    admits,
    pick,
    pinned_batch_min,
    replica_blocks,
    served_groups,
    split_groups,
)
from ebrl.resources.model.search import (
    candidates,
    choose,
    fit_cores,
    mean_prediction,
    rank,
    splits_of,
    thread_options,
    with_threads,
)
from ebrl.resources.model.types import (
    CostTable,
    Layout,
    Prediction,
    Shape,
    Split,
    StageCosts,
    Workload,
    costs_for,
)

__all__ = [
    "COMPILED",
    "CostTable",
    "Layout",
    "Machine",
    "ModelSpan",
    "Played",
    "Prediction",
    "Shape",
    "Split",
    "StageCall",
    "StageCosts",
    "Workload",
    "admits",
    "candidates",
    "choose",
    "costs_for",
    "fit_cores",
    "gen_track",
    "mean_prediction",
    "pick",
    "pinned_batch_min",
    "play",
    "rank",
    "replica_blocks",
    "served_groups",
    "simulate",
    "split_groups",
    "splits_of",
    "thread_options",
    "with_threads",
]
