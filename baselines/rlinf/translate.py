"""An ebrl run config -> RLinf's embodied configuration (RLinf v0.3, the ``rlinf`` extra).

The result is the dict RLinf's Hydra app composes (``examples/embodiment/config/*.yaml`` shape):
``defaults`` pick RLinf's own env / model / FSDP / weight-syncer groups, the rest overrides them.
Pure: no RLinf import, no file access; :mod:`baselines.rlinf.launch` writes and runs it.

The three modes (README.md, "What is here": baselines), as RLinf writes them:

- colocated: ``cluster.component_placement: {actor,env,rollout: 0-(G-1)}``, offload on for actor,
  rollout and env (as ``maniskill_ppo_openvlaoft.yaml``), ``rollout.pipeline_stage_num: 1``;
- hybrid: env on the first half of the GPUs, rollout on the second, actor on all, offload on,
  ``pipeline_stage_num: 2`` (as ``maniskill_ppo_openvla.yaml``);
- async: ``algorithm.loss_type: decoupled_actor_critic`` with ``staleness_threshold`` and
  ``behave_weight_threshold``, offload off (``AsyncMultiStepRolloutWorker`` refuses it),
  ``pipeline_stage_num: 1``; on one GPU every component shares it (RLinf's shipped async configs),
  on more, a static split: env and rollout on the first half, actor on the second.

What is translated: the simulator (a ManiSkill task and episode length; a LIBERO suite as RLinf's
``env/libero_<suite>``; RoboCasa as RLinf's ``env/robocasa_closedrawer`` with the task's names),
the MLP policy (RLinf ``mlp_policy``, a fixed 3x256 Tanh network with one action per decision) or
an RLinf model (a VLA's ``rlinf_model`` with its ``model_cfg.model_path``, or
``scheduler.model``), env count, seed, steps per rollout, the budget, and PPO's shared
hyperparameters (gamma, GAE lambda, ratio clip, dual clip, epochs, minibatches, learning rate,
Adam epsilon, gradient clip, entropy bonus, advantage normalisation, bootstrapping). Not
translated (RLinf has no such knob, or a different form): the KL early stop (``target_kl``),
``vf_coef``, and the critic loss, which stays RLinf's clipped Huber loss with its ManiSkill values
(``value_clip: 1.0``, ``huber_delta: 10.0``).

As RLinf 0.3 runs its models (v0.3's sources):

- ``rollout.enable_torch_compile`` only for the models whose class implements
  ``enable_torch_compile`` (mlp_policy, cnn_policy, openpi), ``rollout.enable_cuda_graph`` only for
  those implementing ``capture_cuda_graph`` (mlp_policy, cnn_policy): every other model's base
  class raises NotImplementedError when the rollout worker starts
  (``rlinf/models/embodiment/base_policy.py``, ``rlinf/workers/rollout/hf/huggingface_worker.py``);
- ``actor.micro_batch_size``: the largest divisor of each actor process's share of the global
  batch that is at most what RLinf's own configs of that model use (:data:`MICRO_BATCH`), so that
  ``global_batch_size % (micro_batch_size x actor processes) == 0`` (RLinf's FSDP validator);
- a model left at RLinf's placeholder path (``/path/to/...``), and a pair whose action sizes
  differ (a 7-d VLA on RoboCasa's 12-d PandaOmron), are refused, naming what to set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MODES = ("colocated", "hybrid", "async")
#: RLinf's env.train.* template for ManiSkill state tasks; only init_params.id changes per task
MANISKILL_ENV = "maniskill_pick_cube"
#: flat state observation sizes of RLinf's ManiSkill env (obs_mode state, wrap_obs_mode simple)
OBS_DIMS = {"PickCube-v1": 42, "PushCube-v1": 35}
#: ebrl control mode -> (RLinf actor.model.policy_setup, action dim); RLinf derives the control
#: mode from the policy setup (rlinf/config.py, validate_embodied_cfg, get_robot_control_mode)
POLICY_SETUPS = {"pd_joint_delta_pos": ("panda-qpos", 8), "pd_ee_delta_pos": ("panda-ee-dpos", 4)}
MANISKILL_TARGET = "ebrl.envs.maniskill.ManiSkillEnv"
MLP_TARGET = "ebrl.policies.mlp.MLPPolicy"
PPO_TARGET = "ebrl.algos.ppo.PPO"
#: RLinf's critic loss values in its ManiSkill PPO configs (not translatable: see module doc)
VALUE_CLIP, HUBER_DELTA = 1.0, 10.0
LIBERO_TARGET = "ebrl.envs.libero.LiberoEnv"
RLINF_ENV_TARGET = "ebrl.envs.rlinf_env.RLinfEnv"
#: LIBERO suites RLinf 0.3 has an env config for (examples/embodiment/config/env/<suite>.yaml)
LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
LIBERO_ACTION_DIM = 7  # RLinf's LiberoEnv: end-effector delta pose (6) + gripper (1)
#: ebrl's RLinf env types -> RLinf 0.3's env config for them (the task names are overridden)
RLINF_ENVS = {"robocasa": "robocasa_closedrawer"}
#: RLinf 0.3's model configs (examples/embodiment/config/model/<name>.yaml) -> their model_type
MODEL_TYPES = {
    "abot_m0": "abot_m0",
    "cnn_policy": "cnn_policy",
    "dexbotic_dm0": "dexbotic_dm0",
    "dexbotic_pi": "dexbotic_pi",
    "dreamzero_5b": "dreamzero",
    "flow_policy": "flow_policy",
    "gr00t": "gr00t",
    "gr00t_n1d6": "gr00t_n1d6",
    "gr00t_n1d7": "gr00t_n1d7",
    "lingbotvla": "lingbotvla",
    "mlp_policy": "mlp_policy",
    "openvla": "openvla",
    "openvla_oft": "openvla_oft",
    "pi0": "openpi",
    "pi0_5": "openpi",
    "starvla": "starvla",
}
#: model types whose RLinf 0.3 class implements enable_torch_compile / capture_cuda_graph
TORCH_COMPILE = frozenset({"mlp_policy", "cnn_policy", "openpi"})
CUDA_GRAPH = frozenset({"mlp_policy", "cnn_policy"})
#: the largest micro-batch RLinf 0.3's own PPO configs give each model type: openpi and gr00t
#: 128 (libero_*_ppo_openpi/gr00t, robocasa_closedrawer_ppo_openpi), openvla_oft 32 (its LIBERO
#: configs; 40 on ManiSkill), openvla 80 (maniskill_ppo_openvla), mlp_policy 6400
#: (maniskill_ppo_mlp), cnn_policy 128 (genesis_cubepick_ppo_cnn)
MICRO_BATCH = {
    "openpi": 128,
    "gr00t": 128,
    "openvla_oft": 32,
    "openvla": 80,
    "mlp_policy": 6400,
    "cnn_policy": 128,
}
#: RLinf's placeholder in its model configs: a model path that still holds it was never set
PLACEHOLDER = "/path/to/"


class TranslationError(ValueError):
    """An ebrl config with no RLinf equivalent; the message says which key and what to do."""


def _span(a: int, b: int) -> str:
    """RLinf's resource-rank range syntax (rlinf/scheduler/placement/placement.py): a-b."""
    return f"{a}-{b}"


