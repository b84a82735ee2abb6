"""GenEval on digits: GenEval's six prompt categories with MNIST digits as the objects.

* `prompts`: the grammar and the disjoint train / eval prompt sets as GenEval metadata.
"""
