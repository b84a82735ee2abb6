"""The reward zoo on tiny random models built locally and loaded through the real loaders (no downloads)."""

import collections
import json
import os
import string
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from transformers import (BertTokenizer, BlipConfig, BlipImageProcessor, BlipVisionModel, CLIPConfig,  # noqa: E402
                          CLIPImageProcessor, CLIPModel, CLIPTokenizer)
from transformers.models.blip.modeling_blip_text import BlipTextModel  # noqa: E402

from vgrpo_lib.integrations.rewards import (CLIPScore, Detection, GenEvalReward, HPSv21, ImageReward,  # noqa: E402
                                  JPEGCompressibility, LAIONAesthetic, MissingWeightsError, MultiReward, OCRReward, PickScore,
                                  ScoreMLP, available_rewards, get_reward, text_similarity)
from vgrpo_lib.integrations.rewards.preprocess import ImagePreprocessor  # noqa: E402

PROMPTS = ['a sign that says "hello"', "a photo of a cat", "an apple", "two dogs"]


def _images(batch=4, size=40, seed=0):
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _write_clip_tokenizer(path):
    """A byte-level CLIP tokenizer with no merges (every character one token), 514 ids."""
    from tokenizers.pre_tokenizers import ByteLevel

    chars = ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(chars))}
    vocab.update({c + "</w>": len(vocab) + i for i, c in enumerate(sorted(chars))})
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer.from_pretrained(path, model_max_length=16)
    tokenizer.save_pretrained(path)
    return tokenizer