def placement(mode: str, gpus: int) -> dict[str, str]:
    """``cluster.component_placement`` of a mode on ``gpus`` accelerators (global ranks)."""
    if mode not in MODES:
        raise TranslationError(f"mode={mode!r}: choose one of {', '.join(MODES)}")
    if gpus < 1:
        raise TranslationError(f"gpus={gpus}: RLinf needs at least one GPU")
    last, half = gpus - 1, gpus // 2
    if mode == "colocated" or (mode == "async" and gpus == 1):
        return {"actor,env,rollout": _span(0, last)}
    if mode == "hybrid":
        if gpus < 2:
            raise TranslationError(
                "mode=hybrid needs >= 2 GPUs: env and rollout on disjoint halves (set gpus)"
            )
        return {"env": _span(0, half - 1), "rollout": _span(half, last), "actor": _span(0, last)}
    return {"env,rollout": _span(0, half - 1), "actor": _span(half, last)}


def world_sizes(place: Mapping[str, str]) -> dict[str, int]:
    """Processes per component: one per GPU of its range (no ``:process`` part is written)."""
    out: dict[str, int] = {}
    for names, ranks in place.items():
        a, b = (int(x) for x in ranks.split("-"))
        for name in names.split(","):
            out[name] = b - a + 1
    return out


