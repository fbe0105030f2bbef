"""Seeded byte mutations of valid request bodies, for the fuzz of the served instance.

What a hostile or damaged client sends: bytes flipped, cut, inserted, repeated, and
32-bit words overwritten with boundary values (lengths, offsets and counts inside an
Arrow stream are such words: the mutation that crashed workers through a string
column's offsets).
"""

from __future__ import annotations

import json

import numpy as np
from helpers import run_json, window

from collapse_guard.service.client.arrow_writer import encode_runs
from collapse_guard.service.client.raw_run import RawRun

__all__ = ["arrow_bases", "json_bases", "mutate"]

_WORDS = np.array([0, 1, 7, 255, 2**15, 2**31 - 1, 2**31, 2**32 - 1, 2**30], dtype=np.uint64)


def _raw(frame, run_id: str, context=None) -> RawRun:
    columns = {c: frame[c].to_numpy() for c in frame.columns if c != "step"}
    return RawRun(run_id, frame["step"].to_numpy(), columns, context)


def arrow_bases(signals) -> list[bytes]:
    """One run; three runs with a context column; a stream of two record batches."""
    frames = [window(40 + k, signals[:6], steps=30, holes=0.1) for k in range(3)]
    one = encode_runs([_raw(frames[0], "a")])
    many = encode_runs([_raw(f, f"run-{k}", {"ctx__steps": 30.0}) for k, f in enumerate(frames)])
    import pyarrow as pa

    table = pa.ipc.open_stream(one).read_all()
    sink = pa.BufferOutputStream()
    without_ids = table.drop_columns(["run_id"])
    with pa.ipc.new_stream(sink, without_ids.schema) as writer:
        for batch in without_ids.to_batches(max_chunksize=15):
            writer.write_batch(batch)
    return [one, many, sink.getvalue().to_pybytes()]


def json_bases(signals) -> list[bytes]:
    """A plain body (the fast reader's), and one with non-finite spellings (the general)."""
    frames = [window(50 + k, signals[:6], steps=30, holes=0.1) for k in range(2)]
    plain = {"runs": [{**run_json(f, f"r{k}")} for k, f in enumerate(frames)], "top_k": 3}
    plain_text = json.dumps(plain).replace('"Infinity"', "1e308").replace('"-Infinity"', "-1e308")
    spelled = {"runs": [run_json(frames[0], "s", context={"ctx__steps": 30})]}
    spelled["runs"][0]["signals"]["loss"][-1] = "NaN"
    return [plain_text.encode(), json.dumps(spelled).encode()]


def mutate(body: bytes, rng: np.random.Generator) -> bytes:
    """One to three mutations of ``body``."""
    out = bytearray(body)
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 5))
        at = int(rng.integers(0, max(len(out), 1)))
        if kind == 0 and out:  # flip a few bytes (of a body an earlier cut left any)
            for i in rng.integers(0, len(out), int(rng.integers(1, 9))):
                out[int(i)] = int(rng.integers(0, 256))
        elif kind == 1:  # cut
            del out[at:]
        elif kind == 2:  # insert random bytes
            out[at:at] = rng.integers(0, 256, int(rng.integers(1, 17)), dtype=np.uint8).tobytes()
        elif kind == 3:  # repeat a slice
            end = min(len(out), at + int(rng.integers(1, 64)))
            out[at:at] = out[at:end]
        else:  # a 32-bit word, aligned as Arrow's are, set to a boundary value
            at -= at % 4
            word = int(rng.choice(_WORDS)).to_bytes(8, "little")[:4]
            out[at : at + 4] = word[: max(0, len(out) - at)]
    return bytes(out)