def _tiny_clip_dir(path, seed=0):
    """A tiny random CLIPModel with its tokenizer and image processor, saved like a hub repo."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _write_clip_tokenizer(path)
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=8,
    )
    CLIPModel(config).save_pretrained(path)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return _tiny_clip_dir(tmp_path_factory.mktemp("clip"))


def _check_scores(scores, batch=4):
    assert scores.shape == (batch,)
    assert scores.dtype == torch.float32
    assert torch.isfinite(scores).all()


def test_pickscore_loads_and_matches_the_clip_logits(clip_dir):
    reward = PickScore.from_pretrained(clip_dir, clip_dir)
    images = _images()
    scores = reward(images, PROMPTS)
    _check_scores(scores)
    model = CLIPModel.from_pretrained(clip_dir)
    pixels = reward.preprocess(images)
    tokens = reward.tokenizer(PROMPTS, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    logits = model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, pixel_values=pixels).logits_per_image
    torch.testing.assert_close(scores, logits.diagonal(), rtol=1e-5, atol=1e-5)


def test_clipscore_and_aesthetic_load_from_local_dirs(clip_dir, tmp_path):
    _check_scores(CLIPScore.from_pretrained(clip_dir)(_images(), PROMPTS))
    assert (CLIPScore.from_pretrained(clip_dir)(_images(), PROMPTS) >= 0).all()
    head = tmp_path / "aesthetic.pth"
    torch.save(ScoreMLP(8).state_dict(), head)
    reward = LAIONAesthetic.from_pretrained(clip_dir, head=str(head))
    scores = reward(_images(), PROMPTS)
    _check_scores(scores)
    assert torch.equal(scores, reward(_images(), ["unused"] * 4)), "the aesthetic score ignores the prompt"


def _to_open_clip(model: CLIPModel) -> dict:
    """Write a transformers CLIPModel in open_clip's key layout (the inverse of the HPS loader's renaming)."""
    out = {"logit_scale": model.logit_scale.detach().clone()}
    towers = {"text_model": "", "vision_model": "visual."}
    for hf_name, value in model.state_dict().items():
        value = value.clone()
        if hf_name == "text_projection.weight":
            out["text_projection"] = value.t()
        elif hf_name == "visual_projection.weight":
            out["visual.proj"] = value.t()
        elif ".encoder.layers." in hf_name:
            tower, rest = hf_name.split(".encoder.layers.")
            layer, name = rest.split(".", 1)
            block = f"{towers[tower]}transformer.resblocks.{layer}."
            if name.startswith("self_attn.q_proj"):
                kind = name.rsplit(".", 1)[1]
                qkv = [model.state_dict()[f"{tower}.encoder.layers.{layer}.self_attn.{p}_proj.{kind}"] for p in "qkv"]
                out[f"{block}attn.in_proj_{kind}"] = torch.cat(qkv)
            elif not name.startswith(("self_attn.k_proj", "self_attn.v_proj")):
                for hf_part, oc_part in (("layer_norm1", "ln_1"), ("layer_norm2", "ln_2"),
                                         ("self_attn.out_proj", "attn.out_proj"), ("mlp.fc1", "mlp.c_fc"),
                                         ("mlp.fc2", "mlp.c_proj")):
                    name = name.replace(hf_part, oc_part)
                out[block + name] = value
    top = {
        "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
        "text_model.embeddings.position_embedding.weight": "positional_embedding",
        "text_model.final_layer_norm.weight": "ln_final.weight", "text_model.final_layer_norm.bias": "ln_final.bias",
        "vision_model.embeddings.class_embedding": "visual.class_embedding",
        "vision_model.embeddings.position_embedding.weight": "visual.positional_embedding",
        "vision_model.embeddings.patch_embedding.weight": "visual.conv1.weight",
        "vision_model.pre_layrnorm.weight": "visual.ln_pre.weight", "vision_model.pre_layrnorm.bias": "visual.ln_pre.bias",
        "vision_model.post_layernorm.weight": "visual.ln_post.weight",
        "vision_model.post_layernorm.bias": "visual.ln_post.bias",
    }
    out.update({oc: model.state_dict()[hf].clone() for hf, oc in top.items()})
    return out


def test_hpsv21_loads_an_open_clip_checkpoint_and_scores_the_cosine(clip_dir, tmp_path):
    reference = CLIPModel.from_pretrained(clip_dir)
    checkpoint = tmp_path / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": _to_open_clip(reference)}, checkpoint)
    reward = HPSv21.from_pretrained(str(checkpoint), base=clip_dir)
    for name, value in reference.state_dict().items():
        if "position_ids" not in name:
            torch.testing.assert_close(reward.model.state_dict()[name], value, rtol=0, atol=0, msg=name)
    scores = reward(_images(), PROMPTS)
    _check_scores(scores)
    assert (scores.abs() <= 1 + 1e-5).all(), "HPSv2.1 is a cosine similarity"


def _tiny_blip_dir(path):
    path.mkdir(parents=True, exist_ok=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "[ENC]"] + list(string.ascii_lowercase + string.digits)
    (path / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizer(str(path / "vocab.txt"), bos_token="[DEC]").save_pretrained(path)
    config = BlipConfig(
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        text_config=dict(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, encoder_hidden_size=16, max_position_embeddings=40,
                         bos_token_id=5, sep_token_id=3, pad_token_id=0),
    )
    config.save_pretrained(path)
    BlipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return config


def _image_reward_checkpoint(tmp_path, head: ScoreMLP):
    """Tiny BLIP towers and ``head`` written as ImageReward.pt in the original BLIP layout; returns the towers."""
    config = _tiny_blip_dir(tmp_path / "blip")
    torch.manual_seed(0)
    vision = BlipVisionModel(config.vision_config)
    text = BlipTextModel(config.text_config, add_pooling_layer=False)
    original = {f"mlp.{k}": v for k, v in head.state_dict().items()}
    original.update({f"blip.text_encoder.{k}": v for k, v in text.state_dict().items()})
    vision_names = {"embeddings.class_embedding": "cls_token", "embeddings.position_embedding": "pos_embed",
                    "embeddings.patch_embedding": "patch_embed.proj", "post_layernorm": "norm",
                    "encoder.layers": "blocks", "layer_norm1": "norm1", "layer_norm2": "norm2",
                    "self_attn.qkv": "attn.qkv", "self_attn.projection": "attn.proj"}
    for key, value in vision.state_dict().items():
        for hf, orig in vision_names.items():
            key = key.replace(hf, orig)
        original[f"blip.visual_encoder.{key}"] = value
    original["blip.itm_head.weight"] = torch.zeros(2, 16)
    torch.save(original, tmp_path / "ImageReward.pt")
    return vision, text


def test_imagereward_loads_the_original_checkpoint_layout(tmp_path):
    torch.manual_seed(1)
    vision, _ = _image_reward_checkpoint(tmp_path, ScoreMLP(16))
    reward = ImageReward.from_pretrained(str(tmp_path / "ImageReward.pt"), blip=str(tmp_path / "blip"), image_size=32)
    torch.testing.assert_close(reward.vision_model.state_dict()["embeddings.class_embedding"],
                               vision.state_dict()["embeddings.class_embedding"])
    scores = reward(_images(), PROMPTS)
    _check_scores(scores)
    assert not torch.allclose(scores, reward(_images(), ["zzz", "yyy", "xxx", "www"])), "the prompt matters"


def test_preprocessor_reads_the_processor_config_and_normalises():
    processor = CLIPImageProcessor(size={"shortest_edge": 24}, crop_size={"height": 20, "width": 20})
    prep = ImagePreprocessor.from_image_processor(processor)
    out = prep(torch.full((2, 3, 48, 64), 0.5))
    assert out.shape == (2, 3, 20, 20)
    expected = (0.5 - torch.tensor(processor.image_mean)) / torch.tensor(processor.image_std)
    torch.testing.assert_close(out[0, :, 5, 5], expected)


def test_jpeg_compressibility_prefers_a_flat_image_over_noise():
    flat = torch.full((1, 3, 64, 64), 0.5)
    noise = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    scores = JPEGCompressibility()(torch.cat([flat, noise]), ["", ""])
    _check_scores(scores, 2)
    assert scores[0] > scores[1] and (scores < 0).all()


def _render(text, size=64):
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=size)
        image = Image.new("RGB", (size * 4, size * 2), "white")
        ImageDraw.Draw(image).text((size // 2, size // 3), text, fill="black", font=font)
    except TypeError:  # Pillow < 10.1: only the small bitmap font, rendered small and scaled up.
        image = Image.new("RGB", (64, 32), "white")
        ImageDraw.Draw(image).text((8, 10), text, fill="black")
        image = image.resize((size * 4, size * 2), Image.NEAREST)
    return torch.from_numpy(np.array(image)).permute(2, 0, 1).float()[None] / 255


def test_ocr_reward_reads_a_rendered_digit_string():
    pytest.importorskip("rapidocr_onnxruntime")
    reward = get_reward("ocr")
    image = _render("2026")
    assert reward.recognise(image) == ["2026"]
    scores = reward(torch.cat([image, image]), ['a sign that says "2026"', 'a sign that says "2024"'])
    torch.testing.assert_close(scores, torch.tensor([1.0, 0.75]))
    blank = reward(torch.ones(1, 3, 128, 256), ['a sign that says "2026"'])
    assert blank.item() == 0.0


def test_the_ocr_engine_runs_its_sessions_on_torchs_threads():
    """rapidocr's default (-1 threads) lets onnxruntime start a pool over every core: the OCR reward's default
    engine (``ocr_engine``) runs its three ONNX sessions on torch's threads, one inter-op thread."""
    pytest.importorskip("rapidocr_onnxruntime")
    threads = torch.get_num_threads()
    try:
        for wanted in (1, 2):
            torch.set_num_threads(wanted)
            engine = OCRReward().engine
            sessions = (engine.text_det.infer, engine.text_cls.infer, engine.text_rec.session)
            options = [s.session.get_session_options() for s in sessions]
            assert [(o.intra_op_num_threads, o.inter_op_num_threads) for o in options] == \
                [(min(wanted, os.cpu_count()), 1)] * 3
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="the pin needs a second core on the machine for the engine's threads to leave to")
def test_a_process_pinned_to_one_core_keeps_every_ocr_thread_on_it():
    """onnxruntime's pool threads set their own CPU affinity, leaving a ``taskset`` pin: a one-thread process pinned
    to one core that scores an image with the OCR reward has every thread still allowed on that core only."""
    pytest.importorskip("rapidocr_onnxruntime")
    script = (
        "import os, torch; torch.set_num_threads(1)\n"
        "from vgrpo_lib.integrations.rewards import get_reward\n"
        "reward = get_reward('ocr'); image = torch.ones(1, 3, 64, 192); image[:, :, 20:44, 20:170] = 0\n"
        "reward(image, ['1'])\n"
        "print(sorted({c for t in os.listdir('/proc/self/task') for c in "
        "open(f'/proc/self/task/{t}/status').read().split('Cpus_allowed_list:')[1].split()[:1]}))\n")
    core = min(os.sched_getaffinity(0))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    assert done.stdout.split()[-1] == f"['{core}']", done.stdout


