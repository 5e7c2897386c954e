"""Rich tables for ``pcd eval`` and ``pcd calibrate`` (the CLI only calls these)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _table(title: str) -> Table:
    """A table whose title is never wrapped (it is at least as wide as its title)."""
    return Table(title=title, title_justify="left", min_width=len(title))


def _f(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ci(f, name: str) -> str:
    """`` [0.731, 0.868]``: the figure's 95 % interval, or nothing where it is undefined."""
    ci = f.intervals.get(name)
    return "" if ci is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def _set_coverage(f) -> str:
    """``0.917 [0.861, 0.952] (asked 0.90)``, or ``-`` without label sets."""
    sets = f.label_sets
    if not sets:
        return "-"
    low, high = sets["coverage_interval"]
    asked = f" (asked {sets['asked']:.2f})" if sets.get("asked") else ""
    return f"{sets['coverage']:.3f} [{low:.3f}, {high:.3f}]{asked}"


def render_eval(report, console: Console) -> None:
    """Summary table (a column per field), then per field: labels, confusion, selective prediction;
    then the multi-select fields: their summary table and each one's options."""
    if report.answered >= report.gold_rows:
        console.print(f"{report.matched} of {report.gold_rows} gold rows matched a prediction "
                      f"({report.prediction_rows} predictions; {report.gold_without_prediction} gold rows without "
                      f"prediction, {report.predictions_without_gold} predictions without gold)", highlight=False)
    else:  # skipped or untouched tasks of an annotation tool: rows without an answer are not gold
        console.print(f"{report.matched_answered} of {report.answered} gold rows with an answer matched a prediction "
                      f"({report.gold_rows - report.answered} of the {report.gold_rows} rows in the gold file have no "
                      f"answer: skipped or not annotated; {report.prediction_rows} predictions; "
                      f"{report.gold_without_prediction} gold rows without prediction)", highlight=False)
    for name, a in report.agreement.items():
        agreed = "-" if a["agreement"] is None else f"{a['agreement']:.3f}"
        console.print(f"annotators on {escape(name)}: {a['rows']} rows answered more than once, {a['disagree']} "
                      f"disagree, {a['ties']} tied (no gold); pairwise agreement {agreed}", highlight=False)
    if report.fields:
        _summary(report, console)
    for f in report.fields:
        _field_tables(f, console)
    if report.multi_fields:
        _multi_tables(report.multi_fields, console)
    if report.fields_without_gold:
        console.print("fields without gold labels: " + escape(", ".join(report.fields_without_gold)), highlight=False)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)


