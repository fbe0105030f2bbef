"""RunContext: the live accumulator equals the run-file path to the bit; each field by
hand on constructed traces; causality, state round trip and errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from collapse_guard.features import FeatureExtractor, RunContext
from collapse_guard.features.context_fields import OPT_IN_CONTEXT
from collapse_guard.runfiles import RunMeta, RunWriter, read_run
from collapse_guard.signals import SIGNAL_NAMES

from .traces import muon_log_run, rewarm_run

NAN = math.nan
Q_LOSS = math.exp(-1 / 10)  # the loss's smoothing: time constant 10 steps, per step
Q_SHORT = 1 - 2 / 11  # span 10, pandas' convention


def records(frame: pd.DataFrame) -> list[tuple[int, dict[str, float]]]:
    """The frame's rows as the probe hands them over: every signal, NaN = not measured."""
    present = [c for c in frame.columns if c in SIGNAL_NAMES]
    out = []
    for row in frame.itertuples(index=False):
        record = dict.fromkeys(SIGNAL_NAMES, NAN)
        record.update({name: float(getattr(row, name)) for name in present})
        out.append((int(row.step), record))
    return out


def context_at(frame: pd.DataFrame, signals=SIGNAL_NAMES, **steps) -> pd.DataFrame:
    """The context columns of ``transform_run`` (the offline path)."""
    fx = FeatureExtractor(window=20, signals=signals)
    return fx.transform_run(frame, **steps)[list(fx.schema.context)]


def test_live_accumulator_equals_the_run_file_to_the_bit(tmp_path):
    # the guard's side: each step, the record goes to the run file and to the context
    frame = rewarm_run()
    fx = FeatureExtractor()
    ctx = RunContext.from_schema(fx.schema)
    live = []
    with RunWriter(tmp_path / "run.parquet", RunMeta(run_id="r", source="guarded")) as writer:
        for step, record in records(frame):
            writer.append(step, record)
            live.append(ctx.update(step, record).vector())
    stored, _ = read_run(tmp_path / "run.parquet")
    batch = fx.transform_run(stored, steps=stored["step"].to_numpy())
    assert np.array_equal(batch[list(fx.schema.context)].to_numpy(), live, equal_nan=True)
    assert np.isfinite(live[-1]).all()  # every field is exercised by the end
    # the whole vector, as the service gets it: the last window plus the live context
    for end in (150, 640, len(stored) - 1):
        tail = stored.iloc[max(end - 199, 0) : end + 1]
        ctx = RunContext.from_schema(fx.schema)
        for step, record in records(stored.iloc[: end + 1]):
            ctx.update(step, record)
        vec = fx.transform_window(tail, context=ctx.get())
        assert np.array_equal(vec, batch.iloc[end].to_numpy(), equal_nan=True)


def test_live_equals_offline_on_a_real_log():
    frame = muon_log_run()  # a real modded-nanogpt log: the loss, thinned mid-way
    signals = ("loss", "loss_nonfinite", "lr", "grad_norm")
    ctx = RunContext(signals)
    live = [ctx.update(step, record).vector() for step, record in records(frame)]
    offline = context_at(frame, signals, steps=frame["step"].to_numpy())
    assert np.array_equal(offline.to_numpy(), live, equal_nan=True)
    assert offline["ctx__loss_over_best"].min() == 1.0  # at each new best
    assert offline["ctx__loss_over_early"].iloc[-1] < 1.0  # it learned


def test_lr_fields_by_hand():
    # warm-up 1..4 (steps 0-3), held at 4 for 12 steps (4-15), down to 2 (16-17), a
    # re-warm to 6 then 8 (18-19), held (20)
    lr = [1.0, 2.0, 3.0, 4.0] + [4.0] * 12 + [2.0, 2.0, 6.0, 8.0, 8.0]
    frame = pd.DataFrame({"step": np.arange(21), "lr": lr})
    got = context_at(frame, ("lr",))
    fields = ["ctx__lr_over_peak", "ctx__lr_over_start", "ctx__lr_steps_since_rise"]
    fields.append("ctx__lr_over_prior_peak")
    # during warm-up: at its peak, 4x its start, rose this step; a warm-up is no re-warm
    assert got.loc[3, fields].tolist()[:3] == [1.0, 4.0, 0.0]
    assert math.isnan(got.loc[3, "ctx__lr_over_prior_peak"])
    # step 17: half the peak, twice the start, 14 steps since the last rise (step 3)
    assert got.loc[17, fields].tolist()[:3] == [0.5, 2.0, 14.0]
    assert math.isnan(got.loc[17, "ctx__lr_over_prior_peak"])
    # the re-warm: 8 is the new peak, 8x the start, twice the peak before it (4)
    assert got.loc[19, fields].tolist() == [1.0, 8.0, 0.0, 2.0]
    assert got.loc[20, fields].tolist() == [1.0, 8.0, 1.0, 2.0]
    assert (got["ctx__steps"] == np.arange(21)).all()