@dataclass(frozen=True)
class Sim:
    """What the translation knows of the simulator, in RLinf's terms.

    Attributes:
        env: RLinf's env config (``examples/embodiment/config/env/<env>.yaml``).
        train: ``env.train`` keys set over that config.
        setup: ManiSkill only: (RLinf ``policy_setup``, action dim) of the control mode.
        obs_dim: the flat state's size where known (ManiSkill state tasks).
        action_dim: the action size the env takes, where known.
    """

    env: str
    train: dict[str, Any] = field(default_factory=dict)
    setup: tuple[str, int] | None = None
    obs_dim: int | None = None
    action_dim: int | None = None


def simulator(sim: Mapping[str, Any], env: str | None) -> Sim:
    """RLinf's env for ebrl's ``simulator`` node (``env``: an RLinf env config named instead)."""
    if env is not None:
        return Sim(env)
    target = sim["_target_"]
    if target == MANISKILL_TARGET:
        setup = POLICY_SETUPS.get(sim["control_mode"])
        if setup is None:
            raise TranslationError(
                f"simulator.control_mode={sim['control_mode']}: RLinf's ManiSkill env takes "
                f"{', '.join(POLICY_SETUPS)} here"
            )
        train = {
            "max_episode_steps": int(sim["max_episode_steps"]),
            "init_params": {"id": sim["task"]},
        }
        return Sim(MANISKILL_ENV, train, setup, OBS_DIMS.get(sim.get("task", "")), setup[1])
    if target == LIBERO_TARGET:
        suite = str(sim["task"])
        if suite not in LIBERO_SUITES:
            raise TranslationError(
                f"simulator.task={suite}: RLinf 0.3 has env configs for {', '.join(LIBERO_SUITES)}"
            )
        if str(sim.get("task_id", "all")) != "all":
            raise TranslationError(
                f"simulator.task_id={sim['task_id']}: RLinf's LIBERO env draws every task of the "
                "suite; use simulator.task_id=all (or scheduler.overrides on RLinf's env.train)"
            )
        # RLinf's env renders its own cameras whatever ebrl's obs_mode; no videos in a timed run
        train = {
            "max_episode_steps": int(sim["max_episode_steps"]),
            "video_cfg": {"save_video": False},
        }
        return Sim(suite, train, action_dim=LIBERO_ACTION_DIM)
    if target == RLINF_ENV_TARGET and sim.get("env_type") in RLINF_ENVS:
        env_cfg = sim.get("env_cfg") or {}
        train = {"max_episode_steps": int(sim["max_episode_steps"])}
        for key in ("robot_name", "task_names"):
            if key in env_cfg:
                train[key] = env_cfg[key]
        train["video_cfg"] = {"save_video": False}
        dim = sim.get("action_dim")
        return Sim(RLINF_ENVS[sim["env_type"]], train, action_dim=None if dim is None else int(dim))
    raise TranslationError(
        f"simulator={target}{'/' + sim['env_type'] if 'env_type' in sim else ''}: not translated "
        "to RLinf (ManiSkill tasks, LIBERO suites and RoboCasa are); or name an RLinf env config "
        "(scheduler.env)"
    )


@dataclass(frozen=True)
class Model:
    """The RLinf model a run trains.

    Attributes:
        name: RLinf's model config (``examples/embodiment/config/model/<name>.yaml``).
        type: its ``model_type`` (None: a config this table does not know).
        cfg: ``actor.model`` keys set over that config.
        action_dim: the action size it emits where ebrl's policy says (None: RLinf's config's).
    """

    name: str
    type: str | None
    cfg: dict[str, Any]
    action_dim: int | None = None


