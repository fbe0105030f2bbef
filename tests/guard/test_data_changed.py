"""``Guard.data_changed``: a change of the data made on purpose (a new mixture, a curriculum's
next stage) is not a collapse. Without the call the loss's jump reads as one: the guard
rolls back to the old data's weights, where every new batch is an outlier. With it the
loss's history starts over, the old data's checkpoints leave the ring and the run trains on
as the plain loop does."""

from __future__ import annotations

import warnings

import pytest
import torch
from guard_helpers import SEQ, VOCAB, Loop, tiny_model

from collapse_guard.guard import Guard, GuardGaveUp
from collapse_guard.runfiles import read_run

SWITCH, STEPS = 80, 200


class Shifted(Loop):
    """The next token is this one + 5 (``Loop``'s is + 1), 40 % of them random: another
    language, learnable down to about 1.9 nats, over the old one's best by more than the
    label's margin for good."""

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.generator
        start = torch.randint(0, VOCAB, (self.batch, 1), generator=g)
        tokens = (start + 5 * torch.arange(SEQ + 1)) % VOCAB
        noise = torch.rand(tokens.shape, generator=g) < 0.4
        tokens = torch.where(noise, torch.randint(0, VOCAB, tokens.shape, generator=g), tokens)
        return tokens[:, :-1], tokens[:, 1:]


def _run(folder, call: bool) -> tuple[Guard, list[float], str]:
    model, optimizer = tiny_model()
    guard = Guard(model, optimizer, folder, risk="off", policy={"checkpoint_every": 20})
    old, new, losses, stopped = Loop(), Shifted(), [], ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(STEPS):
            if step == SWITCH and call:
                guard.data_changed()
            loss = (old if step < SWITCH else new).loss(model)
            try:
                guard.step(loss)
            except GuardGaveUp as error:
                stopped = str(error)
                break
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
    guard.close()
    return guard, losses, stopped


def test_without_the_call_the_jump_is_rescued_again_and_again(tmp_path):
    """Each rescue rolls back to the old data's weights (every 30 steps here: 4 in 120
    steps), so the new data is never learnt: 4.86 nats over the last 20 steps, 2.78 with
    the call (the next test)."""
    guard, losses, _ = _run(tmp_path, call=False)
    assert guard.rescues >= 3 and guard.skipped > 0
    rolled = [e for _, e in guard.events if e.startswith("rollback:")]
    assert rolled and all(e.endswith(f"@{SWITCH - 9}") for e in rolled)  # the old data's
    assert sum(losses[-20:]) / 20 > 4.0


def test_with_the_call_the_run_trains_on_the_new_data_untouched(tmp_path):
    guard, losses, stopped = _run(tmp_path, call=True)
    assert not stopped and guard.rescues == 0 and guard.skipped == 0
    assert [e for s, e in guard.events if e == "data_changed"] == ["data_changed"]
    jump, last = losses[SWITCH], sum(losses[-20:]) / 20
    assert jump > losses[SWITCH - 1] + 3.0 and last < 3.0  # it jumped, and learns
    frame, _ = read_run(guard.run_path)
    assert frame.loc[frame["step"] == SWITCH, "event"].item().startswith("data_changed")
    # the old data's checkpoints left the ring: every one now is the new data's
    ring = sorted(p.name for p in guard.folder.glob("guard-0*.pt"))
    assert ring and all(int(name.split("-")[1].split(".")[0]) > SWITCH for name in ring)


def test_data_changed_after_close_says_what_to_do(tmp_path):
    guard, _, _ = _run(tmp_path, call=False)
    with pytest.raises(RuntimeError, match="create a new Guard"):
        guard.data_changed()
