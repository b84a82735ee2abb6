"""Shipped checkpoints of the testbed: half-precision safetensors weights plus a JSON model card.

A checkpoint ``NAME`` is two files in ``integrations/testbed/checkpoints/``:

* ``NAME.safetensors.planes.xz``: the state dict stored in float16, as safetensors packed by
  :mod:`vgrpo_lib.integrations.packed_weights` (byte planes, xz: 9-13% smaller than gzip, so that the tree stays
  small; ``python -m vgrpo_lib.integrations.packed_weights unpack NAME.safetensors.planes.xz NAME.safetensors``
  gives the plain file, and :func:`weights_path` names it); a policy exported from a run (``vgrpo export``) is a
  plain ``NAME.safetensors`` in float32, which loads the same way;
* ``NAME.json``: ``{"name", "kind", "config", "card"}``: the model class, its constructor config
  and the model card (data, steps, seed, wall time, measured metrics).

``load_pretrained(NAME)`` rebuilds the model in float32 and eval mode. Written by
``python -m vgrpo_lib.integrations.testbed.pretrain``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load, save, save_file
from torch import nn

from vgrpo_lib.integrations.atomic import atomic_write
from vgrpo_lib.integrations.packed_weights import PACKED_SUFFIX, pack, read_packed
from vgrpo_lib.integrations.testbed.models import build_model

__all__ = [
    "CHECKPOINT_DIR", "POLICY_NAMES", "DETECTOR_NAMES", "FROZEN_NAMES", "CHECKPOINT_NAMES", "save_checkpoint",
    "read_card", "weights_path", "read_weights", "load_pretrained",
]

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"

POLICY_NAMES = ("digit_policy", "pair_policy", "digits8_policy")
DETECTOR_NAMES = ("digit_detector", "digit_detector_judge")
"""GenEval-on-digits detectors, written by ``python -m vgrpo_lib.integrations.testbed.geneval_digits.train_detector``."""
FROZEN_NAMES = ("classifier", "judge", "digits8_classifier", "digits8_judge") + DETECTOR_NAMES
CHECKPOINT_NAMES = POLICY_NAMES + FROZEN_NAMES
_SUFFIX = ".safetensors"


def save_checkpoint(name: str, model: nn.Module, card: dict, directory: Path = CHECKPOINT_DIR,
                    dtype: torch.dtype = torch.float16, compressed: bool = True) -> None:
    """Write ``NAME.safetensors.planes.xz`` (``NAME.safetensors`` when not ``compressed``; floating-point weights in
    ``dtype``: float16 for the shipped files) and ``NAME.json`` (kind, config, card) atomically; a copy of the
    weights in the other form is removed, so that :func:`weights_path` cannot pick a stale one."""
    _check_name(name)
    state = {k: v.detach().to(dtype).contiguous() if v.is_floating_point() else v.contiguous()
             for k, v in model.state_dict().items()}
    meta = {"name": name, "kind": type(model).__name__, "config": model.config, "card": card}
    plain = Path(directory) / f"{name}{_SUFFIX}"
    path, other = (_packed_path(plain), plain) if compressed else (plain, _packed_path(plain))

    def write_weights(tmp: str) -> None:
        if compressed:
            Path(tmp).write_bytes(pack(save(state), str(path)))
        else:
            save_file(state, tmp)

    atomic_write(path, write_weights)
    other.unlink(missing_ok=True)

    def write_json(tmp: str) -> None:
        with open(tmp, "w") as fh:
            json.dump(meta, fh, indent=2)
            fh.write("\n")

    atomic_write(Path(directory) / f"{name}.json", write_json)


def read_card(name: str, directory: Path = CHECKPOINT_DIR) -> dict:
    """The JSON metadata of checkpoint ``name``: ``{"name", "kind", "config", "card"}``."""
    _check_name(name)
    path = Path(directory) / f"{name}.json"
    if not path.exists():
        script = "geneval_digits.train_detector" if name in DETECTOR_NAMES else "pretrain"
        raise FileNotFoundError(
            f"checkpoint {name!r} is missing ({path}); build it with `python -m vgrpo_lib.integrations.testbed.{script} {name}`"
        )
    with open(path) as fh:
        return json.load(fh)


def weights_path(name: str, directory: Path = CHECKPOINT_DIR) -> Path:
    """Where checkpoint ``name``'s weights are stored: ``DIRECTORY/NAME.safetensors`` where that exists (an exported
    policy), else ``DIRECTORY/NAME.safetensors.planes.xz`` (the shipped form)."""
    _check_name(name)
    plain = Path(directory) / f"{name}{_SUFFIX}"
    return plain if plain.exists() else _packed_path(plain)


def _packed_path(path: Path) -> Path:
    return path.with_name(path.name + PACKED_SUFFIX)


def read_weights(name: str, directory: Path = CHECKPOINT_DIR) -> dict[str, torch.Tensor]:
    """Checkpoint ``name``'s state dict as stored (float16 floating-point tensors). Raises ``RuntimeError`` naming
    the file when it is truncated or corrupted. A packed file is decoded once per process."""
    path = weights_path(name, directory)
    try:
        return load(read_packed(path) if path.name.endswith(PACKED_SUFFIX) else path.read_bytes())
    except FileNotFoundError:
        raise
    except Exception as exc:  # unpacking and safetensors raise several types for truncated or corrupted files
        raise RuntimeError(f"cannot read checkpoint weights {path}: {exc}") from exc


def _check_name(name: str) -> None:
    if name not in CHECKPOINT_NAMES:
        raise ValueError(f"unknown checkpoint {name!r}; valid names: {', '.join(CHECKPOINT_NAMES)}")


def load_pretrained(name: str, directory: Path = CHECKPOINT_DIR) -> nn.Module:
    """A fresh float32 copy of shipped checkpoint ``name`` in eval mode.

    Policies (``*_policy``) come back with gradients enabled, ready to fine-tune; classifiers and
    judges come back frozen (``requires_grad=False``). Each call returns a new module, so callers
    may modify it freely. Loading never draws from the global RNG (a model built lazily, e.g. the judge at the
    first evaluation, leaves the training streams as they were). Raises ``ValueError`` for an unknown name, ``FileNotFoundError`` when
    the files are missing and ``RuntimeError`` when the weights do not match the stored config.
    """
    meta = read_card(name, directory)
    with torch.random.fork_rng(devices=[]):  # its random init is overwritten: it must not move the global stream
        model = build_model(meta["kind"], meta["config"])
    state = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in read_weights(name, directory).items()}
    model.load_state_dict(state, strict=True)
    model.eval()
    if name in FROZEN_NAMES:
        model.requires_grad_(False)
    return model