def test_text_similarity_is_flow_grpo_normalised_edit_distance():
    assert text_similarity("Hello World", "helloworld") == 1.0
    assert text_similarity("helo", "hello") == pytest.approx(0.8)
    assert text_similarity("something entirely longer", "abc") == 0.0
    assert text_similarity("x407y", "407") == 1.0  # the target inside the recognised text scores in full


def _levenshtein(a: str, b: str) -> int:
    """Reference Levenshtein distance (the `Levenshtein.distance` the official scorer imports), by recursion."""
    from functools import lru_cache

    @lru_cache(maxsize=None)
    def d(i: int, j: int) -> int:
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))

    return d(len(a), len(b))


def _flow_grpo_ocr_reward(recognized_text: str, prompt: str) -> float:
    """The official per-image formula, transcribed from yifan123/flow_grpo, flow_grpo/ocr.py, OcrScorer.__call__
    (commit ac4c86e): spaces removed, lower case; dist = 0 when the target is in the recognised text, else the
    Levenshtein distance, capped at len(prompt); reward = 1 - dist / len(prompt)."""
    recognized_text = recognized_text.replace(" ", "").lower()
    prompt = prompt.replace(" ", "").lower()
    dist = 0 if prompt in recognized_text else _levenshtein(recognized_text, prompt)
    if dist > len(prompt):
        dist = len(prompt)
    return 1 - dist / len(prompt)


