"""Shipped checkpoints: present, small, half precision on disk, float32 when loaded, accurate."""

import lzma
import shutil

import pytest
import torch

from vgrpo_lib.integrations.testbed.checkpoints import (
    CHECKPOINT_DIR,
    CHECKPOINT_NAMES,
    FROZEN_NAMES,
    POLICY_NAMES,
    load_pretrained,
    read_card,
    read_weights,
    save_checkpoint,
    weights_path,
)
from vgrpo_lib.integrations.testbed.data import load_digits8, load_mnist
from vgrpo_lib.integrations.testbed.models import JudgeClassifier
from vgrpo_lib.integrations.testbed.pretrain import accuracy


def test_every_checkpoint_is_shipped_small_and_half_precision():
    total = 0
    for name in CHECKPOINT_NAMES:
        size = weights_path(name).stat().st_size
        assert size < 7e6, (name, size)
        total += size
        assert all(v.dtype == torch.float16 for v in read_weights(name).values() if v.is_floating_point())
        meta = read_card(name)
        assert {"name", "kind", "config", "card"} <= set(meta)
        assert {"data", "steps", "seed", "wall_time_s", "metrics"} <= set(meta["card"])
    assert total < 15e6, total


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_load_pretrained_gives_fresh_float32_eval_copies(name):
    first, second = load_pretrained(name), load_pretrained(name)
    assert first is not second and not first.training
    params = list(first.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    assert all(p.requires_grad == (name in POLICY_NAMES) for p in params)
    with torch.no_grad():
        params[0].add_(1.0)
    assert not torch.equal(params[0], next(second.parameters()))


@pytest.mark.parametrize(
    "name, loader, minimum",
    [("classifier", load_mnist, 0.98), ("judge", load_mnist, 0.94),
     ("digits8_classifier", load_digits8, 0.95), ("digits8_judge", load_digits8, 0.92)],
)
def test_classifiers_reach_their_held_out_accuracy(name, loader, minimum):
    """Held-out accuracy after the float16 round trip; within a point of what the model card claims."""
    images, labels = loader("eval")
    measured = accuracy(load_pretrained(name), images, labels)
    assert measured >= minimum
    assert measured == pytest.approx(read_card(name)["card"]["metrics"]["eval_accuracy"], abs=0.01)


def test_classifier_and_judge_are_different_families_on_disjoint_data():
    assert type(load_pretrained("classifier")) is not type(load_pretrained("judge"))
    assert "'train'" in read_card("classifier")["card"]["data"]
    assert "'judge'" in read_card("judge")["card"]["data"]


def test_bad_names_and_broken_files_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="valid names"):
        load_pretrained("mnist_policy")
    with pytest.raises(FileNotFoundError, match="pretrain judge"):
        load_pretrained("judge", directory=tmp_path)
    shutil.copy(CHECKPOINT_DIR / "judge.json", tmp_path / "judge.json")
    with pytest.raises(FileNotFoundError, match=r"judge\.safetensors\.planes\.xz"):
        load_pretrained("judge", directory=tmp_path)
    stored = weights_path("judge").read_bytes()
    inner = lzma.decompress(stored)
    flipped = bytearray(stored)
    flipped[len(stored) // 2] ^= 0xFF
    # a cut archive, a flipped byte (xz's check), a cut file in a whole archive, an xz file of something else
    for broken in (stored[:1000], bytes(flipped), lzma.compress(inner[:1000]), lzma.compress(b"not weights")):
        weights_path("judge", tmp_path).write_bytes(broken)
        with pytest.raises(RuntimeError, match=r"cannot read checkpoint weights .*judge\.safetensors\.planes\.xz"):
            load_pretrained("judge", directory=tmp_path)


def test_save_and_load_round_trip(tmp_path):
    model = JudgeClassifier(image_size=8, hidden=(16,))
    save_checkpoint("digits8_judge", model, {"note": "round trip"}, directory=tmp_path)
    loaded = load_pretrained("digits8_judge", directory=tmp_path)
    assert read_card("digits8_judge", directory=tmp_path)["card"] == {"note": "round trip"}
    x = torch.rand(5, 1, 8, 8)
    assert torch.allclose(loaded(x), model.eval()(x), atol=1e-2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits8_judge.json", "digits8_judge.safetensors.planes.xz"]
    assert FROZEN_NAMES and not any(p.requires_grad for p in loaded.parameters())
    # Uncompressed (what `vgrpo export` writes): a plain safetensors file, loaded the same way.
    save_checkpoint("digits8_judge", model, {"note": "plain"}, directory=tmp_path / "plain", dtype=torch.float32,
                    compressed=False)
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["digits8_judge.json", "digits8_judge.safetensors"]
    assert weights_path("digits8_judge", tmp_path / "plain").name == "digits8_judge.safetensors"
    plain = load_pretrained("digits8_judge", directory=tmp_path / "plain")
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), model.state_dict().values()))
    # Other weights saved compressed in the same folder: the plain copy goes, so the new weights are the ones read.
    other = JudgeClassifier(image_size=8, hidden=(16,))
    save_checkpoint("digits8_judge", other, {"note": "again"}, directory=tmp_path / "plain")
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["digits8_judge.json", "digits8_judge.safetensors.planes.xz"]
    again = load_pretrained("digits8_judge", directory=tmp_path / "plain")
    assert torch.allclose(again(x), other.eval()(x), atol=1e-2) and not torch.allclose(again(x), model(x), atol=1e-2)
    with pytest.raises(ValueError, match="unknown checkpoint 'nonsense'"):
        save_checkpoint("nonsense", model, {}, directory=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_pretraining_is_seeded():
    """Two short runs of the policy recipe from the same seeds give identical weights."""
    from vgrpo_lib.integrations.testbed.models import VelocityMLP
    from vgrpo_lib.integrations.testbed.pretrain import train_policy

    def run():
        torch.manual_seed(0)
        model = VelocityMLP((1, 8, 8), width=32, depth=1, emb_dim=16, time_features=8)
        train_policy(model, "digits8", steps=5, batch_size=16, lr=1e-3, warmup=2, p_uncond=0.1, seed=0)
        return model.state_dict()

    first, second = run(), run()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["out.weight"], torch.zeros_like(first["out.weight"]))
