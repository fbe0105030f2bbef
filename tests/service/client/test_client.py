"""RiskClient: input forms and the exception hierarchy, against real sockets."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from helpers import TOKEN, window
from support import free_port

from collapse_guard.service import (
    RiskClient,
    RiskServiceError,
    ServiceTimeout,
    ServiceUnavailable,
)


def test_frame_and_dict_of_arrays_give_the_same_answer(served, default_model):
    frame = window(8, default_model.schema.signals)
    frame["event"] = ""  # run files carry it; the client drops it
    arrays = {c: frame[c].to_numpy() for c in frame.columns if c != "event"}
    with RiskClient(served, token=TOKEN, timeout=30.0) as client:
        from_frame = client.risk(frame, run_id="x")
        from_dict = client.risk(arrays, run_id="x")
        assert client.ready()
    assert from_frame == from_dict
    assert from_frame.probability == default_model.predict_window(
        frame.drop(columns="event"), context={}
    )


def test_nothing_listening_is_service_unavailable():
    with RiskClient(f"http://127.0.0.1:{free_port()}", timeout=2.0) as client:
        with pytest.raises(ServiceUnavailable) as caught:
            client.model_info()
        assert not client.ready()
    assert isinstance(caught.value, RiskServiceError)


def test_a_server_that_never_answers_is_service_timeout():
    with socket.socket() as silent:  # accepts connections (backlog), never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        with RiskClient(f"http://127.0.0.1:{port}", timeout=0.5) as client:
            with pytest.raises(ServiceTimeout):
                client.risk({"step": np.arange(3), "loss": np.ones(3)})


def test_bad_input_is_caught_before_sending():
    with RiskClient("http://127.0.0.1:9", timeout=1.0) as client:
        with pytest.raises(ValueError, match="expected a 'step'"):
            client.risk({"loss": [1.0]})
        with pytest.raises(TypeError, match="DataFrame or a dict"):
            client.risk([1.0, 2.0])
