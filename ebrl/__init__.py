"""ebrl: asynchronous embodied RL with multi-grained resource management."""

import os

# Stage processes share cores on purpose (more processes than cores while stages overlap). With
# OpenMP's default spin-waiting, a multi-threaded torch stage burns its idle threads' time while
# another process holds the core: measured here, a 2-thread learner used 3x the CPU and 2.4x the
# wall time per update next to a running rollout. PASSIVE makes idle OpenMP threads sleep. It must
# be set before torch loads OpenMP, hence here; an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
