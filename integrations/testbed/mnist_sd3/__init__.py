"""MNIST-SD3: a real ``StableDiffusion3Pipeline`` trained by the project on MNIST, small enough for two CPU cores.

* ``prompts``: the prompt grammar of the digit and number (OCR) tasks, train/eval splits, parsers.
* ``render``: the image geometry (``DIGIT_SIZE``, ``NUMBER_SIZE``), data rendering from the real
  MNIST-5k digits, and the views the rewards read (``classifier_view``, ``ocr_view``).
* ``build``: the pipeline's components in their final configs (``build_pipeline``) and the shipped
  folder ``PIPELINE_DIR`` (``StableDiffusion3Pipeline.from_pretrained(unpacked_folder(PIPELINE_DIR))``: the weights ship
  packed, :mod:`vgrpo_lib.integrations.packed_weights`).
* ``train``: the rebuild (``python -m vgrpo_lib.integrations.testbed.pretrain mnist_sd3``): VAE, then transformer and
  text encoders by rectified flow, then the measurements; ``card``: the model card written with it.
"""