def test_text_similarity_equals_the_official_flow_grpo_formula():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    text = st.text(alphabet="0123456789 aAbS", max_size=7)

    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(recognised=text, target=text.filter(lambda t: t.replace(" ", "")))
    def check(recognised, target):
        assert text_similarity(recognised, target) == pytest.approx(_flow_grpo_ocr_reward(recognised, target), abs=1e-12)

    check()


class _ScriptedOCR:
    """An OCR engine in rapidocr's format that returns scripted texts, recording how it was called."""

    def __init__(self, texts):
        self.texts, self.calls = list(texts), []

    def __call__(self, array, use_det=True, use_cls=False):
        self.calls.append((array.copy(), use_det))
        text = self.texts.pop(0)
        return ([[text, 0.9]] if not use_det else [[[[0, 0], [1, 0], [1, 1], [0, 1]], text, 0.9]]), None


def test_ocr_reward_single_line_through_a_view_with_a_target_function():
    engine = _ScriptedOCR(["407", "4O7", "12"])
    reward = OCRReward(engine=engine, target=lambda p: p.split()[-1], single_line=True, view=lambda x: 1 - x)
    images = torch.zeros(3, 3, 8, 24)
    scores = reward(images, ["the number 407", "the number 407", "the number 12"])
    torch.testing.assert_close(scores, torch.tensor([1.0, 2 / 3, 1.0]))
    assert all(use_det is False for _, use_det in engine.calls)
    assert all((array == 255).all() for array, _ in engine.calls)  # black canvases read as white


def test_ocr_reward_order_free_scores_the_characters_read_in_any_order():
    # "39" read as "93": order-free full credit, ordered the official formula's 0.0 (two substitutions of two).
    # "4 4X" for "444": sorted "44x" vs "444", one substitution: 1 - 1/3 either way.
    # "33" for "3": the official formula's full credit (the target occurs in the text); order-free one extra
    # character of one: 0.0, so drawing a requested digit twice does not pay.
    texts = ["93", "4 4X", "33", ""]
    targets = {"a": "39", "b": "444", "c": "3"}
    prompts = ["a", "b", "c", "c"]
    free = OCRReward(engine=_ScriptedOCR(texts), target=targets.get, single_line=True, order_free=True)
    ordered = OCRReward(engine=_ScriptedOCR(texts), target=targets.get, single_line=True)
    images = torch.zeros(4, 3, 8, 24)
    torch.testing.assert_close(free(images, prompts), torch.tensor([1.0, 2 / 3, 0.0, 0.0]))
    torch.testing.assert_close(ordered(images, prompts), torch.tensor([0.0, 2 / 3, 1.0, 0.0]))


