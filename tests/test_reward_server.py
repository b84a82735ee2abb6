"""``vgrpo reward-server`` and the remote reward client: real server processes on free ports, a run of the MNIST-SD3
digit task trained through one, a server that dies mid-run (one clear line, exit 6, ``--resume`` after its restart
ends equal to an uninterrupted run), retries on 503 and timeouts against a scripted stand-in server, and the
batcher's batches."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.request import urlopen

import pytest
import torch

from vgrpo_lib.integrations.rewards import JPEGCompressibility, get_reward
from vgrpo_lib.integrations.rewards.remote import (
    RemoteReward, RemoteRewardError, encode_scores, parse_remote_spec, remote_reward,
)
from vgrpo_lib.integrations.rewards.server import Batcher

REPO = Path(__file__).resolve().parents[1]
STARTUP_S = 300  # a loaded 2-core machine imports torch and the library in tens of seconds
BUDGET_VARIABLE = "VGRPO_TEST_REWARD_BUDGET"
_JPEG = JPEGCompressibility()
_served = 0


def jpeg_scores(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """A user's reward by import path (served as ``tests.test_reward_server:jpeg_scores``): the zoo's JPEG
    compressibility. With ``VGRPO_TEST_REWARD_BUDGET=N`` in its environment the server process dies (``os._exit``)
    instead of scoring past N images: a server that goes away at a known point of a run."""
    global _served
    budget = os.environ.get(BUDGET_VARIABLE)
    if budget is not None and _served + images.shape[0] > int(budget):
        os._exit(3)
    _served += images.shape[0]
    return _JPEG(images, prompts)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``vgrpo reward-server`` in a subprocess on ``port``: ``launch()`` starts it, ``wait_ready()`` returns once
    ``/health`` answers (or fails with the server's output), ``start()`` is both; ``stop()`` terminates it (also when
    it already died)."""

    def __init__(self, reward: str, port: int, log: Path, env: dict | None = None):
        self.reward, self.port, self.log, self.env = reward, port, log, env or {}
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.reward}"

    def start(self) -> "ServerProcess":
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), **self.env}
        command = [sys.executable, "-m", "vgrpo_lib.benchmarks.cli", "reward-server", "--reward", self.reward,
                   "--port", str(self.port), "--max-batch", "4"]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> "ServerProcess":
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                with urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as answer:
                    assert json.loads(answer.read())["reward"] == self.reward
                    return self
            except OSError:
                pass
            try:  # the pause between polls: returns at once if the server process has ended
                self.process.wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the reward server did not come up: {self.log.read_text()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def zoo_server(tmp_path_factory):
    """The zoo's ``jpeg_compressibility`` served on a free port for the whole module."""
    server = ServerProcess("jpeg_compressibility", _free_port(), tmp_path_factory.mktemp("zoo") / "server.log")
    try:
        yield server.start()
    finally:
        server.stop()


def _images(count: int, seed: int = 0) -> torch.Tensor:
    return torch.rand((count, 3, 16, 16), generator=torch.Generator().manual_seed(seed))


# -- the served zoo reward ------------------------------------------------------------------------------------------


def test_batched_scores_equal_the_in_process_reward(zoo_server):
    """10 images in chunks of the server's max batch (4), two in flight: the in-process reward's exact scores."""
    remote = remote_reward(zoo_server.url)
    assert isinstance(remote, RemoteReward) and remote.max_batch == 4
    images, prompts = _images(10), [f"prompt {i}" for i in range(10)]
    expected = get_reward("jpeg_compressibility")(images, prompts)
    assert torch.equal(remote(images, prompts), expected)
    assert torch.equal(remote.submit(images, prompts).result(), expected)
    exact = remote_reward(zoo_server.url + "?wire=float32&concurrency=1")
    assert torch.equal(exact(images, prompts), expected)


def test_a_weighted_reward_mixes_served_and_local_rewards(zoo_server):
    from vgrpo_lib.integrations.tasks.hub import make_reward

    mixed = make_reward(f"{zoo_server.url}:2,jpeg_compressibility:0.5")
    assert mixed.names == ["remote_jpeg_compressibility", "jpeg_compressibility"]
    images, prompts = _images(6, seed=1), ["p"] * 6
    local = get_reward("jpeg_compressibility")(images, prompts)
    assert torch.equal(mixed.stack(images, prompts), torch.stack([local, local], 1))
    assert torch.equal(mixed(images, prompts), torch.stack([local, local], 1) @ torch.tensor([2.0, 0.5]))


def test_the_server_names_what_it_serves_and_refuses_bad_requests(zoo_server):
    with pytest.raises(ValueError, match=r"serves 'jpeg_compressibility', not 'ocr'"):
        remote_reward(f"http://127.0.0.1:{zoo_server.port}/ocr")
    wrong = RemoteReward(parse_remote_spec(f"http://127.0.0.1:{zoo_server.port}/ocr"), max_batch=4)
    with pytest.raises(RemoteRewardError, match=r"HTTP 404: this server serves the reward 'jpeg_compressibility'"):
        wrong(_images(2), ["a", "b"])
    with pytest.raises(RemoteRewardError, match="HTTP 400: the body is not a reward request"):
        remote_reward(zoo_server.url)._post(b"not safetensors")


def test_spec_errors_are_one_line_each():
    for spec, message in [("http://host:8000", "not a URL of the form"), ("http://h:1/r?speed=3", "unknown option"),
                          ("http://h:1/r?wire=int4", "wire='int4'"),
                          ("http://h:1/r?retries=-1", "retries and backoff")]:
        with pytest.raises(ValueError, match=message):
            parse_remote_spec(spec)


def test_a_server_that_is_not_there_is_one_line_naming_the_url():
    url = f"http://127.0.0.1:{_free_port()}/pickscore"
    with pytest.raises(RemoteRewardError, match=rf"the reward server at http://127.0.0.1:\d+/health did not answer "
                       r"\(.*\) in 2 attempt\(s\)") as caught:
        remote_reward(url + "?retries=1&backoff=0.01")
    assert "\n" not in str(caught.value) and "--resume" in str(caught.value)


def test_the_command_refuses_an_unknown_reward_in_one_line(capsys):
    from vgrpo_lib.benchmarks.cli import main

    assert main(["reward-server", "--reward", "no_such_reward", "--port", str(_free_port())]) == 2
    assert "vgrpo reward-server: error: unknown reward 'no_such_reward'" in capsys.readouterr().err


# -- retries and timeouts against a scripted stand-in server ----------------------------------------------------------


class Scripted:
    """A stand-in HTTP server answering POSTs by a script: an int is that HTTP status (with a FastAPI-like detail),
    ``"scores"`` a valid answer (``-1`` per image), ``"hang"`` holds the connection until ``release`` is set."""

    def __init__(self, script: list):
        self.script, self.posts, self.release = list(script), 0, threading.Event()
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                step = scripted.script[min(scripted.posts, len(scripted.script) - 1)]
                scripted.posts += 1
                if step == "hang":
                    scripted.release.wait()
                    return
                if step == "scores":
                    from vgrpo_lib.integrations.rewards.remote import decode_request

                    images, _ = decode_request(body)
                    payload, status = encode_scores(-torch.ones(images.shape[0])), 200
                else:
                    payload, status = json.dumps({"detail": f"scripted {step}"}).encode(), step
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Scripted":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def reward(self, options: str) -> RemoteReward:
        return RemoteReward(parse_remote_spec(f"http://127.0.0.1:{self.server.server_port}/r?{options}"), max_batch=8)


def test_a_transient_503_is_retried_with_backoff():
    with Scripted([503, 503, "scores"]) as server:
        assert torch.equal(server.reward("retries=3&backoff=0.01")(_images(3), ["a"] * 3), -torch.ones(3))
        assert server.posts == 3


def test_503_past_the_retries_and_a_500_fail_in_one_line_naming_the_url():
    with Scripted([503]) as server:
        with pytest.raises(RemoteRewardError, match=r"at http://127.0.0.1:\d+/r did not answer \(HTTP 503: scripted "
                           r"503\) in 3 attempt\(s\)"):
            server.reward("retries=2&backoff=0.01")(_images(1), ["a"])
        assert server.posts == 3
    with Scripted([500]) as server:  # the reward raised on the server: not retried
        with pytest.raises(RemoteRewardError, match=r"refused the request: HTTP 500: scripted 500"):
            server.reward("retries=3&backoff=0.01")(_images(1), ["a"])
        assert server.posts == 1


def test_a_server_that_does_not_answer_times_out():
    with Scripted(["hang"]) as server:
        with pytest.raises(RemoteRewardError, match=r"did not answer \(.*timed out.*\) in 2 attempt\(s\)"):
            server.reward("timeout=0.5&retries=1&backoff=0.01")(_images(1), ["a"])
        assert server.posts == 2


# -- the batcher -----------------------------------------------------------------------------------------------------


def test_the_batcher_merges_requests_by_image_size_up_to_max_batch():
    """Four requests waiting at once (4x4 images: 2, 2, 2; one of 8x8: 3), max batch 4: consecutive requests of one
    size share a call until it is full, each request gets its own rows back."""
    calls = []

    def score_batch(images, prompts):
        calls.append((tuple(images.shape), list(prompts)))
        return images.flatten(1).sum(1)

    async def scenario():
        batcher = Batcher(score_batch, max_batch=4, batch_timeout=60.0)  # here every batch closes before its timeout
        loop = asyncio.create_task(batcher.serve_forever())
        while batcher.queue is None:
            await asyncio.sleep(0)
        small = [torch.full((2, 3, 4, 4), float(i)) for i in range(3)]
        large = torch.ones((3, 3, 8, 8))
        results = await asyncio.gather(batcher.score(small[0], ["a", "b"]), batcher.score(large, ["x", "y", "z"]),
                                       batcher.score(small[1], ["c", "d"]), batcher.score(small[2], ["e", "f"]))
        loop.cancel()
        return small, large, results

    small, large, results = asyncio.run(scenario())
    assert calls == [((2, 3, 4, 4), ["a", "b"]), ((3, 3, 8, 8), ["x", "y", "z"]), ((4, 3, 4, 4), ["c", "d", "e", "f"])]
    for expected, got in zip([small[0], large, small[1], small[2]], results):
        assert torch.equal(got, expected.flatten(1).sum(1))


# -- training through a server, and a server that dies mid-run -------------------------------------------------------


def _train_arguments(out: Path, url: str, eval_prompts: Path) -> list[str]:
    return ["train", "--preset", "mnist-sd3", "--task", "digit", "--out", str(out), "iterations=2",
            "prompts_per_iteration=2", "group_size=2", "rollout.num_steps=2", "vgrpo.num_pairs=1", "eval.per_prompt=2",
            "eval.num_steps=1", "eval.every=0", "checkpoint_every=1", f"model.eval_prompts={eval_prompts}",
            f"model.reward={url}?retries=2&backoff=0.05"]


@pytest.mark.slow
def test_a_run_trains_through_the_server_and_resumes_after_the_server_died(zoo_server, tmp_path, capsys):
    pytest.importorskip("diffusers")
    from vgrpo_lib.benchmarks.cli import main
    from vgrpo_lib.benchmarks.reliability import run_differences
    from vgrpo_lib.integrations.testbed.mnist_sd3 import prompts as grammar

    eval_prompts = tmp_path / "eval_prompts.txt"
    eval_prompts.write_text(grammar.digit_prompts("eval")[0][0] + "\n")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    # The same reward by import path, from a server that dies when asked for iteration 1's rewards: 2 evaluation
    # images, then iteration 0's 4 samples, then nothing. It starts up while the uninterrupted run trains.
    port, reward = _free_port(), "tests.test_reward_server:jpeg_scores"
    dying = ServerProcess(reward, port, tmp_path / "dying.log", env={BUDGET_VARIABLE: "6"})
    try:
        dying.launch()
        assert main(_train_arguments(straight, zoo_server.url, eval_prompts)) == 0
        dying.wait_ready()
        capsys.readouterr()
        assert main(_train_arguments(resumed, dying.url, eval_prompts)) == 6
        assert dying.process.wait(timeout=60) == 3  # it died, as scripted
    finally:
        dying.stop()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vgrpo train: error:")]
    assert len(errors) == 1 and "at iteration 1" in errors[0] and f"the reward server at {dying.url}" in errors[0]
    assert "--resume" in errors[0]

    restarted = ServerProcess(reward, port, tmp_path / "restarted.log")
    try:
        restarted.start()
        assert main(["train", "--out", str(resumed), "--resume"]) == 0
    finally:
        restarted.stop()
    assert run_differences(straight, resumed) == []
    final = [json.loads(line) for line in (straight / "eval.jsonl").read_text().splitlines()][-1]
    final_resumed = [json.loads(line) for line in (resumed / "eval.jsonl").read_text().splitlines()][-1]
    assert final_resumed["reward_mean"] == final["reward_mean"] and final["iteration"] == 2
