"""A CPU fake of an RLinf env class: RLinf's env contract, without RLinf.

It follows what RLinf's ManiSkill env does (``rlinf/envs/maniskill/maniskill_env.py``, v0.3): the
constructor ``(cfg, num_envs, seed_offset, total_num_processes, worker_info)``; ``reset(*, seed,
options)`` that falls back to the class's own seed when ``options`` is None; ``step(actions
[N, A], auto_reset)`` returning batched torch tensors and ``infos["success"]``; observations as
``{"states": [N, O]}``. Episodes last ``cfg.episode_len`` steps and succeed when the actions'
sum over the episode is positive, so a test can script a success.
"""

from __future__ import annotations

from typing import ClassVar

import torch

OBS_DIM, ACTION_DIM = 3, 2


class FakeRLinfEnv:
    """Vectorised like RLinf's envs: ``num_envs`` envs in one instance; env i's episodes last
    ``episode_len + i % 2`` steps (so envs of one chunk end at different steps); ``reset``
    with ``options["env_idx"]`` resets those envs only, one seed each."""

    def __init__(self, cfg, num_envs, seed_offset, total_num_processes, worker_info):
        self.cfg, self.num_envs = cfg, num_envs
        self.seed = int(cfg.seed) + seed_offset
        self.auto_reset = cfg.auto_reset
        self.lengths = torch.tensor([int(cfg.episode_len) + i % 2 for i in range(num_envs)])
        self.resets: list[tuple[list[int], list[int]]] = []  # (envs, seeds) of each reset
        self.steps = 0  # step() calls
        self.closed = False
        self._t = torch.zeros(num_envs, dtype=torch.int64)
        self._start = torch.zeros(num_envs)
        self._sum = torch.zeros(num_envs)

    def _obs(self):
        states = torch.stack([self._start, self._t.float(), self._sum], dim=1)
        return {"states": states, "task_descriptions": ["push"] * self.num_envs}

    def reset(self, *, seed=None, options=None):
        if options is None:  # as RLinf's ManiSkill env: no options, its own seed
            seed = self.seed
        idx = options.get("env_idx") if options else None
        rows = list(range(self.num_envs)) if idx is None else [int(i) for i in idx]
        # as ManiSkill: a seed list has one seed per env of the instance, even for a partial reset
        seeds = list(seed) if isinstance(seed, list) else [int(seed)] * self.num_envs
        assert len(seeds) == self.num_envs, (seeds, self.num_envs)
        self.resets.append((rows, [seeds[r] for r in rows]))
        for r in rows:
            self._t[r], self._sum[r], self._start[r] = 0, 0.0, float(seeds[r] % 1000)
        return self._obs(), {}

    def step(self, actions=None, auto_reset=True):
        assert actions.shape == (self.num_envs, ACTION_DIM), actions.shape
        assert not auto_reset, "ebrl resets each env itself"
        self.steps += 1
        self._t += 1
        self._sum += actions.sum(dim=1)
        term = self._t >= self.lengths
        trunc = torch.zeros(self.num_envs, dtype=torch.bool)
        success = term & (self._sum > 0)
        return self._obs(), success.float(), term, trunc, {"success": success}

    def close(self):
        self.closed = True


class EnvIdxResetEnv(FakeRLinfEnv):
    """RoboCasa's reset contract (``rlinf/envs/robocasa/robocasa_env.py``): ``reset(env_idx,
    options)`` with no seed: the class draws initial states itself (here: the reset's count)."""

    def reset(self, env_idx=None, options=None):
        rows = list(range(self.num_envs)) if env_idx is None else [int(i) for i in env_idx]
        self.resets.append((rows, []))
        for r in rows:
            self._t[r], self._sum[r], self._start[r] = 0, 0.0, float(len(self.resets))
        return self._obs(), {}


