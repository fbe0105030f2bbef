"""Real runs: the sampler (a function of (seed, i), stratified, recipes) and the onset rule."""

from __future__ import annotations

from collections import Counter

import pytest

from collapse_guard.datasets.real import (
    DATA_KINDS,
    OPTIMIZERS,
    RECIPES,
    Focus,
    RealRunConfig,
    run_id_for,
    sample_config,
    sample_configs,
)
from collapse_guard.datasets.real.config import ARCHITECTURE_CHOICES, FAMILY_ARCHITECTURES
from collapse_guard.datasets.real.onset import SUDDEN_WITHIN, onset_kind
from collapse_guard.datasets.real.sampler import (
    DATA_SHARES,
    FAMILY_SHARES,
    NANOGPT_EDGE,
    OPTIMIZER_SHARES,
    STABLE_EDGE,
)

STEPS = 1000
FAMILIES = tuple(FAMILY_SHARES)  # the hand-written ones: what an unfocused sweep draws


@pytest.fixture(scope="module")
def sweep() -> list[RealRunConfig]:
    return sample_configs(400, seed=0, steps=STEPS)


# --------------------------------------------------------------------------- onset rule


@pytest.mark.parametrize(
    ("triggers", "onset", "expected"),
    [
        ([0], None, (None, None)),  # healthy
        ([0], 350, ("develops", 350)),  # a constant LR above the edge: counted from step 0
        ([0, 400], 405, ("sudden", 5)),  # 5 steps after a jump
        ([0, 400], 400, ("sudden", 0)),  # at the jump itself
        ([0, 400], 409, ("sudden", 9)),  # the last step that is still sudden
        ([0, 400], 410, ("develops", 10)),  # SUDDEN_WITHIN steps after: develops
        ([0, 300, 600], 450, ("develops", 150)),  # a trigger after the onset does not count
        ([0, 300, 600], 603, ("sudden", 3)),  # the latest trigger at or before onset counts
        ([], 12, ("develops", 12)),  # no trigger given: from step 0
    ],
)
def test_onset_kind_by_hand(triggers, onset, expected):
    assert onset_kind(triggers, onset) == expected


def test_sudden_means_within_the_evaluations_minimum_lead():
    assert SUDDEN_WITHIN == 10


def test_triggers_come_from_the_config():
    assert RealRunConfig().triggers() == [0]
    rewarmed = RealRunConfig(rewarm_step=300, rewarm_steps=150, rewarm_lr=0.1)
    assert rewarmed.triggers() == [0, 300]
    both = RealRunConfig(rewarm_step=300, rewarm_lr=0.1, fault="lr_ramp", fault_step=200)
    assert both.triggers() == [0, 200, 300]


# --------------------------------------------------------------------------- sampler


def test_sampler_is_a_function_of_seed_and_index(sweep):
    assert sample_configs(10, seed=0, steps=STEPS)[7] == sweep[7] == sample_config(0, 7, STEPS)
    assert sample_configs(5, seed=3) != sample_configs(5, seed=4)
    assert sample_config(0, 1, steps=40).steps == 40


def test_sampler_draws_are_pinned():
    # resumable sweeps: run i of a seed must keep its config across versions. If this
    # fails, the sampler changed and every sweep already on disk is now inconsistent
    first = sample_config(0, 0, STEPS)
    assert (first.recipe, first.family, first.optimizer, first.data) == (
        "slow_ramp",
        "gpt",
        "adamw",
        "bytes",
    )
    assert (round(first.lr, 6), round(first.rewarm_lr, 6)) == (0.009595, 0.140827)
    assert (first.rewarm_step, first.rewarm_steps) == (527, 246)
    later = sample_config(0, 123, STEPS)
    assert (later.recipe, later.family, later.optimizer, later.data) == (
        "fragile",
        "rope_swiglu",
        "adamw",
        "bytes",
    )
    assert (round(later.lr, 5), later.seed) == (0.02346, 975220909)


@pytest.mark.parametrize(
    ("field", "shares"),
    [
        ("recipe", RECIPES),
        ("family", FAMILY_SHARES),
        ("optimizer", OPTIMIZER_SHARES),
        ("data", DATA_SHARES),
    ],
)
def test_first_n_runs_hold_each_stratum_in_its_share(sweep, field, shares):
    for n in (50, 400):
        counts = Counter(getattr(c, field) for c in sweep[:n])
        for name, share in shares.items():
            # Kronecker stratification: within 2.5 runs of the share (measured: at most 2.1
            # off), where independent draws would be off by sqrt(n p (1 - p)) ~ 2-9 runs
            assert abs(counts[name] - share * n) <= 2.5, (field, n, name, counts)


