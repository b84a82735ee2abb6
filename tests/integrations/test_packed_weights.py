"""Packed weights (:mod:`vgrpo_lib.integrations.packed_weights`): byte planes + xz give back the safetensors file
byte for byte, refuse what is not theirs with an error naming the file, and a packed pipeline folder unpacks once
into a cache that is checked against its manifest on every use."""

from __future__ import annotations

import json
import lzma
import os
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError
from safetensors.torch import load, save

from vgrpo_lib.integrations.packed_weights import (
    MANIFEST,
    PACKED_SUFFIX,
    cache_root,
    loading_code,
    main,
    pack,
    pack_folder,
    read_packed,
    unpack,
    unpacked_folder,
)
from vgrpo_lib.integrations.testbed.checkpoints import CHECKPOINT_DIR

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8,
          torch.bool, torch.int8, torch.int16]
PIPELINES = ("mnist_sd3", "mnist_sd3_geneval", "mnist_wan")


@st.composite
def state_dicts(draw):
    names = draw(st.lists(st.text("abcdefghij._", min_size=1, max_size=8), min_size=1, max_size=5, unique=True))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    state = {}
    for name in names:
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        values = torch.randn(shape, generator=generator, dtype=torch.float64) * 100
        state[name] = values.to(draw(st.sampled_from(DTYPES)))
    return state


@settings(max_examples=60, deadline=None)
@given(state_dicts(), st.dictionaries(st.text("xyz", min_size=1, max_size=3), st.text(max_size=5), max_size=2))
def test_unpack_gives_back_the_file_byte_for_byte(state, metadata):
    plain = save(state, metadata=metadata or None)
    packed = pack(plain)
    assert unpack(packed) == plain
    loaded = load(unpack(packed))
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)


def test_the_planes_put_each_byte_position_together():
    """Two float16 values: the stored bytes are every value's first byte, then every second byte."""
    plain = save({"w": torch.tensor([1.0, -2.0], dtype=torch.float16)})  # 0x3c00, 0xc000 little-endian
    inner = lzma.decompress(pack(plain))
    assert inner.endswith(bytes([0x00, 0x00, 0x3C, 0xC0])) and plain.endswith(bytes([0x00, 0x3C, 0x00, 0xC0]))


def test_a_plain_xz_of_a_packed_file_is_not_loadable_as_safetensors():
    plain = save({"w": torch.arange(6, dtype=torch.float32)})
    with pytest.raises(SafetensorError):
        load(lzma.decompress(pack(plain)))


@pytest.mark.parametrize("bad, message", [
    (b"", "not a safetensors file"),
    (b"\xff" * 16, "not a safetensors file"),
    ((2).to_bytes(8, "little") + b"[]", "not a safetensors header"),
    (save({"w": torch.zeros(3)}) + b"extra", "5 bytes after the last tensor"),
])
def test_pack_refuses_what_is_not_safetensors_naming_the_source(bad, message):
    with pytest.raises(ValueError, match=f"model.bin: {message}"):
        pack(bad, "model.bin")


def test_unpack_refuses_foreign_or_damaged_bytes_naming_the_source():
    packed = pack(save({"w": torch.randn(64)}))
    flipped = bytearray(packed)
    flipped[len(packed) // 2] ^= 0x01
    for bad in (packed[:20], bytes(flipped), b"plain text"):
        with pytest.raises(ValueError, match="w.xz: not a packed weights file"):
            unpack(bad, "w.xz")
    with pytest.raises(ValueError, match="w.xz: an xz file, but not packed weights"):
        unpack(lzma.compress(b"hello"), "w.xz")


def test_read_packed_reads_a_replaced_file_again(tmp_path):
    path = tmp_path / "w.safetensors.planes.xz"
    first, second = save({"w": torch.zeros(4)}), save({"w": torch.ones(4)})
    path.write_bytes(pack(first))
    assert read_packed(path) == first
    replacement = tmp_path / "new"
    replacement.write_bytes(pack(second))
    os.replace(replacement, path)  # the same size, a new inode
    assert read_packed(path) == second


def _pipeline_like(folder: Path) -> dict[str, bytes]:
    """A folder shaped like a diffusers pipeline: configs and two weight files."""
    files = {"transformer/diffusion_pytorch_model.safetensors": save({"a": torch.randn(5, 3, dtype=torch.float16)}),
             "vae/diffusion_pytorch_model.safetensors": save({"b": torch.randn(7), "c": torch.arange(3)}),
             "model_index.json": b'{"_class_name": "X"}', "transformer/config.json": b"{}"}
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return files


def test_a_packed_folder_unpacks_once_to_the_same_files(tmp_path):
    source, cache = tmp_path / "pipe", tmp_path / "cache"
    files = _pipeline_like(source)
    manifest = pack_folder(source)
    assert sorted(manifest) == sorted(name for name in files if name.endswith(".safetensors"))
    assert not list(source.rglob("*.safetensors")) and len(list(source.rglob(f"*{PACKED_SUFFIX}"))) == 2
    assert json.loads((source / MANIFEST).read_text()) == manifest
    target = unpacked_folder(source, cache)
    assert target.parent == cache and target.name.startswith("pipe-")
    assert {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()} == files
    stamp = (target / "vae/diffusion_pytorch_model.safetensors").stat().st_mtime_ns
    assert unpacked_folder(source, cache) == target  # reused, not written again
    assert (target / "vae/diffusion_pytorch_model.safetensors").stat().st_mtime_ns == stamp
    assert pack_folder(source) == manifest  # packing again keeps the manifest of the files already packed


def test_packing_cut_short_is_completed_by_packing_again(tmp_path):
    """Killed after writing one packed file, before the manifest: the plain files are all still there, and packing
    again gives the whole manifest."""
    source = tmp_path / "pipe"
    files = _pipeline_like(source)
    vae = source / "vae/diffusion_pytorch_model.safetensors"
    vae.with_name(vae.name + PACKED_SUFFIX).write_bytes(pack(vae.read_bytes()))
    manifest = pack_folder(source)
    assert sorted(manifest) == sorted(name for name in files if name.endswith(".safetensors"))
    target = unpacked_folder(source, tmp_path / "cache")
    assert {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()} == files


def test_a_damaged_cache_is_made_again(tmp_path):
    source, cache = tmp_path / "pipe", tmp_path / "cache"
    files = _pipeline_like(source)
    pack_folder(source)
    target = unpacked_folder(source, cache)
    weights = target / "transformer/diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")  # same size, one byte changed
    assert unpacked_folder(source, cache) == target and weights.read_bytes() == files[weights.relative_to(target).as_posix()]
    weights.unlink()
    assert unpacked_folder(source, cache) == target and weights.is_file()


