"""``pcd calibrate --unlabelled`` (issue #50 item 5): a prior correction estimated on unlabelled
rows, stored as a calibration: biases against hand-computed values, and the file written by the
CLI loaded and applied by ``pcd label`` (tiny random model saved as a folder)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pcd_cli.api import Labeler
from pcd_cli.decoding.prior import correct
from pcd_cli.errors import CalibrationError
from pcd_cli.quality import Calibration
from pcd_cli.quality.calibration import UNLABELLED_METHOD, fit_unlabelled, fitted_for, unlabelled_biases
from pcd_cli.results import Record
from pcd_cli.schema.load import load_schema

from ..helpers import flat, pcd, save_tiny_model

SCHEMA_DOC = {"name": "u", "fields": {"tone": {"type": "enum", "labels": ["calm", "angry", "sad"]},
                                      "urgent": {"type": "boolean"}}}
TEXTS = ["where is my parcel", "this is the third time I write", "thank you so much", "refund now",
         "the app crashes on login", "nothing works", "can I change my address", "great service"]


def test_biases_are_minus_log_of_the_mean_probabilities():
    probs = np.array([[0.7, 0.2, 0.1], [0.5, 0.4, 0.1], [0.6, 0.1, 0.3]])
    # column means 0.6, 0.7/3, 0.5/3
    assert unlabelled_biases(probs) == pytest.approx([-math.log(0.6), -math.log(0.7 / 3), -math.log(0.5 / 3)])
    with pytest.raises(ValueError, match="n >= 1"):
        unlabelled_biases(np.zeros((0, 3)))


def test_unlabelled_calibration_written_by_calibrate_applies_in_label(tmp_path):
    model = tmp_path / "tiny-model"
    backend = save_tiny_model(model, seed=5)
    schema_path = tmp_path / "schema.json"
    schema_path.write_text(json.dumps(SCHEMA_DOC))
    schema = load_schema(schema_path)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    cal_path = tmp_path / "cal.json"
    result = pcd("calibrate", rows, "-s", schema_path, "--unlabelled", "--sample", "6", "-o", cal_path,
                 "--model", model, "--seed", "1")
    text = flat(result.stdout)
    assert "prior estimated on 6 of 8 rows" in text and f"wrote {cal_path}" in text
    calibration = Calibration.load(cal_path)
    # the sampled rows' raw probabilities, labelled here without any correction
    sampled = [TEXTS[i] for i in sorted(np.random.default_rng(1).choice(len(TEXTS), 6, replace=False))]
    plain = Labeler(schema, backend=backend)
    raw = list(plain.label([Record(id=str(i), text=t) for i, t in enumerate(sampled)]))
    for i, f in enumerate(schema.fields):
        mean = np.mean([r.fields[i].probs for r in raw], axis=0)
        fc = calibration.fields[f.name]
        assert fc.temperature == 1.0 and fc.n == 6 and fc.cv["method"] == UNLABELLED_METHOD
        assert np.array(fc.biases) == pytest.approx(-np.log(mean), abs=1e-5)
        assert f"{f.name}: mean predicted distribution over 6 rows" in text
    # pcd label --calibration applies it: each record's probabilities divided by the prior
    out = tmp_path / "out.parquet"
    pcd("label", rows, "-s", schema_path, "--model", model, "--calibration", cal_path, "--all-probs", "-o", out)
    table = pq.read_table(out).to_pandas()
    assert pq.read_metadata(out).metadata[b"pcd.calibration_sha256"].decode() == \
        calibration.sha256
    every = list(plain.label([Record(id=f"r{i}", text=t) for i, t in enumerate(TEXTS)]))
    for row, r in zip(table.itertuples(index=False), every):
        for i, f in enumerate(schema.fields):
            prior = np.exp(-np.array(calibration.fields[f.name].biases))
            want = correct(r.fields[i].probs, prior)
            got = dict(getattr(row, f"{f.name}__probs"))
            assert [got[label] for label in f.labels] == pytest.approx(want, abs=1e-4)
            written = int(np.argmax(want))  # the label written: the corrected argmax
            value = getattr(row, f.name)
            assert (str(value).lower() if f.is_boolean else value) == f.labels[written]
            assert getattr(row, f"{f.name}__raw_prob") == pytest.approx(r.fields[i].probs[written], abs=1e-4)
    # options that need gold labels are refused with --unlabelled
    result = pcd("calibrate", rows, "-s", schema_path, "--unlabelled", "-o", tmp_path / "c2.json", "--model", model,
                 "--coverage", "0.9", code=2)
    assert "--unlabelled with --coverage" in flat(result.stderr)
    result = pcd("calibrate", rows, "-s", schema_path, "--unlabelled", "-o", tmp_path / "c3.json", "--model", model,
                 "--readout", "linear", code=2)  # never silently a file without the readout asked for
    assert "--unlabelled with --readout linear" in flat(result.stderr) and not (tmp_path / "c3.json").exists()
    # an output already corrected is refused as input to the fit (one check for every fit:
    # check_raw_predictions), named by what corrected it
    with pytest.raises(CalibrationError, match="made with a calibration already"):
        fit_unlabelled(table, schema, {**plain.metadata(), "pcd.prior_correction": "{}"})
    raw_table = plain.label_frame(pd.DataFrame({"id": [str(i) for i in range(len(sampled))], "text": sampled}),
                                  text_field="text", id_field="id", all_probs=True)
    with pytest.raises(CalibrationError, match="made with --prior-correction"):
        fit_unlabelled(raw_table, schema, {**plain.metadata(), "pcd.prior_correction": "{}"})
    # checked on load by content like any calibration: it names the parts it was fitted for
    unlabelled = fit_unlabelled(raw_table, schema, plain.metadata())
    assert unlabelled.fitted_for and unlabelled.fitted_for == fitted_for(plain.metadata())


def test_multi_select_gets_one_prior_correction_per_option():
    import pandas as pd

    from pcd_cli.schema.load import parse_schema

    schema = parse_schema({"name": "m", "fields": {"tags": {"type": "multi", "labels": ["bug", "ui", "billing"]}}})
    p_yes = np.array([[0.9, 0.2, 0.5], [0.7, 0.4, 0.1], [0.8, 0.3, 0.3], [0.6, 0.1, 0.1]])
    frame = pd.DataFrame({"id": ["a", "b", "c", "d"], "tags": [["bug"], ["bug"], ["bug"], ["bug"]],
                          "tags__prob": [0.5] * 4, "tags__mass": [0.9] * 4,
                          "tags__probs": [list(zip(["bug", "ui", "billing"], row)) for row in p_yes]})
    meta = {"pcd.model": "m", "pcd.schema_sha256": schema.source_sha256, "pcd.prompt_head_sha256": "h",
            "pcd.scoring": "marginal"}
    calibration = fit_unlabelled(frame, schema, meta)
    assert set(calibration.fields) == {"tags.bug", "tags.ui", "tags.billing"}
    bug = calibration.fields["tags.bug"]  # mean P(yes) 0.75: biases -log 0.75, -log 0.25
    assert bug.labels == ("true", "false") and bug.n == 4
    assert bug.biases == pytest.approx((-math.log(0.75), -math.log(0.25)))
    assert calibration.fields["tags.billing"].biases == pytest.approx((-math.log(0.25), -math.log(0.75)))
    # a row at the prior becomes 50/50; one above it leans yes
    assert bug.apply(np.array([0.75, 0.25])) == pytest.approx([0.5, 0.5])
    assert bug.apply(np.array([0.9, 0.1]))[0] > 0.5
