"""``pcd review``: the rows to check, most uncertain first, as Label Studio tasks, an Argilla
dataset or a spreadsheet, each checked with the tool's own SDK classes; the human answers read
back as gold by ``pcd eval``, ``pcd calibrate`` and ``--examples``. No model is loaded."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcd_cli.errors import InputError, MissingExtra
from pcd_cli.decoding.examples import draw_examples
from pcd_cli.io.readers import InputSpec
from pcd_cli.io.output import output_schema
from pcd_cli.quality import read_gold
from pcd_cli.quality.review import (check_label_studio, config_path, label_studio_config, label_studio_tasks,
                                    select_for_review, write_review)
from pcd_cli.schema.load import load_schema

from .. import helpers
from ..helpers import flat

ROOT = Path(__file__).resolve().parents[2]
SENTIMENT = ("NEGATIVE", "NEUTRAL", "POSITIVE")
SCHEMA_YAML = """name: review_test
fields:
  sentiment:
    type: enum
    description: the sentiment
    labels: [NEGATIVE, NEUTRAL, POSITIVE]
  urgent:
    type: boolean
    description: whether it is urgent
"""
N = 40


def pcd(*args, code: int = 0):
    return helpers.pcd(*args, code=code, env={"COLUMNS": "200"})


class Case:
    """A hand-made pcd output of ``N`` records, the input they came from, and their human labels."""

    def __init__(self, root: Path, *, sets: bool = True, id_column: str = "id"):
        rng = np.random.default_rng(7)
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.schema_path = root / "schema.yaml"
        self.schema_path.write_text(SCHEMA_YAML)
        self.schema = load_schema(self.schema_path)
        self.ids = [f"r{i}" for i in range(N)]
        dist = rng.dirichlet([1.0, 1.0, 1.0], size=N)
        self.pred = [SENTIMENT[j] for j in dist.argmax(1)]
        self.prob = dist.max(1)
        self.urgent = [bool(x) for x in rng.random(N) < 0.5]
        self.urgent_prob = 0.5 + 0.5 * rng.random(N)
        # the humans: right on 3 of 4 sentiment rows, on 4 of 5 urgent rows
        self.gold = [p if i % 4 else SENTIMENT[(SENTIMENT.index(p) + 1) % 3] for i, p in enumerate(self.pred)]
        self.gold_urgent = [u if i % 5 else not u for i, u in enumerate(self.urgent)]
        sets_col = [[self.pred[i]] + ([SENTIMENT[(SENTIMENT.index(self.pred[i]) + 1) % 3]] if self.prob[i] < 0.5 else [])
                    for i in range(N)]
        arrow = output_schema(self.schema, id_column, pa.string(), all_probs=True, sets=("sentiment",) if sets else ())
        arrow = arrow.with_metadata({
            "pcd.version": "0.1.0", "pcd.model": "fake-model", "pcd.schema_sha256": self.schema.source_sha256,
            "pcd.prompt_head_sha256": "h" * 64, "pcd.scoring": "marginal",
            "pcd.schema_json": json.dumps({f.name: list(f.labels) for f in self.schema.fields})})
        cols = {id_column: self.ids if id_column != "row" else list(range(N)),
                "sentiment": self.pred, "sentiment__prob": self.prob, "sentiment__mass": np.full(N, 0.9),
                "sentiment__probs": [list(zip(SENTIMENT, row)) for row in dist],
                "urgent": self.urgent, "urgent__prob": self.urgent_prob, "urgent__mass": np.full(N, 0.8),
                "urgent__probs": [[("true", p if u else 1 - p), ("false", 1 - p if u else p)]
                                  for u, p in zip(self.urgent, self.urgent_prob)],
                "__truncated": [False] * N}
        if sets:
            cols["sentiment__set"] = sets_col
        if id_column == "row":
            arrow = arrow.set(0, pa.field("row", pa.int64()))
        self.output = root / "out.parquet"
        pq.write_table(pa.Table.from_pydict({n: cols[n] for n in arrow.names}, schema=arrow), self.output)
        self.input = root / "in.jsonl"
        with self.input.open("w") as fh:
            for i in range(N):
                fh.write(json.dumps({"id": self.ids[i], "text": f"record number {i}", "sentiment": self.gold[i],
                                     "urgent": self.gold_urgent[i]}) + "\n")
        # the review score, computed here by hand: the lower of the two chosen-label probabilities
        self.score = [min(float(np.float32(a)), float(np.float32(b))) for a, b in zip(self.prob, self.urgent_prob)]

    def order(self) -> list[str]:
        return [self.ids[i] for i in sorted(range(N), key=lambda i: (self.score[i], i))]

    def accuracy(self, ids, field: str) -> float:
        index = {rid: i for i, rid in enumerate(self.ids)}
        if field == "sentiment":
            hits = [self.pred[index[r]] == self.gold[index[r]] for r in ids]
        else:
            hits = [self.urgent[index[r]] == self.gold_urgent[index[r]] for r in ids]
        return sum(hits) / len(hits)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return Case(tmp_path_factory.mktemp("review"))


def eval_accuracy(output: Path, gold: Path, tmp: Path, *extra) -> dict[str, float]:
    pcd("eval", output, gold, "--json", tmp / "eval.json", *extra)
    report = json.loads((tmp / "eval.json").read_text())
    return {name: f["accuracy"] for name, f in report["fields"].items()}


# -- choosing the rows ----------------------------------------------------------------------------

def test_rows_come_most_uncertain_first_with_their_text_and_labels(case):
    selection = select_for_review(case.output, case.input)
    assert [r.id for r in selection.rows] == case.order()
    assert selection.total == N and selection.model == "fake-model" and selection.set_fields == ("sentiment",)
    first = selection.rows[0]
    i = case.ids.index(first.id)
    assert first.text == f"record number {i}"
    assert first.score == pytest.approx(case.score[i], abs=1e-6)
    assert first.labels == {"sentiment": case.pred[i], "urgent": "true" if case.urgent[i] else "false"}
    assert set(first.distributions["sentiment"]) == set(SENTIMENT)
    assert sum(first.distributions["sentiment"].values()) == pytest.approx(1, abs=1e-5)


def test_each_filter(case):
    below = select_for_review(case.output, case.input, below=0.6)
    expect = [r for r in case.order() if min(case.prob[case.ids.index(r)], case.urgent_prob[case.ids.index(r)]) < 0.6]
    assert [r.id for r in below.rows] == expect and 0 < len(expect) < N
    sets = select_for_review(case.output, case.input, sets=True)
    assert [r.id for r in sets.rows] == [r for r in case.order() if case.prob[case.ids.index(r)] < 0.5]
    assert all(len(r.sets["sentiment"]) == 2 for r in sets.rows)
    assert [r.id for r in select_for_review(case.output, case.input, top=5).rows] == case.order()[:5]
    both = select_for_review(case.output, case.input, below=0.6, top=3)
    assert [r.id for r in both.rows] == expect[:3]
    sample = [r.id for r in select_for_review(case.output, case.input, sample=10, seed=3).rows]
    assert len(set(sample)) == 10 and sample == [r for r in case.order() if r in sample]  # still ordered
    assert sample == [r.id for r in select_for_review(case.output, case.input, sample=10, seed=3).rows]
    assert sample != [r.id for r in select_for_review(case.output, case.input, sample=10, seed=4).rows]
    assert sample != case.order()[:10]


def test_an_output_labelled_without_id_field_matches_input_rows_by_position(tmp_path):
    rows = Case(tmp_path, sets=False, id_column="row")
    selection = select_for_review(rows.output, rows.input)
    assert selection.id_column == "row"
    assert [r.id for r in selection.rows] == [int(r[1:]) for r in rows.order()]
    assert all(r.text == f"record number {r.id}" for r in selection.rows)
    tasks = label_studio_tasks(selection)
    assert tasks[0]["data"] == {"text": selection.rows[0].text, "row": selection.rows[0].id}


# -- Label Studio ---------------------------------------------------------------------------------

def test_label_studio_files_pass_the_sdk_own_checks(case, tmp_path):
    from label_studio_sdk.label_interface import LabelInterface

    out = tmp_path / "review.json"
    result = pcd("review", case.output, case.input, "--to", "label-studio", "-o", out, "--top", 10)
    assert flat(result.stdout).startswith(f"wrote 10 of {N} rows, most uncertain first, to {out} and "
                                          f"{tmp_path / 'review.label_config.xml'} (checked with label-studio-sdk")
    tasks = json.loads(out.read_text())
    config = config_path(out).read_text()
    interface = LabelInterface(config)
    interface.validate()  # raises on a bad config
    assert sorted(c.name for c in interface.controls) == ["sentiment", "urgent"]
    assert [t["data"]["id"] for t in tasks] == case.order()[:10]
    for task in tasks:
        (prediction,) = task["predictions"]
        assert interface.validate_prediction(prediction, return_errors=True) == []
        assert prediction["model_version"] == "fake-model"
        by_field = {r["from_name"]: r for r in prediction["result"]}
        i = case.ids.index(task["data"]["id"])
        assert by_field["sentiment"]["value"] == {"choices": [case.pred[i]]}
        assert by_field["urgent"]["value"] == {"choices": ["true" if case.urgent[i] else "false"]}
        assert prediction["score"] == pytest.approx(min(r["score"] for r in prediction["result"]))
    # and the check bites: a label the config does not offer
    bad = json.loads(json.dumps(tasks))
    bad[3]["predictions"][0]["result"][0]["value"]["choices"] = ["ANGRY"]
    with pytest.raises(RuntimeError, match="task 3: the prediction does not pass label-studio-sdk"):
        check_label_studio(config, bad)


def _load_script():
    spec = importlib.util.spec_from_file_location("simulate_annotators", ROOT / "scripts" / "simulate_annotators.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_label_studio_export_is_read_back_as_gold(case, tmp_path):
    from label_studio_sdk.converter import Converter
    from label_studio_sdk.label_interface import LabelInterface

    out = tmp_path / "review.json"
    pcd("review", case.output, case.input, "--to", "label-studio", "-o", out, "--below", 0.7)
    export = tmp_path / "export.json"
    assert _load_script().main([str(out), str(case.input), "-o", str(export)]) == 0
    tasks = json.loads(export.read_text())
    reviewed = [t["data"]["id"] for t in tasks]
    # a later annotation that was cancelled, and a ground-truth one among older ones: neither
    # the cancelled one nor the latest non-ground-truth one is read
    first = tasks[0]["annotations"][0]
    wrong = [dict(r, value={"choices": ["POSITIVE" if r["value"]["choices"][0] != "POSITIVE" else "NEGATIVE"]})
             if r["from_name"] == "sentiment" else r for r in first["result"]]
    tasks[0]["annotations"].append(dict(first, id=900, result=wrong, was_cancelled=True,
                                        updated_at="2030-01-01T00:00:00Z"))
    tasks[1]["annotations"] = [dict(tasks[1]["annotations"][0], ground_truth=True),
                               dict(tasks[1]["annotations"][0], id=901, result=[], updated_at="2030-01-01T00:00:00Z")]
    export.write_text(json.dumps(tasks))
    interface = LabelInterface(config_path(out).read_text())
    assert all(interface.validate_annotation(a) for t in tasks for a in t["annotations"] if a["result"])
    # Label Studio's own converter reads the export as an export
    converted = {item["input"]["id"]: item["output"]["sentiment"][0]["choices"][0]
                 for item in Converter(config=config_path(out).read_text(), project_dir=None)
                 .iter_from_json_file(str(export)) if item["output"]}
    gold = read_gold(export)
    assert list(gold["id"]) == reviewed and list(gold["text"]) == [f"record number {int(r[1:])}" for r in reviewed]
    want = {r: case.gold[case.ids.index(r)] for r in reviewed}
    assert dict(zip(gold["id"], gold["sentiment"])) == want
    assert {k: v for k, v in converted.items() if k not in reviewed[:2]} == \
        {k: v for k, v in want.items() if k not in reviewed[:2]}
    assert set(gold["urgent"]) <= {"true", "false"}
    accuracy = eval_accuracy(case.output, export, tmp_path)
    assert accuracy == {"sentiment": pytest.approx(case.accuracy(reviewed, "sentiment")),
                        "urgent": pytest.approx(case.accuracy(reviewed, "urgent"))}


def test_calibrate_and_examples_read_the_export(tmp_path):
    plain = Case(tmp_path / "plain", sets=False)
    out = tmp_path / "review.json"
    pcd("review", plain.output, plain.input, "--to", "label-studio", "-o", out)
    export = tmp_path / "export.json"
    _load_script().main([str(out), str(plain.input), "-o", str(export)])
    calibration = tmp_path / "calibration.json"
    result = pcd("calibrate", export, "-s", plain.schema_path, "--predictions", plain.output, "--coverage", 0.9,
                 "-o", calibration)
    assert f"wrote {calibration}" in flat(result.stdout)
    saved = json.loads(calibration.read_text())
    assert set(saved["fields"]) == {"sentiment", "urgent"}
    assert saved["fields"]["sentiment"]["conformal"]["coverage"] == 0.9
    examples = draw_examples(export, plain.schema, InputSpec(), shots=3)
    assert len(examples) == 3
    for example in examples:
        i = int(example.text.split()[-1])
        assert plain.schema.fields[0].labels[example.labels[0]] == plain.gold[i]
        assert example.labels[1] == plain.schema.fields[1].labels.index("true" if plain.gold_urgent[i] else "false")


# -- Argilla --------------------------------------------------------------------------------------

def test_argilla_dataset_is_built_by_the_sdk_and_its_export_read_back(case, tmp_path):
    from argilla._models import DatasetModel
    from argilla.records._io import GenericIO, JsonIO

    from pcd_cli.quality.review import offline_argilla

    folder = tmp_path / "review.argilla"
    result = pcd("review", case.output, case.input, "--to", "argilla", "-o", folder, "--top", 12)
    assert flat(result.stdout) == f"wrote 12 of {N} rows, most uncertain first, to {folder} (checked with argilla " \
                                  f"{__import__('argilla').__version__})"
    with offline_argilla() as (rg, _):
        settings = rg.Settings.from_json(folder / ".argilla" / "settings.json")
        assert [q.name for q in settings.questions] == ["sentiment", "urgent"]
        assert [list(q.labels) for q in settings.questions] == [list(SENTIMENT), ["true", "false"]]
        assert [f.name for f in settings.fields] == ["text"]
        assert DatasetModel(**json.loads((folder / ".argilla" / "dataset.json").read_text())).name == "review-argilla"
        records = JsonIO._records_from_json(folder / "records.json")  # what Dataset.from_disk logs
        assert [r.id for r in records] == case.order()[:12]
        first = records[0]
        i = case.ids.index(first.id)
        assert first.suggestions["sentiment"].value == case.pred[i]
        assert first.suggestions["sentiment"].score == pytest.approx(float(np.float32(case.prob[i])), abs=1e-6)
        assert first.suggestions["sentiment"].agent == "fake-model"
        assert set(first.metadata["sentiment__probs"]) == set(SENTIMENT)
        assert first.metadata["pcd_score"] == pytest.approx(case.score[i], abs=1e-6)
        # the annotators: two agree on each record; on record 0 a third disagrees (majority
        # wins); on record 1 they tie on urgent (no gold for it)
        users = ["00000000-0000-0000-0000-00000000000%d" % k for k in (1, 2, 3)]
        for n, record in enumerate(records):
            j = case.ids.index(record.id)
            for user in users[:2]:
                record.responses.add(rg.Response("sentiment", case.gold[j], user_id=user, status="submitted"))
                tie = n == 1 and user == users[1]
                urgent = ("false" if case.gold_urgent[j] else "true") if tie else \
                    ("true" if case.gold_urgent[j] else "false")
                record.responses.add(rg.Response("urgent", urgent, user_id=user, status="submitted"))
            if n == 0:
                record.responses.add(rg.Response("sentiment", "NEUTRAL" if case.gold[j] != "NEUTRAL" else "NEGATIVE",
                                                 user_id=users[2], status="submitted"))
        export = JsonIO.to_json(records, tmp_path / "records.json")  # dataset.records.to_json(PATH)
        flattened = tmp_path / "flat.json"
        flattened.write_text(json.dumps(GenericIO.to_list(records, flatten=True)))
    reviewed = case.order()[:12]
    nested, flat_gold = read_gold(export), read_gold(flattened)
    want = [case.gold[case.ids.index(r)] for r in reviewed]
    assert list(nested["id"]) == reviewed and list(nested["sentiment"]) == want
    assert list(flat_gold["id"]) == reviewed and list(flat_gold["sentiment"]) == want
    assert nested["urgent"].isna().tolist() == [n == 1 for n in range(12)]
    assert list(nested["text"]) == [f"record number {int(r[1:])}" for r in reviewed]
    # dataset.to_disk(FOLDER) writes records.json into the folder: the folder reads as the file
    disk = tmp_path / "disk"
    (disk / ".argilla").mkdir(parents=True)
    (disk / "records.json").write_bytes(export.read_bytes())
    accuracy = eval_accuracy(case.output, disk, tmp_path)
    urgent_rows = [r for n, r in enumerate(reviewed) if n != 1]
    assert accuracy == {"sentiment": pytest.approx(case.accuracy(reviewed, "sentiment")),
                        "urgent": pytest.approx(case.accuracy(urgent_rows, "urgent"))}


# -- the spreadsheet ------------------------------------------------------------------------------

def test_the_filled_spreadsheet_is_read_back_as_gold(case, tmp_path):
    sheet = tmp_path / "review.csv"
    result = pcd("review", case.output, case.input, "--to", "csv", "-o", sheet, "--sets")
    assert flat(result.stdout).startswith("wrote ") and flat(result.stdout).endswith(f"to {sheet}")
    with sheet.open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["id", "text", "sentiment", "sentiment__prob", "sentiment__set", "sentiment__gold",
                             "urgent", "urgent__prob", "urgent__gold"]
    assert all(r["sentiment__gold"] == "" and "|" in r["sentiment__set"] for r in rows)
    for n, row in enumerate(rows):  # a person fills the gold columns, leaving the last row's urgent empty
        i = case.ids.index(row["id"])
        row["sentiment__gold"] = case.gold[i]
        row["urgent__gold"] = "" if n == len(rows) - 1 else ("TRUE" if case.gold_urgent[i] else "False")
    with sheet.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    ids = [r["id"] for r in rows]
    accuracy = eval_accuracy(case.output, sheet, tmp_path)
    assert accuracy == {"sentiment": pytest.approx(case.accuracy(ids, "sentiment")),
                        "urgent": pytest.approx(case.accuracy(ids[:-1], "urgent"))}


# -- errors ---------------------------------------------------------------------------------------

def test_sets_needs_label_sets(tmp_path):
    plain = Case(tmp_path, sets=False)
    result = pcd("review", plain.output, plain.input, "--to", "csv", "-o", tmp_path / "x.csv", "--sets", code=2)
    assert "--sets:" in result.stderr and "has no <field>__set column" in flat(result.stderr)
    assert not (tmp_path / "x.csv").exists()


def test_bad_exports_are_named(case, tmp_path):
    out = tmp_path / "review.json"
    pcd("review", case.output, case.input, "--to", "label-studio", "-o", out, "--top", 3)
    result = pcd("eval", case.output, out, code=2)  # the tasks themselves, not annotated
    assert "Label Studio tasks without annotations" in flat(result.stderr)
    tasks = json.loads(out.read_text())
    for task in tasks:
        task["annotations"] = []
    tasks[2]["annotations"] = [{"result": [{"from_name": "sentiment", "to_name": "text", "type": "choices",
                                            "value": {"choices": ["NEGATIVE", "NEUTRAL"]}}]}]
    out.write_text(json.dumps(tasks))
    assert read_gold(out)["sentiment"].tolist()[2] == ["NEGATIVE", "NEUTRAL"]
    result = pcd("eval", case.output, out, code=2)  # two choices on a one-label field: not a label, said so
    assert "field 'sentiment': 1 are not labels: \"['NEGATIVE', 'NEUTRAL']\" (1)" in flat(result.stderr)
    tasks[0]["annotations"] = [{"result": [{"from_name": "sentiment", "to_name": "text", "type": "choices",
                                            "value": {"choices": ["NEGATIVE"]}}]}]
    out.write_text(json.dumps(tasks))
    result = pcd("eval", case.output, out)  # one row scored beside it: a report, and the value named
    assert "1 gold values are not labels" in flat(result.stderr + result.stdout)
    tasks[1]["data"] = "text"
    out.write_text(json.dumps(tasks))
    with pytest.raises(InputError, match="task 1: no 'data' object"):
        read_gold(out)
    json_min = tmp_path / "min.json"
    json_min.write_text(json.dumps([{"id": 5, "text": "x", "sentiment": "NEGATIVE", "annotator": 1,
                                     "annotation_id": 3, "lead_time": 2.0}]))
    with pytest.raises(InputError, match="JSON-MIN export, whose 'id' is Label Studio's own task id"):
        read_gold(json_min)
    no_id = tmp_path / "no_id.json"
    no_id.write_text(json.dumps([{"id": 1, "data": {"text": "x"}, "annotations": []}]))
    result = pcd("eval", case.output, no_id, code=2)
    assert "the data have no id 'id'" in flat(result.stderr)
    with pytest.raises(InputError, match="is a folder without records.json"):
        read_gold(tmp_path)
    unanswered = tmp_path / "unanswered.argilla"
    pcd("review", case.output, case.input, "--to", "argilla", "-o", unanswered, "--top", 2)
    result = pcd("eval", case.output, unanswered, code=2)
    assert "Argilla records without responses" in flat(result.stderr)
    broken = tmp_path / "broken.json"
    broken.write_text("[{\"data\": ")
    with pytest.raises(InputError, match="not a JSON file"):
        read_gold(broken)


def test_another_input_is_refused(case, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "zzz", "text": "other"}) + "\n")
    result = pcd("review", case.output, other, "--to", "csv", "-o", tmp_path / "x.csv", code=2)
    assert f"{N} of the {N} rows to review have no record in" in flat(result.stderr)


def test_without_the_sdks_the_files_are_written_unchecked(case, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "label_studio_sdk", None)
    monkeypatch.setitem(sys.modules, "label_studio_sdk.label_interface", None)
    selection = select_for_review(case.output, case.input, top=2)
    written, checked = write_review(selection, "label-studio", tmp_path / "r.json")
    assert checked is None and all(p.is_file() for p in written)
    assert json.loads((tmp_path / "r.json").read_text()) == label_studio_tasks(selection)
    assert config_path(tmp_path / "r.json").read_text() == label_studio_config(selection.fields)
    result = pcd("review", case.output, case.input, "--to", "label-studio", "-o", tmp_path / "s.json")
    assert "(not checked: pip install 'pcd-cli[review]')" in flat(result.stdout)
    result = pcd("review", case.output, case.input, "--to", "label-studio", "-o", tmp_path / "t.json", "--check",
                 code=3)
    assert "needs label-studio-sdk: pip install 'pcd-cli[review]'" in flat(result.stderr)
    with pytest.raises(MissingExtra):
        write_review(selection, "label-studio", tmp_path / "u.json", check=True)
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "u.json").exists()


# -- multi-select, nullable and integer fields ------------------------------------------------------

TYPED = """name: typed
fields:
  tags: {type: multi, description: the topics, labels: [outage, billing, security]}
  product: {type: enum, description: the product, labels: [API, DASHBOARD], nullable: true}
  urgency: {type: integer, description: how urgent, minimum: 1, maximum: 3}
