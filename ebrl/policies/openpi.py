"""The paper's pi0 (openpi) built by RLinf's own registry, offline, at any size.

``get_model`` here is a registry function for :class:`~ebrl.policies.rlinf_policy.RLinfPolicy`
(``policy.registry=ebrl.policies.openpi.get_model``, ``conf/policy/pi0_tiny.yaml``): it calls
RLinf's ``rlinf.models.get_model`` for ``model_type: openpi`` unchanged (RLinf's
``OpenPi0ForRLActionPrediction`` on openpi's PyTorch ``PI0Pytorch``, PaliGemma and Gemma from
RLinf's transformers fork), after giving it what it would otherwise download or need a real
checkpoint for:

- **assets** (:func:`write_assets`): a checkpoint directory with the norm stats RLinf's builder
  reads (``<model_path>/<asset id>/norm_stats.json``) and an empty ``model.safetensors`` (its
  weights load with ``strict=False``, so the model keeps its random initialisation), and the
  PaliGemma tokenizer openpi fetches from a cloud bucket at build
  (``gs://big_vision/paligemma_tokenizer.model``), replaced by a small SentencePiece model
  trained here on the run's instructions and put where openpi's download cache looks first
  (``$OPENPI_DATA_HOME/big_vision/paligemma_tokenizer.model``);
- **sizes** (:func:`model_sizes`): openpi and RLinf fix pi0's widths in code: Gemma sizes come
  only from openpi's table of named variants (``dummy``, ``gemma_300m``, ``gemma_2b``), the
  vision tower is PaliGemma-3B's SigLIP (27 layers of 1152) whose projection is 2048 wide,
  which the language model's width must equal, and RLinf's value head reads 1024 features, the
  width of ``gemma_300m``; the two Gemmas attend jointly layer by layer, so they share depth
  and head sizes. So the smallest pi0 that runs unpatched is the full one, 3.50B parameters as
  built (0.26B of them the expert's lm_head, which pi0 never calls; fp32 Adam would need about
  56 GB); the ``dummy`` variants build (449M parameters, the SigLIP tower most of them), then
  fail at the first call: image features of 2048 against language embeddings of 64.
  While RLinf builds, :func:`model_sizes` adds two variants to openpi's table, gives the
  fork's PaliGemma config a vision tower of the given size (its projection as wide as the
  language model) and RLinf's value head the expert's width. The vocabulary (257,152) and the
  224 x 224 input resolution are kept.

Everything else (input transforms, denoising, log-probs, values) is RLinf's and openpi's code.
Needs ``make test-openpi``'s venv (.venv-openpi).
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

#: openpi's dataconfig whose transforms fit a single-camera simulator: RLinf's ManiSkill one
#: (one image, the state padded to 32, the first 7 action dims out)
CONFIG_NAME = "pi0_maniskill"
#: the asset id RLinf's ``pi0_maniskill`` reads its norm stats under
ASSET_ID = "physical-intelligence/maniskill"
#: where openpi's download cache looks for the PaliGemma tokenizer (under $OPENPI_DATA_HOME)
TOKENIZER = "big_vision/paligemma_tokenizer.model"
#: pi0's padded state and action width (openpi's ``Pi0Config.action_dim``)
MODEL_DIM = 32
#: the two Gemma variants :func:`model_sizes` adds to openpi's table
VLM_VARIANT, EXPERT_VARIANT = "ebrl_vlm", "ebrl_expert"

#: a pi0 a CPU trains (conf/policy/pi0_tiny.yaml): one layer each, two heads of 8
TINY: dict[str, dict[str, int]] = {
    "vlm": {
        "width": 32,
        "depth": 1,
        "mlp_dim": 64,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 8,
    },
    "expert": {
        "width": 16,
        "depth": 1,
        "mlp_dim": 32,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 8,
    },
    # 224 / 56 = 4 x 4 patches per image
    "vision": {
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "patch_size": 56,
    },
}


#: pi0's real architecture (openpi's ``gemma_2b`` and ``gemma_300m`` variants, PaliGemma-3B's
#: SigLIP So400m/14 tower), built from random weights through :func:`model_sizes`: what a GPU
#: check measures without a checkpoint (3.3B parameters as pi0, plus the value head)
FULL: dict[str, dict[str, int]] = {
    "vlm": {
        "width": 2048,
        "depth": 18,
        "mlp_dim": 16_384,
        "num_heads": 8,
        "num_kv_heads": 1,
        "head_dim": 256,
    },
    "expert": {
        "width": 1024,
        "depth": 18,
        "mlp_dim": 4096,
        "num_heads": 8,
        "num_kv_heads": 1,
        "head_dim": 256,
    },
    # 224 / 14 = 16 x 16 patches per image
    "vision": {
        "hidden_size": 1152,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "intermediate_size": 4304,
        "patch_size": 14,
    },
}
#: ``sizes`` a config may name instead of giving them
SIZES: dict[str, dict[str, dict[str, int]]] = {"tiny": TINY, "full": FULL}


def train_tokenizer(lines: Sequence[str], vocab_size: int = 300) -> bytes:
    """A SentencePiece model (bytes) trained on ``lines``, with byte fallback: it encodes any
    text, and its ids stay far below PaliGemma's vocabulary."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([*lines, "pick place push open close the a to on"]),
        model_writer=out,
        model_type="bpe",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        byte_fallback=True,
        character_coverage=1.0,
        minloglevel=2,
    )
    return out.getvalue()


