"""The shipped pipelines' model cards: what their card writers make of ``card.json``, and their code runs on the
current diffusers without a deprecation warning (``dtype=``, not the deprecated ``torch_dtype=``)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from vgrpo_lib.integrations.testbed.geneval_digits import pipeline as geneval_pipeline  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_sd3.build import PIPELINE_DIR  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_sd3.card import model_card  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_wan import card as mnist_wan_card  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_wan.build import PIPELINE_DIR as MNIST_WAN_DIR  # noqa: E402

REPOSITORY = Path(__file__).resolve().parents[3]
CARDS = {"mnist_sd3": (PIPELINE_DIR, model_card, "image"),
         "mnist_sd3_geneval": (geneval_pipeline.PIPELINE_DIR, geneval_pipeline.model_card, "image"),
         "mnist_wan": (MNIST_WAN_DIR, mnist_wan_card.model_card, "clip")}
"""name -> (the shipped folder, its card writer, the name of what the card's code makes)"""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CARDS))
def test_the_shipped_card_is_its_writers_text_and_its_code_runs_without_deprecation(name, monkeypatch):
    folder, writer, output = CARDS[name]
    readme = (folder / "README.md").read_text()
    assert readme == writer(json.loads((folder / "card.json").read_text()))
    assert "torch_dtype=torch" not in readme.replace("(older releases: torch_dtype=)", "")
    if not (folder / "model_index.json").is_file():
        pytest.skip(f"{folder} is not built")
    [code] = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    monkeypatch.chdir(REPOSITORY)  # the card's paths are relative to the repository
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # diffusers' deprecate() warns with FutureWarning
        namespace = {}
        exec(code.replace("num_inference_steps=20", "num_inference_steps=2"), namespace)  # noqa: S102
    made = namespace[output]
    assert (made.size[0] if output == "image" else made.shape[0]) > 0
    assert namespace["pipe"].transformer.dtype == torch.float32