def _summary(report, console: Console) -> None:
    """The summary table of the single-label fields: a column per field."""
    summary = _table("pcd eval")
    summary.add_column("metric")
    for f in report.fields:
        summary.add_column(escape(f.field), justify="right")
    rows = [
        ("rows evaluated", lambda f: str(f.n)),
        ("gold null / not a label", lambda f: f"{f.gold_null} / {f.gold_invalid}"),
        ("accuracy", lambda f: _f(f.accuracy) + _ci(f, "accuracy")),
        ("majority baseline", lambda f: f"{_f(f.majority_accuracy)} {escape(f.majority_label or '')}"),
        ("macro-F1", lambda f: _f(f.macro_f1) + _ci(f, "macro_f1")),
        ("mean probability", lambda f: _f(f.mean_prob)),
        ("mean candidate mass", lambda f: _f(f.mean_mass)),
        ("rows with mass below --min-mass", lambda f: "-" if f.below_min_mass is None
         else f"{_f(f.below_min_mass)} (< {f.min_mass:g})"),
        ("ECE (15 bins)", lambda f: _f(f.ece) + _ci(f, "ece")),
        ("ECE if calibrated (chance)", lambda f: "-" if f.ece_floor is None
         else f"{_f(f.ece_floor[0])} (95 % <= {_f(f.ece_floor[1])})"),
        ("Brier", lambda f: _f(f.brier) + ("" if f.brier_form == "multiclass" else " *")),
        ("NLL", lambda f: _f(f.nll)),
        ("AUROC (prob, correct)", lambda f: _f(f.auroc) + _ci(f, "auroc")),
    ]
    if any(f.abstained for f in report.fields):
        rows.insert(1, ("abstained (no label)", lambda f: str(f.abstained)))
    if any(f.label_sets for f in report.fields):
        rows += [("label-set coverage", lambda f: _set_coverage(f)),
                 ("mean label-set size", lambda f: _f((f.label_sets or {}).get("mean_size"), 2))]
    scaled = any(f.scale_rows is not None for f in report.fields)
    if scaled:
        def on_scale(cell):
            return lambda f: "-" if f.scale_rows is None else cell(f)

        rows += [("ordered scale: rows (off it)", on_scale(lambda f: f"{f.scale_rows} ({f.scale_excluded})")),
                 ("MAE", on_scale(lambda f: _f(f.mae) + _ci(f, "mae"))),
                 ("within-one accuracy", on_scale(lambda f: _f(f.within_one) + _ci(f, "within_one"))),
                 ("QWK", on_scale(lambda f: _f(f.qwk) + _ci(f, "qwk")))]
    for name, cell in rows:
        summary.add_row(name, *(cell(f) for f in report.fields))
    console.print(summary)
    console.print("\\[low, high]: 95 % intervals (Wilson for the accuracy; a percentile bootstrap of the rows, "
                  "1000 resamples, for macro-F1, ECE and AUROC). ECE if calibrated: what a perfectly "
                  "calibrated model with these probabilities shows on these rows by chance (1000 draws); "
                  "an ECE under its 95 % bound cannot be told from calibrated on so few rows", highlight=False)
    if scaled:
        console.print("ordered scales (ordinal, integer): MAE and within-one in values (integer) or label steps "
                      "(ordinal), QWK = quadratic weighted kappa; rows whose gold or predicted label is null or "
                      "the none label are off the scale and left out of these three (Wilson for within-one, "
                      "bootstrap for MAE and QWK)", highlight=False)
    if any(f.brier_form != "multiclass" for f in report.fields):
        console.print("* Brier of the chosen label only: no <field>__probs column (label with --all-probs for the "
                      "multi-class Brier and the NLL)", highlight=False)


def _multi_tables(fields, console: Console) -> None:
    """Multi-select fields: a summary table (a column per field), then each field's options."""
    summary = _table("pcd eval: multi-select fields")
    summary.add_column("metric")
    for f in fields:
        summary.add_column(escape(f.field), justify="right")
    rows = [
        ("rows evaluated", lambda f: str(f.n)),
        ("gold null / not a list of options", lambda f: f"{f.gold_null} / {f.gold_invalid}"),
        ("subset accuracy (exact set)", lambda f: _f(f.subset_accuracy) + _ci(f, "subset_accuracy")),
        ("Hamming loss", lambda f: _f(f.hamming_loss) + _ci(f, "hamming_loss")),
        ("micro-F1", lambda f: _f(f.micro_f1) + _ci(f, "micro_f1")),
        ("macro-F1", lambda f: _f(f.macro_f1) + _ci(f, "macro_f1")),
        ("options per row: gold / predicted", lambda f: f"{_f(f.mean_gold_size, 2)} / {_f(f.mean_pred_size, 2)}"),
        ("mean probability (whole set)", lambda f: _f(f.mean_prob)),
        ("mean candidate mass", lambda f: _f(f.mean_mass)),
        ("Brier (per option)", lambda f: _f(f.brier)),
        ("NLL (per option)", lambda f: _f(f.nll)),
        ("ECE (per option, 15 bins)", lambda f: _f(f.ece)),
    ]
    if any(f.abstained for f in fields):
        rows.insert(1, ("no choice written", lambda f: str(f.abstained)))
    for name, cell in rows:
        summary.add_row(name, *(cell(f) for f in fields))
    console.print(summary)
    console.print("subset accuracy: Wilson interval; Hamming loss, micro- and macro-F1: a percentile bootstrap of "
                  "the rows. Hamming loss = share of wrong option decisions; macro-F1 over the options chosen in "
                  "the gold or the predictions", highlight=False)
    for f in fields:
        if not f.n:
            console.print(f"{escape(f.field)}: no row with a gold label", highlight=False)
            continue
        table = _table(f"{escape(f.field)}: per option")
        table.add_column("option")
        for name in ("precision", "recall", "F1", "support", "predicted"):
            table.add_column(name, justify="right")
        for s in f.per_option:
            table.add_row(escape(s.label), _f(s.precision), _f(s.recall), _f(s.f1), str(s.support), str(s.predicted))
        console.print(table)


