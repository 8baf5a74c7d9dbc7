"""A scripted expert for LIBERO-Object's pick-X-place-in-basket tasks, on privileged state.

It reads the simulator directly (the target object's collision geometry and pose, the basket's
position, the gripper's pose and finger pads), never the policy's observation, and emits actions
in the adapter's action space: LIBERO's OSC_POSE controller with deltas (``[dx, dy, dz]`` in
``[-1, 1]`` scaled to +-5 cm a step, ``[dax, day, daz]`` an axis-angle in the world frame scaled
to +-0.5 rad, then the gripper: -1 opens, +1 closes).

The script: hover above the object, turning the hand about the vertical so the fingers close
across the object's narrower side (the cream cheese and butter boxes are about as long as the
gripper opens); descend; close; lift; carry until the object (not the hand: it may hang off
centre) is above the basket; lower; open; back off. Heights come from the object's live
bounding box (LIBERO's ``top_offset`` understates the bottles, and objects drop a few cm at the
start of an episode): the hand grasps at the middle of a short object and 4 cm under the top of
a tall one. If the object slips out (it ends up away from the hand) or is pushed while the hand
descends, the script goes back to hovering above it, at most ``retries`` times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: LIBERO's OSC_POSE output limits: an action of 1 moves the goal 5 cm / turns it 0.5 rad
POS_SCALE = 0.05
ROT_SCALE = 0.5
OPEN, CLOSE = -1.0, 1.0
_CORNERS = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)


@dataclass(frozen=True)
class ExpertParams:
    """The script's heights, gains and waits (metres, steps)."""

    #: hover this far above the object's top before descending
    hover: float = 0.06
    #: grasp this far under the object's top, or at its middle if that is higher
    under_top: float = 0.04
    #: and never lower than this above its bottom (the fingertips reach below the grip site)
    min_above_bottom: float = 0.012
    #: carry the object's bottom this far above the basket's rim
    clearance: float = 0.05
    #: release with the hand this far above the basket's rim
    release: float = 0.06
    #: proportional gains: action = gain * error / scale, clipped to [-1, 1]
    gain: float = 1.0
    rot_gain: float = 1.5
    #: position error that counts as reached (the hover, the release point)
    tol: float = 0.01
    #: yaw error (rad) that counts as aligned before descending
    yaw_tol: float = 0.08
    close_steps: int = 10
    open_steps: int = 8
    #: steps a phase may take before moving on regardless
    phase_limit: int = 60
    #: steps the descent may take: a hand held up (by a neighbouring object under its
    #: palm) closes where it is, and the lift finds out whether it holds the object
    descend_limit: int = 25
    #: the object counts as lost when it is this far from the grip site (while held)
    lost: float = 0.08
    #: go back to hovering at most this many times in an episode
    retries: int = 2


def _axis_angle(r: np.ndarray) -> np.ndarray:
    """Axis-angle vector of rotation matrix ``r`` [3, 3]."""
    cos = np.clip((np.trace(r) - 1.0) / 2.0, -1.0, 1.0)
    angle = float(np.arccos(cos))
    if angle < 1e-6:
        return np.zeros(3)
    axis = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])
    return axis / (2.0 * np.sin(angle)) * angle


