"""Reloads reach every worker of a server: a shared file and a follower thread.

``POST /reload`` lands on one worker. That worker loads and checks the new model, swaps
it in, then publishes ``{generation, source}`` to a small JSON file that all workers of
the same server share; each worker's :class:`Follower` sees the new generation within
``FOLLOW_SECONDS`` and does the same load-check-swap itself (a failure there leaves that
worker on its old model and is logged). Replicas on other machines share nothing: reload
each, or start them with ``--poll``.

``--poll S``: every S seconds the follower asks the MLflow registry which version the
serving alias points at and reloads when it moved.

Whoever writes the file chooses the model every worker serves, so the file is private:

- **unguessable**: ``<tmp>/collapse-guard-reload-<32 random hex digits>.json``, named by
  the process that starts the workers and handed to them in the environment:
  ``collapse-guard serve`` sets ``COLLAPSE_GUARD_RELOAD_FILE``; under a plain
  ``bentoml serve`` the service module, imported by that process before it starts its
  workers, sets ``COLLAPSE_GUARD_RELOAD_FILE_<its pid>`` (:func:`name_channel_for_workers`),
  which a worker reads under its parent's pid (an inherited one from a grand-parent is
  not its server's). Nothing is created before the first reload; the old predictable
  ``collapse-guard-reload-<parent pid>.json`` is never read.
- **owner-only, checked before every read**: the file must be a regular file (not a
  link) owned by this user with no group or other permission bits (written 0o600), in a
  folder owned by this user or root that no one else can write to, or that is sticky
  (``/tmp``: others cannot replace or delete our file there). Anything else is refused
  and logged, and the workers keep their model.

Another user therefore cannot choose the model; a process of the same user can read the
workers' environment (and attach a debugger) anyway: that is not a boundary this file
could hold.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import tempfile
import threading
import time
from pathlib import Path

from collapse_guard.service.server.model_state import ModelHolder, ModelLoadError, ReloadBusy

__all__ = [
    "FOLLOW_SECONDS",
    "RELOAD_FILE_ENV",
    "ChannelRefused",
    "Follower",
    "ReloadChannel",
    "fresh_channel_path",
    "name_channel_for_workers",
    "registry_version",
]

log = logging.getLogger(__name__)

# How often a worker looks at the shared file: one stat() (~2 us) per look, so followers
# lag the reloading worker by at most half a second plus their own load time (~0.3 s).
FOLLOW_SECONDS = 0.5

RELOAD_FILE_ENV = "COLLAPSE_GUARD_RELOAD_FILE"
# a message is {"generation": int, "source": str}: a source is a path or a URI
_MAX_MESSAGE_BYTES = 64 * 1024


def fresh_channel_path() -> Path:
    """A file name no one can guess (128 random bits) in the temp folder; not created."""
    return Path(tempfile.gettempdir()) / f"collapse-guard-reload-{secrets.token_hex(16)}.json"


def name_channel_for_workers() -> None:
    """Name this process's workers' channel in the environment they will inherit.

    Called when the service module is imported in the process that starts the workers
    (``bentoml serve`` imports it before it forks them). Only sets a variable: nothing is
    created, so any other importer leaves nothing behind.
    """
    if RELOAD_FILE_ENV not in os.environ:
        os.environ.setdefault(f"{RELOAD_FILE_ENV}_{os.getpid()}", str(fresh_channel_path()))


def _channel_from_env() -> Path:
    named = os.environ.get(RELOAD_FILE_ENV) or os.environ.get(
        f"{RELOAD_FILE_ENV}_{os.getppid()}"  # set by our server before it started us
    )
    return Path(named) if named else fresh_channel_path()  # alone: a channel of our own


class ChannelRefused(Exception):
    """The channel's file or folder is not private to this user: not to be trusted."""


def _check_folder(folder: Path) -> None:
    info = folder.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise ChannelRefused(f"{folder} is not a folder")
    if info.st_uid not in (os.getuid(), 0):
        raise ChannelRefused(f"{folder} is owned by uid {info.st_uid}, not this user or root")
    others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if others_write and not info.st_mode & stat.S_ISVTX:
        raise ChannelRefused(
            f"{folder} is writable by others (mode {stat.filemode(info.st_mode)}) and not "
            "sticky: anyone could replace the file; use a folder only this user can write"
        )


