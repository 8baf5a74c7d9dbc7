"""What the parts of a flat observation are: the simulator's declaration of its layout.

ebrl's stages carry one float32 vector per env (``ebrl.types.Observation [B, O]``), whatever the
simulator observes. A policy that reads the parts separately (a VLA: the robot's state, camera
images, the task's instruction) finds them through the :class:`ObsLayout` the simulator declares
in its :class:`~ebrl.envs.base.EnvSpec`: named fields at fixed offsets, each with its shape and
kind, and the instructions of the tasks the run's envs do.

Field names follow RLinf's env observations (the dict its envs return and its models read):
``states``, ``main_images``, ``wrist_images``, ``extra_view_images``, and ``task`` (a one-hot of
the env's task over ``instructions``: the instruction rides in the vector as its index, so the
learner's observations, those after a chunk included, carry it too).

Kinds:

- ``float``: as stored;
- ``image``: ``[H, W, C]`` values in ``[0, 1]`` in the vector, rows top to bottom; a view gives
  ``uint8`` pixels (``round(255 * v)``), as cameras and RLinf's envs give them;
- ``onehot``: the task; a view gives each row's task index (``int64``).

A simulator that declares nothing has one ``states`` field over the whole vector
(:meth:`ObsLayout.flat`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

#: the kinds of field (see the module docstring)
KINDS = ("float", "image", "onehot")
#: the field that holds the task's one-hot
TASK = "task"
#: the field of the robot's (and objects') state
STATES = "states"


@dataclass(frozen=True, slots=True)
class ObsField:
    """One part of the flat observation: ``obs[start : start + prod(shape)]``."""

    name: str
    start: int
    shape: tuple[int, ...]
    kind: str = "float"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def stop(self) -> int:
        return self.start + self.size


@dataclass(frozen=True, slots=True)
class ObsLayout:
    """The fields of a flat observation, and the instructions of its tasks.

    Args:
        fields: the parts, in any order, disjoint, within the vector.
        instructions: the task's instruction; with a ``task`` field, one per task (its one-hot
            indexes them); else at most one, every env's.
    """

    fields: tuple[ObsField, ...]
    instructions: tuple[str, ...] = ()

    @classmethod
    def flat(cls, obs_dim: int, instruction: str | None = None) -> ObsLayout:
        """One ``states`` field over the whole vector."""
        return cls((ObsField(STATES, 0, (obs_dim,)),), (instruction,) if instruction else ())

    def check(self, obs_dim: int) -> ObsLayout:
        """``self``, after checking it against a vector of ``obs_dim``.

        Raises:
            ValueError: a field outside the vector, two fields that overlap or share a name, an
                unknown kind, an image that is not ``[H, W, C]``, a ``task`` one-hot that does
                not match the instructions.
        """
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"ObsLayout: a field name appears twice ({names})")
        spans = sorted((f.start, f.stop, f.name) for f in self.fields)
        for f in self.fields:
            if f.kind not in KINDS:
                raise ValueError(f"ObsLayout: field {f.name!r} has kind {f.kind!r}; one of {KINDS}")
            if f.start < 0 or f.size < 1 or f.stop > obs_dim:
                raise ValueError(
                    f"ObsLayout: field {f.name!r} spans [{f.start}, {f.stop}), outside the "
                    f"observation's {obs_dim} values"
                )
            if f.kind == "image" and len(f.shape) != 3:
                raise ValueError(f"ObsLayout: image {f.name!r} has shape {f.shape}, not [H, W, C]")
        for (_, stop, a), (start, _, b) in itertools.pairwise(spans):
            if start < stop:
                raise ValueError(f"ObsLayout: fields {a!r} and {b!r} overlap")
        task = self.get(TASK)
        if task is not None:
            if task.kind != "onehot" or task.size != len(self.instructions):
                raise ValueError(
                    f"ObsLayout: the {TASK!r} field must be a one-hot over the "
                    f"{len(self.instructions)} instructions (it is {task.kind} of {task.size})"
                )
        elif len(self.instructions) > 1:
            raise ValueError(
                f"ObsLayout: {len(self.instructions)} instructions but no {TASK!r} one-hot to "
                "say which env does which"
            )
        return self

    def get(self, name: str) -> ObsField | None:
        return next((f for f in self.fields if f.name == name), None)

    def size(self, name: str) -> int:
        """Values of field ``name`` (0 when there is none)."""
        f = self.get(name)
        return f.size if f is not None else 0

    def view(self, obs: torch.Tensor, name: str) -> torch.Tensor:
        """Field ``name`` of every row of ``obs [B, O]``: ``[B, *shape]`` (float32), ``uint8``
        pixels for an image, ``[B]`` task indices (int64) for the one-hot."""
        f = self.get(name)
        if f is None:
            raise KeyError(f"the observation has no field {name!r} (fields: {self.names()})")
        part = obs[:, f.start : f.stop]
        if f.kind == "onehot":
            return part.argmax(dim=1)  # [B]
        part = part.reshape(obs.shape[0], *f.shape)
        if f.kind == "image":
            return (part * 255.0).round().clamp(0, 255).to(torch.uint8)  # [B, H, W, C]
        return part.float()

    def instructions_of(self, obs: torch.Tensor) -> list[str]:
        """Each row's instruction (``""`` where the simulator declares none)."""
        b = obs.shape[0]
        if self.get(TASK) is not None:
            return [self.instructions[int(i)] for i in self.view(obs, TASK)]
        return [self.instructions[0] if self.instructions else ""] * b

    def names(self) -> list[str]:
        return [f.name for f in self.fields]
