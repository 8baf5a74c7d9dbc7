"""Submitit's "Bypassing sacct error", said once per process (the Slurm launcher's log).

Installed by ebrl's Slurm launcher (``hydra_plugins/ebrl_launcher/slurm_launcher.py``) in the
Hydra multirun that submits a sweep's array and waits on its jobs (:mod:`ebrl.launch.cli`).
"""

from __future__ import annotations

import logging

log = logging.getLogger("ebrl.launch")  # the launcher's logger, by the package's name


class SubmititRepeats(logging.Filter):
    """Says Submitit's "Bypassing sacct error" once per process, in one line, and counts the rest.

    Where Slurm keeps no accounting (``sacct`` exits 1, as on a single-node Slurm without
    slurmdbd) Submitit warns on every poll of every job, and each warning goes out three times:
    through Submitit's stdout and stderr handlers and through the root logger's. The first is
    logged once, by this module's logger, saying that later ones are not shown; Submitit's own
    records of it are dropped and counted (``dropped``). Submitit still finishes: it reads the
    jobs' result files.
    """

    MARK = "Bypassing sacct error"

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0
        self._said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.MARK not in record.getMessage():
            return True
        if self._said:
            self.dropped += 1
            return False
        self._said = True
        log.warning(
            "Submitit: %s (it says so on every poll where Slurm keeps no accounting; later "
            "repeats are not shown)",
            record.getMessage(),
        )
        return False


def quiet_submitit_repeats() -> SubmititRepeats:
    """Install :class:`SubmititRepeats` on Submitit's logger (once per process); returns it."""
    logger = logging.getLogger("submitit")
    for f in logger.filters:
        if isinstance(f, SubmititRepeats):
            return f
    f = SubmititRepeats()
    logger.addFilter(f)
    return f