def _field_tables(f, console: Console) -> None:
    if not f.n:
        console.print(f"{escape(f.field)}: no row with a gold label", highlight=False)
        return
    if f.decision_rule:
        _rule_table(f.field, f.decision_rule, console)
    if f.label_sets:
        per = ", ".join(f"{escape(label)} {v['coverage']:.3f} ({v['rows']})" for label, v in
                        f.label_sets["per_label"].items())
        console.print(f"{escape(f.field)}: label-set coverage by gold label (rows): {per}", highlight=False)
    labels = _table(f"{escape(f.field)}: per label")
    labels.add_column("label")
    for name in ("precision", "recall", "F1", "support", "predicted"):
        labels.add_column(name, justify="right")
    for s in f.per_label:
        labels.add_row(escape(s.label), _f(s.precision), _f(s.recall), _f(s.f1), str(s.support), str(s.predicted))
    console.print(labels)
    confusion = _table(f"{escape(f.field)}: confusion (rows: gold, columns: predicted)")
    confusion.add_column("gold")
    for name in f.labels:
        confusion.add_column(escape(name), justify="right")
    for name, row in zip(f.labels, f.confusion):
        confusion.add_row(escape(name), *map(str, row))
    console.print(confusion)
    selective = _table(f"{escape(f.field)}: selective prediction (keep the highest-ranked rows)")
    selective.add_column("ranked by")
    for point in f.by_prob.points:
        selective.add_column(f"acc@{point.coverage:.0%}", justify="right")
    target = f.by_prob.target
    if target is not None:
        selective.add_column(f"threshold for {target.target:.0%}", justify="right")
        selective.add_column("coverage", justify="right")
    for sel in (f.by_prob, f.by_mass):
        if sel is None:
            continue
        cells = [_f(p.accuracy) for p in sel.points]
        if sel.target is not None:
            t = sel.target
            cells += ["not reached", "0%"] if t.threshold is None else [f"{t.threshold:.4f}", f"{t.coverage:.1%}"]
        selective.add_row(f"__{sel.score}", *cells)
    console.print(selective)
    if target is not None:
        console.print(f"{escape(f.field)}: " + (
            (f"no threshold is fitted ({target.reason}); every row goes to review" if target.reason else
             f"no probability threshold keeps the error at or below {1 - target.target:.1%} on these rows")
            if target.threshold is None else
            f"{target.coverage:.1%} of rows ({target.n}) can be decided automatically with an error of at most "
            f"{1 - target.target:.1%} on these gold rows ({1 - target.accuracy:.1%} measured): those whose "
            f"__prob >= {target.threshold:.4f}; the rest go to review"), highlight=False)