"""


def test_multi_nullable_and_integer_fields_go_round(tmp_path):
    from label_studio_sdk.label_interface import LabelInterface

    from pcd_cli.schema.model import schema_metadata

    (tmp_path / "typed.yaml").write_text(TYPED)
    schema = load_schema(tmp_path / "typed.yaml")
    arrow = output_schema(schema, "id", pa.string(), all_probs=True, abstain=("product",))
    arrow = arrow.with_metadata({"pcd.model": "fake-model", **schema_metadata(schema)})
    opts = ("outage", "billing", "security")
    rows = [  # id, tags, tags prob, product, abstained, urgency, its prob
        ("t0", ["outage", "billing"], 0.4, "API", False, 2, 0.9),
        ("t1", [], 0.8, None, False, 3, 0.7),  # no option; the null option
        ("t2", ["security"], 0.6, None, True, 1, 0.3),  # abstained on product
    ]
    cols = {n: [] for n in arrow.names}
    for rid, tags, tp, product, abstained, urgency, up in rows:
        cols["id"].append(rid)
        cols["tags"].append(tags), cols["tags__prob"].append(tp), cols["tags__mass"].append(0.9)
        cols["tags__probs"].append([(o, 0.9 if o in tags else 0.1) for o in opts])
        cols["product"].append(product), cols["product__prob"].append(0.5), cols["product__mass"].append(0.9)
        cols["product__probs"].append([("API", 0.5), ("DASHBOARD", 0.3), ("null", 0.2)])
        cols["product__abstained"].append(abstained)
        cols["urgency"].append(urgency), cols["urgency__prob"].append(up), cols["urgency__mass"].append(0.9)
        cols["urgency__probs"].append([("1", 0.1), ("2", 0.2), ("3", 0.7)]), cols["urgency__expected"].append(2.6)
        cols["__truncated"].append(False)
    output = tmp_path / "typed.parquet"
    pq.write_table(pa.Table.from_pydict(cols, schema=arrow), output)
    source = tmp_path / "typed.jsonl"
    source.write_text("".join(json.dumps({"id": r[0], "text": f"ticket {r[0]}"}) + "\n" for r in rows))

    selection = select_for_review(output, source)
    assert [r.id for r in selection.rows] == ["t2", "t0", "t1"]
    assert [r.labels for r in selection.rows] == [
        {"tags": ["security"], "product": None, "urgency": "1"},
        {"tags": ["outage", "billing"], "product": "API", "urgency": "2"},
        {"tags": [], "product": "null", "urgency": "3"}]
    out = tmp_path / "typed.json"
    written, checked = write_review(selection, "label-studio", out)
    assert checked.startswith("label-studio-sdk")
    config = config_path(out).read_text()
    assert '<Choices name="tags" toName="text" choice="multiple"' in config and '<Choice value="null"/>' in config
    interface = LabelInterface(config)
    tasks = json.loads(out.read_text())
    assert all(interface.validate_prediction(t["predictions"][0], return_errors=True) == [] for t in tasks)
    assert [r["from_name"] for r in tasks[0]["predictions"][0]["result"]] == ["tags", "urgency"]  # abstained
    assert write_review(selection, "argilla", tmp_path / "typed.argilla")[1].startswith("argilla")
    settings = json.loads((tmp_path / "typed.argilla" / ".argilla" / "settings.json").read_text())
    assert [q["type"] for q in settings["questions"]] == ["multi_label_selection", "label_selection", "label_selection"]

    # the people: t2 gets two topics and the null product; t0 no topic; t1 as suggested
    answers = {"t2": {"tags": ["outage", "security"], "product": ["null"], "urgency": ["1"]},
               "t0": {"tags": [], "product": ["DASHBOARD"], "urgency": ["3"]},
               "t1": {"tags": [], "product": ["null"], "urgency": ["3"]}}
    for number, task in enumerate(tasks, start=1):
        task["id"] = number
        task["annotations"] = [{"id": number, "result": [
            {"from_name": f, "to_name": "text", "type": "choices", "value": {"choices": v}}
            for f, v in answers[task["data"]["id"]].items()], "was_cancelled": False}]
        assert interface.validate_annotation(task["annotations"][0])
    export = tmp_path / "typed.export.json"
    export.write_text(json.dumps(tasks))
    gold = read_gold(export).set_index("id")
    assert gold.loc["t2", "tags"] == ["outage", "security"] and gold.loc["t0", "tags"] == []
    assert gold.loc["t2", "product"] == "null" and gold.loc["t0", "urgency"] == "3"
    pcd("eval", output, export, "--json", tmp_path / "eval.json")
    report = json.loads((tmp_path / "eval.json").read_text())
    fields = report["fields"]
    assert fields["product"]["accuracy"] == pytest.approx(1 / 2)  # t0 wrong, t1 right (t2 abstained)
    assert fields["urgency"]["accuracy"] == pytest.approx(2 / 3)
    tags = report["multi_fields"]["tags"]
    assert tags["n"] == 3 and tags["subset_accuracy"] == pytest.approx(1 / 3)  # only t1's empty choice is right
    # the same answers given in Argilla by two annotators: lists of options come back as lists
    from argilla.records._io import JsonIO

    from pcd_cli.quality.review import offline_argilla

    with offline_argilla() as (rg, _):
        records = JsonIO._records_from_json(tmp_path / "typed.argilla" / "records.json")
        for record in records:
            for user in ("00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"):
                for field, value in answers[record.id].items():
                    value = value if field == "tags" else value[0]
                    record.responses.add(rg.Response(field, value, user_id=user, status="submitted"))
        exported = JsonIO.to_json(records, tmp_path / "typed.records.json")
    from_argilla = read_gold(exported).set_index("id")
    assert from_argilla.loc["t2", "tags"] == ["outage", "security"] and from_argilla.loc["t0", "tags"] == []
    assert from_argilla.loc["t1", "product"] == "null" and from_argilla.loc["t2", "urgency"] == "1"


def test_error_budget_sends_only_the_rows_below_each_fields_fitted_threshold(case, tmp_path):
    """Issue #35 item 6, the review loop: ``--error-budget E --gold G`` fits per field the lowest
    probability threshold whose gold rows have error <= E (the same fit as ``pcd eval
    --error-budget``), sends only the rows where some field is below it, and says the share decided
    automatically. The thresholds are recomputed here by brute force."""
    budget = 0.15
    probs = {"sentiment": [float(np.float32(p)) for p in case.prob],
             "urgent": [float(np.float32(p)) for p in case.urgent_prob]}
    right = {"sentiment": [p == g for p, g in zip(case.pred, case.gold)],
             "urgent": [p == g for p, g in zip(case.urgent, case.gold_urgent)]}
    thresholds = {}
    for name in probs:
        ok = [t for t in sorted(set(probs[name]))
              if np.mean([r for p, r in zip(probs[name], right[name]) if p >= t]) >= 1 - budget - 1e-12]
        thresholds[name] = ok[0] if ok else None
    assert all(t is not None for t in thresholds.values())
    review = {case.ids[i] for i in range(N) if any(probs[f][i] < thresholds[f] for f in probs)}
    assert 0 < len(review) < N
    said = helpers.flat(pcd("review", case.output, case.input, "--to", "csv", "-o", tmp_path / "r.csv",
                            "--error-budget", budget, "--gold", case.input).stdout)
    with (tmp_path / "r.csv").open() as fh:
        written = [row["id"] for row in csv.DictReader(fh)]
    assert set(written) == review and written == [r for r in case.order() if r in review]
    auto = N - len(review)
    assert f"error budget {budget:g}: {auto} of {N} rows ({auto / N:.1%}) can be decided automatically; " \
           f"{len(review)} go to review" in said
    assert f"sentiment: probability >= {thresholds['sentiment']:.3f}" in said
    refused = pcd("review", case.output, case.input, "--to", "csv", "-o", tmp_path / "x.csv",
                  "--error-budget", budget, code=2)
    assert "--error-budget and --gold go together" in helpers.flat(refused.stderr + refused.stdout)
