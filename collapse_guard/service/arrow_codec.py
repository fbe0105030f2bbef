"""Moved: writing to :mod:`collapse_guard.service.client.arrow_writer`, reading to
:mod:`collapse_guard.service.server.arrow_reader`; this path is kept for one release."""

from collapse_guard.service.client.arrow_writer import ARROW_TYPE, encode_runs
from collapse_guard.service.client.raw_run import RawRun
from collapse_guard.service.server.arrow_reader import decode_runs

__all__ = ["ARROW_TYPE", "RawRun", "decode_runs", "encode_runs"]
