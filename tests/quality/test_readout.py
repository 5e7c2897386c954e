"""The linear readout (issue #50): fitting, the floor, absent labels, storage, and its application
in the wave by every front-end (alone = packed = served), on the tiny model."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("sklearn")

from pcd_cli.errors import CalibrationError  # noqa: E402
from pcd_cli.quality.calibration import Calibration, FieldCalibration  # noqa: E402
from pcd_cli.quality.readout import (MIN_ROWS, Readout, candidate_layers, feature_layers,  # noqa: E402
                                     fit_readout)

from ..helpers import keyword_rows, pcd, save_tiny_model, write_jsonl  # noqa: E402


def _synthetic(n=60, k=3, d=40, seed=0, absent=()):
    """Features whose first dimensions carry the label (layers 2 and 3, the mean of layer 3 over
    the record) and noise (layer 1)."""
    rng = np.random.default_rng(seed)
    present = [c for c in range(k) if c not in absent]
    gold = np.array([present[i % len(present)] for i in range(n)])
    signal = rng.normal(size=(n, d))
    signal[np.arange(n), gold] += 4.0
    sets = {(1,): rng.normal(size=(n, d)), (2,): signal}
    sets[(1, 2)] = np.hstack([sets[(1,)], sets[(2,)]])
    sets[(-3,)] = signal + rng.normal(size=(n, d))
    model = rng.dirichlet(np.ones(k), n)
    parts = np.array_split(rng.permutation(n), 5)
    return sets, gold, model, parts


def test_candidate_layers_are_issue_50s_for_30_layers():
    assert candidate_layers(30) == ((10,), (15,), (20,), (25,), (30,), (20, 30), (20, 25, 30),
                                    (-10,), (-15,), (-20,), (-25,))  # -l: layer l's mean over the record
    assert feature_layers(30) == (-25, -20, -15, -10, 10, 15, 20, 25, 30)
    assert candidate_layers(2) == ((1,), (2,), (1, 2), (-1,), (-2,))  # a tiny model: no duplicate sets


def test_nested_fit_picks_the_informative_layer_and_scores_held_out_rows():
    sets, gold, model, parts = _synthetic()
    readout, held = fit_readout("f", ("a", "b", "c"), sets, gold, model, parts)
    assert 2 in readout.layers  # the best-ranked regression reads the informative layer
    assert len(readout.regressions) == 3 and (1,) not in [r.layers for r in readout.regressions]  # ENSEMBLE
    assert (held.argmax(axis=1) == gold).mean() > 0.9  # held-out rows, each scored by a fit without it
    assert np.allclose(held.sum(axis=1), 1)
    assert len(readout.cv["chosen"]) == 5 and all(len(c) == 3 for c in readout.cv["chosen"])
    assert readout.absent == () and readout.absent_weight == 0
    read = {1: sets[(1,)], 2: sets[(2,)], -3: sets[(-3,)]}
    probs = readout.read_probs(read, model)
    assert (probs.argmax(axis=1) == gold).mean() == 1.0
    each = [r.probs(r.features(read), model) for r in readout.regressions]  # the mean of the regressions'
    assert np.allclose(probs, np.mean(each, axis=0), atol=1e-12)


def test_the_floor_names_the_field_and_the_thin_label():
    sets, gold, model, parts = _synthetic(n=MIN_ROWS - 1)
    with pytest.raises(CalibrationError, match=r"field 'f'.*at least 20 gold rows.*has 19 rows \("):
        fit_readout("f", ("a", "b", "c"), {k: v[:19] for k, v in sets.items()}, gold[:19], model[:19],
                    np.array_split(np.arange(19), 5))
    sets, gold, model, parts = _synthetic(n=40)
    gold = gold.copy()
    gold[gold == 2] = 0
    gold[0] = 2  # one row of c
    with pytest.raises(CalibrationError, match=r"it has 40 rows, and only c \(1\) of that label \(add gold rows"):
        fit_readout("f", ("a", "b", "c"), sets, gold, model, parts)
    from pcd_cli.quality.readout import floor_problem

    many = floor_problem("f", np.array([0] * 30 + [1, 2]), ("a", "b", "c"))  # several thin labels: counted
    assert many == ("field 'f': the linear readout needs at least 20 gold rows and 2 of each label that has any; "
                    "it has 32 rows, and 2 labels have fewer than 2: b (1), c (1) (add gold rows; leave the field's "
                    "column out of the gold file to fit the other fields' readouts without it; or use --readout "
                    "logits)")


def test_an_absent_label_keeps_the_models_probability_times_the_laplace_weight():
    sets, gold, model, parts = _synthetic(n=40, absent=(1,))
    readout, held = fit_readout("f", ("a", "b", "c"), sets, gold, model, parts)
    assert readout.absent == ("b",) and readout.absent_weight == pytest.approx(1 / 42)
    probs = readout.read_probs({1: sets[(1,)], 2: sets[(2,)], -3: sets[(-3,)]}, model)
    assert np.allclose(probs[:, 1], model[:, 1] / model.sum(axis=1) / 42)  # never zero, never silently impossible
    assert (held[:, 1] > 0).all()
    # a record whose model is sure of b and whose features say nothing: b is written
    x = np.zeros((1, sets[readout.layers].shape[1]))
    flat = Readout(readout.layers, readout.labels, readout.classes, readout.mean, readout.scale,
                   np.zeros_like(readout.coef), np.zeros(2), readout.absent_weight, readout.C)
    assert flat.probs(x, np.array([[0.0, 1.0, 0.0]]))[0, 1] == pytest.approx(1 / 42)


def test_readout_round_trips_through_the_file_exactly_and_bad_entries_are_named(tmp_path):
    sets, gold, model, parts = _synthetic(k=2)
    readout, _ = fit_readout("spam", ("true", "false"), sets, gold, model, parts)
    assert readout.coef.shape[0] == 2 and not readout.coef[0].any()  # binary: two softmax rows
    cal = Calibration("x", "m", "s", "h", "marginal", {"spam": FieldCalibration(
        "spam", ("true", "false"), 1.0, (0.0, 0.0), 60, readout=readout)})
    path = tmp_path / "cal.json"
    saved = cal.save(path)
    loaded = Calibration.load(path)
    assert loaded.sha256 == saved.sha256
    again = loaded.fields["spam"].readout
    read = {1: sets[(1,)], 2: sets[(2,)], -3: sets[(-3,)]}
    assert len(again.members) == 2 and again.read_layers == readout.read_layers
    assert np.array_equal(again.read_probs(read, model), readout.read_probs(read, model))  # floats stored exactly
    doc = json.loads(path.read_text())
    old = dict(doc["fields"]["spam"]["readout"])  # a one-regression file (before members): still loads
    del old["members"]
    alone = Readout.from_dict(old, ("true", "false"), "field 'spam'")
    assert alone.members == () and np.array_equal(alone.read_probs(read, model), readout.probs(
        readout.features(read), model))
    bad = json.loads(json.dumps(doc))
    bad["fields"]["spam"]["readout"]["members"][1]["layers"] = [0]
    path.write_text(json.dumps(bad))
    with pytest.raises(CalibrationError, match=r"'members'\[1\]: 'layers'"):
        Calibration.load(path)
    doc["fields"]["spam"]["readout"]["coef"] = [[1.0, 2.0]]
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=r"field 'spam': 'readout'.*'coef'"):
        Calibration.load(path)


# --- on the tiny model: calibrate, then label with the file ----------------------------------------

TWO_FIELDS = {"name": "keyword", "instructions": "Does the message ask for a refund?",
              "fields": {"refund": {"type": "boolean", "description": "Asks for a refund"},
                         "topic": {"type": "enum", "labels": ["MONEY", "CHECK", "OTHER"], "depends_on": ["refund"],
                                   "description": "What the message is about"}}}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny model folder, the two-field schema, and a ``--readout linear`` calibration fitted
    on 40 keyword rows (``topic``'s ``OTHER`` has no gold row)."""
    from pcd_cli.fitting import calibrate_on_gold
    from pcd_cli.job import LabelJob

    root = tmp_path_factory.mktemp("readout")
    save_tiny_model(root / "tiny", seed=6)
    (root / "schema.json").write_text(json.dumps(TWO_FIELDS))
    rows = [r | {"topic": "MONEY" if r["refund"] else "CHECK"} for r in keyword_rows(40)]
    write_jsonl(root / "gold.jsonl", rows)
    job = LabelJob(model=str(root / "tiny"), id_field="id")
    run = calibrate_on_gold(root / "gold.jsonl", root / "schema.json", job, output=root / "cal.json",
                            readout="linear", folds=4)
    run.calibration.save(root / "cal.json")
    return root, run