def render_calibration(report, console: Console) -> None:
    """Per field: the cross-validated scores before and after, then the final T and biases."""
    from .calibration import MAX_TEMPERATURE, MIN_TEMPERATURE

    for f in report.fields:
        readout = getattr(f, "readout", None)
        table = _table(f"{escape(f.field)} ({f.n} rows, {f.folds}-fold CV" +
                       (", the readout's layers and C chosen inside each fold)" if readout is not None else ")"))
        columns = ("metric", "argmax", "logits calibrated", "linear readout") if readout is not None else \
            ("metric", "before", "after")
        for name in columns:
            table.add_column(name, justify="left" if name == "metric" else "right")
        for name, attr in (("accuracy", "accuracy"), ("macro-F1", "macro_f1"), ("ECE (15 bins)", "ece"),
                           ("NLL", "nll")):
            table.add_row(name, _f(getattr(f.before, attr)),
                          *((_f(getattr(f.logits, attr)),) if readout is not None else ()), _f(getattr(f.after, attr)))
        console.print(table)
        if readout is not None:
            console.print(f"{escape(f.field)}: linear readout, {readout.describe()}" +
                          (f"; labels without gold rows: {escape(', '.join(readout.absent))}" if readout.absent
                           else ""), highlight=False)
        biases = _biases(f.labels, f.biases)
        console.print(f"{escape(f.field)}: temperature {f.temperature:.3f}; biases {biases}", highlight=False)
        if f.conformal is not None:
            c = f.conformal
            console.print(f"{escape(f.field)}: label sets for coverage {c.coverage:.2f}: a label is in the set when "
                          f"its calibrated probability is at least {1 - c.score_threshold:.3f} (split conformal on "
                          f"{c.n} held gold rows; the calibration was fitted on the other {f.n})", highlight=False)
        if f.rule is not None:
            render_rule(f.field, f.rule, console)
        if readout is None and f.temperature >= MAX_TEMPERATURE * 0.999:  # a readout's labels do not use it
            console.print(f"[yellow]warning:[/] field {escape(f.field)}: the temperature is at its bound: the "
                          "model's probabilities carry no usable signal on these rows (higher probability is not "
                          "more often right), so the calibration only sets the label priors; it cannot teach "
                          "the model the task: train it (pcd tune) or pass a larger --model", highlight=False)
        elif f.temperature <= MIN_TEMPERATURE * 1.001:
            console.print(f"[yellow]warning:[/] field {escape(f.field)}: the temperature is at its lower bound: "
                          "the gold rows are separated perfectly and the fit sharpens the probabilities as far as "
                          "allowed; add gold rows before trusting it", highlight=False)
    for note in getattr(report, "notes", ()):
        console.print(f"note: {escape(note)}", highlight=False)
    if report.gold_without_prediction:
        console.print(f"{report.gold_without_prediction} gold rows had no prediction and were not used",
                      highlight=False)
    for name, skipped in report.skipped.items():
        if skipped["gold_null"] or skipped["gold_invalid"]:
            console.print(f"field {escape(name)}: {skipped['gold_null']} rows with no gold value and "
                          f"{skipped['gold_invalid']} with a value that is not a label were not used", highlight=False)
    if report.fields_without_gold:
        console.print("not calibrated (no gold column): " + escape(", ".join(report.fields_without_gold)),
                      highlight=False)


