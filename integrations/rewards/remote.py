"""A reward served over HTTP by ``vgrpo reward-server``, called by the trainer as any in-process reward.

    reward = remote_reward("http://gpu-box:8000/pickscore")     # asks GET /health what the server serves
    scores = reward(images, prompts)                            # (B,) float32, on the images' device
    model.reward=http://gpu-box:8000/pickscore                  # the same from a run's config
    model.reward=http://gpu-box:8000/pickscore:1,ocr:0.5        # mixed with a local reward (a MultiReward)

The wire format, both ways a safetensors body (binary, no pickle, no JSON lists of floats):

    POST /NAME    tensor "images" (B, 3, H, W) uint8 | float16 | float32, metadata "prompts": JSON list of B strings
    answer        tensor "scores" (B,) float32, or (B, R) from a server of a multi-reward (its names in /health)

``uint8`` (the default) sends each pixel as ``round(255 * clamp(x, 0, 1))``: a quarter of float32's bytes, and what
image rewards read anyway (JPEG compressibility and OCR quantise exactly so, so their scores equal the in-process
ones); ``wire=float32`` sends the exact floats (every reward then scores the very same images as in-process).

Options go in the URL's query, ``http://HOST:PORT/NAME?timeout=60&retries=6``:

- ``timeout`` (seconds per request, default 120): a request not answered by then counts as failed;
- ``retries`` (default 4) and ``backoff`` (seconds, default 0.5): a refused connection, a dropped one, a timeout or
  HTTP 502/503/504 (an overloaded or restarting server) is retried after ``backoff * 2**k`` seconds (k = 0, 1, ...);
  any other HTTP error (a bad request, the reward raised on the server) is not retried;
- ``wire`` (``uint8`` | ``float16`` | ``float32``, default ``uint8``);
- ``concurrency`` (default 2): requests in flight when a call holds more than the server's ``max_batch`` images,
  sent in chunks of ``max_batch`` in order, so the server scores one chunk while the next is encoded and sent.

When the retries are spent the call raises :class:`RemoteRewardError`, one line naming the URL; the trainer retries
the reward ``reward_retries`` times more and then stops with that line (exit status 6), its last checkpoint intact:
restart the server and ``vgrpo train --out RUN_DIR --resume`` continues the run as if nothing had happened.
:meth:`RemoteReward.submit` starts a call in the background (a ``Future``), which
:class:`~vgrpo_lib.integrations.rewards.MultiReward` uses to score its local rewards while the server scores.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.error import HTTPError
from urllib.parse import parse_qsl, unquote, urlsplit
from urllib.request import Request, urlopen

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from vgrpo_lib.errors import UsageError

from .base import Reward

__all__ = [
    "WIRE_DTYPES", "RETRIED_STATUS", "RemoteRewardError", "RemoteOptions", "is_remote_spec", "parse_remote_spec",
    "encode_request", "decode_request", "encode_scores", "decode_scores", "RemoteReward", "RemoteMultiReward",
    "remote_reward",
]

WIRE_DTYPES = {"uint8": torch.uint8, "float16": torch.float16, "float32": torch.float32}
"""How images travel: ``wire=`` name -> dtype."""
RETRIED_STATUS = frozenset({502, 503, 504})
"""HTTP statuses of a server that is overloaded, restarting or behind a failing proxy: retried with backoff."""


class RemoteRewardError(ConnectionError, UsageError):
    """The reward server did not answer usefully (gone, timing out, refusing): one line naming its URL. Also a
    :class:`~vgrpo_lib.errors.UsageError` (as ``io.UnsupportedOperation`` is both an ``OSError`` and a ``ValueError``),
    so that a run whose configured server cannot be reached when it starts stops with that line like any other
    configuration error; during training the trainer reports it as the reward's failure
    (:class:`vgrpo_lib.algorithms.scoring.RewardError`, exit status 6)."""


class RemoteOptions:
    """A parsed ``http://HOST:PORT/NAME?options``: ``base`` (``http://HOST:PORT``), ``name`` and the options of the
    module doc (``timeout``, ``retries``, ``backoff``, ``wire``, ``concurrency``)."""

    DEFAULTS = {"timeout": 120.0, "retries": 4, "backoff": 0.5, "wire": "uint8", "concurrency": 2}

    def __init__(self, spec: str):
        parts = urlsplit(spec.strip())
        name = unquote(parts.path.lstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.netloc or not name or "/" in name:
            raise UsageError(f"The remote reward {spec!r} is not a URL of the form http://HOST:PORT/NAME (NAME: the "
                             f"reward the server serves, `vgrpo reward-server --reward NAME`).")
        self.spec, self.base, self.name = spec.strip(), f"{parts.scheme}://{parts.netloc}", name
        options = dict(parse_qsl(parts.query))
        unknown = sorted(set(options) - set(self.DEFAULTS))
        if unknown:
            raise UsageError(f"The remote reward {spec!r}: unknown option(s) {', '.join(unknown)}; the options are "
                             f"{', '.join(self.DEFAULTS)}.")
        try:
            self.timeout = float(options.get("timeout", self.DEFAULTS["timeout"]))
            self.retries = int(options.get("retries", self.DEFAULTS["retries"]))
            self.backoff = float(options.get("backoff", self.DEFAULTS["backoff"]))
            self.concurrency = int(options.get("concurrency", self.DEFAULTS["concurrency"]))
        except ValueError:
            raise UsageError(f"The remote reward {spec!r}: timeout and backoff must be numbers, retries and "
                             f"concurrency integers.") from None
        self.wire = options.get("wire", self.DEFAULTS["wire"])
        if self.wire not in WIRE_DTYPES:
            raise UsageError(f"The remote reward {spec!r}: wire={self.wire!r}; valid: {', '.join(WIRE_DTYPES)}.")
        if self.timeout <= 0 or self.retries < 0 or self.backoff < 0 or self.concurrency < 1:
            raise UsageError(f"The remote reward {spec!r}: timeout must be > 0, retries and backoff >= 0, "
                             f"concurrency >= 1.")

    @property
    def url(self) -> str:
        """Where the images are posted: ``http://HOST:PORT/NAME``."""
        return f"{self.base}/{self.name}"


