"""``vgrpo_lib.benchmarks.compare`` is a package of four small modules (protocol, stats, report, runner), and every
name of its ``__all__`` is importable from the package as before the split."""

import importlib

import vgrpo_lib.benchmarks.compare as compare

PARTS = ("protocol", "stats", "report", "runner")


def test_each_public_name_lives_in_exactly_one_part_and_is_reexported():
    modules = {part: importlib.import_module(f"vgrpo_lib.benchmarks.compare.{part}") for part in PARTS}
    homes = {name: [part for part, module in modules.items() if name in module.__all__] for name in compare.__all__}
    assert all(len(parts) == 1 for parts in homes.values()), homes
    for name, [part] in homes.items():
        assert getattr(compare, name) is getattr(modules[part], name)
    assert {"run_compare", "VARIANTS", "selection_key", "markdown_table", "ratio_cell", "aggregate_seeds"} <= set(compare.__all__)
