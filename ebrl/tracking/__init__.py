"""Experiment tracking: MLflow behind a small interface, and a no-op for tests and debugging.

Default store: a local sqlite database ``<tracking.store>/mlflow.db`` with artifacts in
``<tracking.store>/mlartifacts`` (``outputs/mlflow`` under the working directory unless configured).
A remote tracking server works the same way through ``tracking.uri=http://host:port``.

With a spool file in the run folder, a server that goes away mid-run does not stop training:
metrics are kept there and sent when it returns, at the end, or by
``python -m ebrl.tracking replay <run_dir>``.

- :mod:`ebrl.tracking.tracker`: the run's tracker (``Tracker``, ``NullTracker``,
  ``MLflowTracker``), its attempt counts and MLflow's system metrics;
- :mod:`ebrl.tracking.spool`: the metrics on disk until the server has them;
- :mod:`ebrl.tracking.store`: the store: where it is, its experiments, requests bounded against
  an outage and told apart from a refusal;
- :mod:`ebrl.tracking.provenance`: what a run records about where it ran (commit, machine) and
  text without local paths;
- :mod:`ebrl.tracking.replay`: the command line (``python -m ebrl.tracking replay``).
"""
