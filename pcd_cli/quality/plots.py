"""Reliability diagrams (matplotlib, Agg backend; the optional extra ``pcd-cli[plot]``).

Each diagram shows, per equal-width bin of the chosen label's probability, the share of
correct rows as a bar against the diagonal of perfect calibration, with the bin's row
count written above its bar.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import InputError, MissingExtra
from ..io.files import atomic_writer
from .metrics import ReliabilityBin


def require_matplotlib():
    """Import matplotlib with the Agg backend and return ``pyplot``.

    Raises:
        MissingExtra: matplotlib is not installed (says ``pip install 'pcd-cli[plot]'``).
    """
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra("--plot needs matplotlib: pip install 'pcd-cli[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _draw(ax, bins: tuple[ReliabilityBin, ...], title: str, ece: float | None) -> None:
    width = bins[0].upper - bins[0].lower
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    for b in bins:
        if not b.count:
            continue
        ax.bar(b.lower, b.accuracy, width=width, align="edge", color="tab:blue", edgecolor="black", linewidth=0.5)
        ax.text(b.lower + width / 2, min(b.accuracy + 0.02, 0.97), str(b.count), ha="center", va="bottom", fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("probability of the chosen label")
    ax.set_ylabel("accuracy")
    ax.set_title(title + (f" (ECE {ece:.3f})" if ece is not None else ""), fontsize=10)
    ax.legend(loc="upper left", fontsize=8)


def _out_dir(directory: str | Path) -> Path:
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--plot {str(directory)!r}: cannot create the folder ({exc.strerror})") from None
    return directory


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "field"


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    try:
        with atomic_writer(path) as fh:  # whole or not at all, through a symlink (pcd_cli.io.files)
            fig.savefig(fh, dpi=100, format="png")
    finally:
        plt.close(fig)
    return path


#: Extensions a plot name leaves out of a file's name (formats, then compressions).
_EXTENSIONS = (".gz", ".zst", ".parquet", ".pq", ".jsonl", ".ndjson", ".json", ".csv")


def file_stem(path: str | Path) -> str:
    """A file's name without its format and compression extensions
    (``out/airline.tuned.parquet`` -> ``airline.tuned``, ``x.jsonl.gz`` -> ``x``)."""
    name = Path(path).name
    for ext in _EXTENSIONS:
        if name.lower().endswith(ext) and len(name) > len(ext):
            name = name[: -len(ext)]
    return name


def eval_plot_name(predictions: str | Path, gold: str | Path) -> str:
    """``<predictions stem>.vs.<gold stem>``: the name ``pcd eval --plot`` gives its diagrams,
    so that two evaluations into one folder (another output, or the same output against another
    gold file) never overwrite each other."""
    return f"{file_stem(predictions)}.vs.{file_stem(gold)}"


def eval_plots(report, directory: str | Path, name: str = "") -> list[Path]:
    """One reliability diagram PNG per field of an ``EvalReport``: ``<dir>/<name>.<field>.reliability.png``
    (``name``: ``eval_plot_name`` of the scored files; ``<dir>/<field>.reliability.png`` without it)."""
    plt = require_matplotlib()
    directory = _out_dir(directory)
    written = []
    for f in report.fields:
        fig, ax = plt.subplots(figsize=(5, 4.5))
        _draw(ax, f.bins, f"{f.field}: {f.n} rows", f.ece)
        prefix = f"{_safe(name)}." if name else ""
        written.append(_save(plt, fig, directory / f"{prefix}{_safe(f.field)}.reliability.png"))
    return written


def calibration_plots(report, directory: str | Path, name: str = "") -> list[Path]:
    """Before/after reliability diagrams (cross-validated) per field of a ``CalibrationReport``:
    ``<dir>/<name>.<field>.calibration.png`` (``name``: the calibration file's ``file_stem``, so
    that two calibrations into one folder never overwrite each other; ``<dir>/<field>.calibration.png``
    without it)."""
    plt = require_matplotlib()
    directory = _out_dir(directory)
    written = []
    for f in report.fields:
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
        _draw(left, f.before_bins, f"{f.field}: before", f.before.ece)
        _draw(right, f.after_bins, f"{f.field}: after ({f.folds}-fold CV)", f.after.ece)
        prefix = f"{_safe(name)}." if name else ""
        written.append(_save(plt, fig, directory / f"{prefix}{_safe(f.field)}.calibration.png"))
    return written