def is_remote_spec(spec: object) -> bool:
    """Whether a reward spec names a served reward (``http://`` or ``https://``)."""
    return isinstance(spec, str) and spec.strip().lower().startswith(("http://", "https://"))


def parse_remote_spec(spec: str) -> RemoteOptions:
    """The URL and options of ``spec`` (:class:`RemoteOptions`); a one-line ``UsageError`` (a ``ValueError``) for a
    malformed one."""
    return RemoteOptions(spec)


def _header_metadata(body: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors body (its header is 8 bytes of length, then JSON)."""
    length = int.from_bytes(body[:8], "little")
    return json.loads(body[8 : 8 + length]).get("__metadata__") or {}


def encode_request(images: torch.Tensor, prompts: Sequence[str], wire: str = "uint8") -> bytes:
    """Images ``(B, 3, H, W)`` in [0, 1] and B prompt strings as a request body (see the module doc)."""
    wrong = [type(p).__name__ for p in prompts if not isinstance(p, str)]
    if wrong:
        raise TypeError(f"A remote reward sends prompt strings; got a {wrong[0]} (a testbed task's prompts are digit "
                        f"tensors: serve the rewards of text-prompted tasks).")
    images = images.detach().float().cpu()
    if wire == "uint8":
        images = (images.clamp(0, 1) * 255).round().to(torch.uint8)
    else:
        images = images.to(WIRE_DTYPES[wire])
    return save_tensors({"images": images.contiguous()}, metadata={"prompts": json.dumps(list(prompts))})


def decode_request(body: bytes) -> tuple[torch.Tensor, list[str]]:
    """A request body back to float32 images ``(B, 3, H, W)`` in [0, 1] and B prompts; ``ValueError`` when it is
    not one."""
    try:
        images = load_tensors(body)["images"]
        prompts = json.loads(_header_metadata(body)["prompts"])
    except Exception as error:  # anything unreadable is the client's fault: one line back to it
        raise ValueError(f"the body is not a reward request (safetensors with 'images' and metadata 'prompts'): "
                         f"{type(error).__name__}: {error}") from None
    if images.ndim != 4 or images.shape[1] != 3 or len(prompts) != images.shape[0]:
        raise ValueError(f"expected images (B, 3, H, W) and B prompts; got {tuple(images.shape)} and {len(prompts)}")
    images = images.float() / 255 if images.dtype == torch.uint8 else images.float()
    return images, [str(p) for p in prompts]


def encode_scores(scores: torch.Tensor) -> bytes:
    """Scores ``(B,)`` or ``(B, R)`` as an answer body (float32)."""
    return save_tensors({"scores": scores.detach().float().cpu().contiguous()})


def decode_scores(body: bytes) -> torch.Tensor:
    """An answer body back to its scores tensor."""
    return load_tensors(body)["scores"]


class RemoteReward(Reward):
    """The reward that the server at ``options.url`` serves: ``reward(images, prompts) -> (B,)`` float32.

    Built by :func:`remote_reward` (which asks the server's ``/health`` for ``max_batch``). Images go in chunks of
    ``max_batch`` (at most ``options.concurrency`` in flight), the scores come back in the order of the images.
    """

    def __init__(self, options: RemoteOptions, max_batch: int):
        super().__init__()
        self.options, self.max_batch = options, int(max_batch)
        self._background: ThreadPoolExecutor | None = None

    @property
    def url(self) -> str:
        return self.options.url

    def extra_repr(self) -> str:
        return f"url={self.url!r}, max_batch={self.max_batch}, wire={self.options.wire!r}"

    def _columns(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """The server's scores of every image: ``(B,)`` (``(B, R)`` for a multi-reward server)."""
        starts = range(0, images.shape[0], self.max_batch)
        bodies = (encode_request(images[s : s + self.max_batch], prompts[s : s + self.max_batch], self.options.wire)
                  for s in starts)
        with ThreadPoolExecutor(self.options.concurrency) as pool:
            answers = list(pool.map(lambda body: decode_scores(self._post(body)), bodies))
        scores = torch.cat(answers) if answers else torch.zeros(0)
        if scores.shape[0] != images.shape[0]:
            raise RemoteRewardError(f"the reward server at {self.url} answered {tuple(scores.shape)} scores for "
                                    f"{images.shape[0]} images")
        return scores

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return self._columns(images, prompts)

    def submit(self, images: torch.Tensor, prompts: Sequence[str]) -> Future:
        """Start ``self(images, prompts)`` in a background thread; the ``Future``'s result is the ``(B,)`` scores."""
        if self._background is None:
            self._background = ThreadPoolExecutor(1, thread_name_prefix="remote-reward")
        return self._background.submit(self, images, prompts)

    def _post(self, body: bytes) -> bytes:
        """POST ``body`` to the reward's URL, retried with backoff; the answer's body."""
        return _request(self.options, self.url, body)


class RemoteMultiReward(RemoteReward):
    """A served multi-reward (the server's reward has columns): ``stack(images, prompts) -> (B, R)`` in ``names``
    order, a call the sum weighted by ``weights`` ``(R,)``: the shape the trainer reads as a multi-reward."""

    def __init__(self, options: RemoteOptions, max_batch: int, names: Sequence[str], weights: Sequence[float]):
        super().__init__(options, max_batch)
        self.names = list(names)
        self.register_buffer("weights", torch.tensor([float(w) for w in weights]), persistent=False)

    def stack(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        return self._columns(images, list(prompts)).to(images.device)

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return self._columns(images, prompts) @ self.weights.to(images.device)


def _request(options: RemoteOptions, url: str, body: bytes | None = None) -> bytes:
    """GET (``body`` None) or POST ``url``, retrying what :data:`RETRIED_STATUS` and broken connections are; a
    :class:`RemoteRewardError` of one line when the retries are spent or the server refuses the request."""
    started, reason = time.monotonic(), ""
    for attempt in range(options.retries + 1):
        if attempt:
            time.sleep(options.backoff * 2 ** (attempt - 1))
        request = Request(url, data=body, method="GET" if body is None else "POST",
                          headers={"Content-Type": "application/octet-stream"})
        try:
            with urlopen(request, timeout=options.timeout) as response:
                return response.read()
        except HTTPError as error:
            detail = _error_detail(error)
            if error.code not in RETRIED_STATUS:
                raise RemoteRewardError(f"the reward server at {url} refused the request: HTTP {error.code}: "
                                        f"{detail}") from None
            reason = f"HTTP {error.code}: {detail}"
        except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, a truncated answer
            reason = f"{type(error).__name__}: {getattr(error, 'reason', error)}"
    elapsed = time.monotonic() - started
    raise RemoteRewardError(
        f"the reward server at {url} did not answer ({reason}) in {options.retries + 1} attempt(s) over {elapsed:.1f} "
        f"s; start it again (vgrpo reward-server --reward {options.name} --port ...) and continue with vgrpo train "
        f"--out RUN_DIR --resume".replace("\n", " "))


def _error_detail(error: HTTPError) -> str:
    """The server's one-line explanation (FastAPI's ``{"detail": ...}``), else the status's reason."""
    try:
        return str(json.loads(error.read())["detail"]).replace("\n", " ")
    except Exception:  # not JSON, or no body: the status line says enough
        return str(error.reason)


def remote_reward(spec: str) -> RemoteReward:
    """The reward served at ``spec`` (``http://HOST:PORT/NAME?options``, see the module doc): asks the server's
    ``GET /health`` what it serves (retried like any request), so a server that is down, or serves another reward,
    is one clear error before training starts. A :class:`RemoteMultiReward` when the server's reward has columns."""
    options = parse_remote_spec(spec)
    try:
        health = json.loads(_request(options, f"{options.base}/health"))
    except json.JSONDecodeError:
        raise RemoteRewardError(f"{options.base}/health did not answer JSON: is this a vgrpo reward server?") from None
    if health.get("reward") != options.name:
        raise UsageError(f"The reward server at {options.base} serves {health.get('reward')!r}, not "
                         f"{options.name!r}: set model.reward={options.base}/{health.get('reward')}.")
    if health.get("names"):
        return RemoteMultiReward(options, health["max_batch"], health["names"], health["weights"])
    return RemoteReward(options, health["max_batch"])