def write_assets(
    model_path: pathlib.Path | str,
    data_home: pathlib.Path | str,
    *,
    prompts: Sequence[str] = ("do the task",),
    state_mean: np.ndarray | None = None,
    state_std: np.ndarray | None = None,
    asset_id: str = ASSET_ID,
) -> pathlib.Path:
    """What RLinf's openpi builder reads, written offline.

    ``model_path``: ``model.safetensors`` with no tensors (RLinf loads it with strict=False: the
    model keeps its random init) unless a weights file is there already, and the norm stats of
    the state and the actions (mean 0, std 1 unless given: the identity) under ``asset_id``.
    ``data_home``: a tokenizer trained on ``prompts`` where openpi's download cache finds it.
    Returns ``model_path``."""
    import safetensors.torch
    from openpi.shared import normalize

    root = pathlib.Path(model_path)
    root.mkdir(parents=True, exist_ok=True)
    zeros, ones = np.zeros(MODEL_DIM), np.ones(MODEL_DIM)

    def pad(x: np.ndarray | None, fill: np.ndarray) -> np.ndarray:
        if x is None:
            return fill
        return np.concatenate([np.asarray(x, dtype=np.float64), fill[len(x) :]])

    state = normalize.NormStats(
        mean=pad(state_mean, zeros), std=pad(state_std, ones), q01=-ones, q99=ones
    )
    actions = normalize.NormStats(mean=zeros, std=ones, q01=-ones, q99=ones)
    normalize.save(root / asset_id, {"state": state, "actions": actions})
    has_weights = any(root.glob("*.safetensors")) or (root / "model_state_dict").exists()
    if not has_weights:
        safetensors.torch.save_file({}, str(root / "model.safetensors"))
    tok = pathlib.Path(data_home) / TOKENIZER
    tok.parent.mkdir(parents=True, exist_ok=True)
    tok.write_bytes(train_tokenizer(list(prompts)))
    return root


