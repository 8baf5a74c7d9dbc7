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

What is translated: the ManiSkill task and episode length, the MLP policy (RLinf ``mlp_policy``,
a fixed 3x256 Tanh network with one action per decision) or a named RLinf model, env count, seed,
steps per rollout, the budget, and PPO's shared hyperparameters (gamma, GAE lambda, ratio clip,
dual clip, epochs, minibatches, learning rate, Adam epsilon, gradient clip, entropy bonus,
advantage normalisation, bootstrapping). Not translated (RLinf has no such knob, or a different
form): the KL early stop (``target_kl``), ``vf_coef``, and the critic loss, which stays RLinf's
clipped Huber loss with its ManiSkill values (``value_clip: 1.0``, ``huber_delta: 10.0``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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


def _model(cfg: Mapping[str, Any], model: str | None, obs_dim: int | None, setup) -> tuple:
    """(RLinf model config name, actor.model overrides); ``setup``: (policy setup, action dim),
    None when the simulator is not translated."""
    policy, k = cfg["policy"], int(cfg["chunk_size"])
    model = model or policy.get("rlinf_model") or None
    if model is not None:  # an RLinf model (a VLA): its own config file holds the rest
        return model, {"num_action_chunks": k, "add_value_head": True}
    if setup is None:
        raise TranslationError(
            "policy=mlp is translated only with a ManiSkill simulator (it sizes the network); "
            "with scheduler.env, name an RLinf model too (scheduler.model)"
        )
    policy_setup, action_dim = setup
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
    if obs_dim is None:
        raise TranslationError(
            f"no known RLinf observation size for task {cfg['simulator'].get('task')!r} "
            f"(known: {', '.join(OBS_DIMS)}); set it in scheduler.overrides "
            "(actor.model.obs_dim)"
        )
    return "mlp_policy", {
        "model_type": "mlp_policy",
        "model_path": "",
        "policy_setup": policy_setup,
        "obs_dim": obs_dim,
        "action_dim": action_dim,
        "num_action_chunks": k,
        "hidden_dim": 256,
        "precision": "32",
        "add_value_head": True,
        "is_lora": False,
    }


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
    sim = cfg["simulator"]
    setup = None
    if env is None:
        if sim["_target_"] != MANISKILL_TARGET:
            raise TranslationError(
                f"simulator={sim['_target_']}: only ManiSkill tasks are translated to RLinf "
                "(simulator=pushcube/pickcube), or name an RLinf env config (scheduler.env)"
            )
        setup = POLICY_SETUPS.get(sim["control_mode"])
        if setup is None:
            raise TranslationError(
                f"simulator.control_mode={sim['control_mode']}: RLinf's ManiSkill env takes "
                f"{', '.join(POLICY_SETUPS)} here"
            )
    model_name, model_cfg = _model(cfg, model, OBS_DIMS.get(sim.get("task", "")), setup)

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
    if env is None:
        env_train["max_episode_steps"] = int(sim["max_episode_steps"])
        env_train["init_params"] = {"id": sim["task"]}
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
        "enable_torch_compile": True,
        "enable_cuda_graph": True,
    }
    if mode == "async":
        rollout["recompute_logprobs"] = False
    out: dict[str, Any] = {
        "defaults": [
            f"env/{env or MANISKILL_ENV}@env.train",
            f"model/{model_name}@actor.model",
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
            "micro_batch_size": global_batch // ws["actor"],
            "global_batch_size": global_batch,
            "seed": seed,
            "enable_offload": offload,
            "model": model_cfg,
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
    return out


def env_steps_per_iteration(rlinf_cfg: Mapping[str, Any]) -> int:
    """Environment steps (single actions) one RLinf training step consumes."""
    train = rlinf_cfg["env"]["train"]
    return (
        int(train["total_num_envs"])
        * int(train["max_steps_per_rollout_epoch"])
        * int(train.get("rollout_epoch", 1))
    )
