"""The label -> eval -> calibrate -> label --calibration --examples loop, end to end on the CLI
(embedded model, a few real tweets), and the API's calibration and label_frame."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pcd_cli.api import Labeler
from pcd_cli.errors import SchemaError
from pcd_cli.quality import Calibration, FieldCalibration

from ..helpers import pcd, tiny_backend
from ..cli.test_cli import AIRLINE, DATA

DEV_ROWS = 24
HELD_OUT = 8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loop")
    dev = tmp / "dev.jsonl"
    dev.write_text("".join((DATA / "airline_tweets.dev.jsonl").read_text().splitlines(True)[:DEV_ROWS]))
    held = tmp / "held.jsonl"
    held.write_text("".join((DATA / "airline_tweets.jsonl").read_text().splitlines(True)[:HELD_OUT]))
    return tmp, dev, held


def test_calibrate_with_examples_then_label_with_both(files):
    tmp, dev, held = files
    cal = tmp / "cal.json"
    pcd("calibrate", dev, "-s", AIRLINE, "--examples", dev, "--shots", 3, "--folds", 3, "-o", cal)
    saved = json.loads(cal.read_text())
    assert set(saved["fields"]) == {"sentiment"}
    out = tmp / "calibrated.parquet"
    pcd("label", held, "-s", AIRLINE, "--id-field", "id", "--all-probs", "--examples", dev, "--shots", 3,
        "--calibration", cal, "-o", out, "-q")
    table = pq.read_table(out)
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert meta["pcd.calibration_sha256"] == hashlib.sha256(cal.read_bytes()).hexdigest()
    assert meta["pcd.examples"] == "3"
    assert meta["pcd.prompt_head_sha256"] == saved["prompt_head_sha256"]
    frame = table.to_pandas()
    assert len(frame) == HELD_OUT
    field = Calibration.load(cal).fields["sentiment"]
    for _, row in frame.iterrows():
        probs = dict(row["sentiment__probs"])
        assert row["sentiment"] == max(probs, key=probs.get)  # the label is the calibrated argmax
        assert row["sentiment__prob"] == pytest.approx(probs[row["sentiment"]], abs=1e-6)
        assert 0 < row["sentiment__raw_prob"] <= 1
    # the uncalibrated run with the same examples gives the raw probabilities that calibration maps
    raw = tmp / "raw.parquet"
    pcd("label", held, "-s", AIRLINE, "--id-field", "id", "--all-probs", "--examples", dev, "--shots", 3, "-o", raw, "-q")
    raw_frame = pq.read_table(raw).to_pandas()
    labels = ("NEGATIVE", "NEUTRAL", "POSITIVE")
    raw_probs = np.array([[dict(p)[lab] for lab in labels] for p in raw_frame["sentiment__probs"]], dtype=np.float64)
    expected = field.apply(raw_probs)
    got = np.array([[dict(p)[lab] for lab in labels] for p in frame["sentiment__probs"]])
    assert np.abs(got - expected).max() < 1e-5
    chosen = [labels.index(v) for v in frame["sentiment"]]
    assert np.abs(frame["sentiment__raw_prob"].to_numpy() - raw_probs[np.arange(HELD_OUT), chosen]).max() < 1e-5
    result = pcd("eval", out, held, "--compare", raw)
    assert "raw.parquet -> calibrated.parquet" in result.stdout
    # McNemar's paired test on the same rows, counted here by hand
    gold = {r["id"]: r["sentiment"] for r in map(json.loads, held.read_text().splitlines())}
    right_raw = raw_frame["sentiment"].to_numpy() == raw_frame["id"].map(gold).to_numpy()
    right_cal = frame["sentiment"].to_numpy() == frame["id"].map(gold).to_numpy()
    only_raw, only_cal = int(np.sum(right_raw & ~right_cal)), int(np.sum(~right_raw & right_cal))
    text = " ".join(result.stdout.split())
    assert f"{only_raw} / {only_cal}" in text and "McNemar p" in text


def test_a_calibration_for_another_head_is_refused_before_any_row(files):
    tmp, dev, held = files
    cal = tmp / "cal.json"
    if not cal.exists():
        pytest.skip("needs the calibration of the test above")
    result = pcd("label", held, "-s", AIRLINE, "--id-field", "id", "--calibration", cal, "-o", tmp / "x.parquet",
                 code=2)
    assert "fitted on another prompt" in result.stderr and "refit" in result.stderr
    assert not (tmp / "x.parquet").exists()


def test_calibrate_refuses_examples_with_predictions(files):
    tmp, dev, _ = files
    result = pcd("calibrate", dev, "-s", AIRLINE, "--predictions", tmp / "none.parquet", "--examples", dev,
                 "-o", tmp / "c.json", code=2)
    assert "--examples and --predictions" in result.stderr


def _calibration_for(labeler: Labeler, temperature: float, biases: tuple[float, ...]) -> Calibration:
    meta = labeler.metadata()
    field = labeler.schema.fields[0]
    return Calibration(pcd_version="test", model=meta["pcd.model"], schema_sha256=meta["pcd.schema_sha256"],
                       prompt_head_sha256=meta["pcd.prompt_head_sha256"], scoring=meta["pcd.scoring"],
                       fields={field.name: FieldCalibration(field=field.name, labels=field.labels,
                                                            temperature=temperature, biases=biases, n=10, cv={})},
                       sha256="0" * 64)


def test_labeler_applies_a_calibration_and_label_frame_matches_the_parquet_columns():
    backend = tiny_backend(seed=7)
    plain = Labeler(AIRLINE, backend=backend)
    texts = pd.DataFrame({"id": ["a", "b", "c"], "text": ["Great crew!", "Lost my bag again.", None]})
    raw = plain.label_frame(texts, id_field="id")
    assert list(raw.columns) == ["id", "sentiment", "sentiment__prob", "sentiment__mass", "sentiment__probs",
                                 "sentiment__steered", "__truncated"]
    assert raw.attrs["errors"] == [{"row": 2, "record": "c", "error": "row 2: text field 'text' is missing or null"}]
    cal = _calibration_for(plain, 2.0, (0.0, 3.0, -1.0))  # pushes everything towards NEUTRAL
    calibrated = Labeler(AIRLINE, backend=backend, calibration=cal).label_frame(texts, id_field="id")
    assert list(calibrated.columns) == ["id", "sentiment", "sentiment__prob", "sentiment__mass", "sentiment__raw_prob",
                                        "sentiment__probs", "sentiment__steered", "__truncated"]
    assert calibrated.attrs["metadata"]["pcd.calibration_sha256"] == "0" * 64
    for (_, r), (_, c) in zip(raw.iterrows(), calibrated.iterrows()):
        p = np.array([dict(r["sentiment__probs"])[lab] for lab in ("NEGATIVE", "NEUTRAL", "POSITIVE")], dtype=np.float64)
        z = np.log(p) / 2.0 + np.array([0.0, 3.0, -1.0])
        expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        assert c["sentiment"] == ("NEGATIVE", "NEUTRAL", "POSITIVE")[int(expected.argmax())]
        assert c["sentiment__prob"] == pytest.approx(expected.max(), abs=1e-6)
        assert c["sentiment__mass"] == r["sentiment__mass"]
        assert c["sentiment__raw_prob"] == pytest.approx(p[int(expected.argmax())], abs=1e-6)


def test_labeler_refuses_a_calibration_for_another_scoring_mode():
    backend = tiny_backend(seed=7)
    cal = _calibration_for(Labeler(AIRLINE, backend=backend), 1.0, (0.0, 0.0, 0.0))
    with pytest.raises(SchemaError, match="scoring"):
        Labeler(AIRLINE, backend=backend, scoring="exact", calibration=cal)
