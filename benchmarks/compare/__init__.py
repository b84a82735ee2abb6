"""The controlled comparison: V-GRPO against its baselines and peers on the same task, base policy, prompts,
reward, group size and budget (the same iterations, or with ``nfe_budget`` the same model evaluations per sample,
each setting's iterations then fitted to its own cost: :func:`setting_iterations`), under a protocol that favours no
algorithm (issue 12):

1. **Tuning** on ``TUNING_SEED`` (or on ``tuning_seeds`` seeds from it), none among the reported seeds. Every
   algorithm gets the same budget: the grid ``LEARNING_RATES`` x its step controls (``Variant.step_controls``, as
   many for each): one gradient step per rollout, two epochs over the rollout (with the algorithm's ratio clip
   where it has one), and the several-steps setting of its own paper. The rate is constant over a run, or with
   ``lr_decay`` falls by a cosine to that fraction of it over each setting's iterations (:func:`setting_config`).
2. **Target**, by a rule that depends on no algorithm's pilot, fixed after tuning and before any reported run:
   ``base + TARGET_FRACTION * (ceiling - base)``, where ``base`` is the mean first-iteration training reward of
   every tuning run (the base policy's) and ``ceiling`` the best smoothed training reward any tuning run reaches.
   It is written to ``DIR/protocol.json`` before the reported runs start and stated in the summary. Beside it,
   the same rule on the held-out evaluation reward (``heldout``: base the iteration-0 evaluation, ceiling the best
   evaluation of any tuning run): the training reward is scored on each algorithm's own rollout, and rollouts
   that are SDEs or have SDE windows score differently from the ODE at the same weights, while the evaluation
   is one sampler for all; its clock ticks once per evaluation.
3. **Selection**: per algorithm the tuning setting with the shortest wall-clock time to the target (else the best
   final reward; over several tuning seeds: the fewest that missed, then the median time, then the mean reward);
   ``select="heldout"`` selects by the held-out target instead (else the best final held-out reward), the check
   that a training-reward target, biased between rollout samplers, did not decide the choice;
   ``select="heldout-kept"`` selects by the held-out target too but counts a run that ends below it as a miss, so
   that a learning rate that crosses the target first and then falls back is not chosen.
4. **Reported runs**: the chosen setting on seeds ``0 .. seeds - 1`` (at least ``MIN_SEEDS``; ``quick`` runs are
   smoke tests and may use fewer).
5. **Statistics**: medians over seeds of the time (wall-clock and CPU seconds), NFE and gradient steps to the
   target (a seed that never reaches it counts as infinite), the same to the held-out target (``heldout_*``), and,
   against ``REFERENCE`` (V-GRPO), the ratio of medians with a bootstrap 90% interval (seeds resampled within each
   algorithm). Where the other algorithm's misses leave under 90% of the resamples estimable, the ratio's
   ``bound`` counts each miss at its run's end (``KEY_exceeds``, a lower bound on its time): an upper bound on the
   ratio and on the interval's upper end. ``protocol.json`` records which target selected (``selection``).

Every run records training reward, held-out evaluation, seconds, NFE and gradient steps (:mod:`vgrpo_lib.algorithms.trainer`);
time to target is read off the training-reward curve smoothed over ``SMOOTHING`` iterations. Writes
``DIR/protocol.json``, ``DIR/summary.json``, ``DIR/summary.md``, reward plots against wall-clock, NFE and gradient
steps with seed bands, and each run's directory. KL terms to the base policy are off for every algorithm and
Flow-GRPO rolls out without CFG (the reward of CFG rollouts is not the CFG-free policy's), so the algorithms'
cores are compared; the other official settings are on (``--preset official``, docs/concepts/baselines.md). Run again
with the same ``DIR``, an interrupted comparison continues: finished runs are read back from their tables (no
checkpoint needed), a cut one resumes from its newest checkpoint (:func:`start_or_resume`). Start the same command
again while it runs (on another core) and the two share the runs (:func:`train_stage`).

Add an algorithm by adding a :class:`Variant` to ``VARIANTS`` (its step controls default to
``DEFAULT_STEP_CONTROLS``).
"""

from vgrpo_lib.benchmarks.compare.protocol import (
    DEFAULT_STEP_CONTROLS, FLOW_GRPO_CORE, LEARNING_RATES, MIN_SEEDS, REFERENCE, SELECTIONS, SMOOTHING, TARGET_FRACTION,
    TASK_OVERRIDES, TUNING_SEED, VARIANTS, Selection, Variant, build, chosen_config, cosine_decay, run_name,
    setting_budget, setting_config, variant_preset,
)
from vgrpo_lib.benchmarks.compare.report import markdown_table, plot_curves, ratio_cell
from vgrpo_lib.benchmarks.compare.runner import (
    COMPARISON_ENTRIES, POLL_SECONDS, FinishedRun, check_comparison_folder, finished_run, run_compare,
    setting_iterations, start_or_resume, train_stage, train_to_end,
)
from vgrpo_lib.benchmarks.compare.stats import (
    BOOTSTRAP_RESAMPLES, DIAGNOSTICS, HELDOUT_KEPT, HELDOUT_RATIO_KEYS, INTERVAL, TRAINING_RATIO_KEYS, aggregate_seeds,
    first_heldout_evaluation, heldout_target_rule, heldout_time_to_target, keeps_heldout_target, median_ratio_interval,
    median_ratios, selection_key, smoothed, summarise_run,
    target_rule, time_to_target,
)

__all__ = [
    "BOOTSTRAP_RESAMPLES", "COMPARISON_ENTRIES", "DEFAULT_STEP_CONTROLS", "DIAGNOSTICS", "FLOW_GRPO_CORE", "HELDOUT_KEPT", "HELDOUT_RATIO_KEYS", "INTERVAL",
    "LEARNING_RATES", "MIN_SEEDS", "POLL_SECONDS", "REFERENCE", "SELECTIONS", "SMOOTHING", "TARGET_FRACTION", "TASK_OVERRIDES",
    "TRAINING_RATIO_KEYS", "TUNING_SEED", "VARIANTS", "FinishedRun", "Selection", "Variant", "aggregate_seeds", "build",
    "check_comparison_folder", "chosen_config", "cosine_decay",
    "finished_run", "first_heldout_evaluation", "heldout_target_rule", "heldout_time_to_target", "keeps_heldout_target",
    "markdown_table", "median_ratio_interval", "median_ratios",
    "plot_curves", "ratio_cell", "run_compare", "run_name", "selection_key", "setting_budget", "setting_config",
    "setting_iterations",
    "smoothed", "start_or_resume",
    "summarise_run", "target_rule", "time_to_target", "train_stage", "train_to_end", "variant_preset",
]
