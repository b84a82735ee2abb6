"""Shipped weights packed small: safetensors whose tensor bytes are split into byte planes, then xz-compressed.

The shipped checkpoints are most of the repository's size (float16 weights compress poorly as they are: gzip
saves about 9%). Storing each tensor's bytes as planes (every element's first byte, then every second byte: the
"shuffle" filter of HDF5 and Blosc) puts the exponent bytes side by side, and xz then saves 15% of a diffusers
pipeline's weights and 9-13% of the testbed's float16 checkpoints. A packed file ``NAME.safetensors.planes.xz`` is

    xz( MAGIC  +  the safetensors header as it was  +  each tensor's bytes as byte planes, in the file's order )

so unpacking gives back the original file byte for byte (``unpack(pack(b)) == b``). The magic line makes a plain
``xz -d`` of it unloadable as safetensors (its bytes are not the tensor values) instead of silently wrong.

A shipped diffusers pipeline folder keeps its configs, tokenizers and model card plain and its weights packed, with
``packed.json`` listing each weight file's SHA-256 and size. ``diffusers`` loads plain folders only, so
:func:`unpacked_folder` writes the unpacked pipeline once into a cache folder (``$VGRPO_CACHE``, else
``$XDG_CACHE_HOME/vgrpo_lib``, else ``~/.cache/vgrpo_lib``), checks every file against the manifest (on every call:
a cache edited or cut short is re-made), and returns it; a folder without a manifest comes back as it is. The
library's loaders call it and record the packed folder as the pipeline's ``_name_or_path``, so that an export's model
card names the shipped folder (``StableDiffusion3Pipeline.from_pretrained(unpacked_folder(PIPELINE_DIR))`` by hand).

Command line: ``python -m vgrpo_lib.integrations.packed_weights pack FOLDER`` packs a pipeline folder in place;
``... unpack FOLDER`` prints its unpacked cache folder; ``... unpack FILE.planes.xz OUT.safetensors`` unpacks a file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

from vgrpo_lib.integrations.atomic import atomic_write_bytes, atomic_write_text

__all__ = ["PACKED_SUFFIX", "MANIFEST", "MAGIC", "pack", "unpack", "read_packed", "pack_folder", "unpacked_folder",
           "cache_root", "loading_code", "main"]

PACKED_SUFFIX = ".planes.xz"
MANIFEST = "packed.json"
MAGIC = b"vgrpo_lib byte-planes safetensors 1\n"
_XZ_PRESET = 9 | lzma.PRESET_EXTREME
_HEADER_LENGTH = 8  # safetensors: a little-endian u64 giving the JSON header's length
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
             "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def _tensor_spans(plain: bytes, source: str) -> tuple[int, list[tuple[int, int, int]]]:
    """Where the data starts and each tensor's ``(start, end, itemsize)`` within the data, in the file's order."""
    if len(plain) < _HEADER_LENGTH:
        raise ValueError(f"{source}: not a safetensors file ({len(plain)} bytes, shorter than its header length)")
    (length,) = struct.unpack("<Q", plain[:_HEADER_LENGTH])
    if length > len(plain) - _HEADER_LENGTH:
        raise ValueError(f"{source}: not a safetensors file (header of {length} bytes in a {len(plain)}-byte file)")
    try:
        header = json.loads(plain[_HEADER_LENGTH:_HEADER_LENGTH + length])
        spans = sorted((*info["data_offsets"], _ITEMSIZE[info["dtype"]])
                       for name, info in header.items() if name != "__metadata__")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{source}: not a safetensors header this packer knows ({exc!r})") from exc
    data_start = _HEADER_LENGTH + length
    position = 0
    for start, end, itemsize in spans:
        if start != position or (end - start) % itemsize or data_start + end > len(plain):
            raise ValueError(f"{source}: its tensors do not tile the data (a tensor at bytes {start}-{end})")
        position = end
    if data_start + position != len(plain):
        raise ValueError(f"{source}: {len(plain) - data_start - position} bytes after the last tensor")
    return data_start, spans


def _regroup(plain: bytes, source: str, to_planes: bool) -> bytes:
    data_start, spans = _tensor_spans(plain, source)
    out = bytearray(plain[:data_start])
    for start, end, itemsize in spans:
        block = np.frombuffer(plain, np.uint8, end - start, data_start + start)
        shape = (-1, itemsize) if to_planes else (itemsize, -1)
        out += block.reshape(shape).T.tobytes()
    return bytes(out)


def pack(plain: bytes, source: str = "<bytes>") -> bytes:
    """A safetensors file's bytes packed (byte planes, xz). ``source`` names the file in errors."""
    return lzma.compress(MAGIC + _regroup(plain, source, to_planes=True), preset=_XZ_PRESET)