@contextlib.contextmanager
def _setattr(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def model_sizes(sizes: Mapping[str, Mapping[str, int]]) -> Iterator[None]:
    """While it is open, openpi and RLinf build pi0 at ``sizes`` (:data:`TINY`'s keys) when its
    config names :data:`VLM_VARIANT` and :data:`EXPERT_VARIANT`: the two Gemma variants join
    openpi's table, the fork's PaliGemma config gets a SigLIP of ``sizes["vision"]`` projecting
    to the language model's width, and RLinf's value head reads the expert's width."""
    import openpi.models.gemma as gemma
    import openpi.models_pytorch.gemma_pytorch as gemma_pytorch
    import rlinf.models.embodiment.openpi.openpi_action_model as action_model

    variants = {
        VLM_VARIANT: gemma.Config(**sizes["vlm"]),
        EXPERT_VARIANT: gemma.Config(**sizes["expert"]),
    }
    openpi_get_config = gemma.get_config

    def get_config(variant: str) -> Any:
        return variants[variant] if variant in variants else openpi_get_config(variant)

    vision = dict(sizes["vision"])
    build_paligemma = gemma_pytorch.PaliGemmaForConditionalGeneration

    def paligemma(config: Any) -> Any:
        # openpi has set PaliGemma-3B's vision tower and a projection to 2048 on this config
        for key, value in vision.items():
            setattr(config.vision_config, key, value)
        config.vision_config.projection_dim = config.text_config.hidden_size
        side = config.vision_config.image_size // config.vision_config.patch_size
        config.text_config.num_image_tokens = side * side
        return build_paligemma(config=config)

    rlinf_value_head = action_model.ValueHead
    expert_width = int(sizes["expert"]["width"])

    def value_head(*, input_dim: int, **kwargs: Any) -> Any:
        return rlinf_value_head(input_dim=expert_width, **kwargs)

    with (
        _setattr(gemma, "get_config", get_config),
        _setattr(gemma_pytorch, "PaliGemmaForConditionalGeneration", paligemma),
        _setattr(action_model, "ValueHead", value_head),
    ):
        yield


def asset_id(config_name: str, model_path: str) -> str:
    """The asset id RLinf's openpi builder reads a checkpoint's norm stats under
    (``<model_path>/<asset id>/norm_stats.json``) for openpi dataconfig ``config_name``
    (``physical-intelligence/libero`` for ``pi0_libero`` and ``pi05_libero``)."""
    from rlinf.models.embodiment.openpi.dataconfig import get_openpi_config

    data = get_openpi_config(config_name, model_path=model_path).data
    return str(data.assets.asset_id or data.repo_id)


def tokenizer_path() -> pathlib.Path:
    """Where openpi's download cache holds the PaliGemma tokenizer (``$OPENPI_DATA_HOME``,
    default ``~/.cache/openpi``): a real checkpoint's run reads it there, offline."""
    home = os.environ.get("OPENPI_DATA_HOME", "~/.cache/openpi")
    return pathlib.Path(home).expanduser() / TOKENIZER


def check_checkpoint(model_path: str, config_name: str) -> None:
    """What a real pi0 / pi0.5 run (``sizes: null``) reads before RLinf builds it, offline: the
    checkpoint directory, its norm stats under the dataconfig's asset id, and the PaliGemma
    tokenizer in openpi's cache. Nothing is written: a real checkpoint keeps its own stats.

    Raises:
        FileNotFoundError: naming the missing file and where to get it.
    """
    root = pathlib.Path(model_path)
    if not root.is_dir():
        raise FileNotFoundError(
            f"openpi checkpoint {model_path} is not a directory: download it (huggingface-cli "
            "download <its hub id> --local-dir <dir>) and set policy.model_cfg.model_path"
        )
    stats = root / asset_id(config_name, str(root)) / "norm_stats.json"
    if not stats.exists():
        raise FileNotFoundError(
            f"openpi checkpoint {model_path} has no norm stats for dataconfig {config_name!r} "
            f"({stats} is missing): use the checkpoint trained with that dataconfig, or set "
            "policy.model_cfg.openpi.config_name to its own"
        )
    tok = tokenizer_path()
    if not tok.exists():
        raise FileNotFoundError(
            f"openpi reads the PaliGemma tokenizer from {tok}, which is missing (compute nodes "
            "do not download): copy gs://big_vision/paligemma_tokenizer.model there "
            "(gsutil cp, or from another openpi cache), or set OPENPI_DATA_HOME to a cache "
            "that has it"
        )


def get_model(cfg: Any) -> Any:
    """RLinf's ``get_model`` for ``cfg`` (RLinf's ``actor.model`` node with
    ``model_type: openpi``), offline.

    ``cfg.sizes`` (default :data:`TINY`; a name of :data:`SIZES`, ``tiny`` or ``full``, or the
    sizes themselves): the sizes :func:`model_sizes` builds at, from random weights, with the
    assets :func:`write_assets` writes (norm stats into ``cfg.model_path`` unless it has them,
    a tokenizer trained on ``cfg.prompts`` in a scratch cache). ``sizes:
    null``: openpi's own variants as ``cfg.openpi`` names them, a real checkpoint
    (``cfg.model_path``, required) read as it is (:func:`check_checkpoint`: nothing written),
    openpi's own tokenizer. ``cfg.openpi`` is RLinf's override of openpi's model config
    (``config_name``: the dataconfig, default :data:`CONFIG_NAME`); the executed chunk
    (``action_chunk``), the env's action size (``action_env_dim``) and ``add_value_head`` are
    filled from ebrl's node where absent, and the model's horizon (``action_horizon``) too at
    test sizes (a checkpoint keeps its own: 50 for pi0, 10 for pi0.5)."""
    from omegaconf import OmegaConf
    from rlinf.models import get_model as rlinf_get_model

    node = OmegaConf.to_container(cfg, resolve=True)
    sizes = node.pop("sizes", TINY)
    if isinstance(sizes, str):
        if sizes not in SIZES:
            raise ValueError(
                f"openpi sizes {sizes!r} unknown: name one of {sorted(SIZES)}, give the sizes "
                "(vlm, expert, vision), or null for a real checkpoint"
            )
        sizes = SIZES[sizes]
    prompts = node.pop("prompts", None) or ["do the task"]
    k = int(node["num_action_chunks"])
    openpi = {
        "config_name": CONFIG_NAME,
        "action_chunk": k,
        "action_env_dim": int(node["action_dim"]),
        "add_value_head": bool(node.get("add_value_head", True)),
        **({"action_horizon": k} if sizes is not None else {}),
        **(node.get("openpi") or {}),
    }
    node["openpi"] = openpi
    if sizes is None:  # a real checkpoint: read, never written
        if not node.get("model_path"):
            raise ValueError(
                "openpi at its real sizes (sizes: null) needs a checkpoint: set "
                "policy.model_cfg.model_path to its local directory"
            )
        check_checkpoint(str(node["model_path"]), str(openpi["config_name"]))
        return rlinf_get_model(OmegaConf.create(node))
    openpi.update(paligemma_variant=VLM_VARIANT, action_expert_variant=EXPERT_VARIANT)
    with contextlib.ExitStack() as stack:
        scratch = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="openpi-")))
        model_path = pathlib.Path(node.get("model_path") or scratch / "checkpoint")
        node["model_path"] = str(model_path)
        asset = asset_id(str(openpi["config_name"]), str(model_path))
        if not (model_path / asset / "norm_stats.json").exists():
            write_assets(model_path, scratch, prompts=prompts, asset_id=asset)
        else:  # the tokenizer only
            write_assets(scratch / "unused", scratch, prompts=prompts, asset_id=asset)
        stack.enter_context(_environ("OPENPI_DATA_HOME", str(scratch)))
        stack.enter_context(model_sizes(sizes))
        return rlinf_get_model(OmegaConf.create(node))


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
