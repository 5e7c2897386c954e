"""Before/after: two evaluations of the same gold rows side by side (``pcd eval --compare``)."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import metrics as M
from .evaluate import EvalReport, FieldReport, MultiFieldReport

#: The figures compared, as (FieldReport attribute, column title, higher is better).
FIGURES = (("accuracy", "accuracy", True), ("macro_f1", "macro-F1", True), ("ece", "ECE", False),
           ("nll", "NLL", False), ("auroc", "AUROC", True))
#: A multi-select field's figure (``MultiFieldReport`` attribute, ``None``: none) in each column
#: of ``FIGURES``: the exact-set accuracy, macro-F1 over options, per-option ECE and NLL.
MULTI_FIGURES = {"accuracy": "subset_accuracy", "macro_f1": "macro_f1", "ece": "ece", "nll": "nll", "auroc": None}


def comparison_rows(before: EvalReport, after: EvalReport) -> list[dict]:
    """One dict per field present in both reports: ``{"field", "n_before", "n_after",
    "<figure>": (before, after)}`` for every figure of ``FIGURES`` (``None`` where unknown).
    A multi-select field's row is named ``<field> (exact set)`` and holds ``MULTI_FIGURES``."""
    rows = []
    after_fields = {f.field: f for f in (*after.fields, *after.multi_fields)}
    for b in (*before.fields, *before.multi_fields):
        a = after_fields.get(b.field)
        if a is None or a.type != b.type and "multi" in (a.type, b.type):
            continue
        multi = b.type == "multi"
        row = {"field": f"{b.field} (exact set)" if multi else b.field, "n_before": b.n, "n_after": a.n,
               "mcnemar": paired_test(b, a)}
        for attr, _, _ in FIGURES:
            name = MULTI_FIGURES[attr] if multi else attr
            row[attr] = (getattr(b, name), getattr(a, name)) if name else (None, None)
        rows.append(row)
    return rows


def paired_test(before: FieldReport | MultiFieldReport, after: FieldReport | MultiFieldReport) -> M.McNemar | None:
    """McNemar's test on the rows both reports evaluated (matched by id); ``None`` if none."""
    right_after = dict(zip(after.ids, after.correct))
    both = [(c, right_after[i]) for i, c in zip(before.ids, before.correct) if i in right_after]
    if not both:
        return None
    pairs = np.array(both, dtype=bool)
    return M.mcnemar(pairs[:, 0], pairs[:, 1])


def render_comparison(before: EvalReport, after: EvalReport, console: Console, *,
                      before_name: str = "before", after_name: str = "after") -> None:
    """A table per field: each figure before and after, the better one in green, and McNemar's
    paired test of the accuracy change (rows right only before / only after, two-sided p)."""
    table = Table(title=f"{escape(before_name)} -> {escape(after_name)} (same gold rows)")
    table.add_column("field")
    table.add_column("n", justify="right")
    for _, title, _ in FIGURES:
        table.add_column(title, justify="right")
    rows = comparison_rows(before, after)
    for row in rows:
        cells = []
        for attr, _, higher in FIGURES:
            b, a = row[attr]
            if b is None or a is None:
                cells.append("-")
                continue
            better = (a > b) if higher else (a < b)
            cells.append(f"{b:.3f} -> " + (f"[green]{a:.3f}[/]" if better else f"{a:.3f}"))
        n = str(row["n_after"]) if row["n_before"] == row["n_after"] else f"{row['n_before']}/{row['n_after']}"
        table.add_row(escape(row["field"]), n, *cells)
    console.print(table)
    for row in rows:
        test = row["mcnemar"]
        if test is not None:
            method = "exact" if test.method == "exact" else "chi-square"
            console.print(f"{escape(row['field'])}: {test.only_before} / {test.only_after} rows right only before / "
                          f"only after; McNemar p = {test.p_value:.3g} ({method})", highlight=False)
    console.print("McNemar p: the chance of a change in accuracy at least this large if both were equally "
                  "right (two-sided; exact below 25 discordant rows, else chi-square with continuity "
                  "correction); below 0.05 the change is unlikely to be chance", highlight=False)
