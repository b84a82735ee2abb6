"""``vgrpo reward-server``: one reward of the zoo (or a user's callable) served over HTTP, batched dynamically.

    vgrpo reward-server --reward pickscore --device cuda:1 --port 8000 --max-batch 32    # on the reward's GPU/machine
    vgrpo train --preset sd3.5-medium model.reward=http://HOST:8000/pickscore ...         # the trainer, anywhere

``--reward`` takes what ``model.reward`` takes in-process (:func:`vgrpo_lib.integrations.tasks.hub.make_reward`): a
registered name (``pickscore``, ``ocr``, ``jpeg_compressibility``, ...), a weighted sum (``pickscore:1,ocr:0.5``,
served as a multi-reward: its columns go back, the trainer normalises them as ``advantage.multi_reward`` says) or the
import path of a callable ``package.module:fn`` ``(images, prompts) -> (B,)``. The URL's last part is that text.

Endpoints:

- ``GET /health``: ``{"status": "ok", "reward": NAME, "max_batch": N, "names": [...] | null, "weights": [...] | null}``
  once the reward is loaded (before that the port is closed: clients retry);
- ``POST /NAME``: a batch of images and prompts, answered with their scores (the safetensors wire format of
  :mod:`vgrpo_lib.integrations.rewards.remote`); 400 for a body that is no request, 404 for another NAME, 500 with
  the exception's line when the reward raises, 503 while more than ``--max-queue`` images wait (clients back off).

Dynamic batching: requests that arrive while the reward is busy, or within ``--batch-timeout`` seconds of the first,
are scored together, up to ``--max-batch`` images of one size per call (a larger request is scored in chunks of
``--max-batch``); each request gets back exactly its own rows, in order. The reward runs in one worker thread, so
the event loop keeps answering ``/health`` while it scores.

Why FastAPI + uvicorn, not LitServe. LitServe's batching is per *request* (``max_batch_size`` requests, each one
item), while a trainer sends whole batches of images per request: batching images across requests is ours to write
either way (the :class:`Batcher` below, about 50 lines). LitServe also runs its inference workers and API servers as
separate processes (each imports torch and the reward), which on a 2-core CI machine makes every start slower and a
killed server leave processes behind; FastAPI + uvicorn is one process holding the model once, starting in seconds,
gone when killed, and both packages are the ones LitServe itself is built on. The extra ``server`` installs them
(``pip install 'vgrpo-lib[server]'``); the client side (:mod:`~vgrpo_lib.integrations.rewards.remote`) needs only the
standard library.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations (Request) at definition.
import argparse
import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from vgrpo_lib.errors import UsageError
from vgrpo_lib.extras import needs_extra

from .remote import decode_request, encode_scores

__all__ = ["Batcher", "load_served_reward", "served_columns", "make_app", "serve", "add_server_arguments",
           "run_server"]


def load_served_reward(spec: str, device: str | None = None) -> Callable:
    """The reward ``spec`` names (a registered name, a weighted sum or an import path), moved to ``device`` when it
    is a module; a one-line ``UsageError`` for an unknown name or a bad import path."""
    from vgrpo_lib.integrations.tasks.hub import make_reward  # the one parser of reward specs (it imports this layer)

    try:
        reward = make_reward(spec)
    except KeyError as error:
        raise UsageError(str(error.args[0])) from None
    return reward.to(device) if device is not None and isinstance(reward, nn.Module) else reward


def served_columns(reward: Callable) -> tuple[list[str] | None, list[float] | None]:
    """The column names and weights of a multi-reward (it has ``stack``), else ``(None, None)``."""
    if not hasattr(reward, "stack"):
        return None, None
    return list(reward.names), [float(w) for w in torch.as_tensor(reward.weights).tolist()]


class Batcher:
    """Scores requests in batches of up to ``max_batch`` images: ``await batcher.score(images, prompts)``.

    ``score_batch(images (N, 3, H, W), prompts) -> (N,)`` or ``(N, R)`` runs in one worker thread. The first waiting
    request opens a batch; requests of the same image size that arrive within ``batch_timeout`` seconds (or while
    the previous batch is being scored) join it until ``max_batch`` images are reached. ``waiting`` counts the
    images not yet scored (the server answers 503 past its limit).
    """

    def __init__(self, score_batch: Callable, max_batch: int, batch_timeout: float):
        self.score_batch, self.max_batch, self.batch_timeout = score_batch, max_batch, batch_timeout
        self.queue: asyncio.Queue | None = None
        self.waiting = 0
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="reward")

    async def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        future = asyncio.get_running_loop().create_future()
        self.waiting += images.shape[0]
        await self.queue.put((images, prompts, future))
        return await future

    def _run(self, items: list) -> torch.Tensor:
        """Score ``items`` (same image size) as one call per ``max_batch`` images: their rows, in order."""
        images = torch.cat([item[0] for item in items])
        prompts = [p for item in items for p in item[1]]
        with torch.no_grad():
            scores = torch.cat([self.score_batch(images[s : s + self.max_batch], prompts[s : s + self.max_batch])
                                for s in range(0, images.shape[0], self.max_batch)])
        return scores.detach().float().cpu()

    async def serve_forever(self) -> None:
        """The batching loop (one task of the server's event loop)."""
        self.queue = asyncio.Queue()
        loop, held = asyncio.get_running_loop(), deque()
        while True:
            first = held.popleft() if held else await self.queue.get()
            batch, size = [first], first[0].shape[0]
            deadline = loop.time() + self.batch_timeout
            while size < self.max_batch:
                if held:
                    item = held.popleft()
                else:
                    try:
                        item = await asyncio.wait_for(self.queue.get(), max(0.0, deadline - loop.time()))
                    except asyncio.TimeoutError:
                        break
                if item[0].shape[1:] != first[0].shape[1:] or size + item[0].shape[0] > self.max_batch:
                    held.append(item)  # another image size, or too many: the next batch
                    break
                batch.append(item)
                size += item[0].shape[0]
            try:
                scores = await loop.run_in_executor(self._worker, self._run, batch)
            except Exception as error:  # the reward raised: every request of the batch gets the error
                for item in batch:
                    if not item[2].done():  # a request whose client went away was cancelled
                        item[2].set_exception(error)
            else:
                for rows, item in zip(scores.split([i[0].shape[0] for i in batch]), batch):
                    if not item[2].done():
                        item[2].set_result(rows)
            self.waiting -= size


def make_app(reward: Callable, name: str, max_batch: int = 32, batch_timeout: float = 0.01,
             max_queue: int | None = None):
    """The FastAPI application serving ``reward`` as ``name`` (see the module doc); ``max_queue`` images may wait
    before new requests get 503 (default ``8 * max_batch``)."""
    with needs_extra("server", "vgrpo reward-server"):
        from contextlib import asynccontextmanager

        from fastapi import FastAPI, HTTPException, Request, Response

    names, weights = served_columns(reward)
    score_batch = reward.stack if names else reward
    batcher = Batcher(score_batch, max_batch, batch_timeout)
    max_queue = 8 * max_batch if max_queue is None else max_queue

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(batcher.serve_forever())
        yield
        task.cancel()

    app = FastAPI(title=f"vgrpo reward server: {name}", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "reward": name, "max_batch": max_batch, "names": names, "weights": weights}

    @app.post("/{requested:path}")
    async def score(requested: str, request: Request) -> Response:
        if requested != name:
            raise HTTPException(404, f"this server serves the reward {name!r}, not {requested!r}")
        try:
            images, prompts = decode_request(await request.body())
        except ValueError as error:
            raise HTTPException(400, str(error)) from None
        if batcher.waiting + images.shape[0] > max_queue:
            raise HTTPException(503, f"{batcher.waiting} images are waiting (--max-queue {max_queue}); retry later")
        try:
            scores = await batcher.score(images, prompts)
        except Exception as error:  # the reward's own failure, reported as one line
            raise HTTPException(500, f"the reward {name!r} raised {type(error).__name__}: {error}") from None
        return Response(encode_scores(scores), media_type="application/octet-stream")

    return app


def serve(reward: Callable, name: str, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 32,
          batch_timeout: float = 0.01, max_queue: int | None = None) -> None:
    """Serve ``reward`` as ``name`` on ``host:port`` until interrupted (uvicorn, one process)."""
    with needs_extra("server", "vgrpo reward-server"):
        import uvicorn

    app = make_app(reward, name, max_batch, batch_timeout, max_queue)
    print(f"serving the reward {name!r} at http://{host}:{port}/{name} (max batch {max_batch}); "
          f"GET http://{host}:{port}/health", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``vgrpo reward-server``."""
    parser.add_argument("--reward", required=True, help="what model.reward takes: a registered name (pickscore, ocr, "
                        "...), a weighted sum a:1,b:0.5, or the import path package.module:fn of your own reward")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: every interface, for "
                        "a trainer on another machine)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch", type=int, default=32, help="images per reward call, at most")
    parser.add_argument("--batch-timeout", type=float, default=0.01, help="seconds a batch waits for more requests")
    parser.add_argument("--max-queue", type=int, default=None, help="images that may wait before requests get 503 "
                        "(default 8 x --max-batch)")
    parser.add_argument("--device", default=None, help="device of the reward model, e.g. cuda:1 (default: where it "
                        "loads, the CPU)")


def run_server(args: argparse.Namespace) -> int:
    """``vgrpo reward-server``: check the flags, load the reward, serve it."""
    if args.max_batch < 1 or args.batch_timeout < 0 or not 0 < args.port < 65536:
        raise UsageError("--max-batch must be >= 1, --batch-timeout >= 0 and --port in 1..65535.")
    if args.max_queue is not None and args.max_queue < args.max_batch:
        raise UsageError("--max-queue must be at least --max-batch.")
    with needs_extra("server", "vgrpo reward-server"):
        import fastapi  # noqa: F401  (a missing extra is one line before the reward loads)
        import uvicorn  # noqa: F401
    reward = load_served_reward(args.reward, args.device)
    serve(reward, args.reward, args.host, args.port, args.max_batch, args.batch_timeout, args.max_queue)
    return 0
