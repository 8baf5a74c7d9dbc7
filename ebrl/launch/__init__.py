"""Run a sweep, or preview the Slurm jobs it would submit (``python -m ebrl.launch``).

A sweep is a Hydra config in ``conf/sweep/<name>.yaml`` (index: ``sweeps/README.md``): a base
(``/experiment: ...``), ``hydra.sweeper.params`` (the axes) and a launcher. The launcher expands
the axes exactly as Hydra's basic sweeper does (command-line overrides replace a sweep's axis of
the same key), composes and validates every job against the machine that will run it, and groups
the jobs into one job array per distinct set of sbatch parameters. A multirun submits one array,
so a sweep over GPU types (``--constraint=h100`` / ``a100``) becomes one Hydra multirun per GPU
type.

Usage::

    python -m ebrl.launch --dry-run headline_full          # print the sbatch jobs, submit nothing
    python -m ebrl.launch --dry-run headline_full gpu=h100 seed=0,1 --json
    python -m ebrl.launch headline [--out DIR] [overrides]  # run it (here, or on Slurm)

Checkpoints a job's VLA reads that are not there yet are listed once, as what to fetch before
submitting (the rest of each job is checked with them in place; the dry run exits 0); a real
launch refuses them. In MLflow a launched sweep is one run with a child per job.

- :mod:`ebrl.launch.check`: one job composed and checked against its machine (its launcher's
  sbatch parameters, its MLflow store, the checkpoints to fetch);
- :mod:`ebrl.launch.sweep`: the sweep expanded into jobs and grouped into arrays (the plan), and
  the Hydra multirun that runs each array;
- :mod:`ebrl.launch.preview`: the plan as the dry run prints it (text, or JSON);
- :mod:`ebrl.launch.runs`: the sweep's own MLflow run, the parent of its jobs' runs;
- :mod:`ebrl.launch.cli`: the command line: preview, or run the arrays and wait for them;
- :mod:`ebrl.launch.submitit_log`: Submitit's repeated sacct warning, said once (the Slurm
  launcher's log).
"""
