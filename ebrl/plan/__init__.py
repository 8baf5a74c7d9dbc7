"""The capacity planner: every scheduler's predicted throughput, staleness, busy time and
bubbles on a machine, from measured stage profiles (``python -m ebrl.plan``).

- :mod:`ebrl.plan.profile`: the stage-profile file (``ebrl-plan-profile/1``);
- :mod:`ebrl.plan.machine`: the machine (nodes, GPUs, cores, NUMA), from the project's configs;
- :mod:`ebrl.plan.schedulers`: each scheduler as a setting of the one schedule model
  (``ebrl.resources.model``), placed by the engine's own placement;
- :mod:`ebrl.plan.from_run`: a profile from a run's folder;
- :mod:`ebrl.plan.cli`: the command line.
"""