def unpack(packed: bytes, source: str = "<bytes>") -> bytes:
    """The safetensors bytes :func:`pack` was given. Raises ``ValueError`` naming ``source`` when the bytes are not a
    packed file or are cut short or corrupted (xz's own check)."""
    try:
        inner = lzma.decompress(packed)
    except lzma.LZMAError as exc:
        raise ValueError(f"{source}: not a packed weights file, or cut short or corrupted ({exc})") from exc
    if not inner.startswith(MAGIC):
        raise ValueError(f"{source}: an xz file, but not packed weights (no {MAGIC.strip().decode()!r} line)")
    # the header is stored unchanged, so the planes' layout is read from it exactly as pack read it
    return _regroup(inner[len(MAGIC):], source, to_planes=False)


_READ_CACHE: dict[tuple[str, int, int, int], bytes] = {}


def read_packed(path: str | os.PathLike) -> bytes:
    """The plain safetensors bytes of packed file ``path``, decoded once per process (keyed by the file's path, inode,
    size and modification time, so a rewritten or replaced file is read again)."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _READ_CACHE:
        _READ_CACHE[key] = unpack(path.read_bytes(), str(path))
    return _READ_CACHE[key]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack_folder(folder: str | os.PathLike) -> dict[str, dict]:
    """Pack every ``*.safetensors`` under ``folder`` in place and write the manifest ``packed.json`` (``{relative
    path of the plain file: {"sha256", "bytes"}}``, kept from an earlier packing for files already packed); the plain
    files are removed only once the packed files and the manifest are written (atomically), so packing cut short
    leaves a folder that packing again completes. Returns the manifest."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST
    manifest = _read_manifest(folder)[0] if manifest_path.exists() else {}
    plain_paths = sorted(folder.rglob("*.safetensors"))
    for plain_path in plain_paths:
        plain = plain_path.read_bytes()
        atomic_write_bytes(plain_path.with_name(plain_path.name + PACKED_SUFFIX), pack(plain, str(plain_path)))
        manifest[plain_path.relative_to(folder).as_posix()] = {"sha256": _sha256(plain), "bytes": len(plain)}
    atomic_write_text(manifest_path, json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    for plain_path in plain_paths:
        plain_path.unlink()
    return manifest


def cache_root() -> Path:
    """Where unpacked pipelines are kept: ``$VGRPO_CACHE``, else ``$XDG_CACHE_HOME/vgrpo_lib``, else
    ``~/.cache/vgrpo_lib``."""
    if os.environ.get("VGRPO_CACHE"):
        return Path(os.environ["VGRPO_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vgrpo_lib"


def _read_manifest(folder: Path) -> tuple[dict[str, dict], str]:
    text = (folder / MANIFEST).read_text()
    try:
        manifest = json.loads(text)
        for relative, entry in manifest.items():
            if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
                    and isinstance(entry.get("bytes"), int)):
                raise ValueError(f"entry {relative!r} is not {{'sha256': str, 'bytes': int}}")
    except ValueError as exc:
        raise ValueError(f"{folder / MANIFEST}: not a packed-weights manifest ({exc})") from exc
    return manifest, _sha256(text.encode())


def _matches(folder: Path, manifest: dict[str, dict]) -> bool:
    try:
        return all((folder / relative).stat().st_size == entry["bytes"]
                   and _sha256((folder / relative).read_bytes()) == entry["sha256"] for relative, entry in manifest.items())
    except OSError:  # missing, or moved away by a process replacing a damaged copy
        return False


def _install(staging: Path, target: Path, manifest: dict[str, dict]) -> None:
    """Rename the whole ``staging`` folder to ``target``, unless another process's whole copy got there first; a
    damaged copy there is first renamed aside (a process reading it then fails its check, never half a folder)."""
    for _ in range(3):
        if _matches(target, manifest):
            return
        if target.exists():
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.damaged.", dir=target.parent))
            try:
                target.rename(aside / "copy")
            except FileNotFoundError:  # another process moved it first
                pass
            shutil.rmtree(aside, ignore_errors=True)
        try:
            staging.rename(target)
            return
        except OSError:  # another process renamed its copy first: checked on the next round
            continue
    raise RuntimeError(f"cannot install the unpacked folder {target}: other processes keep replacing it")


def unpacked_folder(folder: str | os.PathLike, cache: str | os.PathLike | None = None) -> Path:
    """``folder`` with its packed weights unpacked: a folder without ``packed.json`` comes back as it is; else the
    cache folder ``CACHE/NAME-DIGEST`` (``cache`` or :func:`cache_root`; DIGEST from the manifest, so a re-packed
    folder gets a new one), made on first use and checked against the manifest on every call (made again when it
    does not match). Written under a temporary name and renamed into place, so processes that unpack at once each
    see a whole folder. Raises ``ValueError`` naming the file when a packed file is corrupted or does not match the
    manifest, and ``FileNotFoundError`` when a listed file is missing."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return folder
    manifest, digest = _read_manifest(folder)
    target = Path(cache if cache is not None else cache_root()) / f"{folder.name}-{digest[:16]}"
    if _matches(target, manifest):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder).as_posix()
            if path.is_dir() or path.name == MANIFEST:
                continue
            if relative.endswith(PACKED_SUFFIX):
                relative = relative[:-len(PACKED_SUFFIX)]
                if relative not in manifest:
                    raise ValueError(f"{path}: a packed file that {folder / MANIFEST} does not list")
                data = unpack(path.read_bytes(), str(path))
                if _sha256(data) != manifest[relative]["sha256"]:
                    raise ValueError(f"{path}: unpacks to bytes whose SHA-256 is not the one {folder / MANIFEST} lists")
                (staging / relative).parent.mkdir(parents=True, exist_ok=True)
                (staging / relative).write_bytes(data)
            else:
                (staging / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, staging / relative)
        missing = [relative for relative in manifest if not (staging / relative).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder}: {MANIFEST} lists {', '.join(missing)}, whose packed files "
                                    f"({PACKED_SUFFIX}) are missing")
        _install(staging, target, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def loading_code(name_or_path: str) -> tuple[list[str], str]:
    """How user code names pipeline ``name_or_path`` for ``from_pretrained``: ``(import lines, expression)``; a packed
    folder goes through :func:`unpacked_folder`, anything else is its ``repr`` with no import."""
    if (Path(name_or_path) / MANIFEST).is_file():
        return [f"from {__name__} import unpacked_folder"], f"unpacked_folder({str(name_or_path)!r})"
    return [], repr(name_or_path)


def main(argv: list[str] | None = None) -> None:
    """The command line: ``pack FOLDER``, ``unpack FOLDER`` (prints the unpacked folder), ``unpack FILE OUT``."""
    parser = argparse.ArgumentParser(prog="python -m vgrpo_lib.integrations.packed_weights", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("pack", help="pack a folder's *.safetensors in place").add_argument("folder", type=Path)
    unpack_parser = commands.add_parser("unpack", help="a folder: print its unpacked cache folder; a file: unpack to OUT")
    unpack_parser.add_argument("path", type=Path)
    unpack_parser.add_argument("out", type=Path, nargs="?")
    args = parser.parse_args(argv)
    if args.command == "pack":
        manifest = pack_folder(args.folder)
        print(f"packed {len(manifest)} weight files in {args.folder}")
    elif args.path.is_dir():
        print(unpacked_folder(args.path))
    elif args.out is None:
        parser.error("unpacking a file needs OUT, the .safetensors file to write")
    else:
        atomic_write_bytes(args.out, read_packed(args.path))


if __name__ == "__main__":
    main()