def test_strata_are_not_locked_to_each_other(sweep):
    # every family x optimizer x data cell is present (the evaluation leaves a family out)
    cells = Counter((c.family, c.optimizer, c.data) for c in sweep)
    assert set(cells) == {(f, o, d) for f in FAMILIES for o in OPTIMIZERS for d in DATA_KINDS}
    assert min(cells.values()) >= 8
    # and every recipe reaches every family and optimizer
    pairs = {(c.recipe, c.family) for c in sweep} | {(c.recipe, c.optimizer) for c in sweep}
    assert len(pairs) == len(RECIPES) * (len(FAMILIES) + len(OPTIMIZERS))


def test_recipes_aim_their_lr_at_the_family_and_optimizers_edge(sweep):
    for config in sweep:
        edge = STABLE_EDGE[config.family, config.optimizer]
        ratio = config.lr / edge
        if config.recipe == "constant_high":
            assert 2.0 <= ratio <= 6.0 and not config.qk_norm and config.triggers() == [0]
            assert 200 <= config.warmup_steps <= 500
        elif config.recipe == "slow_ramp":
            assert 100 <= config.rewarm_steps <= 300
            assert 2.0 <= config.rewarm_lr / edge <= 4.0
        elif config.recipe == "baseline":
            assert ratio <= 0.5 and config.fault == "none" and not config.rewarm_step
        elif config.recipe == "safe_high_lr":
            assert config.grad_clip == 1.0
            if config.family == "mha" or config.optimizer == "sgd":  # no qk-norm to help
                assert ratio <= 0.9 and config.warmup_steps >= 0.15 * STEPS
            else:
                assert config.qk_norm and ratio >= 1.0


def test_growing_faults_ramp_over_100_to_300_steps_and_end_far_from_the_start(sweep):
    growing = [c for c in sweep if c.recipe == "growing_fault"]
    assert {c.fault for c in growing} == {"lr_ramp", "corrupt_ramp"}
    for config in growing:
        assert 100 <= config.fault_steps <= 300
        assert 0.2 * STEPS <= config.fault_step <= 0.55 * STEPS
        if config.fault == "lr_ramp":
            end = config.lr_at(config.fault_step) * config.fault_scale
            edge = STABLE_EDGE[config.family, config.optimizer]
            assert 2.0 <= end / edge <= 4.0 + 1e-9


def test_sampler_never_draws_what_a_family_or_optimizer_lacks(sweep):
    assert not any(c.qk_norm for c in sweep if c.family == "mha")
    assert not any(not c.pre_ln for c in sweep if c.family == "rope_swiglu")
    assert {c.optimizer for c in sweep if c.fault == "opt_reset"} <= {"adamw"}
    assert {c.vocab_size for c in sweep if c.data == "bytes"} == {256}
    assert {c.vocab_size for c in sweep if c.data == "language"} == {64, 128, 512}


def test_config_round_trips_with_the_new_keys(sweep):
    for config in sweep[:20]:
        data = config.to_dict()
        assert {"family", "optimizer", "data", "vocab_size"} <= set(data)
        assert RealRunConfig.from_dict(data) == config
    with pytest.raises(ValueError, match="optimizer='adam' is not known"):
        RealRunConfig(optimizer="adam")
    with pytest.raises(ValueError, match="opt_reset zeroes second moments"):
        RealRunConfig(optimizer="lion", fault="opt_reset")
    with pytest.raises(ValueError, match="share of tokens"):
        RealRunConfig(fault="corrupt_ramp", fault_scale=2.0)


# --------------------------------------------------------------------------- top-ups

NANOGPT = Focus(("nanogpt",), ("adamw",), ("drawn",))


@pytest.fixture(scope="module")
def nanogpt_sweep() -> list[RealRunConfig]:
    return sample_configs(200, seed=0, focus=NANOGPT)


def test_top_up_recipe_and_family_are_never_drawn_unless_chosen(sweep):
    assert "nanogpt" not in {c.recipe for c in sweep}
    assert {c.family for c in sweep} == set(FAMILIES)
    # a recipe-only focus keeps the hand-written families, and its old run ids
    focused = sample_configs(60, seed=1, focus=Focus(("constant_high", "slow_ramp"), ("adamw",)))
    assert {c.family for c in focused} == set(FAMILIES)
    assert Focus(("safe_ramp",)).tag == "safe_ramp.all"
    assert run_id_for(0, 3, NANOGPT) == "real-s0-nanogpt.adamw.drawn-00003"
    assert {c.recipe for c in sample_configs(30, seed=0, focus=Focus(families=("drawn",)))} <= set(
        RECIPES
    )


