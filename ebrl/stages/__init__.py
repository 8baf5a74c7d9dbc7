"""The three stages as plain workers. They do work; they know nothing about scheduling."""

from ebrl.stages.gen import GenStage
from ebrl.stages.sim import SimStage
from ebrl.stages.train import TrainStage

__all__ = ["GenStage", "SimStage", "TrainStage"]
