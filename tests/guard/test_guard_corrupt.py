"""Checkpoints are verified when written and on resume: a damaged newest one is skipped,
named and set aside; what killed writes left is cleaned at the next start; a rollback
averages only the checkpoints that share a basin with the newest."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import shutil
import warnings

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard
from collapse_guard.guard.checkpoints import (
    CheckpointFolderError,
    CheckpointRing,
    CorruptCheckpoint,
    load_verified,
    sidecar,
)


class Evil:
    """Unpickling this runs code: a malicious checkpoint."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path):
    path.write_bytes(b"")


def _random(path):
    size = path.stat().st_size
    path.write_bytes(
        torch.randint(0, 256, (size,), generator=torch.Generator().manual_seed(3))
        .to(torch.uint8)
        .numpy()
        .tobytes()
    )


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit inside the tensor data: still a valid zip
    path.write_bytes(bytes(data))


def _malicious(path):
    with open(path, "wb") as handle:
        torch.save({"format": 1, "step": 30, "x": Evil()}, handle, pickle_module=pickle)
    # as an attacker would write it: no sidecar (or a forged one)
    sidecar(path).unlink(missing_ok=True)


CORRUPTIONS = {
    "truncated": _truncate,
    "empty": _empty,
    "random": _random,
    "bit_flipped": _flip,
    "malicious": _malicious,
}