def test_nanogpt_recipe_is_warmup_cosine_adamw_from_safe_to_3x_over_the_edge(nanogpt_sweep):
    for c in nanogpt_sweep:
        assert (c.recipe, c.family, c.optimizer) == ("nanogpt", "drawn", "adamw")
        assert 1500 <= c.steps <= 2500 and c.triggers() == [0]
        # 0.3-3x the recipe's own edge, twice the ramps' (measured)
        assert 0.3 <= c.lr / (NANOGPT_EDGE * STABLE_EDGE["drawn", "adamw"]) <= 3.0
        assert 0.02 * c.steps <= c.warmup_steps <= 0.1 * c.steps
        assert (c.min_lr_ratio, c.weight_decay, c.grad_clip, c.qk_norm) == (0.1, 0.1, 1.0, False)
        assert c.beta2 in (0.95, 0.99) and c.fault == "none" and not c.rewarm_step
        # cosine to 10 % of the peak at the last step
        assert c.lr_at(c.steps - 1) == pytest.approx(0.1 * c.lr, rel=1e-3)
    ratios = sorted(c.lr / (NANOGPT_EDGE * 0.04) for c in nanogpt_sweep)
    # log-uniform: about half the runs under the edge, a quarter past 1.8x
    assert 0.35 <= sum(r < 1.0 for r in ratios) / len(ratios) <= 0.65
    assert sum(r > 1.8 for r in ratios) >= 0.15 * len(ratios)
    assert {c.beta2 for c in nanogpt_sweep} == {0.95, 0.99}
    assert {c.data for c in nanogpt_sweep} == set(DATA_KINDS)
    assert max(c.steps for c in nanogpt_sweep) - min(c.steps for c in nanogpt_sweep) > 800


def test_drawn_architectures_draw_each_part_independently(nanogpt_sweep):
    for field, choices in ARCHITECTURE_CHOICES.items():
        counts = Counter(getattr(c, field) for c in nanogpt_sweep)
        assert set(counts) == set(choices), field
        assert min(counts.values()) >= 0.5 * len(nanogpt_sweep) / len(choices), (field, counts)
    # independent: every position scheme meets every block and every norm placement
    pairs = {(c.positions, c.block, c.pre_ln) for c in nanogpt_sweep}
    assert len(pairs) == 4 * 2 * 2
    heads = Counter(c.n_head for c in nanogpt_sweep)
    assert set(heads) == {2, 4, 8}
    assert all(
        c.d_model % c.n_head == 0 and (c.d_model // c.n_head) % 2 == 0 for c in nanogpt_sweep
    )
    assert 0.6 <= sum(c.pre_ln for c in nanogpt_sweep) / len(nanogpt_sweep) <= 0.9
    # the parts are recorded in the config, so an evaluation can leave one out
    held_out = [c for c in nanogpt_sweep if c.to_dict()["positions"] == "alibi"]
    assert 0.15 * len(nanogpt_sweep) <= len(held_out) <= 0.35 * len(nanogpt_sweep)


def test_hand_written_families_record_their_own_parts_and_refuse_others(sweep):
    for c in sweep[:30]:
        for field, own in FAMILY_ARCHITECTURES[c.family].items():
            assert getattr(c, field) == own
    assert RealRunConfig(family="rope_swiglu").positions == "rope"
    old_file = {k: v for k, v in RealRunConfig().to_dict().items() if k not in ARCHITECTURE_CHOICES}
    assert RealRunConfig.from_dict(old_file).to_dict()["mlp"] == "gelu"  # files before drawn
    with pytest.raises(ValueError, match="family 'gpt' is built with positions='learned'"):
        RealRunConfig(family="gpt", positions="rope")
    with pytest.raises(ValueError, match="positions='sinusoid' is not known"):
        RealRunConfig(family="drawn", positions="sinusoid")


def test_data_real_names_an_unknown_family_and_the_known_ones_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from collapse_guard.datasets.cli import app

    args = ["real", "--n", "2", "--families", "drawn,rwkv", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == [
        "error: unknown families rwkv; expected some of gpt, rope_swiglu, mha, drawn "
        "(comma-separated)"
    ]
    assert not list(tmp_path.iterdir())  # nothing was started
