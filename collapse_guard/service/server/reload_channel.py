"""Reloads reach every worker of a server: a shared file and a follower thread.

``POST /reload`` lands on one worker. That worker loads and checks the new model, swaps
it in, then publishes ``{generation, source}`` to a small JSON file that all workers of
the same server share; each worker's :class:`Follower` sees the new generation within
``FOLLOW_SECONDS`` and does the same load-check-swap itself (a failure there leaves that
worker on its old model and is logged). Replicas on other machines share nothing: reload
each, or start them with ``--poll``.

``--poll S``: every S seconds the follower asks the MLflow registry which version the
serving alias points at and reloads when it moved.

The file: ``COLLAPSE_GUARD_RELOAD_FILE`` (``collapse-guard serve`` sets a fresh one),
else ``<tmp>/collapse-guard-reload-<parent pid>.json``: the workers of one
``bentoml serve`` share their parent. A file older than that parent is ignored.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

from collapse_guard.service.server.model_state import ModelHolder, ModelLoadError, ReloadBusy

__all__ = ["FOLLOW_SECONDS", "Follower", "ReloadChannel", "registry_version"]

log = logging.getLogger(__name__)

# How often a worker looks at the shared file: one stat() (~2 us) per look, so followers
# lag the reloading worker by at most half a second plus their own load time (~0.3 s).
FOLLOW_SECONDS = 0.5


def _parent_start() -> float:
    """Wall-clock start of the parent process (Linux /proc), or 0 when unknown."""
    try:
        stat = Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + float(stat[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0


class ReloadChannel:
    """The shared file: read the latest ``(generation, source)``, publish a new one."""

    def __init__(self, path: str | Path | None = None) -> None:
        default = Path(tempfile.gettempdir()) / f"collapse-guard-reload-{os.getppid()}.json"
        env = os.environ.get("COLLAPSE_GUARD_RELOAD_FILE")
        self.path = Path(path or env or default)
        # a file left by an earlier server whose pid our parent reuses is not ours
        self._not_before = 0.0 if (path or env) else _parent_start() - 1.0

    def read(self) -> tuple[int, str] | None:
        try:
            if self.path.stat().st_mtime < self._not_before:
                return None
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return int(data["generation"]), str(data["source"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent, or caught mid-replace: look again next time

    def publish(self, source: str) -> int:
        """Write generation + 1 with ``source`` (atomically: temp file, then rename)."""
        latest = self.read()
        generation = (latest[0] if latest else 0) + 1
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"generation": generation, "source": source}), encoding="utf-8")
        os.replace(tmp, self.path)
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
