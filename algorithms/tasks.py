"""Where the trainer gets its task (prompts, base policy, reward, evaluation) from.

The embedded testbed (``integrations.testbed``) provides every task that runs anywhere. The paper's
SD3.5-Medium and FLUX.1-dev settings are presets whose tasks need those models; they fail here with a
message saying what is missing.
"""

from __future__ import annotations

from integrations.testbed.data import to_images, to_model_space
from integrations.testbed.tasks import TASKS, Task, get_task

__all__ = ["load_task", "to_images", "to_model_space", "Task", "TASKS"]

HUB_TASKS = {
    "sd3.5-medium": "stabilityai/stable-diffusion-3.5-medium",
    "flux.1-dev": "black-forest-labs/FLUX.1-dev",
}


def load_task(name: str) -> Task:
    """A testbed task by name; the hub-model tasks raise a clear error when their model is not available."""
    if name in HUB_TASKS:
        raise RuntimeError(
            f"Task {name!r} trains {HUB_TASKS[name]}, whose weights are not available on this machine "
            "(no hub downloads at run time). Use the diffusers adapters in integrations.diffusers_adapters on a "
            f"machine that has the model, or a testbed task: {', '.join(TASKS)}."
        )
    return get_task(name)