RING = ["guard-000000021.pt", "guard-000000026.pt", "guard-000000031.pt"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A run of 31 steps, a checkpoint every 5: trained once, copied into each test."""
    folder = tmp_path_factory.mktemp("pristine")
    model, opt = tiny_model()
    loop = Loop()
    guard = Guard(model, opt, folder, risk="off", policy={"checkpoint_every": 5})
    for _ in range(31):
        guard.step(loop.loss(model))
        opt.zero_grad()
    guard.close()
    assert [p.name for p in guard.ring.paths()] == RING
    return folder


@pytest.fixture
def folder(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path, dirs_exist_ok=True)
    return tmp_path


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_resume_skips_a_damaged_newest_checkpoint_and_names_it(folder, kind):
    tmp_path, ring = folder, RING
    newest = tmp_path / ring[-1]
    CORRUPTIONS[kind](newest)
    model, opt = tiny_model(seed=5)
    guard = Guard(model, opt, tmp_path, risk="off")
    with pytest.warns(RuntimeWarning, match=r"skipped 1 damaged checkpoint.*guard-000000031\.pt"):
        step = guard.resume()
    # the newest valid one, the state after step 25, is loaded; the run had recorded (and
    # finished) up to step 30, so it goes on at 31: no step recorded twice (issue 31, case 9)
    assert step == 31
    assert not newest.exists() and (tmp_path / "guard-000000031.pt.corrupt").exists()
    expected = torch.load(tmp_path / ring[-2], weights_only=True)["model"]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in expected.items())
    guard.close()


def test_a_damaged_checkpoint_asked_for_by_name_is_an_error_naming_it(folder):
    tmp_path = folder
    newest = tmp_path / RING[-1]
    _flip(newest)
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off")
    with pytest.raises(CorruptCheckpoint, match=r"guard-000000031\.pt: its checksum differs"):
        guard.resume(newest)
    guard.close()


def test_a_pickle_with_code_is_refused_without_suggesting_weights_only_false(tmp_path):
    path = tmp_path / "guard-000000030.pt"
    _malicious(path)
    with pytest.raises(CorruptCheckpoint) as caught:
        load_verified(path)
    text = str(caught.value)
    assert "guard-000000030.pt" in text and "could run code" in text
    assert "weights_only=False" not in text


def test_every_checkpoint_damaged_is_one_error_listing_them(folder):
    tmp_path = folder
    for name in RING:
        _truncate(tmp_path / name)
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CorruptCheckpoint, match=r"no valid guard checkpoint") as caught:
            guard.resume()
    assert all(f"guard-0000000{s}.pt" in str(caught.value) for s in (21, 26, 31))
    guard.close()


def test_the_next_start_removes_temp_files_of_killed_writes_and_orphans(folder):
    tmp_path, names = folder, RING
    dead = 2**22 + 12345  # above the default pid_max: no process has it
    killed = [
        tmp_path / f".guard-000000036.pt.{dead}-ab12cd34.tmp",  # a killed checkpoint write
        tmp_path / f".guard-000000036.pt.json.{dead}-zz99yy88.tmp",  # ... of its sidecar
        tmp_path / ".guard-000000036.pt.k3j4h5g6.tmp",  # an older writer's name (no pid)
        tmp_path / "guard-000000036.pt.json",  # a sidecar whose checkpoint never arrived
    ]
    live = tmp_path / f".guard-000000041.pt.{os.getpid()}-qq11ww22.tmp"  # a writer still at it
    orphan = tmp_path / "guard-000000016.pt"  # older than the ring: left by a kill
    for path in [*killed, live]:
        path.write_bytes(b"partial")
    (tmp_path / names[0]).rename(orphan)  # move one down the steps: now older than the ring
    sidecar(tmp_path / names[0]).rename(sidecar(orphan))
    first_ring = CheckpointRing(tmp_path)
    for n in range(21, 32, 5):  # the ring the resumed run adopts: 21, 26, 31 (21 rewritten)
        if not (tmp_path / f"guard-0000000{n}.pt").exists():
            first_ring.save(n, {"model": {"w": torch.zeros(1)}, "loss": 1.0})
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off")
    assert not any(p.exists() for p in killed) and live.exists()
    guard.resume()
    assert not orphan.exists() and not sidecar(orphan).exists()
    assert [p.name for p in guard.ring.paths()] == names
    guard.close()


def test_a_folder_that_cannot_be_made_is_one_clear_error():
    model, opt = tiny_model()
    with pytest.raises(CheckpointFolderError) as caught:
        Guard(model, opt, "/proc/nope", risk="off")
    assert "'/proc/nope'" in str(caught.value) and "checkpoint_dir" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__context__ is None  # not chained


def _hand_ring(folder, entries):
    ring = CheckpointRing(folder, keep=3)
    for step, loss, value in entries:
        ring.save(step, {"model": {"w": torch.full((2,), value)}, "loss": loss})
    return ring


def test_rollback_averages_only_checkpoints_that_share_the_newests_basin(tmp_path):
    # the nanoGPT case of issue 21: step 11 barely trained (loss 4.1), 111 at 2.45
    stale = _hand_ring(tmp_path / "stale", [(11, 4.1, 1.0), (111, 2.45, 3.0)])
    assert [p.name for p in stale.basin(300, 0.05)] == ["guard-000000111.pt"]
    # a plateau: 2.50, 2.46, 2.44 are within 5% of 2.44, and 200 steps apart at most
    flat = _hand_ring(tmp_path / "flat", [(100, 2.50, 1.0), (200, 2.46, 2.0), (300, 2.44, 6.0)])
    chosen = flat.basin(300, 0.05)
    assert len(chosen) == 3
    assert flat.rollback_state(chosen)["model"]["w"][0].item() == pytest.approx(3.0)
    # the same losses, but the oldest 400 steps back: too far to share the basin
    far = _hand_ring(tmp_path / "far", [(100, 2.50, 1.0), (450, 2.46, 2.0), (500, 2.44, 6.0)])
    assert [p.name[-9:] for p in far.basin(300, 0.05)] == ["000450.pt", "000500.pt"]
    # an older checkpoint with no recorded loss: the newest alone
    unknown = _hand_ring(tmp_path / "unknown", [(100, float("nan"), 1.0), (200, 2.44, 2.0)])
    assert len(unknown.basin(300, 0.05)) == 1


# issue 31, case 6: checkpoints that load but must not be trusted. Each is the newest of
# a finished run's ring (RING); the resume falls back to the one before, names the file
# and why, and sets it aside.


def _resave(path, change, keep_sidecar):
    """Rewrite checkpoint ``path`` as ``change(state)`` returns it (``torch.save``: its zip
    checksums match): its sidecar deleted, or recomputed for the new bytes."""
    state = change(torch.load(path, weights_only=True))
    torch.save(state, path)
    if keep_sidecar:
        sidecar(path).write_text(
            json.dumps(
                {
                    "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                    "bytes": path.stat().st_size,
                    "step": 31,
                    "loss": 1.0,
                }
            )
        )
    else:
        sidecar(path).unlink()


def _nan_weight(state):
    next(v for v in state["model"].values() if v.is_floating_point()).view(-1)[0] = math.nan
    return state


def _wrong_shape(state):
    name = next(k for k, v in state["model"].items() if v.dim() == 2)
    state["model"][name] = torch.zeros(3, 3)
    return state


def _moment_shape(state):
    next(iter(state["optimizer"]["state"].values()))["exp_avg"] = torch.zeros(3)
    return state


def _broken_guard_state(state):
    state["guard"]["trajectory"] = {}  # passes the checks; Guard.load_state_dict fails
    return state


def _exp_avg_bit_flip(path):
    """One bit of one AdamW exp_avg value flipped in the file (still finite), sidecar gone."""
    state = torch.load(path, weights_only=True)
    moment = next(iter(state["optimizer"]["state"].values()))["exp_avg"]
    data = bytearray(path.read_bytes())
    at = bytes(data).find(moment.numpy().tobytes())
    assert at > 0 and bytes(data).count(moment.numpy().tobytes()) == 1
    data[at] ^= 0x01  # the lowest mantissa bit of its first element
    path.write_bytes(bytes(data))
    sidecar(path).unlink()
    flipped = torch.load(path, weights_only=True)["optimizer"]["state"][0]["exp_avg"]
    assert torch.isfinite(flipped).all() and not torch.equal(flipped, moment)


UNTRUSTED = {
    "nan_sidecar_deleted": (lambda p: _resave(p, _nan_weight, False), r"holds NaN or inf"),
    "nan_sidecar_recomputed": (lambda p: _resave(p, _nan_weight, True), r"holds NaN or inf"),
    "bit_flip_sidecar_deleted": (_exp_avg_bit_flip, r"fails its zip checksum \(CRC-32\)"),
    "format_and_step_only": (
        lambda p: _resave(p, lambda s: {"format": 1, "step": 161}, False),
        r"lacks \['model', 'optimizer', 'guard'\]",
    ),
    "wrong_shape": (
        lambda p: _resave(p, _wrong_shape, True),
        r"does not match this model \(shapes .*\(3, 3\) where the model has",
    ),
    "optimizer_shape": (
        lambda p: _resave(p, _moment_shape, True),
        r"optimizer state 'exp_avg' of parameter 0 has shape \(3,\)",
    ),
    "load_raises": (
        lambda p: _resave(p, _broken_guard_state, True),
        r"does not load into this model \(KeyError",
    ),
}


@pytest.mark.parametrize("kind", sorted(UNTRUSTED))
def test_a_checkpoint_that_loads_but_is_wrong_is_skipped_and_named(folder, kind):
    damage, why = UNTRUSTED[kind]
    newest = folder / RING[-1]
    damage(newest)
    model, opt = tiny_model(seed=5)
    guard = Guard(model, opt, folder, risk="off")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = guard.resume()
    said = [str(w.message) for w in caught if "skipped" in str(w.message)]
    assert len(said) == 1, said  # one warning, naming the file and why
    assert re.search(r"skipped 1 damaged checkpoint.*guard-000000031\.pt: .*" + why, said[0])
    assert step == 31  # the run recorded up to 30: it goes on after (case 9)
    assert not newest.exists() and (folder / "guard-000000031.pt.corrupt").exists()
    expected = torch.load(folder / RING[-2], weights_only=True)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in expected["model"].items())
    moments = opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(moments, expected["optimizer"]["state"][0]["exp_avg"])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    guard.close()


def test_an_untrusted_checkpoint_asked_for_by_name_is_an_error_naming_it(folder):
    newest = folder / RING[-1]
    _resave(newest, _nan_weight, True)
    model, opt = tiny_model()
    guard = Guard(model, opt, folder, risk="off")
    with pytest.raises(CorruptCheckpoint, match=r"guard-000000031\.pt: .*holds NaN or inf"):
        guard.resume(newest)
    guard.close()
