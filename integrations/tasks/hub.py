"""SD3 / FLUX text-to-image training as a trainer task (:class:`vgrpo_lib.algorithms.tasks.TaskProtocol`).

    from vgrpo_lib.integrations.diffusers_adapters import load_sd35_medium
    from vgrpo_lib.integrations.tasks.hub import DiffusersTask

    base = load_sd35_medium(device="cuda", lora_rank=None)        # frozen pipeline, no adapter yet
    task = DiffusersTask(base, prompts="prompts.txt", reward="pickscore", image_size=512)
    policy = task.load_policy()                                   # the transformer + a trainable LoRA adapter
    cond = task.condition(["a photo of a cat"] * 4)               # TensorDict[4] of prompt embeddings

The trainer (``vgrpo train --preset sd3.5-medium model.prompts=prompts.txt``) builds the task through
:func:`hub_task`, configured by the run config's ``model`` section (saved with the run, so ``--resume`` needs
nothing else); tests and scripts can build a :class:`DiffusersTask` directly.

Where the tensors live. The trainer keeps its batches on the CPU (the testbed never needed a device, and
its replay buffer stores rows on the CPU). The policy (:class:`LoRAPolicy`) moves each call's inputs to the
GPU that holds the transformer and returns the velocity on the caller's device, so the trainer, the
samplers and the losses are unchanged; the per-call copies (latents and prompt embeddings) cost about 1-3 %
of a 2.5B-parameter forward. ``decode`` returns images on the CPU; model-based rewards move them to
their own device. Evaluation (:meth:`DiffusersTask.sample`) runs entirely on the GPU.

What is trained and saved. Only the LoRA parameters of the adapter ``"default"`` require grad, and
``policy.state_dict()`` holds only them (a few MB to ~100 MB instead of the 5 GB SD3.5-M / 24 GB FLUX
transformer), so the trainer's checkpoints stay small; ``load_state_dict`` loads them back and still
reports missing or unexpected LoRA keys. The reference policy is the same transformer with its adapters
switched off (:class:`vgrpo_lib.integrations.diffusers_adapters.AdapterReference`), not a copy; with GARDO's
reference reset (``schedule.reference_reset``) a third frozen adapter ``"reference"`` that each reset copies the
trained one into.

Known costs and differences (documented, not hidden):

- The behaviour policy (DiffusionNFT's old policy) is a second, frozen LoRA adapter ``"old"`` of the same
  transformer (:meth:`DiffusersTask.behaviour_policy`), so it costs the adapter's weights, not a second
  transformer; its checkpointed state is its LoRA weights.
- Training rollouts use the pipeline scheduler's own grid (:meth:`DiffusersTask.time_grid`, also used for
  evaluation) unless ``rollout.shift`` is set, in which case ``vgrpo_lib.samplers.time_grid(num_steps, shift)``.
- The prompt-embedding cache keeps up to ``cache_size`` distinct prompts on the CPU (SD3: 77 + 256 tokens
  x 4096 in bf16 = 2.7 MB per prompt; FLUX: 512 tokens = 4.2 MB; FLUX.2-dev: 512 x 15360 = 15.7 MB, so 1000
  training prompts hold 16 GB; klein 4B: 7.9 MB; Qwen-Image: 256 x 3584 = 1.8 MB), least recently used first out.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from vgrpo_lib.extras import needs_extra
from vgrpo_lib.integrations.diffusers_adapters.checkpointing import enable_block_checkpointing
from vgrpo_lib.integrations.diffusers_adapters.lora import (
    TRAINED_ADAPTER, AdapterBehaviour, AdapterReference, add_lora, upcast_trainable_parameters,
)
from vgrpo_lib.integrations.diffusers_adapters.presets import (
    FLUX1_DEV, FLUX2_DEV, FLUX2_KLEIN, QWEN_IMAGE, SD35_MEDIUM, DiffusersPolicy, absent_components, load_policy,
)
from vgrpo_lib.integrations.diffusers_adapters.velocity import FlowTransformerAdapter
from vgrpo_lib.integrations.diffusers_adapters.wan import WAN21_T2V, load_wan
from vgrpo_lib.integrations.figures import prompt_rows, write_labelled_grid
from vgrpo_lib.integrations.metrics import diversity
from vgrpo_lib.integrations.packed_weights import loading_code
from vgrpo_lib.integrations.rewards import MultiReward, get_reward
from vgrpo_lib.integrations.rewards.loading import MissingWeightsError
from vgrpo_lib.integrations.rewards.remote import is_remote_spec, remote_reward
from vgrpo_lib.integrations.tasks.imports import is_import_path, load_import_path
from vgrpo_lib.integrations.testbed.mnist_sd3.build import PIPELINE_DIR
from vgrpo_lib.integrations.testbed.mnist_wan.build import PIPELINE_DIR as MNIST_WAN_DIR
from vgrpo_lib.samplers import sample_ode
from vgrpo_lib.errors import UsageError

__all__ = ["HUB_MODELS", "DiffusersTask", "HubModel", "ImportedMultiReward", "ImportedReward", "LoRAPolicy",
           "TotalReward", "base_pipeline_code", "hub_task", "imported_reward", "make_reward", "read_prompts",
           "weights_location"]


def _is_trained_lora(key: str) -> bool:
    return "lora_" in key and f".{TRAINED_ADAPTER}." in key


class LoRAPolicy(nn.Module):
    """The trainable policy: a velocity adapter whose transformer carries the LoRA adapter ``"default"``.

    Call ``policy(x_t, t, cond) -> v`` like any protocol model. Inputs are moved to the transformer's device
    and ``v`` comes back on the device of ``x_t`` (see the module doc). ``state_dict()`` holds only the trained
    adapter's LoRA weights; ``load_state_dict`` loads such a dict (strict about the LoRA keys).

    Args:
        velocity: an ``SD3Velocity`` / ``FluxVelocity`` whose transformer already has the LoRA adapter.
    """

    moves_inputs = True  # the losses accept its batches on any device (the trainer's stay on the CPU)

    def __init__(self, velocity: FlowTransformerAdapter):
        super().__init__()
        self.velocity = velocity
        self.register_state_dict_post_hook(_keep_trained_lora)
        self.register_load_state_dict_post_hook(_ignore_missing_frozen)

    @property
    def transformer(self) -> nn.Module:
        """The wrapped diffusers transformer (what ``AdapterView`` switches adapters on)."""
        return self.velocity.transformer

    @property
    def device(self) -> torch.device:
        return next(self.velocity.parameters()).device

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: TensorDict | None) -> torch.Tensor:
        device = self.device
        cond = None if cond is None else cond.to(device)
        return self.velocity(x_t.to(device), t.to(device), cond).to(x_t.device)


def _keep_trained_lora(module, state_dict, prefix, local_metadata) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and not _is_trained_lora(k)]:
        del state_dict[key]


def _ignore_missing_frozen(module, incompatible_keys) -> None:
    incompatible_keys.missing_keys[:] = [k for k in incompatible_keys.missing_keys if _is_trained_lora(k)]


def _short(text: str, length: int = 48) -> str:
    """``text`` cut to ``length`` characters (an ellipsis marks the cut): a row label."""
    return text if len(text) <= length else text[: length - 1] + "\u2026"


def read_prompts(source: str | os.PathLike | Sequence[str]) -> list[str]:
    """Prompts from a list of strings or a UTF-8 text file with one prompt per line (blank lines skipped); a
    :class:`~vgrpo_lib.errors.UsageError` naming the file when it is not UTF-8 or holds no prompt."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {str(path)!r} does not exist (one prompt per line expected)")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(f"prompt file {str(path)!r} is not UTF-8 text (byte {error.start}: "
                             f"{error.object[error.start:error.start + 1]!r}); save it as UTF-8.") from None
        prompts = [line.strip() for line in text.splitlines()]
        prompts = [p for p in prompts if p]
    else:
        prompts = [str(p) for p in source]
    if not prompts:
        raise UsageError(f"no prompts in {source!r}")
    return prompts