def test_calibrate_reports_the_readout_beside_argmax_and_names_the_absent_label(fitted):
    root, run = fitted
    report = {f.field: f for f in run.report.fields}
    assert set(report) == {"refund", "topic"}
    refund = report["refund"]
    assert refund.readout is not None and refund.logits is not None
    fc = run.calibration.fields["refund"]
    assert fc.readout.cv["readout"]["accuracy"] == refund.after.accuracy  # the report's "after" is the readout's
    assert fc.readout.cv["logits"]["accuracy"] == refund.logits.accuracy != refund.after.accuracy
    assert any("topic" in n and "OTHER" in n for n in run.report.notes)  # the absent label, named
    doc = json.loads((root / "cal.json").read_text())
    entry = doc["fields"]["topic"]["readout"]
    assert entry["absent"] == ["OTHER"] and set(entry["cv"]) >= {"argmax", "logits", "readout", "chosen"}
    assert len(entry["mean"]) == len(entry["coef"][0]) == 64 * len(entry["layers"])  # the tiny model's width
    assert len(entry["members"]) == 2 and all(len(m["mean"]) == 64 * len(m["layers"]) for m in entry["members"])
    assert [c for fold in entry["cv"]["chosen"] for c in fold]  # each outer fold's three sets and strengths
    assert len(fc.readout.regressions) == 3 and fc.readout.describe().startswith("the mean of 3 regressions: ")


