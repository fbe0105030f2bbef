"""Dataset card: what a folder of run files holds, as rich tables and one PNG.

The card answers the questions a predictor's training data raises: how many runs of
each source collapsed and of which kind, where the onsets fall (a dataset whose
onsets all sit in the first 100 steps teaches "early = risky"), how many recovered
spikes there are (the hard negatives), which signals were measured on what share of
rows (imported runs have loss and little else), and how long runs are.

The *pack card* (:func:`pack_card`, ``collapse-guard data card``) is the short one a
versioned folder of runs carries in its README: runs, bytes, and per value of each
config key asked for (family, each architecture component, optimizer, recipe, ...)
how many runs stayed healthy, collapsed in a way that develops, or suddenly. It reads
the files' footers only, so it costs milliseconds a run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from collapse_guard.errors import UserInputError
from collapse_guard.runfiles.reader import list_runs, read_meta, read_run
from collapse_guard.signals import SIGNAL_NAMES

__all__ = [
    "CARD_BEGIN",
    "CARD_END",
    "N_EXAMPLES",
    "OUTCOMES",
    "DatasetCard",
    "PackCard",
    "card_markdown",
    "onset_histogram",
    "outcome",
    "pack_card",
    "plot_card",
    "print_card",
    "replace_card",
    "summarize",
]

# Example curves kept for the plot, per outcome group (collapsed / healthy).
N_EXAMPLES = 3
_BAR = "█"
# a pack card's outcomes: the run's label and how soon its collapse followed its trigger
# (``extra.onset_kind``; "collapsed" for a collapse whose file does not say)
OUTCOMES = ("healthy", "develops", "sudden", "collapsed")
# the lines of a README between which ``replace_card`` writes the pack card
CARD_BEGIN = "<!-- card: begin (collapse-guard data card) -->"
CARD_END = "<!-- card: end -->"


def outcome(onset_step: int | None, label_version: str | None, kind: str | None) -> str:
    """ "healthy", "collapsed: <kind>", or "unlabelled" for a run never labelled."""
    if label_version is None and onset_step is None:
        return "unlabelled"
    if onset_step is None:
        return "healthy"
    return f"collapsed: {kind or 'unknown'}"


@dataclass
class DatasetCard:
    """Counts gathered from a folder of run files (see :func:`summarize`)."""

    folder: Path
    outcomes: Counter = field(default_factory=Counter)  # (source, outcome) -> runs
    onsets: list[int] = field(default_factory=list)
    spikes: Counter = field(default_factory=Counter)  # source -> spikes
    runs_with_spikes: Counter = field(default_factory=Counter)  # source -> runs
    rows: list[int] = field(default_factory=list)  # logged steps per run
    spans: list[int] = field(default_factory=list)  # last step - first step + 1
    measured: Counter = field(default_factory=Counter)  # signal -> rows measured
    examples: list[tuple[str, pd.DataFrame, int | None]] = field(default_factory=list)

    @property
    def n_runs(self) -> int:
        return sum(self.outcomes.values())

    @property
    def n_rows(self) -> int:
        return sum(self.rows)

    def coverage(self) -> dict[str, float]:
        """signal -> share of all rows where it was measured (a flagged NaN loss counts)."""
        total = max(self.n_rows, 1)
        return {name: self.measured[name] / total for name in SIGNAL_NAMES}


def summarize(folder: str | Path) -> DatasetCard:
    """Read every run file under ``folder`` (recursively) into a :class:`DatasetCard`."""
    card = DatasetCard(Path(folder))
    kept = Counter()
    for path in list_runs(folder):
        frame, meta = read_run(path)
        kind = meta.extra.get("collapse_kind")
        group = outcome(meta.onset_step, meta.label_version, kind)
        card.outcomes[(meta.source, group)] += 1
        if meta.onset_step is not None:
            card.onsets.append(meta.onset_step)
        n_spikes = len(meta.extra.get("spikes") or ())
        card.spikes[meta.source] += n_spikes
        card.runs_with_spikes[meta.source] += n_spikes > 0
        card.rows.append(len(frame))
        if len(frame):
            card.spans.append(int(frame["step"].iloc[-1] - frame["step"].iloc[0]) + 1)
        measured = frame[list(SIGNAL_NAMES)].notna()
        measured["loss"] |= frame["loss_nonfinite"].eq(1)
        card.measured.update(measured.sum().to_dict())
        example_group = "collapsed" if meta.onset_step is not None else "healthy"
        if kept[example_group] < N_EXAMPLES and frame["loss"].notna().any():
            kept[example_group] += 1
            card.examples.append((meta.run_id, frame[["step", "loss"]], meta.onset_step))
    return card


def onset_histogram(onsets: list[int], bins: int = 10, width: int = 40) -> list[str]:
    """Text histogram lines ``"  1000-  2000 │████ 12"`` of onset steps."""
    if not onsets:
        return ["(no collapses)"]
    counts, edges = np.histogram(onsets, bins=min(bins, max(1, len(set(onsets)))))
    peak = max(int(counts.max()), 1)
    lines = []
    for count, lo, hi in zip(counts, edges[:-1], edges[1:], strict=True):
        bar = _BAR * round(width * int(count) / peak)
        lines.append(f"{int(lo):>8}-{int(hi):<8}│{bar} {int(count)}")
    return lines


def print_card(card: DatasetCard, console=None) -> None:
    """Print the card as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.print(f"[bold]Dataset card[/bold]: {card.folder} — {card.n_runs} runs, "
                  f"{card.n_rows:,} logged steps")  # fmt: skip

    sources = sorted({s for s, _ in card.outcomes})
    groups = sorted({g for _, g in card.outcomes}, key=lambda g: (g != "healthy", g))
    table = Table(title="Runs by source and outcome")
    table.add_column("source")
    for group in [*groups, "total"]:
        table.add_column(group, justify="right")
    for source in sources:
        row = [card.outcomes[(source, g)] for g in groups]
        table.add_row(source, *map(str, row), str(sum(row)))
    console.print(table)

    console.print("[bold]Onset step histogram[/bold]")
    for line in onset_histogram(card.onsets):
        console.print(line, highlight=False)

    spikes = Table(title="Recovered spikes (label)")
    for col in ("source", "spikes", "runs with spikes"):
        spikes.add_column(col, justify="right" if col != "source" else "left")
    for source in sources:
        spikes.add_row(source, str(card.spikes[source]), str(card.runs_with_spikes[source]))
    console.print(spikes)

    coverage = Table(title="Signal coverage (share of rows measured)")
    coverage.add_column("signal")
    coverage.add_column("share", justify="right")
    for name, share in card.coverage().items():
        coverage.add_row(name, f"{share:.1%}", style=None if share else "dim")
    console.print(coverage)

    if card.rows:
        lengths = Table(title="Steps per run")
        for col in ("", "min", "median", "max"):
            lengths.add_column(col, justify="right" if col else "left")
        for name, values in (("logged steps", card.rows), ("step span", card.spans)):
            if values:
                lo, mid, hi = np.min(values), np.median(values), np.max(values)
                lengths.add_row(name, f"{lo:,.0f}", f"{mid:,.0f}", f"{hi:,.0f}")
        console.print(lengths)