def _rule_table(name: str, compared: dict, console: Console) -> None:
    """``pcd eval``: the figures at argmax and at the decision rule (``decision.compare_rule``)."""
    table = _table(f"{escape(name)}: argmax vs the decision rule for {escape(compared['objective'])} (95% bootstrap "
                   "intervals)")
    for col in ("metric", "argmax", "rule"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    a, r = compared["argmax"], compared["rule"]
    table.add_row(escape(compared["metric"]), f"{a['value']:.3f} [{a['low']:.3f}, {a['high']:.3f}]",
                  f"{r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}]")
    for label, key in (("accuracy", "accuracy"), ("macro-F1", "macro_f1"), ("precision", "precision"),
                       ("recall", "recall")):
        if key in a and compared["metric"] != label and not compared["metric"].startswith(label):
            table.add_row(label, _f(a.get(key)), _f(r.get(key)))
    console.print(table)


def _texts(cv: dict) -> str:
    """``", 40 distinct texts"`` when the rows hold copies of one model input (``cv["texts"]``)."""
    return f", {cv['texts']} distinct texts" if "texts" in cv else ""


def render_rule(name: str, rule, console: Console) -> None:
    """A decision rule's held-out figures beside argmax (``DecisionRule.cv``: each fold's rule
    fitted on the other folds' cross-validated calibrated probabilities), then the rule itself."""
    cv = rule.cv
    if cv:
        table = _table(f"{escape(name)}: decision rule for {escape(rule.objective)} (held-out folds, "
                       f"{cv['n']} rows{_texts(cv)}, 95% bootstrap intervals)")
        for col in ("metric", "argmax", "rule"):
            table.add_column(col, justify="left" if col == "metric" else "right")
        a, r = cv["argmax"], cv["rule"]
        table.add_row(escape(cv["metric"]), f"{a['value']:.3f} [{a['low']:.3f}, {a['high']:.3f}]",
                      f"{r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}]")
        rows = [("accuracy", "accuracy"), ("macro-F1", "macro_f1")] + \
            [(k, k) for k in ("precision", "recall") if k in a and not cv["metric"].startswith(k)]
        for label, key in rows:
            if cv["metric"] != label:
                table.add_row(label, _f(a.get(key)), _f(r.get(key)))
        if "gain" in cv:  # the rule's gain over argmax, paired on the same resamples (decision.gain_figures)
            g = cv["gain"]
            table.add_row(f"gain in {escape(g['metric'])}", "", f"{g['value']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]")
        console.print(table)
    if rule.kept_argmax:
        console.print(f"{escape(name)}: argmax kept for {escape(rule.objective)}: the rule fitted "
                      f"({escape(rule.fitted().describe())}) showed no held-out gain", highlight=False)
        return
    console.print(f"{escape(name)}: rule for {escape(rule.objective)}: {escape(rule.describe())} (fitted on all "
                  "rows' cross-validated calibrated probabilities)", highlight=False)


#: Above this many labels (an integer field's values) only the biases that are not 0.000 are listed.
MANY_LABELS = 12


def _biases(labels, biases) -> str:
    """``A +0.120, B -0.120``; past ``MANY_LABELS`` labels only those not 0.000, then how many are."""
    pairs = list(zip(labels, biases))
    shown = pairs if len(pairs) <= MANY_LABELS else [(lab, b) for lab, b in pairs if abs(b) >= 5e-4]
    text = ", ".join(f"{escape(label)} {value:+.3f}" for label, value in shown)
    rest = len(pairs) - len(shown)
    return text + (f"{', ' if shown else ''}the other {rest} 0.000" if rest else "")


def render_tune(result, console: Console, *, calibration=None, notes=()) -> None:
    """``pcd tune``'s before -> after table: per field, holdout accuracy, macro-F1, NLL, ECE and
    mean candidate mass of the model before training (epoch 0) and of the kept epoch; then the
    training's cost; then, per field, the calibration fitted on the holdout (method, why, and
    its cross-validated ECE before -> after), or why there is none."""
    before, after = result.epochs[0].holdout, result.epochs[result.best_epoch].holdout
    cross = result.cross_fit
    title = (f"pcd tune: {cross['folds']}-fold cross-fit, out-of-fold predictions of {result.holdout_rows} rows, "
             f"before -> each fold's kept epoch {cross['kept_epochs']}" if cross else
             f"pcd tune: holdout ({result.holdout_rows} rows, never trained on), before -> epoch {result.best_epoch}")
    table = _table(title)
    table.add_column("field")
    for metric in ("accuracy", "macro-F1", "NLL", "ECE", "mass"):
        table.add_column(metric, justify="right")
    for name, b in before.items():
        a = after.get(name, b)
        table.add_row(escape(name), *(f"{_f(getattr(b, k))} -> {_f(getattr(a, k))}"
                                      for k in ("accuracy", "macro_f1", "nll", "ece", "mass")))
    if before:
        console.print(table)
    else:
        console.print("no holdout (--holdout 0): the last epoch is kept", highlight=False)
    if cross:
        console.print(f"the written model: trained on all {result.train_rows} rows for {cross['final_epochs']} epochs "
                      "(the median of the folds' kept epochs)", highlight=False)
    if result.stopped_early is not None:
        console.print(f"stopped early after epoch {result.stopped_early}: the holdout NLL did not improve on epoch "
                      f"{result.best_epoch} for {result.stopped_early - result.best_epoch} epochs (--patience)",
                      highlight=False)
    console.print(f"{result.train_rows} training rows, {result.steps} optimiser steps, "
                  f"{result.train_seconds:.0f} s; {result.trainable_parameters:,} adapter parameters",
                  highlight=False)
    if calibration is not None:
        for name, fc in calibration.fields.items():
            console.print(f"calibration of {escape(name)}: {escape(fc.cv['reason'])}; T = {fc.temperature:.3f}; "
                          f"cross-validated ECE {_f(fc.cv['before']['ece'])} -> {_f(fc.cv['after']['ece'])}",
                          highlight=False)
            if fc.rule is not None:
                render_rule(name, fc.rule, console)
    for note in notes:
        console.print(escape(note), highlight=False)
