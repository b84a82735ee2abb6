"""The hub path: train a LoRA on a real diffusers SD3 pipeline, export it, load it back in diffusers.

The shipped MNIST-SD3 pipeline (`integrations/testbed/checkpoints/mnist_sd3`, a `StableDiffusion3Pipeline` folder of
a few MB) goes through exactly the code of `--preset sd3.5-medium`: a peft LoRA adapter on the transformer, the
reference policy as the adapter switched off, the scheduler's sigma grid, VAE decoding. Only the preset's values
differ (float32 on the CPU, SD3's T5-free mode, small images). For SD3.5-Medium or FLUX.1-dev, change the preset
(`sd3.5-medium`, `flux.1-dev`) and run on a GPU; everything below stays the same.

    pip install -e ".[diffusers]"
    python docs/examples/hub_lora_export.py          # about a minute on a CPU
"""

import tempfile
from pathlib import Path

import torch
from diffusers import StableDiffusion3Pipeline

from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.export import export_run
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.diffusers_adapters.presets import absent_components
from vgrpo_lib.integrations.packed_weights import unpacked_folder
from vgrpo_lib.integrations.testbed.mnist_sd3.build import PIPELINE_DIR

# 1. Train V-GRPO with a LoRA adapter on the shipped pipeline: what `vgrpo train --preset mnist-sd3 --task digit`
#    runs, shortened to one iteration of 2 prompts x 2 images (a real run keeps the preset's values).
SHORT = ["iterations=1", "prompts_per_iteration=2", "group_size=2", "rollout.num_steps=2", "vgrpo.num_pairs=1",
         "eval.per_prompt=1", "eval.num_steps=1", "eval.every=0",
         "optim.lr=1e-2"]  # a large step, so that one iteration visibly moves the adapter
config = TrainConfig.for_algo("vgrpo", preset="mnist-sd3", task="digit", overrides=SHORT)
print("model.path:", config.model.path, "| LoRA rank:", config.model.lora_rank)

with tempfile.TemporaryDirectory() as tmp:
    run_dir, export_dir = Path(tmp) / "run", Path(tmp) / "lora"
    Trainer(config, run_dir, progress=False).train()

    # 2. Export: the LoRA in the diffusers format (the pipeline class's save_lora_weights) and a model card.
    written = export_run(run_dir, export_dir)
    print("exported:", sorted(p.name for p in written))
    assert (export_dir / "pytorch_lora_weights.safetensors").is_file()

    # 3. Load it in plain diffusers. The shipped weights are packed: unpacked_folder gives the plain folder (unpacked
    #    once into a cache, checked on every call). The folder was saved without T5: absent_components(path) passes
    #    text_encoder_3=None / tokenizer_3=None, as diffusers requires for a component recorded as absent.
    path = str(unpacked_folder(PIPELINE_DIR))
    pipe = StableDiffusion3Pipeline.from_pretrained(path, dtype=torch.float32, **absent_components(path))

    def generate() -> torch.Tensor:
        """One CFG-free image from a fixed seed, as an array (H, W, 3) in [0, 1]."""
        image = pipe("the digit seven", height=32, width=32, num_inference_steps=4, guidance_scale=1.0,
                     max_sequence_length=77, generator=torch.Generator().manual_seed(0), output_type="np").images[0]
        return torch.from_numpy(image)

    before = generate()
    pipe.load_lora_weights(export_dir)
    after = generate()

    change = (after - before).abs().max().item()
    print(f"largest pixel change from the trained LoRA: {change:.4f}")
    assert change > 1e-4, "the exported LoRA did not change the pipeline's output"
print("the exported LoRA loads into StableDiffusion3Pipeline and changes its output")
