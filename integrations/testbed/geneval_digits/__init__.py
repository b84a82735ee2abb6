"""GenEval on digits: GenEval's six prompt categories with MNIST digits as the objects.

* `prompts`: the grammar and the disjoint train / eval prompt sets as GenEval metadata.
* `compositions`: synthetic canvases (tinted, scaled, placed MNIST-5k digits) satisfying any spec,
  with exact boxes: the detector's training data and a composition pipeline's.
* `detector`: a small dense digit detector, its decoding and the crop colour classifier.
* `train_detector`: trains and measures the shipped detector and its independent judge.
* `reward`: GenEval's rules (`vgrpo_lib.integrations.rewards.geneval`) on the shipped detectors.
"""
