"""``pcd eval`` / ``pcd calibrate`` / ``pcd tune`` gold for the field types beyond boolean and enum:
multi-select (per-option scores, micro/macro F1, subset accuracy, Hamming loss, a calibration per
option), ordered scales (MAE, within-one, QWK) and nullable fields. Metrics are checked against
scikit-learn on hand-made predictions written as real pcd outputs (``output.output_schema`` and
``output.results_table``); no model is loaded."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn import metrics as skm

from pcd_cli.api import Labeler
from pcd_cli.results import FieldResult, RecordResult
from pcd_cli.io.readers import InputSpec
from pcd_cli.io.output import output_schema, results_table
from pcd_cli.quality import Calibration, evaluate, fit_calibration, read_gold, read_predictions
from pcd_cli.quality import metrics as M
from pcd_cli.quality.calibration import fit_temperature_biases
from pcd_cli.quality.data import FieldSpec, field_specs, gold_label_index, gold_options
from pcd_cli.schema.model import NULL_LABEL, schema_metadata
from pcd_cli.schema.load import parse_schema
from pcd_cli.tune import gold_records

from ..helpers import pcd

SCHEMA = parse_schema({"name": "types", "fields": {
    "product": {"type": "enum", "labels": ["APP", "WEB"], "nullable": True},
    "topics": {"type": "multi", "labels": ["billing", "outage", "login"]},
    "severity": {"type": "ordinal", "labels": ["LOW", "MEDIUM", "HIGH"], "none_label": "UNKNOWN"},
    "stars": {"type": "integer", "minimum": 1, "maximum": 5, "nullable": True},
}})
OPTIONS = ("billing", "outage", "login")
N = 60


@pytest.fixture(autouse=True)
def fewer_resamples(monkeypatch):
    """The bootstrap intervals with 100 resamples (the figures checked here are not the intervals'
    precision; pcd uses 1000)."""
    full = M.bootstrap_interval
    monkeypatch.setattr(M, "bootstrap_interval", lambda *a, **k: full(*a, **(k | {"resamples": 100})))


def _onehotish(rng, k: int, gold: int, skill: float) -> np.ndarray:
    """A probability vector leaning to ``gold`` with chance ``skill``, else random."""
    p = rng.dirichlet(np.ones(k))
    if rng.random() < skill:
        p = 0.5 * p + 0.5 * np.eye(k)[gold]
    return p


def hand_data(seed: int = 0):
    """Gold answers and decoder results for ``N`` rows: (gold dict per row, RecordResults)."""
    rng = np.random.default_rng(seed)
    fields = {f.name: f for f in SCHEMA.declared}
    golds, results = [], []
    for i in range(N):
        g_product = int(rng.integers(0, 3))
        g_topics = rng.random(3) < [0.4, 0.2, 0.5]
        g_sev = int(rng.integers(0, 4))
        g_stars = int(rng.integers(0, 6))
        out = []
        for name, g in (("product", g_product),):
            p = _onehotish(rng, 3, g, 0.6)
            out.append(FieldResult(int(p.argmax()), fields[name].value(int(p.argmax())), float(p.max()), 0.8,
                                   tuple(map(float, p))))
        p_yes = np.clip(np.where(g_topics, 0.65, 0.3) + rng.normal(0, 0.2, 3), 0.01, 0.99)
        for p in p_yes:
            label = 0 if p >= 0.5 else 1
            out.append(FieldResult(label, label == 0, float(max(p, 1 - p)), 0.7, (float(p), float(1 - p))))
        for name, g, k in (("severity", g_sev, 4), ("stars", g_stars, 6)):
            p = _onehotish(rng, k, g, 0.5)
            out.append(FieldResult(int(p.argmax()), fields[name].value(int(p.argmax())), float(p.max()), 0.6,
                                   tuple(map(float, p))))
        results.append(RecordResult(id=f"r{i}", fields=tuple(out)))
        golds.append({"id": f"r{i}", "product": ["APP", "WEB", NULL_LABEL][g_product],
                      "topics": [o for o, yes in zip(OPTIONS, g_topics) if yes],
                      "severity": ["LOW", "MEDIUM", "HIGH", "UNKNOWN"][g_sev],
                      "stars": [1, "2", 3, " 4", 5, NULL_LABEL][g_stars]})
    golds[0]["stars"] = None  # no gold: not evaluated
    golds[1]["product"] = ""  # no gold either
    golds[2]["topics"] = ["billing", "refund"]  # not a list of options
    return golds, results


def metadata(schema=SCHEMA) -> dict[str, str]:
    return {"pcd.version": "0.1.0", "pcd.model": "fake-model", "pcd.prompt_head_sha256": "h" * 64,
            "pcd.scoring": "marginal", **schema_metadata(schema)}


def write_output(path, results, schema=SCHEMA, **kwargs):
    arrow = output_schema(schema, "id", pa.string(), all_probs=True, **kwargs).with_metadata(metadata(schema))
    pq.write_table(results_table(results, schema, arrow), path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("types")
    golds, results = hand_data()
    preds = write_output(tmp / "preds.parquet", results)
    gold = tmp / "gold.jsonl"
    gold.write_text("".join(json.dumps(g) + "\n" for g in golds))
    return preds, gold, golds, results


# -- metrics against scikit-learn -------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_multilabel_metrics_against_sklearn(seed):
    rng = np.random.default_rng(seed)
    gold = rng.random((50, 4)) < 0.4
    pred = rng.random((50, 4)) < 0.4
    scores = M.option_scores(gold, pred, ("a", "b", "c", "d"))
    p, r, f, support = skm.precision_recall_fscore_support(gold, pred, average=None, zero_division=0)
    assert [s.precision for s in scores] == pytest.approx(p, abs=1e-12)
    assert [s.recall for s in scores] == pytest.approx(r, abs=1e-12)
    assert [s.f1 for s in scores] == pytest.approx(f, abs=1e-12)
    assert [s.support for s in scores] == support.tolist()
    assert M.micro_f1(gold, pred) == pytest.approx(skm.f1_score(gold, pred, average="micro", zero_division=0))
    assert M.macro_f1(scores) == pytest.approx(skm.f1_score(gold, pred, average="macro", zero_division=0))
    assert M.subset_accuracy(gold, pred) == pytest.approx(skm.accuracy_score(gold, pred))
    assert M.hamming_loss(gold, pred) == pytest.approx(skm.hamming_loss(gold, pred))


def test_macro_f1_leaves_out_an_option_nobody_used():
    gold = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0]], dtype=bool)
    pred = np.array([[1, 1, 0], [0, 1, 0], [0, 1, 0]], dtype=bool)
    scores = M.option_scores(gold, pred, OPTIONS)
    # as pcd's single-label macro-F1: an option in neither gold nor predictions neither helps nor hurts
    assert M.macro_f1(scores) == pytest.approx(skm.f1_score(gold, pred, average="macro", labels=[0, 1],
                                                            zero_division=0))
    empty = np.zeros((2, 3), dtype=bool)
    assert M.micro_f1(empty, empty) == 0.0 and M.subset_accuracy(empty, empty) == 1.0
    assert M.micro_f1(np.zeros((0, 3), dtype=bool), np.zeros((0, 3), dtype=bool)) is None


@pytest.mark.parametrize("seed", range(4))
def test_scale_metrics_against_sklearn(seed):
    rng = np.random.default_rng(seed)
    k = 5
    gold = rng.integers(0, k, 80)
    pred = np.clip(gold + rng.integers(-2, 3, 80), 0, k - 1)
    pred[:5] = rng.integers(0, 2, 5)  # a middle value unused on one side must still weigh as a step
    assert M.quadratic_weighted_kappa(gold, pred, k) == pytest.approx(
        skm.cohen_kappa_score(gold, pred, labels=list(range(k)), weights="quadratic"), abs=1e-12)
    assert M.mean_absolute_error(gold.astype(float), pred.astype(float)) == pytest.approx(
        skm.mean_absolute_error(gold, pred))
    assert M.within_one(gold, pred) == pytest.approx(np.mean(np.abs(gold - pred) <= 1))


def test_qwk_undefined_and_perfect():
    assert M.quadratic_weighted_kappa(np.array([2, 2]), np.array([2, 2]), 3) is None
    assert M.quadratic_weighted_kappa(np.array([0, 1, 2]), np.array([0, 1, 2]), 3) == 1.0
    assert M.quadratic_weighted_kappa(np.zeros(0, dtype=int), np.zeros(0, dtype=int), 3) is None


# -- gold values ---------------------------------------------------------------------------------------

def test_gold_options_forms():
    spec = FieldSpec("topics", OPTIONS, False, "multi")
    expect = (True, False, True)
    for value in (["billing", "login"], np.array(["login", "billing"], dtype=object), ("billing", "login"),
                  '["billing", "login"]', "billing|login", "billing, login", " login | billing ",
                  {"billing": True, "outage": False, "login": True}, [("billing", True), ("login", True)],
                  ["billing", "login", "login"]):
        assert gold_options(value, spec) == expect, value
    assert gold_options("outage", spec) == (False, True, False)
    assert gold_options([], spec) == gold_options("[]", spec) == (False, False, False)
    for bad in ("refund", ["billing", "refund"], "billing;login", 3, "[billing]", '{"a": 1}', {"billing": "yes"},
                [1, 2]):
        assert gold_options(bad, spec) is None, bad


def test_gold_label_index_integer_ordinal_nullable():
    stars = FieldSpec.of(SCHEMA.declared[3])
    assert [gold_label_index(v, stars) for v in (1, "2", " 3 ", 4.0, np.int64(5), "null")] == [0, 1, 2, 3, 4, 5]
    assert [gold_label_index(v, stars) for v in (True, 0, 6, "3.5", 2.5, "three", None)] == [None] * 7
    severity = FieldSpec.of(SCHEMA.declared[2])
    assert severity.labels == ("LOW", "MEDIUM", "HIGH", "UNKNOWN")
    assert [gold_label_index(v, severity) for v in ("LOW", "UNKNOWN", "low", 0)] == [0, 3, None, None]
    assert severity.scale_values()[:3].tolist() == [0.0, 1.0, 2.0] and np.isnan(severity.scale_values()[3])
    assert stars.scale_values()[:5].tolist() == [1, 2, 3, 4, 5] and np.isnan(stars.scale_values()[5])


def test_field_specs_from_metadata_and_schema(files):
    preds, *_ = files
    frame, _ = read_predictions(preds)
    for specs in (field_specs(frame, None), field_specs(frame, SCHEMA)):
        by = {s.name: s for s in specs}
        assert list(by) == ["product", "topics", "severity", "stars"]
        assert (by["topics"].type, by["topics"].labels) == ("multi", OPTIONS)
        assert by["product"].nullable and by["stars"].nullable and by["stars"].type == "integer"
        assert by["severity"].none_label == "UNKNOWN"
    # an output without pcd.field_types: a list column is still a multi-select field
    frame.attrs["metadata"] = {k: v for k, v in frame.attrs["metadata"].items() if k != "pcd.field_types"}
    assert {s.name: s.type for s in field_specs(frame, None)}["topics"] == "multi"


# -- evaluate against scikit-learn on the same rows ------------------------------------------------------

def _expected(golds, results):
    """The evaluated rows of each field, computed independently of pcd_cli.quality."""
    return {f.name: [(g[f.name], [r.fields[i] for i in part] if f.is_multi else r.fields[part[0]])
                     for g, r in zip(golds, results)] for f, part in SCHEMA.declared_parts()}


def test_evaluate_against_sklearn(files):
    preds, gold, golds, results = files
    frame, _ = read_predictions(preds)
    report = evaluate(frame, read_gold(gold))
    rows = _expected(golds, results)

    # multi-select: row 2 has an option that is not one; every other row is evaluated
    multi = report.field("topics")
    kept = [(g, opts) for g, opts in rows["topics"] if all(o in OPTIONS for o in g)]
    g = np.array([[o in gl for o in OPTIONS] for gl, _ in kept])
    p = np.array([[res.label == 0 for res in opts] for _, opts in kept])
    assert (multi.n, multi.gold_invalid, multi.gold_null) == (N - 1, 1, 0)
    assert multi.invalid_values == (("['billing', 'refund']", 1),)
    assert multi.subset_accuracy == pytest.approx(skm.accuracy_score(g, p))
    assert multi.hamming_loss == pytest.approx(skm.hamming_loss(g, p))
    assert multi.micro_f1 == pytest.approx(skm.f1_score(g, p, average="micro"))
    assert multi.macro_f1 == pytest.approx(skm.f1_score(g, p, average="macro"))
    assert [s.f1 for s in multi.per_option] == pytest.approx(skm.f1_score(g, p, average=None))
    p_yes = np.array([[res.probs[0] for res in opts] for _, opts in kept])
    assert multi.brier == pytest.approx(np.mean((p_yes - g) ** 2), abs=1e-6)
    assert multi.intervals["subset_accuracy"] == M.wilson_interval(int(round(multi.subset_accuracy * multi.n)),
                                                                    multi.n)
    assert all(multi.intervals[k] is not None for k in ("hamming_loss", "micro_f1", "macro_f1"))

    # nullable enum: the null prediction is the label "null"; an empty gold cell is not evaluated
    product = report.field("product")
    kept = [(gl, res) for gl, res in rows["product"] if gl]
    gold_labels = [gl for gl, _ in kept]
    pred_labels = [res.value if res.value is not None else NULL_LABEL for _, res in kept]
    assert NULL_LABEL in pred_labels and NULL_LABEL in gold_labels
    assert (product.n, product.gold_null, product.abstained) == (N - 1, 1, 0)
    assert product.accuracy == pytest.approx(skm.accuracy_score(gold_labels, pred_labels))
    assert product.macro_f1 == pytest.approx(skm.f1_score(gold_labels, pred_labels, average="macro"))
    assert product.scale_rows is None and product.mae is None and product.type == "enum"

    # integer (nullable): MAE, within-one and QWK on the rows with a value on both sides
    stars = report.field("stars")
    kept = [(str(gl).strip(), res) for gl, res in rows["stars"] if gl is not None]
    assert (stars.n, stars.gold_null) == (N - 1, 1)
    on = [(int(gl), res.value) for gl, res in kept if gl != NULL_LABEL and res.value is not None]
    gv, pv = np.array(on).T
    assert (stars.scale_rows, stars.scale_excluded) == (len(on), len(kept) - len(on))
    assert stars.mae == pytest.approx(skm.mean_absolute_error(gv, pv))
    assert stars.within_one == pytest.approx(np.mean(np.abs(gv - pv) <= 1))
    assert stars.qwk == pytest.approx(skm.cohen_kappa_score(gv, pv, labels=[1, 2, 3, 4, 5], weights="quadratic"))
    assert stars.accuracy == pytest.approx(skm.accuracy_score(
        [gl for gl, _ in kept], [str(res.value) if res.value is not None else NULL_LABEL for _, res in kept]))

    # ordinal with a none label: positions 0..2, UNKNOWN off the scale
    severity = report.field("severity")
    order = {"LOW": 0, "MEDIUM": 1, "HIGH": 2}
    on = [(order[gl], order[res.value]) for gl, res in rows["severity"] if gl in order and res.value in order]
    gv, pv = np.array(on).T
    assert (severity.n, severity.scale_rows) == (N, len(on))
    assert severity.mae == pytest.approx(skm.mean_absolute_error(gv, pv))
    assert severity.qwk == pytest.approx(skm.cohen_kappa_score(gv, pv, labels=[0, 1, 2], weights="quadratic"))
    assert all(severity.intervals[k] is not None for k in ("mae", "within_one", "qwk"))

    d = report.to_dict()
    json.dumps(d, allow_nan=False)
    assert set(d["multi_fields"]) == {"topics"} and "topics" not in d["fields"]
    assert d["multi_fields"]["topics"]["per_option"]["login"]["support"] == int(g[:, 2].sum())
    assert d["fields"]["stars"]["type"] == "integer" and d["fields"]["stars"]["qwk"] == pytest.approx(stars.qwk)


def test_gold_as_csv_and_parquet_gives_the_same_report(files, tmp_path):
    preds, gold, golds, _ = files
    frame, _ = read_predictions(preds)
    want = evaluate(frame, read_gold(gold)).to_dict()
    csv_rows = ["id,product,topics,severity,stars"]
    for i, g in enumerate(golds):
        topics = g["topics"]
        cell = ("|".join(topics) if i % 3 == 0 else json.dumps(topics) if i % 3 == 1 else ", ".join(topics)) \
            if topics else "[]"
        stars = "" if g["stars"] is None else str(g["stars"]).strip()
        csv_rows.append(f"{g['id']},{g['product']},\"{cell.replace(chr(34), chr(34) * 2)}\",{g['severity']},{stars}")
    (tmp_path / "gold.csv").write_text("\n".join(csv_rows) + "\n")
    got = evaluate(frame, read_gold(tmp_path / "gold.csv")).to_dict()
    for name in ("multi_fields", "fields"):
        for field, report in want[name].items():
            other = got[name][field]
            keys = [k for k in report if k != "invalid_values"]
            assert {k: other[k] for k in keys} == {k: report[k] for k in keys}, field
    parquet_gold = pd.DataFrame(golds).assign(stars=[None if s is None else str(s).strip() for s in
                                                     (g["stars"] for g in golds)])
    parquet_gold.to_parquet(tmp_path / "gold.parquet")
    got = evaluate(frame, read_gold(tmp_path / "gold.parquet")).to_dict()
    assert got["multi_fields"]["topics"]["subset_accuracy"] == want["multi_fields"]["topics"]["subset_accuracy"]
    assert got["fields"]["stars"]["qwk"] == want["fields"]["stars"]["qwk"]


def test_abstained_rows_are_not_the_null_option(tmp_path):
    schema = parse_schema({"fields": {"product": {"type": "enum", "labels": ["APP", "WEB"], "nullable": True}}})
    f = schema.declared[0]
    probs = [(0.7, 0.2, 0.1), (0.1, 0.1, 0.8), (0.4, 0.35, 0.25), (0.1, 0.8, 0.1)]
    abstained = [False, False, True, False]
    results = [RecordResult(id=str(i), fields=(FieldResult(int(np.argmax(p)), None if a else
                                                           f.value(int(np.argmax(p))), max(p), 0.9, p,
                                                           abstained=a),))
               for i, (p, a) in enumerate(zip(probs, abstained))]
    path = write_output(tmp_path / "p.parquet", results, schema, abstain=("product",))
    frame, _ = read_predictions(path)
    gold = pd.DataFrame({"id": ["0", "1", "2", "3"], "product": ["APP", "null", "APP", "APP"]})
    report = evaluate(frame, gold).field("product")
    # row 1: predicted null, gold "null" (right); row 2 abstained (not scored); row 3 wrong
    assert (report.n, report.abstained, report.accuracy) == (3, 1, pytest.approx(2 / 3))
    assert report.confusion[2][2] == 1


# -- calibration per option ---------------------------------------------------------------------------

def test_calibration_per_option_round_trip(files, tmp_path):
    preds, gold, golds, results = files
    frame, meta = read_predictions(preds)
    calibration, report = fit_calibration(frame, read_gold(gold), SCHEMA, meta, folds=3)
    names = ["product", "topics.billing", "topics.outage", "topics.login", "severity", "stars"]
    assert list(calibration.fields) == names and [f.field for f in report.fields] == names
    assert calibration.fields["topics.login"].labels == ("true", "false")
    assert calibration.fields["stars"].labels == ("1", "2", "3", "4", "5", NULL_LABEL)
    # the per-option fit is the plain boolean fit on P(yes) / P(no) and the gold's membership
    rows = [(g, r) for g, r in zip(golds, results) if all(o in OPTIONS for o in g["topics"])]
    probs = np.array([[r.fields[3].probs[0], r.fields[3].probs[1]] for _, r in rows])
    truth = np.array([0 if "login" in g["topics"] else 1 for g, _ in rows])
    t, b = fit_temperature_biases(probs.astype(np.float32).astype(np.float64), truth)
    fc = calibration.fields["topics.login"]
    assert fc.n == len(rows) and fc.temperature == pytest.approx(t, rel=1e-4)
    assert fc.biases == pytest.approx(b, abs=1e-4)
    calibration.save(tmp_path / "cal.json")
    loaded = Calibration.load(tmp_path / "cal.json")
    assert loaded.fields["topics.login"].apply(np.array([0.6, 0.4])) == pytest.approx(fc.apply([0.6, 0.4]))

    # applied as pcd label --calibration does: topics__probs become the calibrated P(yes)
    fake = SimpleNamespace(schema=SCHEMA, calibration=loaded, abstain_unless_single=False)
    calibrated = [Labeler._calibrated(fake, r, SCHEMA) for r in results[:5]]
    arrow = output_schema(SCHEMA, "id", pa.string(), all_probs=True, calibrated=True)
    table = results_table(calibrated, SCHEMA, arrow).to_pandas()
    for i, r in enumerate(results[:5]):
        got = dict(table["topics__probs"][i])
        for j, option in enumerate(OPTIONS):
            want = loaded.fields[f"topics.{option}"].apply(np.array(r.fields[1 + j].probs))[0]
            assert got[option] == pytest.approx(want, abs=1e-6)
        assert list(table["topics"][i]) == [o for j, o in enumerate(OPTIONS) if got[o] >= 0.5]
    assert "topics__raw_prob" in table.columns


def test_calibration_coverage_skips_multi_with_a_note(files):
    preds, gold, *_ = files
    frame, meta = read_predictions(preds)
    calibration, report = fit_calibration(frame, read_gold(gold), SCHEMA, meta, folds=2, coverage=0.8)
    assert calibration.fields["severity"].conformal is not None
    assert all(calibration.fields[f"topics.{o}"].conformal is None for o in OPTIONS)
    assert len(report.notes) == 1 and "'topics' is multi-select" in report.notes[0]


# -- pcd tune's gold ------------------------------------------------------------------------------------

def test_tune_gold_records_expand_multi_to_option_decisions():
    gold = pd.DataFrame({"id": ["a", "b", "c", "d"], "text": ["one", "two", "three", "four"],
                         "product": ["APP", None, "null", "WEB"],
                         "topics": [["login"], "billing|outage", None, ["nope"]],
                         "severity": ["HIGH", "LOW", "UNKNOWN", None], "stars": [5, "1", None, 2.0]})
    records, labels, skipped = gold_records(gold, SCHEMA, InputSpec(text_field="text", id_field="id"))
    assert [r.id for r in records] == ["a", "b", "c", "d"] and not skipped
    assert [f.name for f in SCHEMA.fields] == ["product", "topics.billing", "topics.outage", "topics.login",
                                              "severity", "stars"]
    assert labels == [[0, 1, 1, 0, 2, 4], [None, 0, 0, 1, 0, 0], [2, None, None, None, 3, None],
                      [1, None, None, None, None, 1]]


# -- the CLI ---------------------------------------------------------------------------------------------

def test_pcd_eval_and_calibrate_cli(files, tmp_path):
    preds, gold, *_ = files
    result = pcd("eval", str(preds), str(gold), "--json", str(tmp_path / "r.json"), "--compare",
                 str(preds), code=None, env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.stdout
    text = " ".join(result.stdout.split())
    for words in ("pcd eval: multi-select fields", "subset accuracy (exact set)", "Hamming loss", "micro-F1",
                  "topics: per option", "MAE", "within-one accuracy", "QWK", "ordered scale: rows (off it)",
                  "gold null / not a list of options", "0 / 1", "│ topics (exact set) │ 59 │",
                  "topics (exact set): 0 / 0 rows right only before / only after"):
        assert words in text, words
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["multi_fields"]["topics"]["hamming_loss"] is not None and doc["fields"]["stars"]["mae"] is not None

    schema_file = tmp_path / "s.json"
    schema_file.write_text(json.dumps({"name": "types", "fields": {
        "product": {"type": "enum", "labels": ["APP", "WEB"], "nullable": True},
        "topics": {"type": "multi", "labels": list(OPTIONS)},
        "severity": {"type": "ordinal", "labels": ["LOW", "MEDIUM", "HIGH"], "none_label": "UNKNOWN"},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5, "nullable": True}}}))
    result = pcd("calibrate", str(gold), "-s", str(schema_file), "--predictions", str(preds),
                 "-o", str(tmp_path / "cal.json"), "--folds", "2", "--coverage", "0.8",
                 code=None, env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.stdout + str(result.exception)
    text = " ".join(result.stdout.split())
    assert "topics.billing (" in text and "calibrated per option, without label sets" in text
    assert set(json.loads((tmp_path / "cal.json").read_text())["fields"]) >= {f"topics.{o}" for o in OPTIONS}
