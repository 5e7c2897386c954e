"""Gold values that are not labels (a new-user trial, round 8): ``pcd calibrate`` refuses, before
the model loads, a field none of whose gold values is a label (lower-cased labels once ran the
model over every row and then said "0 rows with gold labels ... lower --folds", or, with
``--readout linear``, "it has 0 rows (add gold rows...)"); where only some are not, it names those
rows by id and value and the label a value spells but for case. ``pcd eval`` says the same label.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from pcd_cli.errors import CalibrationError
from pcd_cli.quality.calibration import check_gold_labels
from pcd_cli.quality.data import FieldSpec, near_label
from pcd_cli.schema.load import load_schema

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = load_schema(ROOT / "schemas" / "airline_sentiment.yaml")


def _rows(n: int = 40) -> list[dict]:
    lines = (ROOT / "sample_data" / "airline_tweets.dev.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines][:n]


def test_near_label_is_the_one_label_spelt_but_for_case():
    spec = FieldSpec.of(SCHEMA.fields[0])
    assert near_label(" positive ", spec) == "POSITIVE" and near_label("Neutral", spec) == "NEUTRAL"
    assert near_label("POSITVE", spec) is None and near_label(3, spec) is None


def test_some_values_not_labels_are_named_by_row_and_the_rest_fit():
    rows = _rows()
    rows[1]["sentiment"], rows[4]["sentiment"], rows[6]["sentiment"] = "POSITVE", "negative", None
    (line,) = check_gold_labels(pd.DataFrame(rows), SCHEMA)
    assert line == (f"field 'sentiment': 2 of its 39 gold values are not labels and left out of its fit: "
                    f"row {rows[1]['id']!r} 'POSITVE', row {rows[4]['id']!r} 'negative' (the label is 'NEGATIVE')")
    assert check_gold_labels(pd.DataFrame(_rows()), SCHEMA) == []  # every value a label: nothing said


def test_no_value_a_label_is_refused_naming_values_counts_and_labels():
    rows = _rows()
    for r in rows:
        r["sentiment"] = r["sentiment"].lower()
    counts = pd.Series([r["sentiment"] for r in rows]).value_counts()
    with pytest.raises(CalibrationError) as caught:
        check_gold_labels(pd.DataFrame(rows), SCHEMA)
    message = str(caught.value)
    assert message.startswith("field 'sentiment': none of its 40 gold values is a label: ")
    top = counts.index[0]
    assert f"{top!r} ×{counts.iloc[0]} (the label is {top.upper()!r})" in message
    assert "its labels are NEGATIVE, NEUTRAL, POSITIVE, matched exactly" in message


@pytest.mark.parametrize("readout", ["logits", "linear"])
def test_pcd_calibrate_refuses_lower_cased_gold_before_the_model_loads(monkeypatch, tmp_path, readout):
    import pcd_cli.fitting
    from pcd_cli.cli import app

    def no_model(*_args, **_kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pcd_cli.fitting, "build_labeler", no_model)
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(r | {"sentiment": r["sentiment"].lower()}) + "\n" for r in _rows()))
    result = CliRunner().invoke(app, ["calibrate", str(gold), "-s", str(ROOT / "schemas" / "airline_sentiment.yaml"),
                                      "--readout", readout, "-o", str(tmp_path / "cal.json")])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "field 'sentiment': none of its 40 gold values is a label" in said and "add gold rows" not in said
    assert not (tmp_path / "cal.json").exists()


def test_pcd_eval_names_the_label_a_lower_cased_gold_value_spells(tmp_path):
    from ..helpers import flat, pcd, write_sentiment_output

    probs = [0.2, 0.3, 0.5]
    preds = write_sentiment_output(tmp_path / "p.parquet", [(f"r{i}", 2, probs) for i in range(4)])
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": f"r{i}", "sentiment": v}) + "\n"
                            for i, v in enumerate(["positive", "positive", "POSITVE", "POSITIVE"])))
    text = flat(pcd("eval", preds, gold).stdout)
    assert "field 'sentiment': 3 gold values are not labels: 'positive' (2; the label is 'POSITIVE'), " \
           "'POSITVE' (1)" in text


def test_pcd_calibrate_names_rows_whose_value_is_not_a_label_before_the_model_loads(monkeypatch, tmp_path):
    """The rows are said before the decoding (a user can stop and fix the file): here the model
    never loads, and the warning is out already."""
    import pcd_cli.fitting
    from pcd_cli.cli import app
    from pcd_cli.errors import ModelError

    def no_model(*_args, **_kwargs):
        raise ModelError("stopped where the model would load")

    monkeypatch.setattr(pcd_cli.fitting, "build_labeler", no_model)
    rows = _rows()
    rows[2]["sentiment"] = "Positive"
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["calibrate", str(gold), "-s", str(ROOT / "schemas" / "airline_sentiment.yaml"),
                                      "-o", str(tmp_path / "cal.json")])
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "stopped where the model would load" in said
    assert (f"warning: field 'sentiment': 1 of its 40 gold values is not a label and left out of its fit: "
            f"row {rows[2]['id']!r} 'Positive' (the label is 'POSITIVE')") in said


def test_pcd_eval_with_no_gold_value_a_label_is_an_error_not_an_empty_report(tmp_path):
    """Lower-cased gold once gave "rows evaluated 0" and exit 0: a cron job's silent failure."""
    from ..helpers import flat, pcd, write_sentiment_output

    preds = write_sentiment_output(tmp_path / "p.parquet", [(f"r{i}", 2, [0.2, 0.3, 0.5]) for i in range(4)])
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": f"r{i}", "sentiment": "positive"}) + "\n" for i in range(4)))
    result = pcd("eval", preds, gold, code=2)
    assert ("error: no matched gold value is a label of its field, so nothing can be scored: field 'sentiment': 4 "
            "are not labels: 'positive' (4; the label is 'POSITIVE') (labels are matched exactly)") \
        in flat(result.stderr + result.stdout)
    gold.write_text("".join(json.dumps({"id": f"r{i}", "sentiment": None}) + "\n" for i in range(4)))
    pcd("eval", preds, gold)  # no gold answer at all (an unreviewed export) is a report, as before