def plot_card(card: DatasetCard, path: str | Path) -> Path:
    """Write a PNG: onset histogram on the left, example loss curves on the right."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_onset, ax_loss) = plt.subplots(1, 2, figsize=(12, 4.5))
    if card.onsets:
        ax_onset.hist(card.onsets, bins=min(30, max(1, len(set(card.onsets)))), color="tab:red")
    else:
        ax_onset.text(0.5, 0.5, "no collapses", ha="center", va="center")
    ax_onset.set(title=f"Collapse onsets ({len(card.onsets)} of {card.n_runs} runs)",
                 xlabel="onset step", ylabel="runs")  # fmt: skip
    for run_id, frame, onset in card.examples:
        finite = frame[np.isfinite(frame["loss"])]
        (line,) = ax_loss.plot(finite["step"], finite["loss"], lw=0.8, label=run_id[-40:])
        if onset is not None:
            ax_loss.axvline(onset, color=line.get_color(), ls="--", lw=0.8)
    ax_loss.set(title="Example loss curves (dashed: onset)", xlabel="step", ylabel="loss")
    if card.examples:
        ax_loss.legend(fontsize=6)
        # sources differ by 10x in loss (Conformer CTC ~30 at start, LMs ~2): log keeps all readable
        if all((frame["loss"].dropna() > 0).all() for _, frame, _ in card.examples):
            ax_loss.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@dataclass
class PackCard:
    """Counts of a folder of run files by outcome and config value (see :func:`pack_card`)."""

    folder: Path
    keys: tuple[str, ...]  # the config keys counted, in the card's order
    bytes: int = 0
    outcomes: Counter = field(default_factory=Counter)  # outcome -> runs
    by: Counter = field(default_factory=Counter)  # (key, value, outcome) -> runs
    sweeps: Counter = field(default_factory=Counter)  # run id without its index -> runs

    @property
    def n_runs(self) -> int:
        return sum(self.outcomes.values())

    def values(self, key: str) -> list[str]:
        """The values of ``key`` seen, in sorted order."""
        return sorted({value for k, value, _ in self.by if k == key})


def _pack_outcome(onset_step: int | None, extra: dict) -> str:
    if onset_step is None:
        return "healthy"
    kind = extra.get("onset_kind")
    return kind if kind in OUTCOMES else "collapsed"


def pack_card(folder: str | Path, keys: tuple[str, ...]) -> PackCard:
    """Count the runs under ``folder`` by outcome (``OUTCOMES``) and by each config key.

    A run whose config lacks a key counts under the value ``-``.
    """
    card = PackCard(Path(folder), tuple(keys))
    for path in list_runs(folder):
        meta = read_meta(path)
        result = _pack_outcome(meta.onset_step, meta.extra)
        card.bytes += path.stat().st_size
        card.outcomes[result] += 1
        card.sweeps[meta.run_id.rpartition("-")[0] or meta.run_id] += 1
        for key in card.keys:
            card.by[(key, str(meta.config.get(key, "-")), result)] += 1
    return card


def card_markdown(card: PackCard) -> str:
    """The card as Markdown: a summary line and one table of every key's values."""
    shown = [o for o in OUTCOMES if card.outcomes[o] or o != "collapsed"]
    collapsed = card.n_runs - card.outcomes["healthy"]
    per_run = card.bytes / max(card.n_runs, 1) / 1e3
    sweeps = ", ".join(f"{name} {n}" for name, n in sorted(card.sweeps.items()))
    lines = [
        f"{card.n_runs} runs ({sweeps}): {collapsed} collapsed "
        f"({card.outcomes['develops']} develop, {card.outcomes['sudden']} sudden), "
        f"{card.outcomes['healthy']} healthy; {card.bytes / 1e6:.1f} MB, {per_run:.1f} KB a run.",
        "",
        "| key | value | runs | " + " | ".join(shown) + " |",
        "|---|---|---:|" + "---:|" * len(shown),
    ]
    for key in card.keys:
        for value in card.values(key):
            counts = [card.by[(key, value, o)] for o in OUTCOMES]
            row = [card.by[(key, value, o)] for o in shown]
            lines.append(f"| {key} | {value} | {sum(counts)} | " + " | ".join(map(str, row)) + " |")
    return "\n".join(lines) + "\n"


def replace_card(readme: str | Path, text: str) -> Path:
    """Put ``text`` between the ``CARD_BEGIN`` and ``CARD_END`` lines of ``readme``."""
    readme = Path(readme)
    if not readme.is_file():
        raise UserInputError(f"{readme}: no such file", "pass the README that holds the card")
    current = readme.read_text(encoding="utf-8")
    begin, end = current.find(CARD_BEGIN), current.find(CARD_END)
    if begin < 0 or end < begin:
        raise UserInputError(
            f"{readme}: expected a line {CARD_BEGIN!r} and, after it, a line {CARD_END!r}; "
            "got no such pair",
            "add the two lines where the card belongs",
        )
    head = current[: begin + len(CARD_BEGIN)]
    readme.write_text(f"{head}\n{text}{current[end:]}", encoding="utf-8")
    return readme