def test_a_warmup_that_repeats_a_value_is_not_a_rewarm():
    # fewer than 10 rows without a rise do not settle the LR: no prior peak
    frame = pd.DataFrame({"step": np.arange(6), "lr": [0.0, 1.0, 1.0, 2.0, 3.0, 4.0]})
    got = context_at(frame, ("lr",))
    assert got["ctx__lr_over_prior_peak"].isna().all()
    # the start is the first positive LR (1), and a peak of 0 gives no ratio at step 0
    assert got["ctx__lr_over_start"].tolist()[1:] == [1.0, 1.0, 2.0, 3.0, 4.0]
    assert math.isnan(got.loc[0, "ctx__lr_over_peak"])


def test_loss_fields_by_hand():
    loss = [4.0, 3.0, 2.0, 1.0, 1.0, 5.0, 5.0, 5.0]
    frame = pd.DataFrame({"step": np.arange(8), "loss": loss})
    got = context_at(frame, ("loss",))
    # the smoothed loss: sum q^(t-i) x_i / sum q^(t-i); it falls to step 4, the second
    # 1.0, and rises from step 5 (the 5.0s)
    smooth = [
        sum(Q_LOSS ** (t - i) * loss[i] for i in range(t + 1))
        / sum(Q_LOSS ** (t - i) for i in range(t + 1))
        for t in range(8)
    ]
    assert int(np.argmin(smooth)) == 4
    assert got["ctx__loss_steps_since_best"].tolist() == [0, 0, 0, 0, 0, 1, 2, 3]
    expected = [s / min(smooth[: t + 1]) for t, s in enumerate(smooth)]
    assert got["ctx__loss_over_best"].to_numpy() == pytest.approx(expected, rel=1e-13)
    assert got["ctx__loss_over_early"].isna().all()  # the first 200 steps are not over


def test_early_references_by_hand():
    t = np.arange(260)
    param = np.where(t < 200, 2.0, 3.0)
    param[0] = 100.0  # the initialisation's outlier: the median ignores it
    attn = np.full(260, NAN)
    attn[[0, 50, 100, 150, 200, 250]] = [1.0, 2.0, 3.0, 10.0, 5.0, 5.0]  # early median 2.5
    frame = pd.DataFrame({"step": t, "param_norm": param, "attn_logit_max": attn})
    got = context_at(frame, ("param_norm", "attn_logit_max"))
    early = ["ctx__param_norm_over_early", "ctx__attn_logit_max_over_early"]
    assert got.loc[:199, early].isna().all().all()  # not settled: never a moving reference
    # step 250: the EWMA of the attention logits over their steps, over the median 2.5
    steps = np.array([0, 50, 100, 150, 200, 250])
    weights = Q_SHORT ** (250 - steps)
    smooth = (weights * attn[steps]).sum() / weights.sum()
    assert got.loc[250, early[1]] == pytest.approx(smooth / 2.5, rel=1e-13)
    assert got.loc[250, early[1]] == pytest.approx(2.0, rel=1e-4)  # 5 / 2.5, nearly
    # step 259: 60 steps of 3.0 after 2.0s: (2 q^60 ... + 3) / ..., over the median 2.0
    w = Q_SHORT ** (259 - t)
    assert got.loc[259, early[0]] == pytest.approx((w * param).sum() / w.sum() / 2.0, rel=1e-12)


def test_a_window_end_between_rows_counts_the_steps_to_it():
    frame = pd.DataFrame({"step": [0, 1, 2, 250], "param_norm": [1.0, 2.0, 3.0, 4.0]})
    got = context_at(frame, ("param_norm",), steps=[2, 220, 250])
    assert got["ctx__steps"].tolist() == [2.0, 220.0, 250.0]
    # at 220 the early steps are over but no row has come since: median(1, 2, 3) = 2
    short = (Q_SHORT**2 * 1.0 + Q_SHORT * 2.0 + 3.0) / (Q_SHORT**2 + Q_SHORT + 1.0)
    assert got.loc[220, "ctx__param_norm_over_early"] == pytest.approx(short / 2.0, rel=1e-13)


def test_causal_the_context_at_t_reads_no_later_row():
    frame = rewarm_run(steps=700, seed=1)
    full = context_at(frame)
    for end in (5, 199, 200, 450, 650):
        cut = frame[frame["step"] <= end]
        changed = frame.copy()
        later = changed["step"] > end
        changed.loc[later, ["loss", "lr", "grad_norm", "param_norm"]] *= 7.0
        for other in (context_at(cut), context_at(changed)):
            assert np.array_equal(
                other.loc[end].to_numpy(), full.loc[end].to_numpy(), equal_nan=True
            )


