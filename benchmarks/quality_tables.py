"""Write benchmarks/quality.md: the quality benchmarks' log (benchmarks/quality_notes.md) with
every ``<!-- table: NAME -->`` line replaced by the markdown table NAME rendered from the JSON
the benchmark scripts wrote (benchmarks/prior_correction.json, tune_quality.json, tune_mass.json,
quality.json, quality_rules.json, quality_rivals.json). No model, no network: ``python benchmarks/quality_tables.py`` (``--check`` exits 1
when benchmarks/quality.md is not what it would write; tests/test_docs.py runs that check)."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from generated_page import render_or_check  # benchmarks/ (the script's folder)

HERE = Path(__file__).resolve().parent
NOTES = HERE / "quality_notes.md"
OUTPUT = HERE / "quality.md"
MARKER = re.compile(r"^<!-- table: (\w+) -->$", re.M)


def _load(name: str) -> dict:
    return json.loads((HERE / name).read_text(encoding="utf-8"))


def f3(x) -> str:
    """A figure to 3 decimals; ``-`` where there is none."""
    return "-" if x is None else f"{x:.3f}"


def ci(pair) -> str:
    return "" if not pair else f" [{pair[0]:.3f}, {pair[1]:.3f}]"


def chance(m: dict) -> str:
    """``(mean / 95th percentile)`` of the ECE a calibrated model shows on these rows by chance."""
    floor = m.get("ece_floor")
    return f" ({floor[0]:.3f} / {floor[1]:.3f})" if floor else ""


def afe(m: dict, *, interval: bool = False) -> str:
    """accuracy / macro-F1 / ECE (with its interval)."""
    return f"{f3(m['accuracy'])} / {f3(m['macro_f1'])} / {f3(m['ece'])}" + (ci(m.get("ece_ci")) if interval else "")


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


SHORT = {"airline_tweets": "airline", "sms_spam": "SMS", "trec_questions": "TREC"}


def prior_correction() -> str:
    rows = []
    for name, s in _load("prior_correction.json").items():
        plain, corrected = s["plain"], s["corrected"]
        flips = f"{plain['flips_when_reversed']} → {corrected['flips_when_reversed']}"
        if name == "sms_spam":
            flips += " (a boolean's order is fixed)"
        rows.append([name, f"{f3(plain['accuracy'])} → {f3(corrected['accuracy'])}",
                     f"{f3(plain['macro_f1'])} → {f3(corrected['macro_f1'])}", f3(plain["majority"]), flips])
    return table(["set", "accuracy plain → corrected", "macro-F1 plain → corrected", "majority",
                  "rows whose label changes when the label list is reversed, plain → corrected"], rows)


def tune_quality() -> str:
    rows = []
    for name, s in _load("tune_quality.json")["sets"].items():
        rows.append([f"{name} ({s['rows']['train']} / {s['rows']['test']})", f3(s["majority"]["accuracy"]),
                     afe(s["tfidf_logreg"]), afe(s["zero_shot"]), afe(s["tune"]), afe(s["tune_calibrated"]),
                     f"{s['tune_seconds']:.0f} s, best epoch {s['best_epoch']}"])
    return table(["set (train / test rows)", "majority", "TF-IDF + logreg", "zero-shot", "+tune",
                  "+tune +calibration", "tune time"], rows)


def tune_mass() -> str:
    data = _load("tune_mass.json")
    rows = []
    for name, s in data["sets"].items():
        short = SHORT.get(name, name)

        def row(label, m, *, flips=True):
            mass = "-" if m.get("mean_mass") is None else f3(m["mean_mass"])
            below = "-" if m.get("below_min_mass") is None else f3(m["below_min_mass"])
            flip = m.get("flips_when_reversed")
            return [short, label, f3(m["accuracy"]), f3(m["macro_f1"]), f3(m["ece"]) + ci(m.get("ece_ci")), mass,
                    below, ("-" if flip is None else flip) if flips else ""]

        t = s["tfidf_logreg"]
        rows.append([short, "TF-IDF + logreg", f3(t["accuracy"]), f3(t["macro_f1"]), f3(t["ece"]), "-", "-", "-"])
        rows.append(row("base (zero-shot)", s["base"]))
        for weight in data["mass_weights"]:
            tune = s[f"tune_w{weight:g}"]
            rows.append(row(f"tune, mass weight {weight:g}", tune["raw"]))
            method = "T" if tune["calibration"]["method"] == "temperature" else "T + biases"
            rows.append(row(f"+ tune's cal. ({method})", tune["calibrated"], flips=name == "sms_spam"))
    return table(["set", "configuration", "acc", "F1", "ECE [95 % CI]", "mass", "<0.5", "flips"], rows)


def _tune_sets(section: str) -> dict:
    return _load("quality.json")["tune"][section]["sets"]


def learning_curve() -> str:
    rows = []
    for name, s in _tune_sets("learning_curve").items():
        for n, p in s["points"].items():
            tune = p["tune"]
            rows.append([SHORT.get(name, name), n + (" (all)" if p["train_rows"] == s["pool_rows"] else ""),
                         afe(p["tfidf_logreg"]), afe(tune["raw"], interval=True), f3(tune["calibrated"]["ece"]),
                         f"{f3(s['base']['mean_mass'])} -> {f3(tune['raw']['mean_mass'])}",
                         f"{tune['tune_seconds']:.0f}"])
    return table(["set", "train rows", "TF-IDF + logreg acc / F1 / ECE", "tune acc / F1 / ECE [95 % CI]",
                  "tune +cal. ECE", "mass before -> after", "tune s"], rows)


def learning_curve_epochs6() -> str:
    three = _tune_sets("learning_curve")
    rows = []
    for name, s in _tune_sets("learning_curve_epochs6").items():
        for n, p in s["points"].items():
            raw3 = three[name]["points"][n]["tune"]["raw"]
            tune = p["tune"]
            raw6 = tune["raw"]
            rows.append([SHORT.get(name, name), n, f"{f3(p['tfidf_logreg']['accuracy'])} / "
                         f"{f3(p['tfidf_logreg']['macro_f1'])}", f"{f3(raw3['accuracy'])} / {f3(raw3['macro_f1'])}",
                         f"{f3(raw6['accuracy'])} / {f3(raw6['macro_f1'])} ({tune['best_epoch']})",
                         f3(raw6["mean_mass"]), f"{tune['tune_seconds']:.0f}"])
    return table(["set", "train rows", "TF-IDF + logreg acc / F1", "tune, 3 epochs", "tune, 6 epochs (best epoch)",
                  "mass, 6 epochs", "tune s, 6 epochs"], rows)


def kfold() -> str:
    rows = []
    for name, s in _tune_sets("kfold").items():
        raw = s["tune_raw"]
        rows.append([name, afe(s["tfidf_logreg"], interval=True), afe(raw, interval=True),
                     afe(s["tune_calibrated"], interval=True), f"{f3(raw['mass_before'])} -> {f3(raw['mean_mass'])}",
                     f"{statistics.mean(s['tune_seconds']):.0f}"])
    return table(["set", "TF-IDF + logreg acc / F1 / ECE [95 % CI]", "tune acc / F1 / ECE [95 % CI]",
                  "tune +cal. acc / F1 / ECE [95 % CI]", "mass before -> after", "tune s per fold"], rows)


def _written(run: dict) -> str:
    """The ECE of the calibration tune wrote, or ``(raw)`` where its own check wrote none."""
    return f3(run["calibrated"]["ece"]) if run["written"] else "(raw)"


def cross_fit() -> str:
    rows = []
    for name, s in _tune_sets("cross_fit").items():
        hold, cross = s["holdout"], s["cross_fit"]
        t = s["tfidf_logreg"]
        rows.append([SHORT.get(name, name), f"{f3(t['accuracy'])} / {f3(t['ece'])}",
                     f"{afe(hold['raw'], interval=True)}, {_written(hold)}",
                     f"{afe(cross['raw'], interval=True)}, {_written(cross)}",
                     f"{f3(s['base']['mean_mass'])} -> {f3(hold['raw']['mean_mass'])} / {f3(cross['raw']['mean_mass'])}",
                     f"{hold['tune_seconds']:.0f} / {cross['tune_seconds']:.0f}"])
    return table(["set", "TF-IDF acc / ECE", "holdout: acc / F1 / ECE [95 % CI] raw, cal.",
                  "cross-fit 3: acc / F1 / ECE [95 % CI] raw, cal.", "mass base -> holdout / cross-fit",
                  "tune s holdout / cross-fit"], rows)


def holdout_v2() -> str:
    rows = []
    for name, s in _tune_sets("holdout_v2").items():
        hold = s["holdout"]
        raw, forced = hold["raw"], hold["calibrated_always"]
        rows.append([f"{SHORT.get(name, name)} ({s['test_rows']})", f3(s["tfidf_logreg"]["ece"]) + chance(s["tfidf_logreg"]),
                     f"{f3(raw['accuracy'])} / {f3(raw['nll'])} / {f3(raw['ece'])}{chance(raw)}",
                     f"NLL {f3(forced['nll'])}, ECE {f3(forced['ece'])}",
                     "its own" if hold["written"] else "none (its CV: worse)"])
    return table(["set (test rows)", "TF-IDF ECE (chance)", "tuned, holdout, raw: acc / NLL / ECE (chance)",
                  "calibration forced on", "written by tune"], rows)


def decision_rules() -> str:
    """``benchmarks/quality_rules.json`` (``benchmarks/quality.py --rules``): held-out macro-F1 [95 %]
    and accuracy at argmax, with a likelihood calibration, with the rule, and TF-IDF + LR tuned."""
    run = _load("quality_rules.json")
    rows = []
    for name, s in run["sets"].items():
        def cell(m):
            return "refused (floor)" if m is None else \
                f"{m['value']:.3f} [{m['low']:.3f}, {m['high']:.3f}] / {m['accuracy']:.3f}"
        rows.append([f"{name} ({s['dev']}/{s['held_out']})", cell(s["argmax"]), cell(s["likelihood_calibration"]),
                     cell(s["rule"]), cell(s["tfidf_lr_tuned"])])
    return table(["set (dev/held-out rows)", "argmax", "+ likelihood calibration", f"+ rule ({run['objective']})",
                  "TF-IDF + LR, its own tuned rule"], rows)


RIVAL_CELLS = (("unlabelled", "`--unlabelled`"), ("calibrate", "calibrate"),
               ("calibrate_objective", "calibrate `--objective macro-f1`"), ("readout", "readout"),
               ("readout_objective", "readout + objective"), ("tfidf_lr", "TF-IDF+LR"),
               ("minilm_lr", "MiniLM+LR"))


def rivals() -> str:
    """``benchmarks/quality_rivals.json`` (``benchmarks/quality.py --rivals``): held-out macro-F1 per
    set and N of pcd zero-shot, its label-free corrections, calibrate, the readout, and the rivals."""
    run = _load("quality_rivals.json")
    rows = []
    for name, s in run["sets"].items():
        for n, r in s["by_n"].items():
            def cell(m):
                return f3(m["macro_f1"]) if "macro_f1" in m else "skipped" if "skipped" in m else "refused"
            rows.append([f"{SHORT.get(name, name)} ({s['held_out']})", n, f3(s["zero_shot"]["macro_f1"]),
                         f3(s["prior_correction"]["macro_f1"]), f3(s["unlabelled_on_input"]["macro_f1"]),
                         f3(s["minilm_cosine"]["macro_f1"])] +
                        [cell(r[key]) for key, _ in RIVAL_CELLS])
    return table(["set (held-out rows)", "N", "pcd zero-shot", "`--prior-correction`",
                  "`--unlabelled` on the held-out rows", "MiniLM cosine"] +
                 [title for _, title in RIVAL_CELLS], rows)


def rival_speed() -> str:
    """Records/s of each method in ``benchmarks/quality_rivals.json`` (the largest N's fit)."""
    rows = []
    for name, s in _load("quality_rivals.json")["sets"].items():
        last = s["by_n"][str(s["ns"][-1])]
        rows.append([SHORT.get(name, name), f"{s['pcd_records_per_s']:.1f}",
                     f"{s['minilm_cosine']['records_per_s']:.0f}", f"{last['minilm_lr']['records_per_s']:.0f}",
                     f"{last['tfidf_lr']['records_per_s']:.0f}",
                     f"{last['minilm_lr']['fit_seconds']:.1f} / {last['tfidf_lr']['fit_seconds']:.1f}"])
    return table(["set", "pcd records/s (every pcd column)", "MiniLM cosine", "MiniLM+LR", "TF-IDF+LR",
                  "fit s with CV: MiniLM+LR / TF-IDF+LR"], rows)


TABLES = {f.__name__: f for f in (prior_correction, tune_quality, tune_mass, learning_curve, learning_curve_epochs6,
                                   kfold, cross_fit, holdout_v2, decision_rules, rivals, rival_speed)}


def render() -> str:
    notes = NOTES.read_text(encoding="utf-8")
    unknown = set(MARKER.findall(notes)) - set(TABLES)
    if unknown:
        raise SystemExit(f"{NOTES.name}: no table named {', '.join(sorted(unknown))}")
    body = MARKER.sub(lambda m: TABLES[m.group(1)](), notes)
    return ("<!-- Generated by benchmarks/quality_tables.py from benchmarks/quality_notes.md and the JSON it names;"
            " edit those, not this file. -->\n" + body)


def main(argv=None) -> int:
    return render_or_check(render, OUTPUT, argv, description=__doc__.splitlines()[0],
                           script="benchmarks/quality_tables.py")


if __name__ == "__main__":
    sys.exit(main())
