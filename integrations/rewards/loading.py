"""Loading pretrained weights by hub name or local path, and saying clearly when they are missing.

Reward models (and the SD3 / FLUX presets) load with `from_pretrained(name_or_path)`. When the
weights are neither a local directory nor in the Hugging Face cache and the machine is offline
(`HF_HUB_OFFLINE=1`) or has no network, the libraries raise a variety of OSError subclasses whose
messages mention connection errors. `load_weights` turns all of them into one
`MissingWeightsError` naming the model, what it is needed for, and how to get it. A local folder whose weight
file is damaged (truncated, emptied) or is a pickle that ``weights_only`` loading refuses is the same one line,
naming the file.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import SafetensorError, safe_open

from vgrpo_lib.extras import needs_extra

__all__ = [
    "T", "MissingWeightsError", "offline", "resolve_local_files_only", "load_weights", "unreadable_weight_files",
    "load_config_and_processors",
]

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}


class MissingWeightsError(RuntimeError):
    """Pretrained weights are needed and are not available locally (and cannot be downloaded)."""


def offline() -> bool:
    """True when the Hugging Face hub is switched off (`HF_HUB_OFFLINE` or `TRANSFORMERS_OFFLINE`)."""
    return any(os.environ.get(var, "").strip().lower() in _TRUE for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def resolve_local_files_only(local_files_only: bool | None) -> bool:
    """An explicit choice wins; otherwise load only local files when the hub is switched off."""
    return offline() if local_files_only is None else local_files_only


def load_weights(load: Callable[[], T], name: str, purpose: str) -> T:
    """Run `load()` and translate a missing-file error into `MissingWeightsError`. The global torch RNG is left
    as it was (a reward model built lazily, at its first call, does not change a run's random stream).

    Args:
        load: a zero-argument callable doing the actual `from_pretrained` / `hf_hub_download`.
        name: the hub name or path being loaded (quoted in the message).
        purpose: what the weights are for, e.g. "the PickScore reward model".
    """
    try:
        with torch.random.fork_rng(devices=[]):  # a model's random init must not move the global stream
            return load()
    except (SafetensorError, pickle.UnpicklingError) as err:  # transformers' loaders raise these unwrapped
        if not Path(name).is_dir():
            raise
        damaged = "; ".join(unreadable_weight_files(Path(name))) or f"{type(err).__name__}: {err}"
        raise MissingWeightsError(f"{purpose}: a weight file in the local directory '{name}' cannot be loaded: "
                                  f"{damaged}".replace("\n", " ")) from err
    except OSError as err:
        if Path(name).is_dir():
            raise MissingWeightsError(
                f"{purpose} needs the pretrained weights in the local directory '{name}', which is incomplete or "
                f"unreadable (is every component's folder there?). Underlying error: {type(err).__name__}: {err}"
            ) from err
        mode = "offline (HF_HUB_OFFLINE=1)" if offline() else "without the files in the local Hugging Face cache"
        raise MissingWeightsError(
            f"{purpose} needs the pretrained weights of '{name}', which could not be loaded {mode}. "
            f"Download them once on a machine with network access (`hf download {name}`, or "
            f"`huggingface-cli download {name}` with older hubs) and point HF_HOME at that cache, or pass a "
            f"local directory holding the weights. Underlying error: {type(err).__name__}: {err}"
        ) from err


def unreadable_weight_files(folder: Path) -> list[str]:
    """What is wrong with each weight file under ``folder`` that cannot be read, one ``"PATH: problem"`` each: a
    ``.safetensors`` whose header does not parse (truncated, emptied, not safetensors) and every pickled ``.bin`` /
    ``.pt`` / ``.pth`` (loaded only as safetensors-convertible tensors, ``weights_only``; any other pickle is refused
    unread). Reads the safetensors headers and the pickles' tensors only when called (an error path)."""
    problems = []
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".safetensors":
            try:
                with safe_open(path, framework="pt"):
                    pass
            except (SafetensorError, OSError) as err:
                problems.append(f"{path}: {err}")
        elif path.suffix in (".bin", ".pt", ".pth"):
            try:
                torch.load(path, map_location="cpu", weights_only=True)
            except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
                lines = str(err).strip().splitlines() or [type(err).__name__]
                reason = next((line for line in lines if "GLOBAL" in line), lines[0]).strip()  # what it would run
                problems.append(f"{path}: refused by weights_only loading ({reason})")
    return problems


def load_config_and_processors(config_class, name: str, local_files_only: bool, purpose: str, model_kind: str):
    """A transformers config, tokenizer and image processor from ``name`` (hub id or folder), each failing
    clearly when missing offline: the pieces a converted original checkpoint is loaded into."""
    with needs_extra("rewards", f"Loading {purpose}"):
        from transformers import AutoImageProcessor, AutoTokenizer

    def load(loader, what: str):
        return load_weights(lambda: loader.from_pretrained(name, local_files_only=local_files_only), name,
                            f"{purpose} ({what})")

    return (load(config_class, f"the {model_kind} config"), load(AutoTokenizer, f"the {model_kind} tokenizer"),
            load(AutoImageProcessor, f"the {model_kind} image processor config"))
