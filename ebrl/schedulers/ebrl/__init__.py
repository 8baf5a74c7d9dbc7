"""The EBRL asynchronous pipelined scheduler: driver (scheduler.py, with spawn.py, relay.py,
reshape.py, gpu.py and restarts.py), workers, messages."""

from ebrl.schedulers.ebrl.scheduler import EBRLScheduler

__all__ = ["EBRLScheduler"]
