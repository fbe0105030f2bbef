"""An empty folder of run files: the error says what was expected, and the hint is the
command's own (training makes runs; calibration needs the user's own healthy runs)."""

from __future__ import annotations

import pytest

from collapse_guard.errors import UserInputError
from collapse_guard.runfiles.records import find_run_files


def test_an_empty_folder_suggests_making_runs_by_default(tmp_path):
    with pytest.raises(UserInputError) as raised:
        find_run_files([tmp_path])
    assert raised.value.message == f"no runs found under {tmp_path}: expected *.parquet run files"
    assert "collapse-guard data synth" in raised.value.hint


def test_the_command_gives_its_own_hint_for_an_empty_folder(tmp_path):
    hint = "record healthy runs of your set-up with Probe.record_to"
    with pytest.raises(UserInputError) as raised:
        find_run_files([tmp_path], empty_hint=hint)
    assert raised.value.hint == hint and "data synth" not in str(raised.value)