class FakeChunkEnv(FakeRLinfEnv):
    """BEHAVIOR's contract (``rlinf/envs/behavior/behavior_env.py``, v0.3): the constructor reads
    ``worker_info.group_world_size`` and ``cfg.total_num_envs``; ``reset()`` resets every env
    (no seed, no env index); ``chunk_step(actions [N, K, A])`` returns per-step lists (the
    intermediate observations None, as with ``skip_intermediate_obs_in_chunk``) with an
    episode's end at the chunk's last column, success in ``infos["episode"]["success_once"]``;
    there is no ``step``. An env whose episode ended inside the chunk is held still (its time
    stops), as OmniGibson's done envs are."""

    def __init__(self, cfg, num_envs, seed_offset, total_num_processes, worker_info):
        assert total_num_processes % worker_info.group_world_size == 0
        assert int(cfg.total_num_envs) == num_envs
        super().__init__(cfg, num_envs, seed_offset, total_num_processes, worker_info)
        self.chunk_steps = 0

    step = None  # BEHAVIOR's class has none

    def reset(self):
        self.resets.append((list(range(self.num_envs)), []))
        self._t[:], self._sum[:] = 0, 0.0
        self._start[:] = float(len(self.resets))
        return self._obs(), {}

    def chunk_step(self, chunk_actions):
        n, k, a = chunk_actions.shape
        assert (n, a) == (self.num_envs, ACTION_DIM), chunk_actions.shape
        self.chunk_steps += 1
        rewards, ended = torch.zeros(n, k), torch.zeros(n, dtype=torch.bool)
        obs_list, infos_list = [], []
        for j in range(k):
            moving = ~ended
            self._t[moving] += 1
            self._sum[moving] += chunk_actions[moving, j].sum(dim=1)
            now = moving & (self._t >= self.lengths)
            rewards[now, j] = (self._sum[now] > 0).float()
            ended |= now
            obs_list.append(self._obs() if j == k - 1 else None)
            success = ended & (self._sum > 0)
            infos_list.append({"episode": {"success_once": success.clone()}})
        terms = torch.zeros(n, k, dtype=torch.bool)
        terms[:, -1] = ended
        return obs_list, rewards, terms, torch.zeros(n, k, dtype=torch.bool), infos_list


class NoStateEnv(FakeRLinfEnv):
    def _obs(self):
        return {"main_images": torch.zeros(self.num_envs, 8, 8, 3)}


def get_env_cls(env_type, cfg=None):
    if env_type == "fake":
        return FakeRLinfEnv
    if env_type == "no_state":
        return NoStateEnv
    if env_type == "env_idx":
        return EnvIdxResetEnv
    if env_type == "behavior":  # BEHAVIOR's contract, under its own env type
        return FakeChunkEnv
    if env_type == "needs_sim":
        raise ImportError("No module named 'robocasa'")
    raise ValueError(f"{env_type!r} is not a valid SupportedEnvType")


# --- models: RLinf's model contract (rlinf/models/embodiment/mlp_policy, v0.3) -----------------
class FakeRLinfMLP(torch.nn.Module):
    """RLinf's MLP policy contract: a Gaussian over the chunk's K*A dims, a value head;
    ``predict_action_batch`` -> (chunk [B, K, A], {prev_logprobs [B, K*A], prev_values [B, 1],
    forward_inputs}); ``default_forward(forward_inputs, ...)`` -> logprobs, entropy, values."""

    def __init__(self, cfg):
        super().__init__()
        self.k, self.a = int(cfg.num_action_chunks), int(cfg.action_dim)
        self.net = torch.nn.Linear(int(cfg.obs_dim), self.k * self.a)
        self.logstd = torch.nn.Parameter(torch.full((1, self.k * self.a), -0.5))
        self.value_head = torch.nn.Linear(int(cfg.obs_dim), 1)

    def _dist(self, states):
        mean = self.net(states)
        return torch.distributions.Normal(mean, self.logstd.exp().expand_as(mean))

    @torch.inference_mode()
    def predict_action_batch(self, env_obs, mode="train", **kwargs):
        states = env_obs["states"].to(self.net.weight.dtype)
        d = self._dist(states)
        action = d.mean if mode == "eval" else d.sample()
        inputs = {"action": action, "model_action": action, "states": states}
        result = {
            "prev_logprobs": d.log_prob(action),
            "prev_values": self.value_head(states),
            "forward_inputs": inputs,
        }
        return action.reshape(-1, self.k, self.a), result

    def default_forward(
        self,
        forward_inputs,
        compute_logprobs=True,
        compute_entropy=True,
        compute_values=True,
        **kwargs,
    ):
        states, action = forward_inputs["states"], forward_inputs["action"]
        states = states.to(self.net.weight.dtype)
        d = self._dist(states)
        return {
            "logprobs": d.log_prob(action),
            "entropy": d.entropy(),
            "values": self.value_head(states),
        }


