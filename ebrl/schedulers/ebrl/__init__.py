"""The EBRL asynchronous pipelined scheduler: driver (scheduler.py), workers, messages."""

from ebrl.schedulers.ebrl.scheduler import EBRLScheduler

__all__ = ["EBRLScheduler"]
