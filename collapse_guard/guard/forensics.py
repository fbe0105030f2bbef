"""Per-tensor gradient norms of the last 500 steps: outlier layers, and forensics on a rescue.

The guard already computes every parameter tensor's gradient norm (one
``torch._foreach_norm``) to clip; :class:`GradientHistory` keeps them in a ring on the
device (``capacity x tensors`` floats: 500 x 30 for the demo model, 60 kB), so keeping
them costs no host sync. On a rescue :meth:`GradientHistory.save` writes, for the
forensics folder:

=========================  =========================================================
file                       what
=========================  =========================================================
``grad_history.npz``       ``names`` (tensor names), ``steps`` (n,), ``norms`` (n x
                           tensors), ``edges`` (bins of log10 norm), ``counts``
                           (tensors x bins): per-layer histogram of the last n steps
``grad_history.png``       log10 norm by step and tensor (heat map) beside the
                           histograms of the tensors that blew up
=========================  =========================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = ["HISTORY_STEPS", "GradientHistory"]

HISTORY_STEPS = 500  # the "last 500 steps": longer than the slowest real collapse
# (300-step ramps in the real-run recipes), so the plot shows the run before it began
_BINS = np.linspace(-8.0, 4.0, 49)  # log10 gradient norm: 1e-8 (dead) .. 1e4 (blown up)


class GradientHistory:
    """A ring of per-tensor gradient norms (``names`` fixed at construction)."""

    def __init__(self, names: Sequence[str], capacity: int = HISTORY_STEPS, device=None) -> None:
        self.names = tuple(names)
        self.capacity = int(capacity)
        self.norms = torch.full((self.capacity, len(self.names)), math.nan, device=device)
        self.steps = np.full(self.capacity, -1, dtype=np.int64)
        self.count = 0  # rows ever added

    def add(self, step: int, norms: torch.Tensor) -> None:
        row = self.count % self.capacity
        self.norms[row].copy_(norms.detach().float().reshape(-1))
        self.steps[row] = step
        self.count += 1

    def _ordered(self) -> tuple[np.ndarray, np.ndarray]:
        n = min(self.count, self.capacity)
        start = self.count % self.capacity if self.count > self.capacity else 0
        order = (np.arange(n) + start) % self.capacity
        return self.steps[order], self.norms.cpu().numpy()[order]

    def outliers(self, latest: torch.Tensor, ratio: float, min_rows: int = 20) -> dict[str, float]:
        """Tensors whose ``latest`` norm exceeds ``ratio`` x their median over the ring:
        ``{name: median}`` (one host sync; called only at warn and above, or on a rescue)."""
        n = min(self.count, self.capacity)
        if n < min_rows or ratio <= 0:
            return {}
        median = torch.nanmedian(self.norms[:n], dim=0).values
        over = (latest.float() > ratio * median) | ~torch.isfinite(latest)
        medians = median.cpu().tolist()  # sync point
        return {
            self.names[i]: medians[i]
            for i in torch.nonzero(over).flatten().tolist()
            if math.isfinite(medians[i]) and medians[i] > 0
        }

    def save(self, folder: str | Path, blown: Sequence[str] = ()) -> Path:
        """Write ``grad_history.npz`` and ``grad_history.png`` into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        steps, norms = self._ordered()
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log10(norms)
        counts = np.zeros((len(self.names), len(_BINS) - 1), dtype=np.int64)
        for i, col in enumerate(logs.T):
            counts[i] = np.histogram(col[np.isfinite(col)], bins=_BINS)[0]
        path = folder / "grad_history.npz"
        np.savez_compressed(
            path, names=np.array(self.names), steps=steps, norms=norms, edges=_BINS, counts=counts
        )
        _plot(folder / "grad_history.png", self.names, steps, logs, counts, blown)
        return path


def _plot(path: Path, names, steps, logs, counts, blown) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (heat, hist) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    if len(steps):
        image = heat.imshow(
            logs.T,
            aspect="auto",
            origin="lower",
            cmap="magma",
            extent=(steps[0], steps[-1] + 1, -0.5, len(names) - 0.5),
            vmin=-6,
            vmax=2,
        )
        fig.colorbar(image, ax=heat, label="log10 gradient norm")
    heat.set(xlabel="step", ylabel="parameter tensor", title="Per-tensor gradient norm")
    shown = [n for n in blown if n in names][:6] or list(names[:3])
    centers = (_BINS[:-1] + _BINS[1:]) / 2
    for name in shown:
        hist.step(centers, counts[names.index(name)], where="mid", label=name)
    hist.set(xlabel="log10 gradient norm", ylabel="steps", title="Histogram, last steps")
    if shown:
        hist.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