class TotalReward(nn.Module):
    """A :class:`vgrpo_lib.integrations.rewards.MultiReward` as a plain ``(B,)`` reward: its weighted sum ``total``.

    ``stack(images, prompts)`` gives the raw scores ``(B, R)`` in ``names`` order with ``weights`` ``(R,)`` (the
    trainer normalises them as ``advantage.multi_reward`` says), ``components`` the same as ``{name: (B,)}``.
    """

    def __init__(self, multi: nn.Module):
        super().__init__()
        self.multi = multi

    @property
    def names(self) -> list[str]:
        return list(self.multi.names)

    @property
    def weights(self) -> torch.Tensor:
        return self.multi.weights

    def forward(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.multi(images, prompts).total

    def stack(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.multi(images, prompts).per_reward

    def components(self, images: torch.Tensor, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
        per_reward = self.multi(images, prompts).per_reward
        return {name: per_reward[:, i] for i, name in enumerate(self.multi.names)}


class ImportedReward:
    """A user's reward ``fn(images, prompts) -> (B,)``, named by its import path, checked on its first call.

    ``images`` ``(B, 3, H, W)`` float in [0, 1] (on the CPU), ``prompts`` B strings; the result must be a float
    tensor ``(B,)``. A reward with several columns ``(B, R)`` declares them: ``fn.names`` (R strings) and optionally
    ``fn.weights`` (R floats, default 1); it is then a multi-reward (:class:`ImportedMultiReward`) whose columns the
    trainer normalises as ``advantage.multi_reward`` says. A wrong result is a ``ValueError`` that names ``source``.
    """

    def __init__(self, fn: Callable, source: str):
        self.fn, self.source, self._checked = fn, source, False

    def _check(self, result, images: torch.Tensor, columns: int | None) -> torch.Tensor:
        expected = (images.shape[0],) if columns is None else (images.shape[0], columns)
        if not isinstance(result, torch.Tensor):
            raise ValueError(f"The reward {self.source} returned a {type(result).__name__}; it must return a float "
                             f"tensor of shape {expected} (one score per image).")
        if result.ndim == 2 and columns is None:
            raise ValueError(f"The reward {self.source} returned shape {tuple(result.shape)}: a reward with several "
                             f"columns must declare them as `{self.source.split(':')[1]}.names` (one name per column; "
                             f"`.weights` optional), or return {expected}.")
        if tuple(result.shape) != expected:
            raise ValueError(f"The reward {self.source} returned shape {tuple(result.shape)} for {images.shape[0]} "
                             f"images; expected {expected}.")
        if not result.is_floating_point():
            raise ValueError(f"The reward {self.source} returned dtype {result.dtype}; it must be a float tensor.")
        self._checked = True
        return result

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        result = self.fn(images, prompts)
        return result if self._checked else self._check(result, images, None)


class ImportedMultiReward(ImportedReward):
    """An :class:`ImportedReward` with columns ``(B, R)``: ``stack`` gives them (``names`` order), a call their sum
    weighted by ``weights`` ``(R,)`` (the shape of :class:`TotalReward`, which the trainer reads)."""

    def __init__(self, fn: Callable, source: str):
        super().__init__(fn, source)
        names = getattr(fn, "names")
        if isinstance(names, str) or not names or not all(isinstance(n, str) for n in names):
            raise UsageError(f"The reward {source}: `names` must be a non-empty list of strings, got {names!r}.")
        self.names = list(names)
        weights = getattr(fn, "weights", None)
        self.weights = torch.ones(len(self.names)) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
        if self.weights.shape != (len(self.names),):
            raise UsageError(f"The reward {source}: `weights` must hold one weight per name ({len(self.names)}), got "
                             f"shape {tuple(self.weights.shape)}.")

    def stack(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        result = self.fn(images, prompts)
        return result if self._checked else self._check(result, images, len(self.names))

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        scores = self.stack(images, prompts)
        return scores @ self.weights.to(scores)


def imported_reward(path: str) -> ImportedReward:
    """The reward callable at the import path ``"package.module:function"``, checked on its first call
    (:class:`ImportedMultiReward` when it declares ``names``); one-line ``ValueError`` for a bad path."""
    fn = load_import_path(path, "reward")
    if not callable(fn):
        raise UsageError(f"The reward {path!r} is a {type(fn).__name__}, not a callable (images, prompts) -> rewards.")
    return ImportedMultiReward(fn, path) if hasattr(fn, "names") else ImportedReward(fn, path)


def make_reward(spec: str | Mapping[str, float] | Callable) -> Callable:
    """A ``reward(images, prompts) -> (B,)`` from the reward zoo or the user's own code.

    ``spec``: a registered name (``"pickscore"``), a weighted spec ``"pickscore:1,ocr:0.5"`` or a mapping
    ``{"pickscore": 1.0, "ocr": 0.5}`` (a :class:`MultiReward`, trained on its weighted sum), an import path
    ``"my_package.my_module:my_reward"`` of any callable ``(images, prompts) -> (B,)`` (:func:`imported_reward`;
    ``model.reward=my_module:my_reward``), the URL of a served reward ``"http://HOST:PORT/NAME"``
    (:func:`vgrpo_lib.integrations.rewards.remote.remote_reward`; also inside a weighted spec, mixed with local
    rewards: ``"http://HOST:PORT/pickscore:1,ocr:0.5"``), or any callable (returned unchanged).
    """
    if callable(spec) and not isinstance(spec, str):
        return spec
    if isinstance(spec, str) and is_import_path(spec.strip()):
        return imported_reward(spec.strip())
    if isinstance(spec, str) and is_remote_spec(spec) and "," not in spec and _split_weight(spec.strip())[1] is None:
        return remote_reward(spec.strip())
    if isinstance(spec, str) and ":" not in spec and "," not in spec:
        return get_reward(spec.strip())
    if isinstance(spec, str):
        items = [_split_weight(item.strip()) for item in spec.split(",")]
    else:
        items = [(str(name), float(weight)) for name, weight in dict(spec).items()]
    return TotalReward(_weighted_rewards([(name, 1.0 if weight is None else weight) for name, weight in items]))


def _split_weight(item: str) -> tuple[str, float | None]:
    """``"name:0.5"`` -> ``("name", 0.5)``; a URL keeps its own colons: ``"http://h:8000/ocr:0.5"`` ->
    ``("http://h:8000/ocr", 0.5)``; the weight is None when the item has none."""
    if not is_remote_spec(item):
        name, _, weight = item.partition(":")
        return name.strip(), float(weight) if weight else None
    head, colon, tail = item.rpartition(":")
    if colon and "/" in head.partition("://")[2]:  # the colon follows the URL's path: a weight
        try:
            return head, float(tail)
        except ValueError:
            pass
    return item, None


def _weighted_rewards(items: list[tuple[str, float]]) -> MultiReward:
    """A :class:`MultiReward` of registered names and served rewards (URLs, each named by the reward it serves,
    ``remote_NAME`` beside a local reward of the same name; a UsageError when two items still share a name)."""
    served = {name: remote_reward(name) for name, _ in items if is_remote_spec(name)}
    short = [served[name].options.name.replace(".", "_") if name in served else name for name, _ in items]
    keys = [f"remote_{s}" if name in served and short.count(s) > 1 else s for s, (name, _) in zip(short, items)]
    if len(set(keys)) < len(keys):
        raise UsageError(f"The weighted reward names a reward twice: {', '.join(name for name, _ in items)}.")
    return MultiReward({key: weight for key, (_, weight) in zip(keys, items)},
                       rewards={key: served[name] for key, (name, _) in zip(keys, items) if name in served})


class DiffusersTask:
    """A diffusers text-to-image model, prompts and a reward, as the trainer's task.

    Args:
        base: a :class:`DiffusersPolicy` loaded WITHOUT an adapter (``load_policy(..., lora_rank=None)``); its
            pipeline supplies the transformer, text encoders, VAE and scheduler. The task adapts its
            transformer in place.
        prompts: training prompts, a list of strings or a text file (one per line).
        reward: see :func:`make_reward` (name, ``"a:1,b:0.5"``, mapping or callable).
        image_size: ``H`` or ``(H, W)`` in pixels (multiples of 16): the training rollouts' size.
        eval_image_size: the size of :meth:`sample`'s images (evaluation, ``vgrpo sample``), ``H`` or ``(H, W)``;
            default ``image_size``. Training at a lower resolution than the evaluation saves the rollout's and the
            update's memory and time (the latents' tokens grow with the area); the LoRA adapter applies at any size.
        eval_prompts: evaluation prompts (list or file); default: the first 8 training prompts.
        lora_rank, lora_alpha: the trained adapter (paper SD3.5-M: r=32, alpha=64), on the attention
            projections; only its parameters are trainable.
        max_sequence_length: T5 tokens per prompt (None: the pipeline's default, 256 SD3 / 512 FLUX).
        gradient_checkpointing: recompute the transformer's activations in backward (needed at 512-1024 px).
        gradient_checkpointing_every: with ``gradient_checkpointing``, recompute only every N-th transformer block
            (:func:`~vgrpo_lib.integrations.diffusers_adapters.checkpointing.enable_block_checkpointing`; 1: all).
        batch_size: samples per forward when evaluating, per VAE decode and per text-encoder call.
        cache_size: distinct prompts whose embeddings are kept (least recently used dropped first).
        eval_solver: ODE solver for :meth:`sample` (the pipelines' scheduler is Euler).
        metrics: ``metrics(images, prompts, rewards) -> dict`` of further evaluation numbers (e.g. accuracy and
            an independent judge's accuracy; ``rewards`` ``(B,)`` are the images' reward), merged into
            :meth:`evaluate`.
        label: ``label(prompt) -> int | str``, what a prompt asks for (a digit, a number), written beside the
            images by ``vgrpo sample``.
        evaluation_metrics: the headline numbers of :meth:`evaluate` and their labels, ``{key: label}`` (the
            trainer checks them, plots them and shows the first while training); default ``reward_mean``.
        negative_prompt, true_cfg_scale: evaluation samples under the pipeline's CFG against this prompt at this
            scale (Qwen-Image: its norm-rescaled true CFG) when the prompt is set and the scale exceeds 1; else
            CFG-free. Training never uses them.
    """

    def __init__(self, base: DiffusersPolicy, prompts, reward, image_size: int | tuple[int, int] = 512, *,
                 eval_prompts=None, lora_rank: int = 32, lora_alpha: int = 64, max_sequence_length: int | None = None,
                 gradient_checkpointing: bool = False, gradient_checkpointing_every: int = 1, batch_size: int = 8,
                 cache_size: int = 4096,
                 eval_solver: str = "euler", metrics: Callable | None = None, label: Callable | None = None,
                 evaluation_metrics: Mapping[str, str] | None = None, negative_prompt: str | None = None,
                 true_cfg_scale: float = 1.0, eval_image_size: int | tuple[int, int] | None = None):
        if getattr(base.model.transformer, "peft_config", None):
            raise ValueError("DiffusersTask adds its own LoRA adapter: load the DiffusersPolicy with lora_rank=None.")
        self.base = base
        self.height, self.width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.sample_shape = base.latent_shape(self.height, self.width)
        eval_size = image_size if eval_image_size is None else eval_image_size
        self.eval_height, self.eval_width = (eval_size, eval_size) if isinstance(eval_size, int) else tuple(eval_size)
        self.eval_sample_shape = base.latent_shape(self.eval_height, self.eval_width)
        self.prompts = read_prompts(prompts)
        self.eval_prompt_list = read_prompts(eval_prompts) if eval_prompts is not None else self.prompts[:8]
        self.reward_spec = reward
        self.lora_rank, self.lora_alpha = lora_rank, lora_alpha
        self.max_sequence_length = max_sequence_length
        self.gradient_checkpointing, self.gradient_checkpointing_every = gradient_checkpointing, gradient_checkpointing_every
        self.batch_size, self.cache_size, self.eval_solver = batch_size, cache_size, eval_solver
        self.metrics, self.label = metrics, label
        self.evaluation_metrics = dict(evaluation_metrics or {"reward_mean": "mean reward"})
        if negative_prompt is not None and not hasattr(base, "spec"):
            raise ValueError(f"model.negative_prompt: true CFG at evaluation is for the image pipelines; "
                             f"{type(base).__name__} has none.")
        self.negative_prompt, self.true_cfg_scale = negative_prompt, true_cfg_scale
        self._cache: OrderedDict[str, TensorDict] = OrderedDict()
        self._policy: LoRAPolicy | None = None
        self._reward = None

    @property
    def device(self) -> torch.device:
        """Where the transformer (and the rest of the pipeline) lives."""
        return next(self.base.model.transformer.parameters()).device

    # -- prompts and conditioning ----------------------------------------------------------------------

    def sample_prompts(self, num_prompts: int, generator: torch.Generator | None = None) -> list[str]:
        """``num_prompts`` training prompts drawn uniformly with replacement."""
        index = torch.randint(len(self.prompts), (num_prompts,), generator=generator)
        return [self.prompts[i] for i in index.tolist()]

    def eval_prompts(self, per_prompt: int) -> list[str]:
        """Every evaluation prompt ``per_prompt`` times in a row."""
        return [p for p in self.eval_prompt_list for _ in range(per_prompt)]

    def condition(self, prompts: Sequence[str]) -> TensorDict:
        """TensorDict[B] of prompt embeddings (on the CPU) through the pipeline's encoders; each distinct
        prompt is encoded once and cached."""
        missing = list(dict.fromkeys(p for p in prompts if p not in self._cache))
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start : start + self.batch_size]
            encoded = self._encode(chunk).to("cpu")
            for i, prompt in enumerate(chunk):
                self._cache[prompt] = encoded[i].clone()
        rows = []
        for prompt in prompts:
            self._cache.move_to_end(prompt)
            rows.append(self._cache[prompt])
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return torch.stack(rows)

    def null_cond(self, cond: TensorDict) -> TensorDict:
        """The unconditional condition for CFG: the empty prompt's embeddings for every row of ``cond`` (entries it
        lacks, e.g. FLUX's per-sample guidance, are kept from ``cond``)."""
        null = self.condition([""]).to(cond.device).expand(cond.batch_size[0])
        return cond.clone().update(null.clone())

    def _encode(self, prompts: list[str]) -> TensorDict:
        kwargs = {} if self.max_sequence_length is None else {"max_sequence_length": self.max_sequence_length}
        return self.base.encode_prompts(prompts, **kwargs)

    # -- policies ------------------------------------------------------------------------------------------

    def load_policy(self) -> LoRAPolicy:
        """The base transformer with a fresh trainable LoRA adapter (B = 0: equal to the base model), float32
        LoRA weights on a bf16 base. One policy per task: the adapter lives inside the pipeline's transformer."""
        if self._policy is not None:
            raise RuntimeError("this DiffusersTask already made its policy (the LoRA adapter lives in the pipeline's "
                               "transformer); build a new task for a second, independent policy")
        transformer = self.base.model.transformer
        add_lora(transformer, r=self.lora_rank, alpha=self.lora_alpha, target_modules=self.base.lora_target_modules)
        upcast_trainable_parameters(transformer)
        if self.gradient_checkpointing:
            enable_block_checkpointing(transformer, self.gradient_checkpointing_every)
        self._policy = LoRAPolicy(self.base.model)
        return self._policy

    def reference_policy(self, policy: LoRAPolicy) -> AdapterReference:
        """The pretrained model: ``policy`` with its adapters switched off for each call (no copy); with GARDO's
        reference reset, a frozen adapter of it that each reset copies the trained one into."""
        return AdapterReference(policy)

    def behaviour_policy(self, policy: LoRAPolicy) -> AdapterBehaviour:
        """A soft-updated old policy: a frozen second adapter of ``policy``'s transformer, starting as a copy of
        the trained one (no second transformer)."""
        return AdapterBehaviour(policy)

    def time_grid(self, num_steps: int) -> list[float]:
        """The pipeline scheduler's time grid at the training resolution (num_steps + 1 times, 1 -> 0)."""
        return self.base.sigma_grid(num_steps, self.height, self.width)

    # -- sampling, decoding, rewards -------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, samples: torch.Tensor) -> torch.Tensor:
        """Latents ``(B, *sample_shape)`` -> float32 images ``(B, 3, H, W)`` in ``[0, 1]`` on the CPU."""
        device = self.device
        return torch.cat([self.base.decode(chunk.to(device)).cpu() for chunk in samples.split(self.batch_size)])

    def reward(self) -> Callable:
        """The reward ``reward(images, prompts) -> (B,)`` (built once, moved to the pipeline's device)."""
        if self._reward is None:
            reward = make_reward(self.reward_spec)
            self._reward = reward.to(self.device) if isinstance(reward, nn.Module) else reward
        return self._reward

    @torch.no_grad()
    def sample(self, policy: nn.Module, prompts: Sequence[str], num_steps: int = 40,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """ODE samples on the pipeline's own time grid (of :meth:`evaluation_policy`: CFG-free unless the task has a
        negative prompt), decoded: images ``(B, 3, H, W)`` on the CPU.

        All the initial noise is drawn up front on the CPU from ``generator`` (a seed gives the same images
        for any ``batch_size``); batches of ``batch_size`` are integrated on the pipeline's device. The images are
        ``eval_image_size`` (default: the training size), on the scheduler's grid at that resolution.
        """
        noise = torch.randn((len(prompts), *self.eval_sample_shape), generator=generator)
        grid = self.base.sigma_grid(num_steps, self.eval_height, self.eval_width)
        policy = self.evaluation_policy(policy)
        device, images = self.device, []
        for start in range(0, len(prompts), self.batch_size):
            chunk = list(prompts[start : start + self.batch_size])
            cond = self.condition(chunk).to(device)
            z = noise[start : start + len(chunk)].to(device)
            images.append(self.decode(sample_ode(policy, z, grid, cond, method=self.eval_solver)))
        return torch.cat(images)

    def evaluation_policy(self, policy: nn.Module) -> nn.Module:
        """``policy`` as :meth:`sample` integrates it: under the pipeline's CFG against ``negative_prompt`` at
        ``true_cfg_scale`` (the family's ``guidance``; Qwen-Image's norm-rescaled true CFG) when the prompt is set and
        the scale exceeds 1, else ``policy`` itself."""
        if self.negative_prompt is None or self.true_cfg_scale <= 1.0:
            return policy
        return self.base.spec.guidance(policy, self.condition([self.negative_prompt]), self.true_cfg_scale)

    def labels(self, prompts: Sequence[str]) -> list | None:
        """What each prompt asks for (``label(prompt)``), or None for a task without labels."""
        return None if self.label is None else [self.label(p) for p in prompts]

    @torch.no_grad()
    def evaluate(self, images: torch.Tensor, prompts: Sequence[str]) -> dict:
        """``reward_mean`` / ``reward_std`` (and ``reward/<name>`` for a weighted reward), ``diversity`` (mean
        pairwise RMS pixel distance between images of the same prompt) and the task's own ``metrics``."""
        reward = self.reward()
        scored = reward.multi(images, prompts) if isinstance(reward, TotalReward) else None  # each reward once
        scores = reward(images, prompts) if scored is None else scored.total
        out = {"num_samples": images.shape[0], "reward_mean": scores.mean().item(), "reward_std": scores.std(correction=0).item()}
        if scored is not None:
            out.update({f"reward/{k}": scored.per_reward[:, i].mean().item() for i, k in enumerate(reward.names)})
        ids = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
        out["diversity"] = diversity(images, torch.tensor([ids[p] for p in prompts]))
        if self.metrics is not None:
            out.update(self.metrics(images, list(prompts), scores))
        return out

    def write_samples(self, images: torch.Tensor, prompts: Sequence[str], path: str | os.PathLike, title: str = "",
                      max_rows: int = 30, max_per_row: int = 8, thumbnail: int = 128) -> Path:
        """A PNG grid of evaluation images (prompts repeated consecutively), each shrunk to at most ``thumbnail`` px,
        under ``title``, written atomically: one row per prompt labelled with it (whole, up to 48 characters), at most
        ``max_per_row`` images each. Every prompt has its row when there are at most ``max_rows`` (MNIST-SD3's 30
        digit prompts); else ``max_rows`` prompts evenly spaced over them, first and last included (30 of the OCR
        task's 108 numbers, two- and three-digit ones alike)."""
        per_prompt = sum(1 for p in prompts if p == prompts[0])
        index, starts = prompt_rows(len(prompts), per_prompt, max_per_row, max_rows, spread=True)
        images = images[index].float().clamp(0, 1)
        scale = min(1.0, thumbnail / max(images.shape[-2:]))
        if scale < 1.0:
            images = F.interpolate(images, scale_factor=scale, mode="bilinear", antialias=True).clamp(0, 1)
        labels = [_short(prompts[i]) for i in starts]
        if len(starts) < len(prompts) // per_prompt:
            title = f"{title} ({len(starts)} of {len(prompts) // per_prompt} prompts, evenly spaced)".strip()
        return write_labelled_grid(images, labels, title, path)

    def export_policy(self, policy: LoRAPolicy, directory: str | os.PathLike) -> dict[str, str]:
        """Write ``policy``'s trained LoRA adapter to ``directory`` in the diffusers format (peft's state dict of the
        adapter and its config as metadata, through the pipeline class's ``save_lora_weights``), so that
        ``Pipeline.from_pretrained(base).load_lora_weights(directory)`` gives the trained transformer. Returns the
        model card's facts: ``base_model`` and ``usage`` (Python code loading it)."""
        with needs_extra("diffusers", "Exporting a LoRA policy"):
            from peft.utils import get_peft_model_state_dict

        pipeline_class = type(self.base.pipe)
        transformer = policy.transformer
        pipeline_class.save_lora_weights(
            directory,
            transformer_lora_layers=get_peft_model_state_dict(transformer, adapter_name=TRAINED_ADAPTER),
            transformer_lora_adapter_metadata=transformer.peft_config[TRAINED_ADAPTER].to_dict(),
        )
        base_model = self.base.pipe.config._name_or_path
        usage = [*base_pipeline_code(pipeline_class.__name__, base_model), f"pipe.load_lora_weights({str(directory)!r})"]
        return {"base_model": base_model, "usage": "\n".join(usage)}


def base_pipeline_code(pipeline_class: str, base_model: str) -> list[str]:
    """The lines of an export's usage code that load its base pipeline: the imports, a blank line, and
    ``pipe = PipelineClass.from_pretrained(...)`` with the components the folder records as absent (a shipped,
    packed folder through ``unpacked_folder``)."""
    imports, source = loading_code(base_model)
    absent = "".join(f", {name}=None" for name in absent_components(base_model))
    return [f"from diffusers import {pipeline_class}", *imports, "", f"pipe = {pipeline_class}.from_pretrained({source}{absent})"]


# -- the hub tasks the trainer knows by name -------------------------------------------------------------


@dataclass(frozen=True)
class HubModel:
    """A named hub model: the checkpoint (a hub id or a local pipeline directory), its family and the default
    image size."""

    hub_id: str
    family: str
    image_size: int | tuple[int, int]


HUB_MODELS = {
    # Flow-GRPO's SD3.5-M recipe trains at 512 px.
    "sd3.5-medium": HubModel(SD35_MEDIUM, "sd3", 512),
    # DanceGRPO / MixGRPO train FLUX.1-dev at 720 px (uncertain for the V-GRPO paper, which does not say).
    "flux.1-dev": HubModel(FLUX1_DEV, "flux", 720),
    # Flow-Factory's FLUX.2 recipes train at 512 px (dev, examples/grpo/lora/flux2/t2i.yaml) and 384 px (klein base,
    # examples/grpo/lora/flux2_klein_base/default.yaml).
    "flux.2-dev": HubModel(FLUX2_DEV, "flux2", 512),
    "flux.2-klein": HubModel(FLUX2_KLEIN, "flux2-klein", 384),
    # Flow-Factory's Qwen-Image recipes train at 512 px (examples/grpo/lora/qwen_image/default.yaml).
    "qwen-image": HubModel(QWEN_IMAGE, "qwen-image", 512),
    # Wan 2.1 T2V 1.3B at WanPipeline's own size, 480x832 (its video length: model.frames, default 81); the
    # wan2.1-t2v preset trains at Flow-Factory's scale (vgrpo_lib.algorithms.presets.HUB_PRESETS).
    "wan2.1-t2v": HubModel(WAN21_T2V, "wan", (480, 832)),
    # The project's own StableDiffusion3Pipeline trained on MNIST, shipped in the repository (its tasks set the
    # image size per task: vgrpo_lib.integrations.tasks.mnist_sd3).
    "mnist-sd3": HubModel(str(PIPELINE_DIR), "sd3", 32),
    # The project's own WanPipeline trained on moving MNIST digits (9 frames of 32x32; its task sets them:
    # vgrpo_lib.integrations.tasks.mnist_wan).
    "mnist-wan": HubModel(str(MNIST_WAN_DIR), "wan", (32, 32)),
}

def weights_location(name_or_path: str) -> str | None:
    """A local directory holding the pipeline: ``name_or_path`` itself, or its Hugging Face cache snapshot; None
    when neither exists (no network access is attempted)."""
    if Path(name_or_path).is_dir():
        return str(name_or_path)
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(name_or_path, local_files_only=True)
    except Exception:  # not cached, malformed id, or an incomplete cache entry: all mean "not available"
        return None
    return path if (Path(path) / "model_index.json").is_file() else None


def hub_task(name: str, *, path: str | None = None, prompts=None, eval_prompts=None, reward=None,
             image_size: int | tuple[int, int] | None = None, lora_rank: int = 32, lora_alpha: int = 64,
             device: str | None = None, dtype: str = "bfloat16", max_sequence_length: int | None = None,
             gradient_checkpointing: bool | None = None, gradient_checkpointing_every: int = 1, batch_size: int = 8,
             without_t5: bool = False,
             metrics: Callable | None = None, label: Callable | None = None,
             evaluation_metrics: Mapping[str, str] | None = None, frames: int | None = None,
             negative_prompt: str | None = None, true_cfg_scale: float = 1.0,
             eval_image_size: int | tuple[int, int] | None = None) -> DiffusersTask:
    """Build the task of the hub model ``name`` (a key of :data:`HUB_MODELS`; the run config's ``model`` section,
    see :class:`vgrpo_lib.algorithms.config.ModelConfig`, gives the keyword arguments).

    ``path``: a local diffusers pipeline directory or hub id (default: the model's, looked up as a directory or
    in the Hugging Face cache; nothing is downloaded). ``prompts`` / ``eval_prompts``: a file or a list of
    strings. ``reward``: a reward spec or callable (default ``"pickscore"``). ``device``: default this process's
    GPU, the CPU without CUDA. ``gradient_checkpointing``: default on with CUDA. ``image_size``: default the
    model's (512 SD3.5-M, 720 FLUX.1-dev, 480x832 Wan). ``without_t5``: SD3 without its T5 encoder (``max_sequence_length``
    zero tokens instead, see :func:`vgrpo_lib.integrations.diffusers_adapters.presets.load_policy`). ``frames``: a
    video model's frames per sample (``wan2.1-t2v``: a :class:`vgrpo_lib.integrations.tasks.wan.WanTask`; default
    81). ``negative_prompt`` / ``true_cfg_scale``: evaluation under true CFG (image models). The other arguments are
    :class:`DiffusersTask`'s.

    Raises ``MissingWeightsError`` (a ``RuntimeError``) when the pipeline is neither at ``path`` nor in the Hugging
    Face cache, and ``ValueError`` when no prompt file is given; both say what is missing.
    """
    spec = HUB_MODELS[name]
    source = path or spec.hub_id
    location = weights_location(source)
    if location is None:
        raise MissingWeightsError(
            f"Task {name!r} trains {spec.hub_id}, whose weights are not available on this machine (looked for "
            f"{source!r} as a local directory and in the Hugging Face cache; no hub downloads at run time). "
            f"Download them once (`hf download {spec.hub_id}`) or set model.path=<local diffusers pipeline directory>."
        )
    if prompts is None:
        raise UsageError(f"Task {name!r} needs a prompt file: set model.prompts=<file with one prompt per line>.")
    cuda = torch.cuda.is_available()
    device = torch.device(device or (f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"))
    if spec.family == "wan":  # video: its own loader and task (tasks.wan builds on this module, so imported here)
        from vgrpo_lib.integrations.tasks.wan import WanTask

        if without_t5:
            raise ValueError(f"model.without_t5 applies to SD3 pipelines; task {name!r} has one UMT5 text encoder.")
        base = load_wan(location, **({} if frames is None else {"frames": frames}), device=device,
                        dtype=getattr(torch, dtype), autocast=device.type == "cuda", local_files_only=True)
        task_class = WanTask
    else:
        if frames is not None:
            raise ValueError(f"model.frames={frames} sets a video's length; task {name!r} makes images.")
        base = load_policy(location, spec.family, device=device, dtype=getattr(torch, dtype), lora_rank=None,
                           autocast=device.type == "cuda", local_files_only=True, without_t5=without_t5)
        task_class = DiffusersTask
    return task_class(
        base,
        prompts,
        "pickscore" if reward is None else reward,
        spec.image_size if image_size is None else image_size,
        eval_prompts=eval_prompts,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        max_sequence_length=max_sequence_length,
        gradient_checkpointing=device.type == "cuda" if gradient_checkpointing is None else gradient_checkpointing,
        gradient_checkpointing_every=gradient_checkpointing_every,
        batch_size=batch_size,
        metrics=metrics,
        label=label,
        evaluation_metrics=evaluation_metrics,
        negative_prompt=negative_prompt,
        true_cfg_scale=true_cfg_scale,
        eval_image_size=eval_image_size,
    )