class FakeFlowModel(FakeRLinfMLP):
    """openpi's contract in miniature (rlinf/models/embodiment/openpi, v0.3): the chunk is the
    end of a denoising chain with noise injected at every step, its log-prob that of the chain's
    steps, so the learner can score it only from the chain that sampled it.

    ``x_0 ~ N(0, 1)``; ``x_{i+1} = x_i + v(states, x_i, i) / S + sigma * eps_i``; the chunk is
    ``x_S``. ``forward_inputs``: ``chains [B, S+1, K*A]``, ``denoise_inds [B, S]`` (int64),
    ``action`` and ``model_action`` (equal), ``states``. ``default_forward`` reads the chain
    and the step indices, never the action; the value head reads the states only (openpi's with
    ``value_after_vlm``)."""

    steps = 3
    sigma = 0.3

    def __init__(self, cfg):
        super().__init__(cfg)
        o, d = int(cfg.obs_dim), self.k * self.a
        self.velocity = torch.nn.Linear(o + d + 1, d)

    def _step_means(self, states, chains, inds):  # -> [B, S, D]
        x = chains[:, :-1]  # [B, S, D]
        s = states[:, None].expand(-1, x.shape[1], -1)  # [B, S, O]
        i = inds[..., None].to(x.dtype) / self.steps  # [B, S, 1]
        return x + self.velocity(torch.cat([s, x, i], dim=-1)) / self.steps

    def _chain_scores(self, states, chains, inds):
        step = torch.distributions.Normal(self._step_means(states, chains, inds), self.sigma)
        return step.log_prob(chains[:, 1:]).sum(1), step.entropy().sum(1)  # [B, D] each

    @torch.inference_mode()
    def predict_action_batch(self, env_obs, mode="train", **kwargs):
        states = env_obs["states"].to(self.net.weight.dtype)
        b, like = states.shape[0], {"device": states.device, "dtype": states.dtype}
        inds = torch.arange(self.steps, device=states.device).expand(b, -1)  # [B, S]
        draw = torch.zeros if mode == "eval" else torch.randn
        x = draw(b, self.k * self.a, **like)
        chain = [x]
        for i in range(self.steps):
            step_in = torch.cat([states, x, torch.full((b, 1), i / self.steps, **like)], dim=-1)
            x = x + self.velocity(step_in) / self.steps
            if mode != "eval":
                x = x + self.sigma * torch.randn_like(x)
            chain.append(x)
        chains = torch.stack(chain, dim=1)  # [B, S+1, D]
        logprob, _ = self._chain_scores(states, chains, inds)
        result = {
            "prev_logprobs": logprob,
            "prev_values": self.value_head(states),
            "forward_inputs": {
                "chains": chains,
                "denoise_inds": inds,
                "action": x,
                "model_action": x,
                "states": states,
            },
        }
        return x.reshape(-1, self.k, self.a), result

    def default_forward(self, forward_inputs, compute_values=True, **kwargs):
        states = forward_inputs["states"].to(self.net.weight.dtype)
        logprob, entropy = self._chain_scores(
            states, forward_inputs["chains"], forward_inputs["denoise_inds"]
        )
        return {"logprobs": logprob, "entropy": entropy, "values": self.value_head(states)}