def test_multiset_similarity_is_one_minus_the_edit_distance_of_the_sorted_texts():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from vgrpo_lib.integrations.rewards.simple import multiset_similarity

    text = st.text(alphabet="0123456789 aA", max_size=6)

    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(recognised=text, target=text.filter(lambda t: t.replace(" ", "")), order=st.randoms(use_true_random=False))
    def check(recognised, target, order):
        letters = list(recognised)
        order.shuffle(letters)
        score = multiset_similarity("".join(letters), target)
        assert score == multiset_similarity(recognised, target)  # the order read never matters
        clean = sorted(recognised.replace(" ", "").lower()), sorted(target.replace(" ", "").lower())
        same = collections.Counter(clean[0]) == collections.Counter(clean[1])
        assert (score == 1.0) == same  # full credit exactly when the same characters, as often, were read
        assert 0.0 <= score <= 1.0

    check()
    assert multiset_similarity("x", "") == 0.0 and multiset_similarity(" ", "") == 1.0


def test_geneval_reward_with_an_injected_detector():
    def detector(images):
        cat = Detection("cat", 0.9, (0, 0, 10, 10), color="red")
        dog = Detection("dog", 0.95, (30, 0, 40, 10), color="blue")
        weak_dog = Detection("dog", 0.1, (0, 30, 10, 40))
        return [[cat, dog], [cat, dog, weak_dog], [cat]]

    specs = [
        {"tag": "color_attr", "prompt": "a red cat and a blue dog",
         "include": [{"class": "cat", "count": 1, "color": "red"}, {"class": "dog", "count": 1, "color": "blue"}]},
        {"tag": "position", "prompt": "a dog right of a cat",
         "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["right of", 0]}]},
        {"tag": "position", "prompt": "a dog left of a cat",
         "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}]},
        {"tag": "counting", "prompt": "two dogs",
         "include": [{"class": "dog", "count": 2}], "exclude": [{"class": "dog", "count": 3}]},
    ]
    specs = {spec["prompt"]: spec for spec in specs}
    reward = GenEvalReward(detector, specs)
    images = _images(3)
    torch.testing.assert_close(reward(images, ["a red cat and a blue dog", "a dog right of a cat", "a dog left of a cat"]),
                               torch.tensor([1.0, 1.0, 0.0]))
    assert reward(images, ["two dogs"] * 3).tolist() == [0.0, 0.0, 0.0], "the weak detection does not count"
    partial = GenEvalReward(detector, specs, partial=True)
    assert partial(images, ["two dogs"] * 3).tolist() == [0.5, 0.5, 0.0]
    with pytest.raises(KeyError, match="no requirement spec"):
        reward(images, ["a prompt without a spec"] * 3)


def test_registry_lists_rewards_and_names_the_unknown_one():
    names = available_rewards()
    for expected in ["aesthetic", "clipscore", "geneval", "hpsv21", "imagereward", "jpeg_compressibility", "ocr",
                     "pickscore"]:
        assert expected in names
    with pytest.raises(KeyError) as info:
        get_reward("pickscor")
    assert "pickscor" in str(info.value) and "pickscore" in str(info.value) and "jpeg_compressibility" in str(info.value)


def test_multi_reward_returns_per_reward_scores_and_the_weighted_sum(clip_dir):
    pick = PickScore.from_pretrained(clip_dir, clip_dir)
    multi = MultiReward({"pickscore": 2.0, "jpeg_compressibility": 0.5}, rewards={"pickscore": pick})
    images = _images()
    out = multi(images, PROMPTS)
    assert out.per_reward.shape == (4, 2) and out.total.shape == (4,)
    torch.testing.assert_close(out.per_reward[:, 0], pick(images, PROMPTS))
    torch.testing.assert_close(out.per_reward[:, 1], JPEGCompressibility()(images, PROMPTS))
    torch.testing.assert_close(out.total, 2.0 * out.per_reward[:, 0] + 0.5 * out.per_reward[:, 1])


def test_rewards_follow_their_device_and_return_on_the_input_device(clip_dir):
    reward = PickScore.from_pretrained(clip_dir, clip_dir).to(torch.float64)
    scores = reward(_images(), PROMPTS)
    assert scores.dtype == torch.float32 and scores.device == torch.device("cpu")
    with pytest.raises(ValueError, match="prompts"):
        reward(_images(), PROMPTS[:2])


@pytest.mark.parametrize("name", ["pickscore", "hpsv21", "clipscore", "aesthetic", "imagereward"])
def test_missing_weights_offline_raise_a_clear_error(name, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(MissingWeightsError) as info:
        get_reward(name)
    message = str(info.value)
    assert "weights" in message and "HF_HUB_OFFLINE" in message
    assert "/" in message.split("'")[1], "the message names the hub model"


# -- scores computed by hand from the tiny models' weights -----------------------------------------------------------
# The official scoring code, transcribed: HPSv2 (tgxs002/HPSv2, hpsv2/img_score.py, score()): unit-norm open_clip
# image and text features, hps = diag(image_features @ text_features.T). open_clip (mlfoundations/open_clip,
# src/open_clip/model.py encode_image / encode_text and transformer.py VisionTransformer / TextTransformer /
# ResidualAttentionBlock): x + attn(ln_1(x)), x + mlp(ln_2(x)) with fused in_proj q/k/v; the image feature is
# ln_post(x[:, 0]) @ proj, the text feature ln_final(x)[argmax(ids)] @ text_projection under a causal mask. LAION
# aesthetic (christophschuhmann/improved-aesthetic-predictor, simple_inference.py): the MLP on the L2-normalised
# CLIP image embedding. ImageReward (THUDM/ImageReward, ImageReward/ImageReward.py, score()): the MLP on the text
# encoder's [CLS] feature, then (reward - 0.16717362830052426) / 1.0333394966054072. OpenAI CLIP's pixel statistics
# (openai/CLIP, clip/clip.py, _transform).
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
ACTIVATIONS = {"quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "gelu": torch.nn.functional.gelu}


def _pixels_by_hand(images):
    """32 x 32 images need no resize or crop at the tiny models' 32 px: only CLIP's normalisation."""
    return (images - torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(CLIP_STD).view(1, 3, 1, 1)


def _layer_norm(x, s, name):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], s[f"{name}.weight"], s[f"{name}.bias"], eps=1e-5)


def _block_by_hand(x, s, prefix, heads, act, mask=None):
    batch, tokens, width = x.shape
    h = _layer_norm(x, s, prefix + "ln_1")
    q, k, v = (h @ s[prefix + "attn.in_proj_weight"].T + s[prefix + "attn.in_proj_bias"]).split(width, -1)
    q, k, v = (t.view(batch, tokens, heads, width // heads).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / (width // heads) ** 0.5 + (0.0 if mask is None else mask)
    attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, tokens, width)
    x = x + attended @ s[prefix + "attn.out_proj.weight"].T + s[prefix + "attn.out_proj.bias"]
    h = act(_layer_norm(x, s, prefix + "ln_2") @ s[prefix + "mlp.c_fc.weight"].T + s[prefix + "mlp.c_fc.bias"])
    return x + h @ s[prefix + "mlp.c_proj.weight"].T + s[prefix + "mlp.c_proj.bias"]


def _open_clip_features_by_hand(s, pixels, ids, heads, act):
    """Unit-norm image and text features of an open_clip state dict ``s`` (one layer per tower here)."""
    patch = s["visual.conv1.weight"].shape[-1]
    x = torch.nn.functional.conv2d(pixels, s["visual.conv1.weight"], stride=patch).flatten(2).transpose(1, 2)
    x = torch.cat([s["visual.class_embedding"].expand(x.shape[0], 1, -1), x], 1) + s["visual.positional_embedding"]
    x = _block_by_hand(_layer_norm(x, s, "visual.ln_pre"), s, "visual.transformer.resblocks.0.", heads, act)
    image = _layer_norm(x[:, 0], s, "visual.ln_post") @ s["visual.proj"]
    length = ids.shape[1]
    t = s["token_embedding.weight"][ids] + s["positional_embedding"][:length]
    causal = torch.full((length, length), -float("inf")).triu(1)
    t = _layer_norm(_block_by_hand(t, s, "transformer.resblocks.0.", heads, act, causal), s, "ln_final")
    text = t[torch.arange(ids.shape[0]), ids.argmax(-1)] @ s["text_projection"]
    return torch.nn.functional.normalize(image, dim=-1), torch.nn.functional.normalize(text, dim=-1)


def _spread(head: ScoreMLP) -> ScoreMLP:
    """Unit-normal weights (the default init shrinks through five layers to nearly one score for every input)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return head


def _mlp_by_hand(head: ScoreMLP, x):
    """The score MLP's five linear layers (the dropouts are inert at inference; there is no activation)."""
    for index in (0, 2, 4, 6, 7):
        x = x @ head.layers[index].weight.T + head.layers[index].bias
    return x.squeeze(-1)


def test_hpsv21_equals_the_open_clip_score_computed_by_hand(clip_dir, tmp_path):
    state = _to_open_clip(CLIPModel.from_pretrained(clip_dir))  # the checkpoint: open_clip's layout
    torch.save({"state_dict": state}, tmp_path / "HPS_v2.1_compressed.pt")
    reward = HPSv21.from_pretrained(str(tmp_path / "HPS_v2.1_compressed.pt"), base=clip_dir)
    images = _images(size=32)
    ids = reward.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=16, return_tensors="pt").input_ids
    act = ACTIVATIONS[reward.model.config.vision_config.hidden_act]
    image, text = _open_clip_features_by_hand(state, _pixels_by_hand(images), ids, heads=2, act=act)
    expected = (image @ text.T).diagonal()
    torch.testing.assert_close(reward(images, PROMPTS), expected, rtol=1e-5, atol=1e-6)
    assert expected.std() > 1e-3, "the four scores differ: the comparison is not between constants"


def test_aesthetic_equals_the_score_computed_by_hand(clip_dir, tmp_path):
    head = _spread(ScoreMLP(8))
    torch.save(head.state_dict(), tmp_path / "aesthetic.pth")
    reward = LAIONAesthetic.from_pretrained(clip_dir, head=str(tmp_path / "aesthetic.pth"))
    state = _to_open_clip(CLIPModel.from_pretrained(clip_dir))
    images = _images(size=32)
    ids = reward.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=16, return_tensors="pt").input_ids
    act = ACTIVATIONS[reward.model.config.vision_config.hidden_act]
    image, _ = _open_clip_features_by_hand(state, _pixels_by_hand(images), ids, heads=2, act=act)
    expected = _mlp_by_hand(head, image)
    torch.testing.assert_close(reward(images, PROMPTS), expected, rtol=1e-5, atol=1e-4)
    assert expected.std() > 1e-2


def test_imagereward_equals_the_head_and_standardisation_computed_by_hand(tmp_path):
    head = _spread(ScoreMLP(16))
    vision, text = _image_reward_checkpoint(tmp_path, head)
    reward = ImageReward.from_pretrained(str(tmp_path / "ImageReward.pt"), blip=str(tmp_path / "blip"), image_size=32)
    images = _images(size=32)
    processor = BlipImageProcessor.from_pretrained(tmp_path / "blip")
    mean, std = torch.tensor(processor.image_mean).view(1, 3, 1, 1), torch.tensor(processor.image_std).view(1, 3, 1, 1)
    tokens = reward.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    with torch.no_grad():
        image_tokens = vision.eval()(pixel_values=(images - mean) / std).last_hidden_state
        fused = text.eval()(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                            encoder_hidden_states=image_tokens).last_hidden_state
        expected = (_mlp_by_hand(head, fused[:, 0]) - 0.16717362830052426) / 1.0333394966054072
    torch.testing.assert_close(reward(images, PROMPTS), expected, rtol=1e-5, atol=1e-4)
    assert expected.std() > 1e-2
