"""Conformal label sets (issue #18 item 3): the split-conformal threshold against hand-computed
values, coverage on synthetic scores with a known distribution, the calibration file, and the
sets a Labeler writes (tiny random model)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pcd_cli.api import Labeler
from pcd_cli.errors import CalibrationError
from pcd_cli.io.readers import InputSpec
from pcd_cli.engines.local import label_file
from pcd_cli.quality import evaluate, read_predictions
from pcd_cli.quality.calibration import Calibration, fit_calibration
from pcd_cli.quality.conformal import ConformalSet, conformal_split, fit_conformal
from pcd_cli.schema.load import parse_schema

from ..helpers import tiny_backend


def test_threshold_is_the_ceil_n_plus_1_quantile_of_the_scores():
    # scores 1 - p(gold): 0.1, 0.2, ..., 1.0 (10 rows); coverage 0.8 -> rank ceil(11 * 0.8) = 9 -> 0.9
    probs = np.array([[1 - s, s] for s in np.linspace(0.1, 1.0, 10)])
    gold = np.zeros(10, dtype=np.int64)
    assert fit_conformal(probs, gold, 0.8).score_threshold == pytest.approx(0.9)
    assert fit_conformal(probs, gold, 0.5).score_threshold == pytest.approx(0.6)  # ceil(5.5) = 6
    assert fit_conformal(probs, gold, 0.95).score_threshold == 1.0  # ceil(10.45) = 11 > 10: every label
    assert fit_conformal(probs[:0], gold[:0], 0.9).score_threshold == 1.0


def test_sets_hold_every_label_within_the_threshold_most_probable_first():
    cs = ConformalSet(0.9, 0.7, 100)
    assert cs.label_set([0.5, 0.2, 0.3]) == (0, 2)  # 1 - 0.2 = 0.8 > 0.7
    assert cs.label_set([0.31, 0.30, 0.39]) == (2, 0, 1)
    assert ConformalSet(0.9, 0.0, 10).label_set([0.2, 0.5, 0.3]) == (1,)  # never empty: the top label stays


def test_coverage_holds_on_scores_with_a_known_distribution():
    """Dirichlet probabilities, gold drawn from them (a calibrated model): over 400 repetitions
    the mean coverage is within sampling error of the asked 0.9 and at most 0.9 + 1/(n+1)."""
    rng = np.random.default_rng(3)
    k, n_cal, n_test, covered = 4, 200, 200, []
    for _ in range(400):
        p = rng.dirichlet(np.ones(k) * 0.7, n_cal + n_test)
        gold = np.array([rng.choice(k, p=row) for row in p])
        cs = fit_conformal(p[:n_cal], gold[:n_cal], 0.9)
        sets = [cs.label_set(row) for row in p[n_cal:]]
        covered.append(np.mean([g in s for g, s in zip(gold[n_cal:], sets)]))
    mean = float(np.mean(covered))
    assert 0.9 - 0.005 <= mean <= 0.9 + 1 / (n_cal + 1) + 0.005


def test_the_split_is_seeded_and_disjoint():
    fit, held = conformal_split(101, seed=0)
    assert len(held) == 50 and len(fit) == 51 and not set(fit) & set(held)
    assert np.array_equal(held, conformal_split(101, seed=0)[1])
    assert not np.array_equal(held, conformal_split(101, seed=1)[1])


SCHEMA = parse_schema({"name": "s", "fields": {"tone": {"type": "enum", "labels": ["calm", "angry", "sad"]}}})


def _predictions(n: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    rng = np.random.default_rng(seed)
    labels = ("calm", "angry", "sad")
    p = rng.dirichlet(np.ones(3), n)
    gold = [labels[rng.choice(3, p=row)] for row in p]
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(n)], "tone": [labels[int(np.argmax(r))] for r in p],
                          "tone__prob": p.max(axis=1), "tone__mass": np.ones(n),
                          "tone__probs": [list(zip(labels, row)) for row in p]})
    meta = {"pcd.model": "m", "pcd.schema_sha256": SCHEMA.source_sha256, "pcd.prompt_head_sha256": "h",
            "pcd.scoring": "marginal"}
    return frame, pd.DataFrame({"id": frame["id"], "tone": gold}), meta


def test_calibrate_with_coverage_writes_the_threshold_fitted_on_held_rows(tmp_path):
    frame, gold, meta = _predictions(300)
    calibration, report = fit_calibration(frame, gold, SCHEMA, meta, coverage=0.9)
    field = calibration.fields["tone"]
    assert field.conformal is not None and field.conformal.n == 150 and field.n == 150
    fit_rows, held_rows = conformal_split(300, seed=0)
    probs = np.array([[dict(c)[lab] for lab in ("calm", "angry", "sad")] for c in frame["tone__probs"]])
    gold_idx = np.array([("calm", "angry", "sad").index(g) for g in gold["tone"]])
    expected = fit_conformal(field.apply(probs[held_rows]), gold_idx[held_rows], 0.9)
    assert field.conformal.score_threshold == pytest.approx(expected.score_threshold)
    saved = calibration.save(tmp_path / "c.json")
    loaded = Calibration.load(tmp_path / "c.json")
    assert loaded.fields["tone"].conformal == field.conformal and saved.sha256 == loaded.sha256
    assert report.to_dict()["fields"]["tone"]["conformal"]["coverage"] == 0.9
    doc = json.loads((tmp_path / "c.json").read_text())
    doc["fields"]["tone"]["conformal"]["coverage"] = 1.5
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=r"'conformal.coverage' must be a number in \(0, 1\), got 1.5"):
        Calibration.load(tmp_path / "bad.json")


def test_labeler_writes_sets_and_abstains_unless_single(tmp_path):
    backend = tiny_backend(chat_template=True, seed=2)
    schema = parse_schema({"name": "s", "fields": {"tone": {"type": "enum", "labels": ["calm", "angry", "sad"]},
                                                   "urgent": {"type": "boolean"}}})
    plain = Labeler(schema, backend=backend)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": f"message {i} " * (i % 5 + 1)}) + "\n" for i in range(24)))
    label_file(plain, src, InputSpec(id_field="id"), output=tmp_path / "raw.parquet",
               errors_path=tmp_path / "e.jsonl", all_probs=True)
    raw, meta = read_predictions(tmp_path / "raw.parquet")
    rng = np.random.default_rng(0)
    gold = pd.DataFrame({"id": raw["id"], "tone": rng.choice(["calm", "angry", "sad"], len(raw)),
                         "urgent": rng.choice([True, False], len(raw))})
    calibration, _ = fit_calibration(raw, gold, schema, meta, folds=2, coverage=0.8)
    cal = calibration.save(tmp_path / "cal.json")
    for abstain in (False, True):
        labeler = Labeler(schema, backend=backend, calibration=cal, abstain_unless_single=abstain)
        out = tmp_path / f"out-{abstain}.parquet"
        label_file(labeler, src, InputSpec(id_field="id"), output=out, errors_path=tmp_path / "e.jsonl",
                   all_probs=True)
        table = pq.read_table(out).to_pandas()
        metadata = {k.decode(): v.decode() for k, v in pq.read_schema(out).metadata.items()}
        assert json.loads(metadata["pcd.label_sets"]) == {"tone": 0.8, "urgent": 0.8}
        for _, row in table.iterrows():
            probs = dict(row["tone__probs"])  # float32 in the file: the threshold is checked to 1e-6
            q, chosen = cal.fields["tone"].conformal.score_threshold, list(row["tone__set"])
            assert chosen[0] == row["tone"] or pd.isna(row["tone"])
            assert chosen == sorted(chosen, key=lambda lab: -probs[lab])
            assert all(1 - probs[lab] <= q + 1e-6 for lab in chosen[1:])
            assert all(1 - probs[lab] > q - 1e-6 for lab in probs if lab not in chosen)
            single = len(row["tone__set"]) == 1
            assert pd.isna(row["tone"]) == (abstain and not single)
        report = evaluate(read_predictions(out)[0], gold, schema)
        sets = report.field("tone").label_sets
        covered = sum(g in s for g, s in zip(gold["tone"], table["tone__set"]))
        assert sets["covered"] == covered and sets["rows"] == 24 and sets["asked"] == 0.8
        assert report.field("tone").abstained == (int(table["tone"].isna().sum()) if abstain else 0)
    with pytest.raises(CalibrationError, match="--abstain-unless-single needs label sets"):
        Labeler(schema, backend=backend, abstain_unless_single=True)


def test_abstain_below_leaves_low_probability_fields_without_a_label(tmp_path):
    from pcd_cli.engines.summary import ABSTAINED

    backend = tiny_backend(chat_template=True, seed=2)
    schema = parse_schema({"name": "s", "fields": {
        "tone": {"type": "enum", "labels": ["calm", "angry", "sad"], "abstain_below": 0.5},
        "urgent": {"type": "boolean"}}})
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": f"message {i} " * (i % 5 + 1)}) + "\n" for i in range(24)))
    plain_schema = parse_schema({"name": "s", "fields": {"tone": {"type": "enum", "labels": ["calm", "angry", "sad"]},
                                                         "urgent": {"type": "boolean"}}})
    plain = Labeler(plain_schema, backend=backend)  # the same prompt: abstain_below is not shown to the model
    decided = label_file(plain, src, InputSpec(id_field="id"), output=tmp_path / "plain.parquet",
                         errors_path=tmp_path / "e.jsonl")
    assert "tone__abstained" not in pq.read_schema(tmp_path / "plain.parquet").names
    plain = pq.read_table(tmp_path / "plain.parquet").to_pandas()
    labeler = Labeler(schema, backend=backend, abstain_below=0.9)  # urgent: 0.9 from the option; tone: its own 0.5
    assert labeler.abstain_thresholds == {"tone": 0.5, "urgent": 0.9}
    stats = label_file(labeler, src, InputSpec(id_field="id"), output=tmp_path / "o.parquet",
                       errors_path=tmp_path / "e.jsonl")
    table = pq.read_table(tmp_path / "o.parquet").to_pandas()
    for name, threshold in (("tone", 0.5), ("urgent", 0.9)):
        low = table[f"{name}__prob"] < threshold
        assert list(table[f"{name}__abstained"]) == list(low)
        assert table[name][low].isna().all() and (table[name][~low] == plain[name][~low]).all()
        assert stats.fields[schema.field_index(name)].labels[ABSTAINED] == int(low.sum())
    assert decided.records == 24 and 0 < int(table["tone__abstained"].sum() + table["urgent__abstained"].sum()) < 48
    gold = pd.DataFrame({"id": table["id"], "tone": plain["tone"], "urgent": plain["urgent"]})
    report = evaluate(read_predictions(tmp_path / "o.parquet")[0], gold, schema)
    tone = report.field("tone")
    assert tone.abstained == int(table["tone__abstained"].sum()) and tone.n == 24 - tone.abstained
    assert tone.accuracy == 1.0  # the decided rows are the plain run's labels
    with pytest.raises(Exception, match="'abstain_below' must be a probability between 0 and 1"):
        parse_schema({"fields": {"x": {"type": "boolean", "abstain_below": 1.5}}})
