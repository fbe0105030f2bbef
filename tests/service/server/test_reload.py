"""Reload without downtime on the served instance (2 workers), and the alias poller."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import TOKEN, until_every_worker_serves, window
from service_settings import VARIANT_VERSION

from collapse_guard.service import RequestRejected, RiskClient


@pytest.fixture(scope="module")
def client(served, default_model):
    with RiskClient(served, token=TOKEN, timeout=60.0) as c:
        yield c
        # leave the default serving, in every worker, for the other modules
        c.reload("default")
        until_every_worker_serves(served, default_model.meta["version"])


def versions_seen(client, frame, n: int = 12) -> set[str]:
    return {client.risk(frame).model_version for _ in range(n)}


def test_failed_reload_leaves_the_old_model_serving(client, broken_dir, default_model):
    frame = window(1, default_model.schema.signals)
    with pytest.raises(RequestRejected) as caught:
        client.reload(str(broken_dir))
    assert caught.value.status == 409
    # the folder by its last name, the file LightGBM could not read, no server path
    assert "'.../model'" in caught.value.message and "model.txt" in caught.value.message
    assert str(broken_dir.parent) not in caught.value.message
    assert default_model.meta["version"] in caught.value.message  # "... keeps serving"
    assert versions_seen(client, frame) == {default_model.meta["version"]}
    with pytest.raises(RequestRejected) as missing:
        client.reload("models:/no-such-model@champion")
    assert missing.value.status == 409 and "no-such-model" in missing.value.message


def test_reload_from_the_registry_reaches_every_worker(served, client, default_model):
    answer = client.reload("models:/collapse-predictor/1")
    assert answer.reloaded and answer.previous_version == default_model.meta["version"]
    assert answer.model.version == "1" and answer.model.source == "models:/collapse-predictor/1"
    assert 0.0 <= answer.check_probability <= 1.0
    until_every_worker_serves(served, "1")
    assert client.model_info().version == "1"
    client.reload("default")
    until_every_worker_serves(served, default_model.meta["version"])


def _hammer(url, frames, stop, answers, errors):
    with RiskClient(url, token=TOKEN, timeout=30.0) as c:
        k = 0
        while not stop.is_set():
            name = list(frames)[k % len(frames)]
            sent = time.monotonic()
            try:
                r = c.risk(frames[name], run_id=name)
                answers.append((sent, time.monotonic(), name, r.model_version, r.probability))
            except Exception as error:  # every failure is counted, none may happen
                errors.append(repr(error))
            k += 1


@pytest.mark.slow  # ~10 s of load by design
def test_load_with_a_reload_in_the_middle(served, client, default_model, variant_dir):
    """8 clients for ~9 s; the variant model is loaded after ~3 s. No request fails, and
    each answer's probability is exactly what the model it names gives that window."""
    from collapse_guard.predictor.core.risk import RiskModel

    variant = RiskModel.load(variant_dir)
    new = f"{VARIANT_VERSION}+{variant.fingerprint()[:8]}"  # a folder: label + content
    signals = default_model.schema.signals
    frames = {f"w{s}": window(100 + s, signals) for s in range(4)}
    expected = {
        default_model.meta["version"]: {
            k: default_model.predict_window(f, context={}) for k, f in frames.items()
        },
        new: {k: variant.predict_window(f, context={}) for k, f in frames.items()},
    }
    stop, answers, errors = threading.Event(), [], []
    threads = [
        threading.Thread(target=_hammer, args=(served, frames, stop, answers, errors))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    time.sleep(3.0)
    reload_started = time.monotonic()
    client.reload(str(variant_dir))
    reload_done = time.monotonic()
    time.sleep(6.0)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(answers) > 100, len(answers)
    old = default_model.meta["version"]
    for _sent, received, name, version, p in answers:
        assert p == expected[version][name], (version, name)  # the model it names made it
        if received < reload_started:
            assert version == old
    # the reloading worker serves the new model at once; the other follows (0.5 s + load)
    assert any(v == new for s, _, _, v, _ in answers if s > reload_done)
    last_old = max(s for s, _, _, v, _ in answers if v == old)
    assert last_old - reload_done < 5.0, (
        f"a worker served the old model {last_old - reload_done:.1f} s on"
    )


def test_poller_follows_the_alias(tmp_path, mlflow_uri, monkeypatch, variant_dir):
    """The --poll path: the alias moves to a new version, the follower reloads it."""
    from collapse_guard.predictor.core import store
    from collapse_guard.predictor.core.risk import RiskModel
    from collapse_guard.predictor.lifecycle import registry
    from collapse_guard.service.server.model_state import ModelHolder, load_serving
    from collapse_guard.service.server.reload_channel import Follower, ReloadChannel

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    source = "models:/collapse-predictor@champion"
    holder = ModelHolder(load_serving(source))
    before = holder.current.version
    record = registry.log_training(
        RiskModel.load(variant_dir), metrics={}, params={"test": 2}, fingerprint="service-test-2"
    )
    # the alias is moved as an operator (or retrain) would: what the poller follows
    assert not record.promoted and record.version != before
    store.use_store().set_registered_model_alias("collapse-predictor", "champion", record.version)
    follower = Follower(holder, ReloadChannel(tmp_path / "reload.json"), poll_seconds=0.1)
    follower._poll()
    assert holder.current.version == record.version
    assert holder.current.alias == "champion"


def test_a_reload_request_waits_for_the_one_this_worker_is_running(monkeypatch):
    # a client's /reload that lands while the worker follows another worker's reload waited
    # nothing and answered 409 "already in progress" (CI, 2026-12-02: the larger bundled
    # model made the follower's reload long enough to meet the next request)
    from types import SimpleNamespace

    from collapse_guard.service.server import model_state
    from collapse_guard.service.server.model_state import ModelHolder, ReloadBusy

    started = threading.Event()

    def slow_load(source):
        started.set()
        time.sleep(0.5)
        return SimpleNamespace(source=source)

    monkeypatch.setattr(model_state, "load_serving", slow_load)
    holder = ModelHolder(SimpleNamespace(source="first"))
    follower = threading.Thread(target=holder.reload, args=("followed",))
    follower.start()
    assert started.wait(5)
    with pytest.raises(ReloadBusy, match="waited 0 s"):
        holder.reload("now")  # the follower's own rule: never wait
    new, previous, _ = holder.reload("requested", wait=5.0)
    follower.join()
    assert (previous.source, new.source, holder.current.source) == (
        "followed",
        "requested",
        "requested",
    )
