"""`collapse-guard serve` rejects bad options in one line and leaves nothing behind."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

COMMAND = str(Path(sys.executable).with_name("collapse-guard"))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--port", "abc"], "--port must be a whole number 1..65535; got 'abc'"),
        (["--poll", "5"], "--poll needs a models:/NAME@ALIAS model"),
        (["--model", "/no/such/model"], "/no/such/model does not exist"),
    ],
)
def test_bad_options_fail_in_one_line(args, words):
    done = subprocess.run(
        [COMMAND, "serve", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert words in lines[0] and "Traceback" not in done.stderr


def test_a_port_in_use_is_one_error_line():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run(
            [COMMAND, "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0] == (
        f"error: cannot listen on 127.0.0.1:{port}: the port is in use (another server?); "
        "choose another with --port, or stop what holds it"
    )


def test_serving_leaves_no_folder_in_the_temp_directory():
    from collapse_guard.service.server.serve_command import serve_environment

    before = set(Path(tempfile.gettempdir()).glob("collapse-guard-*"))
    env = serve_environment("default", 2, 0.0)
    assert set(Path(tempfile.gettempdir()).glob("collapse-guard-*")) == before
    reload_file = Path(env["COLLAPSE_GUARD_RELOAD_FILE"])
    assert not reload_file.exists() and reload_file.parent == Path(tempfile.gettempdir())
    assert serve_environment("default", 2, 0.0)["COLLAPSE_GUARD_RELOAD_FILE"] != str(reload_file)


def test_the_reload_file_goes_when_the_server_stops(tmp_path):
    from collapse_guard.service.server.reload_channel import ReloadChannel

    channel = ReloadChannel(tmp_path / "reload.json")
    assert channel.publish("default") == 1 and channel.read() == (1, "default")
    channel.remove()  # what each worker's shutdown does
    channel.remove()  # the second worker's: already gone
    assert channel.read() is None and list(tmp_path.iterdir()) == []


def test_serve_is_listed_in_help():
    done = subprocess.run([COMMAND, "--help"], capture_output=True, text=True, timeout=60)
    assert " serve " in done.stdout
