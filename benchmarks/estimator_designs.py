"""The estimator designs that the estimator lab and the ground-truth check measure: ``ELBOSurrogate`` keyword
arguments by name (one table for both, so neither imports the other).

``PILOT`` is a placeholder for ``timesteps``: the estimator lab replaces it with the importance density it measures
on its rollout (:func:`vgrpo_lib.benchmarks.estimator_lab.pilot_importance_density`); the ground truth, on another
model, leaves those designs out.
"""

from __future__ import annotations

__all__ = ["ANTITHETIC", "ESTIMATORS", "IMPORTANCE", "NAIVE", "PILOT", "QUICK", "VGRPO", "without_pilot"]

VGRPO = dict(num_pairs=4, timesteps="stratified", sharing="group", weighting="adaptive_x")
NAIVE = dict(num_pairs=4, timesteps="uniform", sharing="none", weighting="v")
PILOT = "pilot"  # placeholder timesteps: the importance density measured on the rollout (pilot_importance_density)
IMPORTANCE = {**VGRPO, "timesteps": PILOT}
ANTITHETIC = {**VGRPO, "noise": "antithetic"}

ESTIMATORS: dict[str, dict] = {
    "naive": NAIVE,
    "vgrpo": VGRPO,
    "vgrpo_without_sharing": {**VGRPO, "sharing": "none"},
    "vgrpo_without_stratified": {**VGRPO, "timesteps": "uniform"},
    "vgrpo_without_adaptive": {**VGRPO, "weighting": "v"},
    "vgrpo_batch_sharing": {**VGRPO, "sharing": "batch"},
    **{f"vgrpo_k{k}": {**VGRPO, "num_pairs": k} for k in (1, 2, 8)},
    **{f"vgrpo_weighting_{w}": {**VGRPO, "weighting": w} for w in ("eps", "x", "elbo")},  # "v": vgrpo_without_adaptive
    # Our options beyond the paper, at the paper's K = 4 (equal NFE) unless the name says otherwise.
    "vgrpo_importance (ours)": IMPORTANCE,
    "vgrpo_antithetic (ours)": ANTITHETIC,
    "vgrpo_antithetic_k8 (ours)": {**ANTITHETIC, "num_pairs": 8},
    "vgrpo_antithetic_importance (ours)": {**ANTITHETIC, "timesteps": PILOT},
}
QUICK = ("naive", "vgrpo", "vgrpo_without_sharing", "vgrpo_without_stratified", "vgrpo_without_adaptive",
         "vgrpo_k2", "vgrpo_k8", "vgrpo_weighting_eps", "vgrpo_weighting_x", "vgrpo_importance (ours)",
         "vgrpo_antithetic (ours)", "vgrpo_antithetic_importance (ours)")


def without_pilot(names) -> dict[str, dict]:
    """The designs among ``names`` whose timesteps do not depend on a pilot measurement of a rollout."""
    return {name: ESTIMATORS[name] for name in names if ESTIMATORS[name]["timesteps"] != PILOT}