def test_state_dict_round_trip_and_rollback():
    rows = records(rewarm_run(steps=700, seed=2))
    whole = RunContext()
    for step, record in rows:
        whole.update(step, record)
    first = RunContext()
    for step, record in rows[:300]:
        first.update(step, record)
    saved = json.loads(json.dumps(first.state_dict()))  # through JSON, NaN included
    resumed = RunContext().load_state_dict(saved)
    assert resumed.step == rows[299][0]
    for step, record in rows[300:]:
        resumed.update(step, record)
    assert np.array_equal(resumed.vector(), whole.vector(), equal_nan=True)
    # a rollback: back to the saved state, then other steps
    for step, record in rows[300:320]:
        first.update(step, record)
    first.load_state_dict(saved)
    assert first.step == rows[299][0]
    assert first.reset().step is None and all(math.isnan(v) for v in first.get().values())


def test_update_and_context_errors_say_how_to_fix():
    ctx = RunContext(("loss", "lr"))
    assert list(ctx.get()) == [
        "ctx__steps",
        "ctx__lr_over_peak",
        "ctx__lr_over_start",
        "ctx__lr_steps_since_rise",
        "ctx__lr_over_prior_peak",
        "ctx__loss_over_best",
        "ctx__loss_steps_since_best",
        "ctx__loss_over_early",
    ]
    ctx.update(5, {"loss": 3.0, "step": 5, "event": ""})  # a run file's row as a dict
    with pytest.raises(ValueError, match=r"unknown signal names \['los'\]"):
        ctx.update(6, {"los": 3.0})
    with pytest.raises(ValueError, match="got step 5 after step 5; call reset"):
        ctx.update(5, {"loss": 3.0})
    with pytest.raises(TypeError, match="step must be an integer"):
        ctx.update(True, {})
    with pytest.raises(ValueError, match="loss must be a number"):
        ctx.update(7, {"loss": "high"})
    assert ctx.step == 5  # a refused update changes nothing
    with pytest.raises(ValueError, match="state is of context fields"):
        RunContext(("loss",)).load_state_dict(ctx.state_dict())
    with pytest.raises(ValueError, match="RunContext state has keys"):
        ctx.load_state_dict({"run": []})


def test_a_context_mapping_is_checked_and_may_be_partial():
    fx = FeatureExtractor(window=10, signals=("loss", "lr"))
    frame = pd.DataFrame({"step": np.arange(30), "loss": 3.0, "lr": 1e-3})
    n = len(fx.schema.names) - len(fx.schema.context)
    with pytest.raises(ValueError, match=r"unknown context fields \['ctx__lr'\].*ctx__steps"):
        fx.transform_window(frame, context={"ctx__lr": 1.0})
    partial = fx.transform_window(frame, context={"ctx__steps": 29, "ctx__lr_over_peak": None})
    assert partial[n] == 29.0 and np.isnan(partial[n + 1 :]).all()  # missing/None: unknown
    with pytest.raises(ValueError, match="ctx__steps must be a number"):
        fx.transform_window(frame, context={"ctx__steps": "29 steps"})
    assert np.isnan(fx.transform_window(frame, context={})[n:]).all()
    with pytest.raises(ValueError, match="one entry per frame"):
        fx.transform_windows([frame, frame], contexts=[{}])
    both = fx.transform_windows([frame, frame.iloc[:12]], contexts=[None, {}])
    assert np.array_equal(both[0], fx.transform_window(frame), equal_nan=True)
    assert np.isnan(both[1, n:]).all()


RISE = ["ctx__loss_per_log_lr_rise", "ctx__grad_norm_per_log_lr_rise"]


def rise_response(frame: pd.DataFrame) -> pd.DataFrame:
    """The opt-in rise-response fields of ``transform_run`` at every step."""
    signals = tuple(c for c in ("lr", "loss", "grad_norm") if c in frame)
    fx = FeatureExtractor(window=20, signals=signals, extra_context=OPT_IN_CONTEXT)
    return fx.transform_run(frame)[[n for n in RISE if n in fx.schema.context]]