def _model(cfg: Mapping[str, Any], model: str | None, sim: Sim) -> Model:
    """The RLinf model of the run: ``model``, else the policy's ``rlinf_model``, else the MLP."""
    policy, k = cfg["policy"], int(cfg["chunk_size"])
    own = policy.get("rlinf_model") or None
    model = model or own
    if model is not None:  # an RLinf model (a VLA): its own config file holds the rest
        out: dict[str, Any] = {"num_action_chunks": k, "add_value_head": True}
        action_dim = None
        if model == own:  # the policy's own checkpoint, not RLinf's placeholder path
            path = (policy.get("model_cfg") or {}).get("model_path")
            if path:
                out["model_path"] = str(path)
            action_dim = int(policy["action_dim"]) if policy.get("action_dim") else None
        return Model(model, MODEL_TYPES.get(model), out, action_dim)
    if sim.setup is None:
        raise TranslationError(
            "policy=mlp is translated only with a ManiSkill simulator (it sizes the network); "
            "with scheduler.env, name an RLinf model too (scheduler.model)"
        )
    policy_setup, action_dim = sim.setup
    if policy["_target_"] != MLP_TARGET:
        raise TranslationError(
            f"policy={policy['_target_']}: RLinf has no counterpart; use policy=mlp, or name an "
            "RLinf model config (scheduler.model=openvla_oft, ...)"
        )
    if (int(policy["hidden"]), int(policy["layers"])) != (256, 3):
        raise TranslationError(
            f"policy.hidden={policy['hidden']}, policy.layers={policy['layers']}: RLinf's "
            "mlp_policy is a fixed 3x256 network; use the defaults"
        )
    if k != 1:
        raise TranslationError(
            f"chunk_size={k}: RLinf's mlp_policy emits one action per decision (its action head "
            "is action_dim wide); use chunk_size=1, or an RLinf VLA via scheduler.model"
        )
    if sim.obs_dim is None:
        raise TranslationError(
            f"no known RLinf observation size for task {cfg['simulator'].get('task')!r} "
            f"(known: {', '.join(OBS_DIMS)}); set it in scheduler.overrides "
            "(actor.model.obs_dim)"
        )
    return Model(
        "mlp_policy",
        "mlp_policy",
        {
            "model_type": "mlp_policy",
            "model_path": "",
            "policy_setup": policy_setup,
            "obs_dim": sim.obs_dim,
            "action_dim": action_dim,
            "num_action_chunks": k,
            "hidden_dim": 256,
            "precision": "32",
            "add_value_head": True,
            "is_lora": False,
        },
        action_dim,
    )


def micro_batch(per_process: int, model_type: str | None) -> int:
    """``actor.micro_batch_size``: the largest divisor of ``per_process`` (an actor process's
    share of the global batch) that is at most RLinf's own micro-batch for the model type.

    Raises:
        TranslationError: a model type RLinf's configs give no micro-batch here.
    """
    cap = MICRO_BATCH.get(model_type or "")
    if cap is None:
        raise TranslationError(
            f"RLinf model type {model_type!r}: no micro-batch known from RLinf's configs here "
            f"(known: {', '.join(sorted(MICRO_BATCH))}); set one in scheduler.overrides "
            "(actor.micro_batch_size) that divides the global batch per actor process"
        )
    return max(d for d in range(1, min(cap, per_process) + 1) if per_process % d == 0)


