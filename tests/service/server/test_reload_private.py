"""The reload channel is private (issue 31, case 3).

Any local process used to choose the served model: under a plain ``bentoml serve`` the
workers followed ``<tmp>/collapse-guard-reload-<server pid>.json``, a name anyone could
write first. Now the channel has a random name handed to the workers by their server, and
a message is read only from a file of this user's, mode 0o600, not a link, in a folder no
one else can write (or a sticky one). Everything else is ignored and logged.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
from helpers import AUTH, serving_by_worker, until_every_worker_serves
from server_processes import started

from collapse_guard.service.server.reload_channel import (
    FOLLOW_SECONDS,
    RELOAD_FILE_ENV,
    Follower,
    ReloadChannel,
)

# long enough for a follower to see a message and load a model (~0.3 s) three times over
WAIT_SECONDS = 3 * FOLLOW_SECONDS + 1.5
NOBODY = 65534


def _write(path: Path, generation: int, source: str, mode: int = 0o600) -> None:
    path.write_text(json.dumps({"generation": generation, "source": source}), encoding="utf-8")
    os.chmod(path, mode)


# ------------------------------------------------------------------- the file checks
def test_a_private_message_is_read(tmp_path):
    channel = ReloadChannel(tmp_path / "reload.json")
    _write(channel.path, 3, "default")
    assert channel.read() == (3, "default")
    assert channel.publish("default") == 4
    assert stat.S_IMODE(channel.path.stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o606, 0o666])
def test_a_message_others_may_read_or_write_is_refused(tmp_path, mode, caplog):
    channel = ReloadChannel(tmp_path / "reload.json")
    _write(channel.path, 3, "default", mode)
    assert channel.read() is None
    assert "reload channel refused" in caplog.text and "0o600" in caplog.text


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file away needs root")
def test_a_message_of_another_user_is_refused(tmp_path, caplog):
    channel = ReloadChannel(tmp_path / "reload.json")
    _write(channel.path, 3, "default")
    os.chown(channel.path, NOBODY, NOBODY)
    assert channel.read() is None
    assert f"owned by uid {NOBODY}" in caplog.text


def test_a_linked_message_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    _write(elsewhere, 3, "default")
    channel = ReloadChannel(tmp_path / "reload.json")
    channel.path.symlink_to(elsewhere)
    assert channel.read() is None


def test_a_folder_others_can_write_is_refused_unless_sticky(tmp_path, caplog):
    folder = tmp_path / "shared"
    folder.mkdir()
    channel = ReloadChannel(folder / "reload.json")
    _write(channel.path, 3, "default")
    os.chmod(folder, 0o777)  # anyone could replace the file
    assert channel.read() is None and "writable by others" in caplog.text
    with pytest.raises(Exception, match="writable by others"):
        channel.publish("default")
    os.chmod(folder, 0o1777)  # sticky, as /tmp: only the owner replaces its file
    assert channel.read() == (3, "default")


def test_publishing_goes_on_from_the_last_generation_after_a_refusal(tmp_path):
    channel = ReloadChannel(tmp_path / "reload.json")
    assert channel.publish("default") == 1 and channel.publish("default") == 2
    _write(channel.path, 1000, "elsewhere", 0o644)  # a bad file: ignored, not counted
    assert channel.publish("default") == 3 and channel.read() == (3, "default")


def test_the_follower_ignores_a_refused_message(tmp_path, variant_dir, default_model):
    """In-process, a real model: a tampered message never reaches the holder; the same
    message written privately does (the check is what stops it)."""
    from collapse_guard.service.server.model_state import ModelHolder, load_serving

    holder = ModelHolder(load_serving("default"))
    channel = ReloadChannel(tmp_path / "reload.json")
    follower = Follower(holder, channel)
    _write(channel.path, 1, str(variant_dir), 0o644)
    follower._follow()
    assert holder.current.version == default_model.meta["version"]
    os.chmod(channel.path, 0o600)
    follower._follow()
    assert holder.current.version != default_model.meta["version"]


# ------------------------------------------------------------------- the channel's name
def test_the_channel_has_a_name_no_one_can_guess(monkeypatch):
    from collapse_guard.service.server.serve_command import serve_environment

    names = {Path(serve_environment("default", 2, 0.0)[RELOAD_FILE_ENV]) for _ in range(3)}
    assert len(names) == 3
    for name in names:
        assert re.fullmatch(r"collapse-guard-reload-[0-9a-f]{32}\.json", name.name), name
    # a worker of a plain `bentoml serve`: its server's name, else one of its own
    for key in [k for k in os.environ if k.startswith(RELOAD_FILE_ENV)]:
        monkeypatch.delenv(key)
    legacy = Path(tempfile.gettempdir()) / f"collapse-guard-reload-{os.getppid()}.json"
    assert ReloadChannel().path != legacy
    monkeypatch.setenv(f"{RELOAD_FILE_ENV}_{os.getppid()}", "/some/where/reload.json")
    assert ReloadChannel().path == Path("/some/where/reload.json")


# ------------------------------------------------------------------- a real server
def _reload(url: str, source: str) -> dict:
    answer = httpx.post(f"{url}/reload", json={"source": source}, headers=AUTH, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _serving(url: str) -> set[str]:
    serving = serving_by_worker(url)
    assert len(serving) == 2, serving
    return set(serving.values())


@pytest.mark.slow  # a real 2-worker server: ~60 s on this 2-core machine
def test_only_the_server_chooses_the_model_of_a_plain_bentoml_serve(
    tmp_path, variant_dir, default_model
):
    """``bentoml serve`` by hand, 2 workers, a token: a message in the old predictable
    place, or in the real channel but readable by others or another user's, changes
    nothing; ``/reload`` still switches every worker, both ways."""
    default = default_model.meta["version"]
    with started(tmp_path, plain=True) as server:
        until_every_worker_serves(server.url, default)
        legacy = Path(tempfile.gettempdir()) / f"collapse-guard-reload-{server.proc.pid}.json"
        try:
            _write(legacy, 99, str(variant_dir))  # as the outside test did
            time.sleep(WAIT_SECONDS)
            assert _serving(server.url) == {default}
        finally:
            legacy.unlink(missing_ok=True)

        named = {
            psutil.Process(p).environ().get(f"{RELOAD_FILE_ENV}_{server.proc.pid}")
            for p in server.workers
        }
        (channel,) = named  # both workers were handed the same name by their server
        channel = Path(channel)
        assert channel != legacy and not channel.exists()

        variant = _reload(server.url, str(variant_dir))["model"]["version"]
        until_every_worker_serves(server.url, variant)
        assert stat.S_IMODE(channel.stat().st_mode) == 0o600

        _write(channel, 50, "default", 0o644)  # the real channel, but others may write it
        time.sleep(WAIT_SECONDS)
        assert _serving(server.url) == {variant}
        if os.getuid() == 0:
            _write(channel, 60, "default")
            os.chown(channel, NOBODY, NOBODY)  # private, but another user's
            time.sleep(WAIT_SECONDS)
            assert _serving(server.url) == {variant}

        _reload(server.url, "default")
        until_every_worker_serves(server.url, default)
    assert not channel.exists()  # the workers' shutdown removed it
