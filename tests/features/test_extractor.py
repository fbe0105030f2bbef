"""FeatureExtractor: the window rule, bad input, and streaming == batch to the bit."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collapse_guard.features.extractor as extractor_module
from collapse_guard.errors import UserInputError
from collapse_guard.features import FeatureExtractor

from .traces import muon_log_run, probe_like_run


def streaming(fx: FeatureExtractor, frame: pd.DataFrame) -> np.ndarray:
    """What the guard computes: at each row, the window of the rows seen so far."""
    return np.stack([fx.transform_window(frame.iloc[: i + 1]) for i in range(len(frame))])


@pytest.mark.parametrize("collapse", [True, False])
def test_streaming_equals_batch_on_a_probe_like_run(collapse):
    frame = probe_like_run(collapse=collapse)
    fx = FeatureExtractor()
    batch = fx.transform_run(frame, steps=frame["step"].to_numpy())
    assert batch.dtypes.eq(np.float64).all() and list(batch.columns) == list(fx.schema.names)
    assert np.array_equal(batch.to_numpy(), streaming(fx, frame), equal_nan=True)
    if collapse:
        assert batch["loss__nonfinite"].iloc[-1] == 5.0
        assert batch["grad_norm__nonfinite"].iloc[-1] == 1.0


def test_streaming_equals_batch_on_a_real_log():
    frame = muon_log_run()
    fx = FeatureExtractor(signals=("loss", "loss_nonfinite", "lr", "grad_norm"))
    batch = fx.transform_run(frame, steps=frame["step"].to_numpy())
    assert np.array_equal(batch.to_numpy(), streaming(fx, frame), equal_nan=True)
    # the window's mean of the loss is 0.5 * (first + second) at the second row
    loss = frame["loss"].to_numpy()
    assert batch["loss__last_dev"].iloc[1] == pytest.approx((loss[1] - loss[0]) / 2)
    assert (batch["ctx__loss_over_best"] >= 1.0).all()  # smoothed / its lowest so far
    assert batch["lr__last_rel"].isna().all()  # not in the log: missing, not 0
    assert batch["ctx__lr_over_peak"].isna().all()


def test_every_path_agrees_to_the_bit(monkeypatch):
    frame = probe_like_run(steps=400, seed=1)
    fx = FeatureExtractor()
    full = fx.transform_run(frame)  # every step of the range, gaps included
    assert full.index.tolist() == list(range(1, frame["step"].iloc[-1] + 1))
    monkeypatch.setattr(extractor_module, "_BLOCK", 7)  # block edges anywhere
    assert np.array_equal(fx.transform_run(frame).to_numpy(), full.to_numpy(), equal_nan=True)
    strided = fx.transform_run(frame, stride=9)
    assert strided.index.tolist() == full.index[::9].tolist()
    assert np.array_equal(strided.to_numpy(), full.to_numpy()[::9], equal_nan=True)
    # many runs per request, and the pandas-free fast path
    tails = [frame.iloc[:n] for n in (1, 37, 250, 400)]
    many = fx.transform_windows(tails)
    one_by_one = np.stack([fx.transform_window(t) for t in tails])
    assert np.array_equal(many, one_by_one, equal_nan=True)
    values = frame.reindex(columns=fx.signals).to_numpy()
    fast = fx.transform_array(values, steps=frame["step"].to_numpy())
    assert np.array_equal(fast, one_by_one[-1], equal_nan=True)
    # a non-contiguous view of the same numbers gives the same bits
    wide = np.repeat(values, 2, axis=1)[:, ::2]
    assert np.array_equal(fx.transform_array(wide, frame["step"]), fast, equal_nan=True)


def test_short_window_at_run_start_is_padded():
    frame = pd.DataFrame({"step": [10, 11, 12], "loss": [3.0, 2.0, 1.0]})
    fx = FeatureExtractor(signals=("loss",))
    vec = dict(zip(fx.schema.names, fx.transform_window(frame), strict=True))
    # mean 2: last 1 is 1 below it, the max 3 one above
    assert vec["loss__last_dev"] == -1.0 and vec["loss__max_dev"] == 1.0
    assert vec["loss__slope"] == -1.0
    assert vec["ctx__steps"] == 2.0  # steps since the run's first row
    batch = fx.transform_run(frame)
    assert batch.index.tolist() == [10, 11, 12]
    assert np.array_equal(batch.to_numpy()[-1], fx.transform_window(frame), equal_nan=True)


def test_window_spans_steps_not_rows():
    # rows every 100 steps: a 200-step window holds 2 of them, not 200
    frame = pd.DataFrame({"step": np.arange(0, 1000, 100), "loss": np.arange(10.0)})
    fx = FeatureExtractor(signals=("loss",))
    vec = dict(zip(fx.schema.names, fx.transform_window(frame), strict=True))
    # the window holds losses 8 and 9 (mean 8.5); the context knows the whole run
    assert vec["loss__last_dev"] == 0.5 and vec["loss__min_dev"] == -0.5
    assert vec["loss__slope"] == pytest.approx(0.01)  # per step
    assert vec["ctx__steps"] == 900.0


def test_unknown_columns_are_ignored():
    frame = probe_like_run(steps=260)
    fx = FeatureExtractor()
    noisy = frame.assign(foo=1.0, event="lower_lr")
    assert np.array_equal(fx.transform_window(noisy), fx.transform_window(frame), equal_nan=True)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"loss": [1.0]}), "'step' column"),
        (pd.DataFrame({"step": [1, 3, 2], "loss": 1.0}), "step 2 at row 2, smaller than step 3"),
        (pd.DataFrame({"step": [1, 2, 2], "loss": 1.0}), "a duplicate of step 2.*drop_duplicates"),
        (pd.DataFrame({"step": [1.5, 2.0], "loss": 1.0}), "steps must be integers"),
        (pd.DataFrame({"step": pd.Series([], dtype="int64")}), "zero rows"),
        (pd.DataFrame({"step": [1], "loss": ["high"]}), "must be numeric"),
    ],
)
def test_bad_frames_say_what_and_how_to_fix(frame, message):
    with pytest.raises(ValueError, match=message):
        FeatureExtractor().transform_window(frame)


@pytest.mark.parametrize("call", ["transform_run", "transform_window"])
def test_a_misspelt_or_absent_signal_column_is_refused_not_scored_as_healthy(call):
    # issue 21: a frame whose loss column was "Loss" scored 0.041, as if all were well
    fx = FeatureExtractor()
    steps = np.arange(300)
    misspelt = pd.DataFrame({"step": steps, "Loss": 3.0 - steps / 300, "grad-norm": 1.0})
    with pytest.raises(UserInputError) as info:
        getattr(fx, call)(misspelt)
    message = str(info.value)
    assert "['Loss', 'grad-norm']" in message  # the unknown names
    assert "'Loss' -> 'loss'" in message and "'grad-norm' -> 'grad_norm'" in message
    assert "expected signal columns among: loss, loss_nonfinite, lr," in message
    # a frame with none of the signals: its columns and the expected names
    with pytest.raises(UserInputError, match=r"none of the signal columns.*\['foo'\].*loss, "):
        getattr(fx, call)(pd.DataFrame({"step": steps, "foo": 1.0}))
    # one signal is enough; other columns (event, notes) pass as before
    fine = pd.DataFrame({"step": steps, "loss": 3.0 - steps / 300, "notes": "x"})
    assert np.isfinite(np.asarray(getattr(fx, call)(fine))).any()


def test_bad_arguments():
    with pytest.raises(ValueError, match="window must be an integer >= 2"):
        FeatureExtractor(window=1)
    with pytest.raises(ValueError, match="unknown signal 'losss'"):
        FeatureExtractor(signals=("losss",))
    with pytest.raises(ValueError, match="duplicates"):
        FeatureExtractor(signals=("loss", "loss"))
    fx = FeatureExtractor(signals=("loss",))
    frame = pd.DataFrame({"step": [5, 6], "loss": [1.0, 2.0]})
    with pytest.raises(ValueError, match=r"within the run's steps 5..6; got \[9\]"):
        fx.transform_run(frame, steps=[5, 9])
    with pytest.raises(ValueError, match="stride must be an integer >= 1"):
        fx.transform_run(frame, stride=0)
    with pytest.raises(ValueError, match=r"shape \(rows, 1\)"):
        fx.transform_array(np.zeros((3, 2)))


_VALUES = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from([np.nan, np.nan, np.inf, -np.inf, 0.5, 2.0]),
)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(1, 4), st.lists(_VALUES, min_size=4, max_size=4)),
        min_size=1,
        max_size=30,
    )
)
def test_property_streaming_equals_batch(rows):
    steps = np.cumsum([gap for gap, _ in rows])
    signals = ("loss", "grad_cv", "attn_kl", "update_cos")
    frame = pd.DataFrame([v for _, v in rows], columns=list(signals)).assign(step=steps)
    fx = FeatureExtractor(window=8, signals=signals)
    batch = fx.transform_run(frame, steps=steps)
    assert np.array_equal(batch.to_numpy(), streaming(fx, frame), equal_nan=True)
    mins, maxs = batch.filter(regex="__min$").to_numpy(), batch.filter(regex="__max$").to_numpy()
    means = batch.filter(regex="__mean$").to_numpy()
    seen = ~np.isnan(means)
    assert (mins[seen] <= maxs[seen]).all()
    assert (
        np.abs(means[seen] - np.clip(means[seen], mins[seen], maxs[seen]))
        <= 1e-6 * (1 + np.abs(means[seen]))
    ).all()
    # the loss is read relative to its window mean: min <= 0 <= max, last in between
    low, high, last = (batch[f"loss__{s}_dev"].to_numpy() for s in ("min", "max", "last"))
    seen = ~np.isnan(last)
    tol = 1e-6 * (1 + np.abs(high[seen] - low[seen]))
    assert (low[seen] <= tol).all() and (high[seen] >= -tol).all()
    assert ((low[seen] - tol <= last[seen]) & (last[seen] <= high[seen] + tol)).all()
