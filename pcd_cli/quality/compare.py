"""Before/after: two evaluations of the same gold rows side by side (``pcd eval --compare``).

Two outputs that cover different gold rows (4 labelled rows before, 120 after) are compared on
the gold rows both have a prediction for, never each on its own rows (``compare``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import InputError
from . import metrics as M
from .data import _id_strings
from .evaluate import EvalReport, FieldReport, MultiFieldReport, evaluate

#: The figures compared, as (FieldReport attribute, column title, higher is better).
FIGURES = (("accuracy", "accuracy", True), ("macro_f1", "macro-F1", True), ("ece", "ECE", False),
           ("nll", "NLL", False), ("auroc", "AUROC", True))
#: A multi-select field's figure (``MultiFieldReport`` attribute, ``None``: none) in each column
#: of ``FIGURES``: the exact-set accuracy, macro-F1 over options, per-option ECE and NLL.
MULTI_FIGURES = {"accuracy": "subset_accuracy", "macro_f1": "macro_f1", "ece": "ece", "nll": "nll", "auroc": None}


@dataclass(frozen=True)
class Comparison:
    """Two evaluations of the same gold rows (``compare``).

    Attributes:
        before, after: the reports compared, both on the same gold rows.
        rows: how many gold rows both are on (gold rows with a prediction in both outputs).
        before_matched, after_matched: gold rows each output has a prediction for on its own.
    """

    before: EvalReport
    after: EvalReport
    rows: int
    before_matched: int
    after_matched: int

    @property
    def same_rows(self) -> bool:
        """Whether both outputs had predictions for the same gold rows (nothing was left out)."""
        return self.before_matched == self.after_matched == self.rows


def _prediction_ids(predictions: pd.DataFrame, id_field: str) -> set[str]:
    """The ids of a pcd output as ``data.join`` matches them (its ``id_field`` column, else ``row``)."""
    column = id_field if id_field in predictions.columns else "row"
    return set(_id_strings(predictions[column], "predictions", column)) if column in predictions.columns else set()


def compare(before_predictions: pd.DataFrame, after: EvalReport, after_predictions: pd.DataFrame,
            gold: pd.DataFrame, schema=None, *, id_field: str = "id", min_mass: float = 0.5) -> Comparison:
    """Evaluate ``before_predictions`` and set it beside ``after`` (the report of
    ``after_predictions``) on the gold rows both outputs have a prediction for. When the two
    outputs cover different gold rows, both are evaluated again on the shared ones only, so a
    4-row "before" is never set beside a 120-row "after".

    Raises:
        InputError: as ``evaluate``; also when the outputs share no gold row.
    """
    before = evaluate(before_predictions, gold, schema, id_field=id_field, min_mass=min_mass)
    gold_ids = _id_strings(gold[id_field], "gold", id_field)
    in_before, in_after = _prediction_ids(before_predictions, id_field), _prediction_ids(after_predictions, id_field)
    shared = [rid in in_before and rid in in_after for rid in gold_ids]
    rows = int(sum(shared))
    if rows == before.matched == after.matched:
        return Comparison(before, after, rows, before.matched, after.matched)
    if not rows:
        raise InputError(f"--compare: the two outputs have no gold row in common (before: {before.matched} gold "
                         f"rows, after: {after.matched}); label the same records to compare them")
    kept = gold.loc[np.array(shared)]
    return Comparison(evaluate(before_predictions, kept, schema, id_field=id_field, min_mass=min_mass),
                      evaluate(after_predictions, kept, schema, id_field=id_field, min_mass=min_mass),
                      rows, before.matched, after.matched)


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


def render_comparison(comparison: Comparison, console: Console, *,
                      before_name: str = "before", after_name: str = "after") -> None:
    """A table per field: each figure before and after, the better one in green, and McNemar's
    paired test of the accuracy change (rows right only before / only after, two-sided p).
    When the outputs cover different gold rows a warning says so and which rows the table is on."""
    before, after = comparison.before, comparison.after
    if comparison.same_rows:
        title = f"{escape(before_name)} -> {escape(after_name)} (the same {comparison.rows} gold rows)"
    else:
        title = f"{escape(before_name)} -> {escape(after_name)} (only the {comparison.rows} gold rows both have)"
        console.print(f"[yellow]warning:[/] {escape(before_name)} has a prediction for {comparison.before_matched} "
                      f"gold rows, {escape(after_name)} for {comparison.after_matched}: both are compared on the "
                      f"{comparison.rows} gold rows both have (the figures above are on all "
                      f"{comparison.after_matched} rows of {escape(after_name)}); label the same records to "
                      "compare the whole set", highlight=False)
    table = Table(title=title)
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