def test_a_packed_file_that_does_not_match_its_manifest_is_refused(tmp_path):
    source = tmp_path / "pipe"
    _pipeline_like(source)
    pack_folder(source)
    packed = source / f"vae/diffusion_pytorch_model.safetensors{PACKED_SUFFIX}"
    packed.write_bytes(pack(save({"b": torch.zeros(7), "c": torch.arange(3)})))
    with pytest.raises(ValueError, match="vae/diffusion_pytorch_model.safetensors.planes.xz: unpacks to bytes whose SHA-256"):
        unpacked_folder(source, tmp_path / "cache")
    packed.unlink()
    with pytest.raises(FileNotFoundError, match="vae/diffusion_pytorch_model.safetensors, whose packed files"):
        unpacked_folder(source, tmp_path / "cache")
    (source / MANIFEST).write_text('{"a.safetensors": {"sha256": 1}}')
    with pytest.raises(ValueError, match="packed.json: not a packed-weights manifest"):
        unpacked_folder(source, tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # no staging folder left


def test_processes_unpacking_at_once_each_get_the_whole_folder(tmp_path):
    source, cache = tmp_path / "pipe", tmp_path / "cache"
    files = _pipeline_like(source)
    pack_folder(source)
    results, errors = [], []

    def unpack_one():
        try:
            results.append(unpacked_folder(source, cache))
        except Exception as exc:  # collected: a thread's exception would otherwise be lost
            errors.append(exc)

    threads = [threading.Thread(target=unpack_one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(results)) == 1
    target = results[0]
    assert {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()} == files
    assert [p.name for p in cache.iterdir()] == [target.name]


def test_a_folder_without_manifest_and_a_hub_name_pass_through(tmp_path):
    (tmp_path / "model_index.json").write_text("{}")
    assert unpacked_folder(tmp_path) == tmp_path
    hub = "stabilityai/stable-diffusion-3.5-medium"
    assert str(unpacked_folder(hub)) == hub  # what the loaders pass on to from_pretrained
    assert loading_code(hub) == ([], repr(hub)) and loading_code(str(tmp_path)) == ([], repr(str(tmp_path)))


def test_loading_code_of_a_packed_folder_unpacks_it(tmp_path):
    source = tmp_path / "pipe"
    _pipeline_like(source)
    pack_folder(source)
    imports, expression = loading_code(str(source))
    namespace = {}
    exec("\n".join([*imports, f"folder = {expression}"]), namespace)  # noqa: S102
    assert namespace["folder"] == unpacked_folder(source) and (namespace["folder"] / "model_index.json").is_file()


def test_the_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VGRPO_CACHE", str(tmp_path / "v"))
    assert cache_root() == tmp_path / "v"
    monkeypatch.delenv("VGRPO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "vgrpo_lib"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert cache_root() == tmp_path / "h" / ".cache" / "vgrpo_lib"


def test_the_command_line_packs_and_unpacks(tmp_path, capsys):
    source = tmp_path / "pipe"
    files = _pipeline_like(source)
    main(["pack", str(source)])
    assert "packed 2 weight files" in capsys.readouterr().out
    main(["unpack", str(source)])
    target = Path(capsys.readouterr().out.strip())
    assert (target / "model_index.json").read_bytes() == files["model_index.json"]
    out = tmp_path / "vae.safetensors"
    main(["unpack", str(source / f"vae/diffusion_pytorch_model.safetensors{PACKED_SUFFIX}"), str(out)])
    assert out.read_bytes() == files["vae/diffusion_pytorch_model.safetensors"]


@pytest.mark.parametrize("name", PIPELINES)
def test_every_shipped_pipeline_is_packed_and_unpacks_to_its_manifest(name):
    folder = CHECKPOINT_DIR / name
    assert not list(folder.rglob("*.safetensors")), "a shipped weight file is stored unpacked"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert sorted(manifest) == sorted(p.relative_to(folder).as_posix()[:-len(PACKED_SUFFIX)]
                                      for p in folder.rglob(f"*{PACKED_SUFFIX}"))
    target = unpacked_folder(folder)  # checks every file's SHA-256 against the manifest
    assert all((target / relative).stat().st_size == entry["bytes"] for relative, entry in manifest.items())
