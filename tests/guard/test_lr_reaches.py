"""A rollback that cuts the LR off: a wrapper of two optimizers whose ``param_groups`` are
its inner optimizers' dicts loses them to ``load_state_dict`` (torch builds new ones), and
the guard's cap then reaches nothing. The guard says so once, at the rollback."""

from __future__ import annotations

import pytest
import torch
from guard_helpers import nan_weight_run, tiny_model

from collapse_guard.datasets.real.optim import MuonAdamW
from collapse_guard.guard.check import lr_reaches


class TwoHalves(torch.optim.Optimizer):
    """Two AdamWs stepped as one, exposing their group dicts: the defect MuonAdamW had."""

    def __init__(self, first: list, second: list, lr: float) -> None:
        self.halves = (torch.optim.AdamW(first, lr=lr), torch.optim.AdamW(second, lr=lr))
        super().__init__([g for half in self.halves for g in half.param_groups], {})

    @torch.no_grad()
    def step(self, closure=None):
        for half in self.halves:
            half.step()

    def state_dict(self) -> dict:
        return {"halves": [half.state_dict() for half in self.halves]}

    def load_state_dict(self, state_dict: dict) -> None:
        for half, saved in zip(self.halves, state_dict["halves"], strict=True):
            half.load_state_dict(saved)


class Unreadable(torch.optim.SGD):
    """An optimizer whose state cannot be read now (ZeRO's before its consolidation)."""

    def state_dict(self) -> dict:
        raise RuntimeError("consolidate_state_dict() first")


def _two_halves(model: torch.nn.Module, lr: float = 3e-3) -> TwoHalves:
    params = list(model.parameters())
    return TwoHalves(params[:2], params[2:], lr)


def test_an_lr_that_reaches_the_stepped_groups_is_told_from_one_that_does_not():
    model, adamw = tiny_model()
    assert lr_reaches(adamw)
    adamw.load_state_dict(adamw.state_dict())
    assert lr_reaches(adamw)
    wrapper = _two_halves(model)
    assert lr_reaches(wrapper)  # before a restore the dicts are the inner ones
    wrapper.load_state_dict(wrapper.state_dict())
    assert not lr_reaches(wrapper)
    hidden = [p for p in model.parameters() if p.dim() == 2][:1]
    rest = [p for p in model.parameters() if all(p is not h for h in hidden)]
    muon = MuonAdamW([{"params": hidden}], [{"params": rest}], lr=0.02)
    muon.load_state_dict(muon.state_dict())
    assert lr_reaches(muon)  # the dataset's wrapper keeps its dicts since 2026-12-06
    assert [g["lr"] for g in muon.param_groups] == [0.02, 0.02]  # the check puts LRs back
    assert lr_reaches(Unreadable(model.parameters(), lr=0.1))  # cannot tell: no warning


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_rollback_that_cuts_the_lr_off_is_said_once(tmp_path, wrapped):
    model, adamw = tiny_model(seed=1)
    rescues, caught = nan_weight_run(model, _two_halves(model) if wrapped else adamw, tmp_path)
    said = [w for w in caught if "no longer reaches" in str(w.message)]
    assert rescues == [92]
    assert len(said) == (1 if wrapped else 0)
    if wrapped:
        assert "step 92" in str(said[0].message) and "TwoHalves" in str(said[0].message)
