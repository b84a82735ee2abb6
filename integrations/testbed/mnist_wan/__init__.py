"""MNIST-Wan: a real ``WanPipeline`` (text to video) trained by the project on moving MNIST digits, on one CPU core.

* ``prompts``: the ``motion`` task's grammar ("a 3 moving left"), train/eval phrasings, ``parse_motion``.
* ``render``: the clip geometry (9 frames of 32x32), moving-digit clips from the real MNIST-5k digits, and the
  measurements rewards read (``centre_of_mass``, ``measured_direction``, ``classifier_view``).
* ``rewards``: the ``motion`` task's reward (``MotionReward``: classifier probability x centre-of-mass motion
  agreement) and its independent judge (``MotionJudge``: the MLP judge and block-matching motion).
* ``build``: the pipeline's components in their final configs (``build_pipeline``).
* ``train``: the resumable rebuild (``python -m vgrpo_lib.integrations.testbed.mnist_wan.train --work DIR``):
  VAE, then transformer and text encoder by rectified flow, then the measurements; ``card``: its model card.
"""
