"""Cold seeds (evo.tasks.seeds, "Cold seeds"): neutral tunable values, never the hand-chosen ones."""

from __future__ import annotations

import pytest

from evo.tasks.seeds import (COLD_SUFFIX, SEEDS, UnknownSeedError, cold_params, cold_spec, cold_task,
                             seed_params, seed_source, seed_spec)
from evo.tasks.seedspec import SeedSpec, render
from evo.core.tunables import check_tunable_defaults, parse_tunables, violated_constraints


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_every_seed_has_a_feasible_cold_seed_whose_source_declares_it(name):
    params = cold_params(name)
    src = seed_source(name + COLD_SUFFIX)
    assert violated_constraints(src, params) == []
    assert seed_params(name + COLD_SUFFIX) == params  # the cold source's own defaults
    assert check_tunable_defaults(src) == []  # annotation and #ifndef agree
    # same template and task-config block as the hand-tuned seed
    assert cold_spec(name).template == SEEDS[name].template and cold_spec(name).defines == SEEDS[name].defines


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_cold_values_are_first_choices_except_constraint_fallbacks_to_the_template_default(name):
    spec = SEEDS[name]
    template = {t.name: t for t in parse_tunables(render(SeedSpec(spec.template, spec.defines, "")))}
    for k, v in cold_params(name).items():
        assert v in (template[k].choices[0], template[k].default), (k, v)


def test_cold_seed_drops_the_hand_chosen_defaults():
    # gelu_bf16's hand-tuned VEC 8 / ITEMS 2 / FAST_MATH 2 are gone; every tunable is at its first value
    cold = cold_params("gelu_bf16")
    assert cold == {t.name: t.choices[0] for t in parse_tunables(seed_source("gelu_bf16"))}
    assert cold != seed_params("gelu_bf16")
    for k, v in SEEDS["gelu_bf16"].tunable_defaults:
        assert cold[k] != v


def test_first_values_breaking_a_constraint_fall_back_in_declaration_order():
    # 3xTF32: BM = BN = 64 with WARPS 1 x 1 breaks "(BM / WARPS_M) * (BN / WARPS_N) <= 2048", and
    # PAD 0 with WGMMA 0 breaks "PAD == 1 || WGMMA == 1": those tunables return to the template's
    # defaults, the others stay first.
    cold = cold_params("kb01_square")
    assert (cold["BM"], cold["BN"], cold["WARPS_M"], cold["WARPS_N"], cold["PAD"]) == ("128", "128", "2", "4", "1")
    assert (cold["BK"], cold["STAGES"], cold["WGMMA"], cold["PAD_LD"]) == ("16", "2", "0", "4")


def test_unknown_seed_names_the_cold_form():
    with pytest.raises(UnknownSeedError, match=":cold"):
        seed_spec("nope:cold")


def test_cold_task_is_the_same_task_under_a_new_name_starting_cold():
    from evo.tasks import get_task

    hand, cold = get_task("kb23_softmax"), cold_task("kb23_softmax")
    assert cold.name == "kb23_softmax_cold" and cold.seed == "kb23_softmax" + COLD_SUFFIX
    assert (cold.reference, cold.shapes, cold.tolerance) == (hand.reference, hand.shapes, hand.tolerance)


def test_a_task_file_of_cold_tasks_gives_a_search_its_cold_seed(tmp_path):
    from evo.engine.search import seed_for
    from evo.tasks import BUILTIN_TASKS, load_task_file

    f = tmp_path / "cold_tasks.py"
    f.write_text('from evo.tasks.seeds import cold_task\nTASKS = [cold_task("kb19_relu")]\n')
    (task,) = load_task_file(f)
    src, params = seed_for(task.name, BUILTIN_TASKS.with_files([f]))
    assert params == cold_params("kb19_relu") and src == seed_source("kb19_relu:cold")