def _check_file(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise ChannelRefused(f"{path} is not a regular file")
    if info.st_uid != os.getuid():
        raise ChannelRefused(f"{path} is owned by uid {info.st_uid}, not this user")
    if info.st_mode & 0o077:
        raise ChannelRefused(
            f"{path} has mode {stat.filemode(info.st_mode)}; the server writes it 0o600 "
            "(group and others: none)"
        )
    if info.st_size > _MAX_MESSAGE_BYTES:
        raise ChannelRefused(f"{path} has {info.st_size} bytes; a message has a few hundred")


class ReloadChannel:
    """The shared file: read the latest ``(generation, source)``, publish a new one."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else _channel_from_env()
        self._last = 0  # the newest generation seen or written here
        self._refused: str | None = None  # the last refusal logged (once, not every look)

    def read(self) -> tuple[int, str] | None:
        """The latest message, or None: absent, caught mid-replace, or refused."""
        try:
            message = self._read_checked()
        except ChannelRefused as refused:
            if str(refused) != self._refused:
                self._refused = str(refused)
                log.error(
                    "reload channel refused, its message ignored (every worker keeps its "
                    "model): %s",
                    refused,
                )
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent, or caught mid-replace: look again next time
        self._refused = None
        self._last = max(self._last, message[0])
        return message

    def _read_checked(self) -> tuple[int, str]:
        _check_folder(self.path.parent)
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)  # the file opened, not a name that may be swapped after
            _check_file(self.path, info)
            raw = os.read(fd, _MAX_MESSAGE_BYTES + 1)
        finally:
            os.close(fd)
        data = json.loads(raw.decode("utf-8"))
        generation, source = data["generation"], data["source"]
        if type(generation) is not int or generation < 1 or not isinstance(source, str):
            raise ValueError("not a channel message")
        return generation, source

    def publish(self, source: str) -> int:
        """Write generation + 1 with ``source`` (atomically: a private temp file, then
        rename). Raises :class:`ChannelRefused` when the folder is not private."""
        latest = self.read()
        generation = max(latest[0] if latest else 0, self._last) + 1
        _check_folder(self.path.parent)
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump({"generation": generation, "source": source}, out)
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._last = generation
        return generation

    def remove(self) -> None:
        """Delete the file (the server is stopping: nothing is left in the temp folder)."""
        self.path.unlink(missing_ok=True)


def registry_version(source: str) -> str | None:
    """The registry version a ``models:/name@alias`` source points at now (None: not one)."""
    if not source.startswith("models:/") or "@" not in source:
        return None
    import mlflow

    from collapse_guard.predictor.core.store import tracking_uri

    name, alias = source.removeprefix("models:/").rsplit("@", 1)
    uri = tracking_uri(create=False)  # a read: a missing store is an error, never made
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    return str(client.get_model_version_by_alias(name, alias).version)


class Follower(threading.Thread):
    """Daemon thread of one worker: follows the shared file, and polls the alias."""

    def __init__(
        self, holder: ModelHolder, channel: ReloadChannel, poll_seconds: float = 0.0
    ) -> None:
        super().__init__(name="collapse-guard-reload-follower", daemon=True)
        self.holder, self.channel, self.poll_seconds = holder, channel, poll_seconds
        latest = channel.read()
        self.seen = latest[0] if latest else 0
        self._halt = threading.Event()
        self._next_poll = time.monotonic() + poll_seconds

    def mark_seen(self, generation: int) -> None:
        """This worker published ``generation`` itself: nothing to follow."""
        self.seen = max(self.seen, generation)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(FOLLOW_SECONDS):
            try:
                self._follow()
                if self.poll_seconds and time.monotonic() >= self._next_poll:
                    self._next_poll = time.monotonic() + self.poll_seconds
                    self._poll()
            except Exception:  # a follower that dies would silently stop reloads
                log.exception("reload follower: unexpected error; still following")

    def _follow(self) -> None:
        latest = self.channel.read()
        if latest is None or latest[0] <= self.seen:
            return
        self.seen = latest[0]
        self._reload(latest[1], f"generation {latest[0]}")

    def _poll(self) -> None:
        source = self.holder.current.source
        version = registry_version(source)
        if version is not None and version != self.holder.current.version:
            self._reload(source, f"{source} moved to version {version}")

    def _reload(self, source: str, why: str) -> None:
        try:
            new, previous, seconds = self.holder.reload(source)
        except (ModelLoadError, ReloadBusy) as error:
            log.error("reload (%s) failed, still serving the old model: %s", why, error)
            return
        log.info("reloaded (%s): %s -> %s in %.2f s", why, previous.version, new.version, seconds)
