"""The loop against a served instance: a retrain moves the champion while a client keeps
querying; no request fails, and the new version is served afterwards (--poll)."""

from __future__ import annotations

import threading
import time

import pytest
from lifecycle_models import never_warning_champion, served
from predictor_settings import LIFECYCLE_TRAINING

from collapse_guard.predictor.lifecycle.retrain import retrain
from collapse_guard.runfiles import read_run
from collapse_guard.service import RiskClient


def _query(url, frame, stop, answers, errors):
    with RiskClient(url, timeout=30.0) as client:
        while not stop.is_set():
            try:
                answers.append((time.monotonic(), client.risk(frame).model_version))
            except Exception as error:  # every failure is counted; none may happen
                errors.append(repr(error))


@pytest.mark.slow  # ~60 s: a server, a training, a poll
def test_retrain_moves_the_served_champion_without_a_failed_request(
    tmp_path, store, base, new_paths
):
    never_warning_champion(base)
    frame, _ = read_run(new_paths[0])
    frame = frame.drop(columns="event").iloc[:200]
    args = ("--model", "models:/collapse-predictor@champion", "--poll", "1")
    with served(tmp_path, *args) as url:
        stop, answers, errors = threading.Event(), [], []
        client = threading.Thread(target=_query, args=(url, frame, stop, answers, errors))
        client.start()
        try:
            result = retrain([str(new_paths[0].parent)], base=base, **LIFECYCLE_TRAINING)
            promoted = time.monotonic()
            deadline = promoted + 60
            while not any(v == "2" for _, v in answers) and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)  # a second more of answers from the new champion
        finally:
            stop.set()
            client.join(timeout=60)
    assert result.promoted and result.version == "2"
    assert errors == []
    versions = [v for _, v in answers]
    assert set(versions) == {"1", "2"} and len(versions) > 50
    first_new = versions.index("2")
    assert set(versions[first_new:]) == {"2"}  # once swapped, never back
    swapped_at = answers[first_new][0]
    assert swapped_at - promoted < 10.0  # --poll 1: within a poll and a model load