def prompt_tokens(prompts, n: int = 16) -> torch.Tensor:  # [B, n] int64
    """A stand-in for a tokenizer: the prompt's first ``n`` characters' codes."""
    return torch.tensor([[ord(c) for c in p[:n].ljust(n)] for p in prompts], dtype=torch.int64)


class FakeVLAModel(FakeFlowModel):
    """A VLA's contract on RLinf's env observation: ``states``, ``main_images`` (uint8
    ``[B, H, W, 3]``), ``wrist_images`` (alike, or ``None`` without a wrist camera) and
    ``task_descriptions`` (one instruction per row), the prompt tokenised in the rollout and
    handed to the learner in ``forward_inputs`` (openpi's ``tokenized_prompt``), beside the
    chain. The value head reads the state, the image and the prompt.

    Every row it is shown is recorded in ``seen`` (env id, step, first pixel, instruction; the
    state's first and third values under ``CountingEnv``), so a test can check that each env's
    image and instruction reached the model with its state."""

    seen: ClassVar[list[tuple[float, float, int, str]]] = []

    def __init__(self, cfg):
        super().__init__(cfg)
        self.vla_value = torch.nn.Linear(int(cfg.obs_dim) + 2, 1)

    def _features(self, states, images, tokens):
        pixels = images.float().mean(dim=(1, 2, 3))[:, None] / 255.0
        return torch.cat([states, pixels, tokens.float().mean(1, keepdim=True) / 100.0], dim=1)

    @torch.inference_mode()
    def predict_action_batch(self, env_obs, mode="train", **kwargs):
        states, images = env_obs["states"], env_obs["main_images"]
        wrist = env_obs["wrist_images"]
        assert images.dtype == torch.uint8 and images.dim() == 4
        assert wrist is None or (wrist.dtype == torch.uint8 and wrist.shape == images.shape)
        prompts = env_obs["task_descriptions"]
        assert len(prompts) == states.shape[0]
        FakeVLAModel.seen.extend(
            zip(states[:, 0].tolist(), states[:, 2].tolist(), images[:, 0, 0, 0].tolist(), prompts)
        )
        chunk, result = super().predict_action_batch({"states": states}, mode)
        tokens = prompt_tokens(prompts).to(states.device)
        result["prev_values"] = self.vla_value(self._features(states, images, tokens))
        # openpi's names: the camera under "observation/image"
        result["forward_inputs"].update({"observation/image": images, "tokenized_prompt": tokens})
        return chunk, result

    def default_forward(self, forward_inputs, compute_values=True, **kwargs):
        out = super().default_forward(forward_inputs)
        f = forward_inputs
        out["values"] = self.vla_value(
            self._features(f["states"], f["observation/image"], f["tokenized_prompt"])
        )
        return out


class ListInputsModel(FakeRLinfMLP):
    """A rollout whose forward_inputs hold something other than one row per decision."""

    @torch.inference_mode()
    def predict_action_batch(self, env_obs, mode="train", **kwargs):
        chunk, result = super().predict_action_batch(env_obs, mode, **kwargs)
        result["forward_inputs"]["prompt"] = ["pick up the cube"] * chunk.shape[0]
        return chunk, result


class OneActionModel(FakeRLinfMLP):
    """Like RLinf's MLP: one action per decision whatever num_action_chunks says."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.net = torch.nn.Linear(int(cfg.obs_dim), self.a)
        self.logstd = torch.nn.Parameter(torch.full((1, self.a), -0.5))
        self.k = 1


def get_model(cfg):
    model = {
        "fake_mlp": FakeRLinfMLP,
        "fake_flow": FakeFlowModel,
        "fake_vla": FakeVLAModel,
        "list_inputs": ListInputsModel,
        "one_action": OneActionModel,
    }.get(str(cfg.model_type), lambda _cfg: None)(cfg)
    if model is not None and cfg.precision == "bf16":  # RLinf's builders take the dtype from it
        model.to(torch.bfloat16)
    return model