def test_a_readout_reading_a_layer_the_model_lacks_is_refused_by_name(fitted):
    from pcd_cli.api import Labeler

    root, run = fitted
    cal = run.calibration
    ro = cal.fields["refund"].readout
    deep = replace(ro, members=(replace(ro.members[0], layers=(-99,)), *ro.members[1:]))  # a pooled layer 99
    cal = replace(cal, fields={**cal.fields, "refund": replace(cal.fields["refund"], readout=deep)})
    with pytest.raises(CalibrationError, match=r"field 'refund': the calibration's readout reads the record-mean of "
                                               r"layer 99 \('layers' -99\), and this model has 2 layers"):
        Labeler(root / "schema.json", model=str(root / "tiny"), calibration=cal)


def test_a_records_readout_is_the_same_alone_packed_and_decided_in_the_wave(fitted):
    from pcd_cli.api import Labeler
    from pcd_cli.results import Record

    root, _ = fitted
    rows = keyword_rows(48)[40:]
    records = [Record(r["id"], r["text"]) for r in rows]
    labeler = Labeler(root / "schema.json", model=str(root / "tiny"), calibration=str(root / "cal.json"),
                      trace=True)
    plain = Labeler(root / "schema.json", backend=labeler.backend, trace=True)
    packed = labeler.label_batch(records)
    alone = [labeler.label_batch([r])[0] for r in records]
    raw = plain.label_batch(records)
    assert labeler.decoder.record_passes > 0
    worst = 0.0
    for p, a, r in zip(packed, alone, raw):
        for fp, fa in zip(p.fields, a.fields):
            assert fp.readout and fp.label == fa.label and fp.prob == fp.probs[fp.label]
            worst = max(worst, float(np.abs(np.array(fp.probs) - fa.probs).max()))
        first, model = p.fields[0], r.fields[0]  # wave 0: the same context with and without the readout
        assert first.mass == pytest.approx(model.mass, abs=1e-6)  # __mass stays the model's candidate mass
        assert np.allclose(first.raw_probs, model.probs, atol=1e-5)  # the decoder's own, kept
        assert f'"refund": {json.dumps(p.fields[0].value)}' in p.traces[1]["context"]
    assert worst < 1e-5
    meta = json.loads(labeler.metadata()["pcd.readout"])
    assert meta["refund"]["kind"] == "linear" and "readout" in meta["refund"]["cv"]
    # a readout that always answers against the model's first argmax: the topic field (depends_on)
    # sees the readout's answer line, not the model's
    forced = 1 - raw[0].fields[0].label
    cal = Calibration.load(root / "cal.json")
    ro = cal.fields["refund"].readout
    intercept = np.zeros(2)
    intercept[forced] = 30.0
    cal = replace(cal, fields={**cal.fields, "refund": replace(cal.fields["refund"], readout=replace(
        ro, coef=np.zeros_like(ro.coef), intercept=intercept, members=tuple(
            replace(m, coef=np.zeros_like(m.coef), intercept=intercept) for m in ro.members)))})
    steered = Labeler(root / "schema.json", backend=labeler.backend, calibration=cal, trace=True)
    for p, r in zip(steered.label_batch(records), raw):
        assert p.fields[0].label == forced and p.fields[0].raw_probs == pytest.approx(r.fields[0].probs, abs=1e-5)
        value = json.dumps(p.fields[0].value)
        assert f'"refund": {value}' in p.traces[1]["context"]
    assert f'"refund": {json.dumps(raw[0].fields[0].value)}' in raw[0].traces[1]["context"]  # the model's own