def _rot_z(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _wrap_half_pi(angle: float) -> float:
    """``angle`` modulo pi, into [-pi/2, pi/2): a gripper closing along an axis or its
    opposite is the same grasp."""
    return float((angle + np.pi / 2) % np.pi - np.pi / 2)


class PickPlaceExpert:
    """The script for one env's episodes; :meth:`reset` after each env reset.

    Args:
        env: a :class:`~ebrl.envs.libero.LiberoEnv` of a LIBERO-Object task (its ``raw_env``).
        params: heights, gains, waits.

    Raises:
        ValueError: the task's goal is not "an object in the basket".
    """

    PHASES = ("hover", "descend", "close", "lift", "carry", "lower", "open", "retreat")

    def __init__(self, env: Any, params: ExpertParams | None = None) -> None:
        self.p = params or ExpertParams()
        self._env = env.raw_env.env  # LIBERO's robosuite env
        goal = self._env.parsed_problem["goal_state"]
        if len(goal) != 1 or goal[0][0] != "in" or not str(goal[0][2]).startswith("basket"):
            raise ValueError(
                f"PickPlaceExpert scripts 'put X in the basket' tasks; this task's goal is {goal}"
            )
        self.target = str(goal[0][1])
        self.basket = str(goal[0][2]).removesuffix("_contain_region")
        self._geoms = self._collision_geoms(self.target)
        self._basket_geoms = self._collision_geoms(self.basket)
        gripper = self._env.robots[0].gripper
        self._pads = [
            self._env.sim.model.geom_name2id(gripper.important_geoms[side][0])
            for side in ("left_fingerpad", "right_fingerpad")
        ]
        self.reset()

    # -- privileged state -----------------------------------------------------------------------
    def _collision_geoms(self, name: str) -> list[int]:
        """The collision geoms of object ``name``: its body's and those of the bodies under it."""
        model = self._env.sim.model._model
        body = self._env.obj_body_id[name]
        bodies = {b for b in range(model.nbody) if b == body or model.body_parentid[b] == body}
        geoms = [
            g
            for g in range(model.ngeom)
            if model.geom_bodyid[g] in bodies and model.geom_contype[g] != 0
        ]
        if not geoms:
            raise ValueError(f"PickPlaceExpert: {name} has no collision geometry")
        return geoms

    @property
    def _data(self) -> Any:
        return self._env.sim.data._data

    def _body(self, name: str) -> np.ndarray:
        return np.array(self._env.sim.data.body_xpos[self._env.obj_body_id[name]])

    def _eef(self) -> tuple[np.ndarray, np.ndarray]:
        site = self._env.robots[0].eef_site_id
        return (
            np.array(self._data.site_xpos[site]),
            np.array(self._data.site_xmat[site]).reshape(3, 3),
        )

    def _box(self, geoms: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The world bounding box (low, high corners) of ``geoms`` (default: the object's)."""
        model, data = self._env.sim.model._model, self._data
        points = []
        for g in self._geoms if geoms is None else geoms:
            centre, half = model.geom_aabb[g, :3], model.geom_aabb[g, 3:]
            local = _CORNERS * half + centre  # [8, 3] in the geom's frame
            points.append(local @ data.geom_xmat[g].reshape(3, 3).T + data.geom_xpos[g])
        pts = np.concatenate(points)
        return pts.min(0), pts.max(0)

    def _narrow_yaw(self) -> float:
        """World yaw of the object's narrower horizontal side's axis: the direction the
        fingers should close along."""
        model, data = self._env.sim.model._model, self._data
        rot = np.array(data.xmat[self._env.obj_body_id[self.target]]).reshape(3, 3)
        inv = rot.T
        pts = []
        for g in self._geoms:
            centre, half = model.geom_aabb[g, :3], model.geom_aabb[g, 3:]
            world = (_CORNERS * half + centre) @ data.geom_xmat[g].reshape(3, 3).T
            world += data.geom_xpos[g]
            pts.append(world @ inv.T)  # the object's own frame (translation cancels below)
        p = np.concatenate(pts)
        extent = p.max(0) - p.min(0)
        # of the object's axes that lie about flat, the one along which it is narrower
        flat = [i for i in range(3) if abs(rot[2, i]) < 0.7]
        axis = min(flat, key=lambda i: extent[i]) if flat else 0
        return float(np.arctan2(rot[1, axis], rot[0, axis]))

    def _closing_yaw(self) -> float:
        """World yaw of the line between the finger pads (the axis the gripper closes along)."""
        a, b = (self._data.geom_xpos[g] for g in self._pads)
        return float(np.arctan2(b[1] - a[1], b[0] - a[0]))

    # -- the script -----------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new episode (call after the env's reset)."""
        self.phase = 0
        self._t = 0
        self.retries = 0
        self._rot0 = self._eef()[1]
        self._goal_rot = self._rot0
        self._offset = np.zeros(2)

    def _go(self, phase: str) -> None:
        self.phase = self.PHASES.index(phase)
        self._t = 0

    def _retry(self) -> None:
        """Back to hovering above the object (it slipped, or the hand pushed it)."""
        if self.retries < self.p.retries:
            self.retries += 1
            self._go("hover")

    def _move(self, target: np.ndarray, gripper: float) -> tuple[np.ndarray, float]:
        pos, rot = self._eef()
        err = target - pos
        a = np.zeros(7)
        a[:3] = np.clip(self.p.gain * err / POS_SCALE, -1.0, 1.0)
        turn = _axis_angle(self._goal_rot @ rot.T)
        a[3:6] = np.clip(self.p.rot_gain * turn / ROT_SCALE, -1.0, 1.0)
        a[6] = gripper
        return a, float(np.linalg.norm(err))

    def act(self) -> np.ndarray:  # -> [7]
        """The next action, from the simulator's current state."""
        p = self.p
        low, high = self._box()
        obj = (low + high) / 2
        basket = self._body(self.basket)
        rim = self._box(self._basket_geoms)[1][2]
        eef, _ = self._eef()
        height = high[2] - low[2]
        grasp_z = max(high[2] - p.under_top, low[2] + height / 2)
        grasp_z = max(grasp_z, low[2] + p.min_above_bottom)
        phase = self.PHASES[self.phase]
        self._t += 1
        late = self._t > p.phase_limit
        held = np.linalg.norm(obj - eef) < p.lost
        if phase == "hover":
            # turn so the fingers close across the narrower side, keeping the hand down
            turn = _wrap_half_pi(self._narrow_yaw() - self._closing_yaw())
            if self._t == 1:
                self._goal_rot = _rot_z(turn) @ self._eef()[1]
            a, e = self._move(np.array([obj[0], obj[1], high[2] + p.hover]), OPEN)
            if (e < 2 * p.tol and abs(turn) < p.yaw_tol) or late:
                self._go("descend")
        elif phase == "descend":
            a, e = self._move(np.array([obj[0], obj[1], grasp_z]), OPEN)
            if np.linalg.norm(obj[:2] - eef[:2]) > 3 * p.tol:  # pushed it: start over
                self._retry()
            elif e < p.tol or self._t > p.descend_limit:
                self._go("close")
        elif phase == "close":
            a, _ = self._move(np.array([eef[0], eef[1], grasp_z]), CLOSE)
            if self._t >= p.close_steps:
                self._offset = obj[:2] - eef[:2]
                self._go("lift")
        elif phase == "lift":
            z = self._carry_z(rim, low[2], eef[2])
            a, _ = self._move(np.array([eef[0], eef[1], z]), CLOSE)
            if not held:
                self._retry()
            elif abs(eef[2] - z) < 3 * p.tol or late:
                self._go("carry")
        elif phase in ("carry", "lower"):
            # the hand goes where the object, as it hangs, comes above the basket
            xy = basket[:2] - (obj[:2] - eef[:2])
            z = self._carry_z(rim, low[2], eef[2]) if phase == "carry" else rim + p.release
            a, e = self._move(np.array([xy[0], xy[1], z]), CLOSE)
            if not held:
                self._retry()
            elif phase == "carry" and (np.linalg.norm(basket[:2] - obj[:2]) < 2 * p.tol or late):
                self._go("lower")
            elif phase == "lower" and (e < 2 * p.tol or late):
                self._go("open")
        elif phase == "open":
            a, _ = self._move(eef, OPEN)
            if self._t >= p.open_steps:
                self._go("retreat")
        else:  # retreat
            a, _ = self._move(np.array([eef[0], eef[1], rim + p.clearance + 0.1]), OPEN)
        return a

    def _carry_z(self, rim: float, bottom: float, hand: float) -> float:
        """The hand's height that carries the object's bottom ``clearance`` over the basket's
        rim (the object hangs ``hand - bottom`` under the hand)."""
        return rim + self.p.clearance + (hand - bottom)