def test_rise_response_by_hand_on_a_jump():
    # the LR held at 1 (steps 0-29), jumps to 4 at step 30 and holds; the loss, flat at 2,
    # settles at 2 * 4**0.25 after it: +0.25 per e-fold of LR; the grad norm flat at 1
    t = np.arange(300)
    lr = np.where(t < 30, 1.0, 4.0)
    loss = np.where(t < 30, 2.0, 2.0 * 4.0**0.25)
    got = rise_response(pd.DataFrame({"step": t, "lr": lr, "loss": loss, "grad_norm": 1.0}))
    assert got.loc[:29].isna().all().all()  # no rise yet
    # the reference is step 29, the row before the climb (loss 2, LR 1), as it stays
    # while the LR holds; the smoothed loss has settled by step 200 (e^-17)
    assert got.loc[200, RISE[0]] == pytest.approx(0.25, rel=1e-6)
    assert got.loc[200, RISE[1]] == 0.0  # a grad norm that does not answer
    assert (got.loc[30:229, RISE[0]] > 0).all()  # it turns up from the jump on
    # 200 steps after the LR last rose (step 30) the run is out of the rise: NaN
    assert got.loc[230:].isna().all().all()


def test_a_rise_the_loss_absorbs_reads_at_most_zero_one_it_turns_up_on_above():
    # warm-up from LR 0 over 150 steps (the first anchor, LR 0, is replaced at once); the
    # loss falls all along, or turns up from step 100 on while the LR still climbs
    t = np.arange(400)
    lr = np.minimum(t / 150, 1.0) * 1e-3
    falls = 3.0 + 2.0 * np.exp(-t / 60)
    frame = pd.DataFrame({"step": t, "lr": lr, "loss": falls})
    absorbs = rise_response(frame)[RISE[0]]
    frame["loss"] = falls + 0.01 * np.clip(t - 100, 0, None)
    turns_up = rise_response(frame)[RISE[0]]
    # LR 0 at step 0 has no log: step 1 is the reference, and a climb shows from step 2
    assert absorbs.loc[:1].isna().all()
    inside = absorbs.loc[2:349]  # the LR last rose at step 150: in the rise until 349
    assert (inside <= 0).all() and inside.notna().all()
    assert (turns_up.loc[160:349] > 0).all()
    assert turns_up.loc[349] > 1.0 > absorbs.loc[349] + 1.0  # a clear margin at the end
    assert absorbs[350:].isna().all() and turns_up[350:].isna().all()


def test_rise_response_reads_the_latest_stretch_of_a_long_rise():
    # a 400-step exponential ramp (x e^4): the loss falls for 300 steps, then turns up;
    # the reference stays 50-100 steps back, so the early fall does not hide the turn
    t = np.arange(500)
    lr = 1e-4 * np.exp(np.minimum(t, 400) / 100)
    loss = 3.0 - 0.002 * np.minimum(t, 300) + 0.004 * np.clip(t - 300, 0, None)
    got = rise_response(pd.DataFrame({"step": t, "lr": lr, "loss": loss}))[RISE[0]]
    assert (got.loc[20:300] < 0).all()
    assert (got.loc[370:420] > 0).all()
    assert loss[400] < loss[0]  # against the rise's start it would still read a fall


def test_rise_response_live_equals_offline_and_round_trips():
    frame = rewarm_run()
    fx = FeatureExtractor(extra_context=OPT_IN_CONTEXT)
    assert fx.schema.context[-2:] == tuple(RISE) and fx.extra_context == tuple(RISE)
    ctx = RunContext.from_schema(fx.schema)
    assert ctx.names == fx.schema.context
    rows = records(frame)
    live = np.array([ctx.update(step, record).vector() for step, record in rows])
    offline = fx.transform_run(frame, steps=frame["step"].to_numpy())[list(fx.schema.context)]
    assert np.array_equal(offline.to_numpy(), live, equal_nan=True)
    got = offline[RISE]
    assert got.notna().any().all() and got.isna().any().all()  # in rises and out
    # the default fields are those of the default accumulator, to the bit
    default = context_at(frame, steps=frame["step"].to_numpy())
    assert np.array_equal(default.to_numpy(), live[:, :-2], equal_nan=True)
    # saved halfway and resumed: the same bits
    first = RunContext.from_schema(fx.schema)
    for step, record in rows[:620]:
        first.update(step, record)
    resumed = RunContext(extra=OPT_IN_CONTEXT).load_state_dict(
        json.loads(json.dumps(first.state_dict()))
    )
    for step, record in rows[620:]:
        resumed.update(step, record)
    assert np.array_equal(resumed.vector(), live[-1], equal_nan=True)


def test_opt_in_fields_are_named_and_checked():
    with pytest.raises(ValueError, match=r"opt-in fields .*got \['ctx__steps'\]"):
        FeatureExtractor(extra_context=["ctx__steps"])
    # a field whose signals the schema lacks is left out, as the default ones are
    fx = FeatureExtractor(signals=("lr", "loss"), extra_context=OPT_IN_CONTEXT)
    assert fx.schema.context[-1] == "ctx__loss_per_log_lr_rise"
    assert fx.extra_context == ("ctx__loss_per_log_lr_rise",)