def test_non_finite_features_fail_the_record_by_name(fitted, monkeypatch):
    from pcd_cli.api import Labeler
    from pcd_cli.results import Record, RecordFailure

    root, _ = fitted
    labeler = Labeler(root / "schema.json", model=str(root / "tiny"), calibration=str(root / "cal.json"))
    real = labeler.backend.forward_features

    def poisoned(*args):
        lp, features = real(*args)
        features[:] = np.nan
        return lp, features

    monkeypatch.setattr(labeler.backend, "forward_features", poisoned)
    out = labeler.label_batch([Record("r7", "please refund my order")])
    assert isinstance(out[0], RecordFailure)
    assert "record 'r7'" in out[0].error and "not finite" in out[0].error
    from pcd_cli.quality.readout import regression_name
    layers = labeler.decoder.readouts["refund"].layers  # every one poisoned: named in words, record-means too
    assert f"(NaN or infinite: {regression_name(layers)}, in float32)" in out[0].error
    assert any(layer < 0 for layer in layers) and not re.search(r"-\d", out[0].error)  # no raw "-15"


def test_readout_options_refused_by_name(fitted, tmp_path):
    root, _ = fitted
    out = pcd("calibrate", str(root / "gold.jsonl"), "-s", str(root / "schema.json"), "--readout", "linear",
              "--predictions", str(root / "gold.jsonl"), "-o", str(tmp_path / "c.json"), code=2)
    assert "--readout linear and --predictions" in out.stdout + out.stderr
    thin = [json.loads(line) for line in (root / "gold.jsonl").read_text().splitlines()]
    thin = [r for r in thin if not r["refund"]] + [next(r for r in thin if r["refund"])]  # one row of true
    write_jsonl(tmp_path / "thin.jsonl", thin)
    out = pcd("calibrate", str(tmp_path / "thin.jsonl"), "-s", str(root / "schema.json"), "--readout", "linear",
              "--model", str(tmp_path / "no-such-model"), "-o", str(tmp_path / "t.json"), code=2)
    text = " ".join((out.stdout + out.stderr).split())  # refused from the gold file, before any model loads
    assert f"field 'refund': the linear readout needs at least 20 gold rows and 2 of each label that has any; it " \
           f"has {len(thin)} rows, and only true (1) of that label" in text, text
    from pcd_cli.api import Labeler

    with pytest.raises(CalibrationError, match="--permutations 6"):
        Labeler(root / "schema.json", model=str(root / "tiny"), calibration=str(root / "cal.json"), permutations=6)


def test_served_v1_label_applies_the_same_readout(fitted):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    from pcd_cli.api import Labeler
    from pcd_cli.job import LabelJob
    from pcd_cli.results import Record
    from pcd_cli.schema.load import load_schema
    from pcd_cli.server.app import AppConfig
    from pcd_cli.server.main import ServerThread
    from pcd_cli.server.service import LabelService, ModelHost

    root, _ = fitted
    schema = load_schema(root / "schema.json")
    job = LabelJob(model=str(root / "tiny"), calibration=str(root / "cal.json"))
    labeler = Labeler(schema, job)
    rows = [{"id": r["id"], "text": r["text"]} for r in keyword_rows(46)[40:]]
    alone = [labeler.label_batch([Record(r["id"], r["text"])])[0] for r in rows]
    service = LabelService(ModelHost(loaded=labeler.backend), {"kw": (schema, job)})
    with ServerThread(service, AppConfig()) as srv:
        r = httpx.post(srv.url + "/v1/label", json={"schema": "kw", "records": rows, "all_probs": True}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert "pcd.readout" in body["metadata"]
    for row, ref in zip(body["rows"], alone):
        assert row["refund"] == ref.fields[0].value and row["topic"] == ref.fields[1].value
        assert abs(row["refund__prob"] - ref.fields[0].prob) < 1e-5
        assert abs(row["refund__probs"]["true"] - ref.fields[0].probs[0]) < 1e-5


def test_calibrate_warns_of_the_temperature_bound_only_where_the_logits_write_the_labels(fitted):
    """A field with a readout: its labels are the readout's, so the logits calibration's temperature
    at its bound is no warning (pcd label leaves that line out too); without a readout it is."""
    from rich.console import Console

    from pcd_cli.quality.calibration import MAX_TEMPERATURE
    from pcd_cli.quality.render import render_calibration

    _, run = fitted
    at_bound = replace(run.report, fields=[replace(f, temperature=MAX_TEMPERATURE) for f in run.report.fields])
    shown = Console(record=True, width=200, file=io.StringIO())
    render_calibration(at_bound, shown)
    text = shown.export_text()  # (export_text clears what it returns)
    assert "linear readout" in text and "temperature is at its bound" not in text
    logits_only = replace(at_bound, fields=[replace(f, readout=None, logits=None) for f in at_bound.fields])
    shown = Console(record=True, width=200, file=io.StringIO())
    render_calibration(logits_only, shown)
    assert shown.export_text().count("temperature is at its bound") == len(at_bound.fields)