def _algorithm(cfg: Mapping[str, Any], mode: str, staleness: int) -> dict[str, Any]:
    algo = cfg["algo"]
    if algo["_target_"] != PPO_TARGET:
        raise TranslationError(f"algo={algo['_target_']}: only algo=ppo is translated to RLinf")
    ppo = algo["cfg"]
    out: dict[str, Any] = {
        "adv_type": "gae",
        "loss_type": "decoupled_actor_critic" if mode == "async" else "actor_critic",
        "loss_agg_func": "token-mean",
        "reward_type": "action_level",
        "logprob_type": "action_level",
        "entropy_type": "action_level",
        "group_size": 1,
        "normalize_advantages": bool(ppo["norm_adv"]),
        "kl_penalty": "kl",
        "kl_beta": 0.0,
        "entropy_bonus": float(ppo["ent_coef"]),
        "update_epoch": int(ppo["update_epochs"]),
        "clip_ratio_low": float(ppo["clip_coef"]),
        "clip_ratio_high": float(ppo["clip_coef"]),
        "clip_ratio_c": ppo["dual_clip"],
        "value_clip": VALUE_CLIP,
        "huber_delta": HUBER_DELTA,
        "bootstrap_type": "always" if ppo["bootstrap_at_done"] else "standard",
        "gamma": float(ppo["gamma"]),
        "gae_lambda": float(ppo["gae_lambda"]),
    }
    if mode == "async":
        if staleness not in (1, 2):
            raise TranslationError(f"staleness={staleness}: RLinf async PPO runs with 1 or 2")
        out["staleness_threshold"] = staleness
        out["behave_weight_threshold"] = ppo["behave_weight_threshold"]
    return out


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """``tree["a"]["b"] = value`` for ``key="a.b"``, creating the dicts on the way."""
    *path, leaf = key.split(".")
    for part in path:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def translate(
    cfg: Mapping[str, Any],
    *,
    mode: str,
    gpus: int = 1,
    nodes: int = 1,
    staleness: int = 1,
    model: str | None = None,
    env: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    log_path: str = "logs",
) -> dict[str, Any]:
    """RLinf's configuration for an ebrl run.

    Args:
        cfg: the resolved ebrl run config as plain containers (``StageFactory.cfg``).
        mode: ``colocated``, ``hybrid`` or ``async``.
        gpus: GPUs per node.
        nodes: nodes (``cluster.num_nodes``); GPU ranks are global across them.
        staleness: async only: ``algorithm.staleness_threshold``.
        model: an RLinf model config name (``examples/embodiment/config/model/<name>.yaml``) to
            use instead of translating ``cfg["policy"]``.
        env: an RLinf env config name to use instead of translating ``cfg["simulator"]``.
        overrides: dotted RLinf keys set last.
        log_path: ``runner.logger.log_path`` (where RLinf's TensorBoard logs go).

    Raises:
        TranslationError: the config has no RLinf equivalent, or RLinf would refuse it.
    """
    total = gpus * nodes
    place = placement(mode, total)
    ws = world_sizes(place)
    stages = 2 if mode == "hybrid" else 1
    offload = mode != "async"
    sim = simulator(cfg["simulator"], env)
    mod = _model(cfg, model, sim)

    n, k = int(cfg["num_envs"]), int(cfg["chunk_size"])
    t = max(1, int(cfg["rollout_steps"]) // k)  # decisions per env per iteration
    if n % (ws["env"] * stages):
        raise TranslationError(
            f"num_envs={n}: RLinf splits envs evenly over {ws['env']} env process(es) x "
            f"{stages} pipeline stage(s); use a multiple of {ws['env'] * stages}"
        )
    minibatches = int(cfg["algo"]["cfg"]["num_minibatches"])
    if (n * t) % (minibatches * ws["actor"]):
        raise TranslationError(
            f"num_envs x decisions = {n * t} samples do not split into "
            f"algo.cfg.num_minibatches={minibatches} x {ws['actor']} actor process(es)"
        )
    global_batch = n * t // minibatches
    micro = micro_batch(global_batch // ws["actor"], mod.type)
    budget = cfg["budget"]
    iters = budget.get("iterations") or math.ceil(int(budget["env_steps"]) / (n * t * k))
    ppo = cfg["algo"]["cfg"]
    seed = int(cfg["seed"])

    env_train: dict[str, Any] = {
        "total_num_envs": n,
        "max_steps_per_rollout_epoch": t * k,
        "rollout_epoch": 1,
        "auto_reset": True,
        "ignore_terminations": False,
        "use_fixed_reset_state_ids": False,
        "group_size": 1,
        "seed": seed,
        "enable_offload": offload,
    }
    env_train.update(sim.train)
    rollout: dict[str, Any] = {
        "group_name": "RolloutGroup",
        "backend": "huggingface",
        "enable_offload": offload,
        "pipeline_stage_num": stages,
        # the rollout worker loads the weights the actor starts from
        "model": {
            "model_path": "${actor.model.model_path}",
            "precision": "${actor.model.precision}",
        },
        # only where RLinf 0.3's model class has them (module doc); else its rollout worker
        # raises NotImplementedError when it starts
        "enable_torch_compile": mod.type in TORCH_COMPILE,
        "enable_cuda_graph": mod.type in CUDA_GRAPH,
    }
    if mode == "async":
        rollout["recompute_logprobs"] = False
    out: dict[str, Any] = {
        "defaults": [
            f"env/{sim.env}@env.train",
            f"model/{mod.name}@actor.model",
            "training_backend/fsdp@actor.fsdp_config",
            "weight_syncer/patch_syncer@weight_syncer",
            {"override hydra/job_logging": "stdout"},
            "_self_",
        ],
        "hydra": {
            "run": {"dir": "."},
            "output_subdir": None,
            "searchpath": ["file://${oc.env:EMBODIED_PATH}/config/"],
        },
        "cluster": {"num_nodes": nodes, "component_placement": place},
        "runner": {
            "task_type": "embodied",
            "logger": {
                "log_path": log_path,
                "project_name": "ebrl",
                "experiment_name": f"ebrl_rlinf_{mode}",
                "logger_backends": ["tensorboard"],
            },
            "max_epochs": int(iters),
            "max_steps": -1,
            "only_eval": False,
            "val_check_interval": -1,
            "save_interval": -1,
            "resume_dir": None,
            "ckpt_path": None,
        },
        "algorithm": _algorithm(cfg, mode, staleness),
        "env": {"group_name": "EnvGroup", "train": env_train},
        "rollout": rollout,
        "actor": {
            "group_name": "ActorGroup",
            "training_backend": "fsdp",
            "micro_batch_size": micro,
            "global_batch_size": global_batch,
            "seed": seed,
            "enable_offload": offload,
            "model": mod.cfg,
            "optim": {
                "lr": float(ppo["lr"]),
                "value_lr": float(ppo["lr"]),
                "adam_beta1": 0.9,
                "adam_beta2": 0.999,
                "adam_eps": float(ppo["adam_eps"]),
                "weight_decay": 0.0,  # ebrl's Adam has none
                "clip_grad": float(ppo["max_grad_norm"]),
            },
            "fsdp_config": {
                "strategy": "fsdp",
                "sharding_strategy": "no_shard",
                "mixed_precision": {
                    key: "${actor.model.precision}"
                    for key in ("param_dtype", "reduce_dtype", "buffer_dtype")
                },
            },
        },
        "reward": {"use_reward_model": False},
        "critic": {"use_critic_model": False},
    }
    for key, value in (overrides or {}).items():
        set_dotted(out, key, value)
    _check(out, mod, sim, ws["actor"])
    return out


def _check(out: Mapping[str, Any], mod: Model, sim: Sim, actors: int) -> None:
    """What RLinf would refuse, or fail on, once the overrides are in: the batch split its FSDP
    validator checks, a model left at its placeholder path, compile or CUDA graphs where the
    model has none, action sizes that differ."""
    actor, rollout = out["actor"], out["rollout"]
    gb, mb = int(actor["global_batch_size"]), int(actor["micro_batch_size"])
    if mb < 1 or gb % (mb * actors):
        raise TranslationError(
            f"actor.micro_batch_size={mb} x {actors} actor process(es) does not divide "
            f"actor.global_batch_size={gb} (RLinf's FSDP validator refuses it): set a "
            f"micro-batch that divides {gb // actors}"
        )
    if mod.type not in ("mlp_policy", "cnn_policy"):  # RLinf's small models have no weights file
        path = str(actor["model"].get("model_path") or "")
        if not path or path.startswith(PLACEHOLDER):
            raise TranslationError(
                f"RLinf's model/{mod.name} would load from its placeholder path: set "
                "policy.model_cfg.model_path (or EBRL_CHECKPOINTS), or "
                "scheduler.overrides={actor.model.model_path: <checkpoint directory>}"
            )
    for key, ok in (("enable_torch_compile", TORCH_COMPILE), ("enable_cuda_graph", CUDA_GRAPH)):
        if rollout.get(key) and mod.type not in ok:
            raise TranslationError(
                f"rollout.{key}=true: RLinf 0.3's {mod.type or mod.name} model has no such path "
                f"(only {', '.join(sorted(ok))}); its rollout worker would raise at start"
            )
    emits = actor["model"].get("action_dim", mod.action_dim)
    if emits is not None and sim.action_dim is not None and int(emits) != sim.action_dim:
        raise TranslationError(
            f"model/{mod.name} emits {emits}-d actions, RLinf's env/{sim.env} takes "
            f"{sim.action_dim}-d: use a policy trained for that robot, or set its RLinf model "
            "(actor.model.action_dim and what the model needs with it, e.g. RLinf's "
            "robocasa_closedrawer_ppo_openpi.yaml: openpi.config_name pi0_robocasa_human and "
            "its checkpoint) in scheduler.overrides"
        )


def env_steps_per_iteration(rlinf_cfg: Mapping[str, Any]) -> int:
    """Environment steps (single actions) one RLinf training step consumes."""
    train = rlinf_cfg["env"]["train"]
    return (
        int(train["total_num_envs"])
        * int(train["max_steps_per_rollout_epoch"])
        * int(train.get("rollout_epoch", 1))
    )
