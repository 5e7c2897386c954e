"""Gold from annotation tools keeps its meaning (issue #28, item 3): only submitted (Argilla) or
not-cancelled (Label Studio) answers are gold, several annotators resolve by majority with ties
reported, "none of these" on a multi-select field comes back as an empty list, the review files
meet the servers' rules, and the exports that cannot be read right are refused by name.

The two cases of cases-round4 (argilla-response-status-and-names,
label-studio-cancelled-and-multiple-annotators) are rebuilt here as their make_export(s).py
builds them; the predictions are hand-made pcd outputs (no model is loaded).
"""

from __future__ import annotations

import csv
import json
import uuid
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcd_cli.errors import InputError
from pcd_cli.io.output import output_schema
from pcd_cli.quality import read_gold
from pcd_cli.io.annotations import ARGILLA_NAME, GOLD_ATTR, task_answers
from pcd_cli.quality.data import FieldSpec
from pcd_cli.quality.review import argilla_names, label_studio_config, offline_argilla
from pcd_cli.schema.load import load_schema
from pcd_cli.schema.model import schema_metadata

from .. import helpers
from ..helpers import flat
from .test_review import Case

SENTIMENT = ("NEGATIVE", "NEUTRAL", "POSITIVE")
TEXTS = ["The parcel arrived broken and support never answered.", "Quick delivery, lovely packaging, thank you!",
         "It works. Nothing special.", "Refund took three weeks, I will not order again.",
         "Great price but the colour is not as pictured.", "Five stars, would buy again.",
         "Item matches the description."]


def pcd(*args, code: int = 0):
    return helpers.pcd(*args, code=code, env={"COLUMNS": "200"})


def write_output(path: Path, schema_yaml: str, labels: dict[str, dict]) -> Path:
    """A pcd output (``--all-probs``) of the records ``labels`` (``{id: {field: label}}``): the
    chosen label at probability 0.7 (a multi-select option at P(yes) 0.8, others 0.2)."""
    (path.parent / "schema.yaml").write_text(schema_yaml)
    schema = load_schema(path.parent / "schema.yaml")
    arrow = output_schema(schema, "id", pa.string(), all_probs=True)
    arrow = arrow.with_metadata({"pcd.model": "fake-model", **schema_metadata(schema)})
    cols: dict[str, list] = {name: [] for name in arrow.names}
    for rid, chosen in labels.items():
        cols["id"].append(rid)
        for f in schema.declared:
            value = chosen[f.name]
            if f.type == "multi":
                probs = [(o, 0.8 if o in value else 0.2) for o in f.labels]
            else:
                probs = [(label, 0.7 if label == value else 0.3 / (len(f.labels) - 1)) for label in f.labels]
            typed = value == "true" if f.type == "boolean" else int(value) if f.type == "integer" else value
            cols[f.name].append(typed)
            cols[f"{f.name}__prob"].append(0.7)
            cols[f"{f.name}__mass"].append(0.9)
            cols[f"{f.name}__probs"].append(probs)
        cols["__truncated"].append(False)
        for column in cols.values():  # columns this helper does not fill (<f>__expected...)
            column.extend([None] * (len(cols["id"]) - len(column)))
    pq.write_table(pa.Table.from_pydict(cols, schema=arrow), path)
    return path


SENTIMENT_YAML = "name: reviews\nfields:\n  sentiment: {type: enum, labels: [NEGATIVE, NEUTRAL, POSITIVE]}\n"


# -- Label Studio: the case ----------------------------------------------------------------------

def ls_annotation(aid, user, when, choices=None, cancelled=False, gt=False, field="sentiment"):
    result = [] if choices is None else [{"id": f"x{aid}", "from_name": field, "to_name": "text", "type": "choices",
                                          "origin": "manual", "value": {"choices": choices}}]
    return {"id": aid, "completed_by": user, "result": result, "was_cancelled": cancelled, "ground_truth": gt,
            "created_at": when, "updated_at": when, "lead_time": 3.2, "task": None}


def ls_case_tasks() -> list[dict]:
    """label-studio-cancelled-and-multiple-annotators/make_exports.py's export.json."""
    def task(tid, rid, annotations, predictions=()):
        return {"id": tid, "data": {"text": TEXTS[int(rid[1:]) - 1], "id": rid}, "annotations": annotations,
                "predictions": list(predictions), "meta": {}, "inner_id": tid - 100}

    a = ls_annotation
    pred = {"model_version": "smollm2", "score": 0.4, "result": [
        {"from_name": "sentiment", "to_name": "text", "type": "choices", "value": {"choices": ["POSITIVE"]}}]}
    return [
        task(101, "r1", [a(1, 11, "2026-05-01T09:00:00Z", ["NEGATIVE"]), a(2, 12, "2026-05-01T09:05:00Z", ["NEGATIVE"]),
                         a(3, 13, "2026-05-01T09:10:00Z", ["POSITIVE"])]),
        task(102, "r2", [a(4, 11, "2026-05-01T09:00:00Z", ["POSITIVE"]),
                         a(5, 12, "2026-05-01T10:00:00Z", None, cancelled=True)]),
        task(103, "r3", [a(6, 11, "2026-05-01T09:00:00Z", None, cancelled=True)]),
        task(104, "r4", [a(7, 14, "2026-05-01T08:00:00Z", ["NEGATIVE"], gt=True),
                         a(8, 12, "2026-05-01T12:00:00Z", ["NEUTRAL"])]),
        task(105, "r5", [a(9, 11, "2026-05-01T09:00:00Z", ["NEUTRAL"]),
                         a(10, 12, "2026-05-01T09:30:00Z", ["NEGATIVE"])]),
        task(106, "r6", [], [pred]),
        task(107, "r7", [a(11, 11, "2026-05-01T09:00:00Z", ["NEUTRAL", "POSITIVE"])]),
    ]


def test_label_studio_case_skips_cancelled_and_resolves_annotators_by_majority(tmp_path):
    tasks = ls_case_tasks()
    export = tmp_path / "export.json"
    export.write_text(json.dumps(tasks))
    gold = read_gold(export)
    got = {rid: (v if isinstance(v, (str, list)) else None) for rid, v in zip(gold["id"], gold["sentiment"])}
    assert got == {"r1": "NEGATIVE",  # 2 against 1, not the latest (POSITIVE)
                   "r2": "POSITIVE",  # the later skip does not count
                   "r3": None, "r4": "NEGATIVE",  # the older ground truth over a newer plain answer
                   "r5": None,  # 1-1: no gold, not the latest
                   "r6": None,  # the prediction is never gold
                   "r7": ["NEUTRAL", "POSITIVE"]}
    output = write_output(tmp_path / "pred.parquet", SENTIMENT_YAML,
                          {f"r{i}": {"sentiment": "POSITIVE"} for i in range(1, 8)})
    result = pcd("eval", output, export, "--json", tmp_path / "eval.json")
    text = flat(result.stdout)
    assert "5 of 5 gold rows with an answer matched a prediction (2 of the 7 rows in the gold file have no " \
           "answer: skipped or not annotated" in text
    assert "annotators on sentiment: 2 rows answered more than once, 2 disagree, 1 tied (no gold); pairwise " \
           "agreement 0.167" in text
    report = json.loads((tmp_path / "eval.json").read_text())
    assert (report["gold_rows"], report["gold_rows_with_answer"], report["matched_with_answer"]) == (7, 5, 5)
    # r1: 1 of 3 pairs agree, r5: 0 of 1
    assert report["agreement"] == {"sentiment": {"rows": 2, "disagree": 2, "ties": 1, "tie_ids": ["r5"],
                                                 "agreement": pytest.approx(1 / 6)}}
    field = report["fields"]["sentiment"]
    assert (field["n"], field["gold_null"], field["gold_invalid"]) == (3, 3, 1)
    assert field["accuracy"] == pytest.approx(1 / 3)  # r2 right; r1, r4 wrong
    assert any("tied (no answer most given: no gold, e.g. id 'r5')" in w for w in report["warnings"])
    assert any("\"['NEUTRAL', 'POSITIVE']\" (1)" in w for w in report["warnings"])  # named, not scored

    # JSON-MIN and CSV: Label Studio's task id in 'id', one row per annotation: refused by name
    mins = [{"text": t["data"]["text"], "id": t["id"], "sentiment": a["result"][0]["value"]["choices"][0],
             "annotator": a["completed_by"], "annotation_id": a["id"], "created_at": a["created_at"],
             "updated_at": a["updated_at"], "lead_time": a["lead_time"]}
            for t in tasks for a in t["annotations"] if a["result"] and len(a["result"][0]["value"]["choices"]) == 1]
    (tmp_path / "min.json").write_text(json.dumps(mins))
    result = pcd("eval", output, tmp_path / "min.json", code=2)
    assert "a Label Studio JSON-MIN export, whose 'id' is Label Studio's own task id" in flat(result.stderr)
    for name, rows in (("export.csv", mins), ("one_per_task.csv", [m for m in mins if m["annotation_id"] in
                                                                   (1, 4, 7, 9)])):
        with (tmp_path / name).open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=sorted(mins[0]))
            writer.writeheader()
            writer.writerows(rows)
        result = pcd("eval", output, tmp_path / name, code=2)
        assert f"'{tmp_path / name}': a Label Studio CSV export (columns annotator, annotation_id, lead_time): one " \
               "row per annotation, its 'id' Label Studio's own task id" in flat(result.stderr)
        assert "export as JSON (the full format) instead" in flat(result.stderr)


def test_an_annotator_counts_once_and_ground_truth_answers_alone():
    a = ls_annotation
    # user 11 answered twice (the later answer counts), user 12 once: 1-1, a tie
    assert task_answers([a(1, 11, "2026-01-01", ["NEGATIVE"]), a(2, 12, "2026-01-02", ["NEUTRAL"]),
                         a(3, 11, "2026-01-03", ["NEUTRAL"])]) == [{"sentiment": "NEUTRAL"}, {"sentiment": "NEUTRAL"}]
    assert task_answers([a(1, {"id": 11, "email": "x@y"}, "2026-01-01", ["NEGATIVE"]),
                         a(2, {"id": 11, "email": "x@y"}, "2026-01-02", ["POSITIVE"])]) == [{"sentiment": "POSITIVE"}]
    # two ground-truth answers disagreeing 1-1 with a third plain one: only the ground truth counts
    assert task_answers([a(1, 1, "t", ["NEGATIVE"], gt=True), a(2, 2, "t", ["POSITIVE"], gt=True),
                         a(3, 3, "t", ["POSITIVE"])]) == [{"sentiment": "NEGATIVE"}, {"sentiment": "POSITIVE"}]
    assert task_answers([a(1, 1, "t", ["NEGATIVE"], cancelled=True), dict(a(2, 2, "t", ["NEUTRAL"]), skipped=True)]) \
        == []


def test_label_studio_csv_export_of_a_multi_select_project_is_refused(tmp_path):
    """label-studio-sdk's own converter writes the CSV export (as the server does): one row per
    annotation, several choices as a JSON cell; pcd names the form instead of failing on ids."""
    from label_studio_sdk.converter import Converter

    config = label_studio_config([FieldSpec("tags", ("outage", "billing", "security"), False, "multi")])
    tasks = [{"id": 1, "data": {"text": "down and billed twice", "id": "t1"}, "annotations": [
        dict(ls_annotation(1, 11, "2026-01-01", ["outage", "billing"], field="tags"), task=1),
        dict(ls_annotation(2, 12, "2026-01-01", ["outage"], field="tags"), task=1)]}]
    (tmp_path / "export.json").write_text(json.dumps(tasks))
    Converter(config=config, project_dir=None).convert_to_csv(str(tmp_path / "export.json"), str(tmp_path / "csv"),
                                                              is_dir=False, sep=",")
    exported = tmp_path / "csv" / "result.csv"
    rows = list(csv.DictReader(exported.open()))
    assert len(rows) == 2 and json.loads(rows[0]["tags"]) == {"choices": ["outage", "billing"]}
    with pytest.raises(InputError, match="a Label Studio CSV export .* several choices as a JSON cell"):
        read_gold(exported)


# -- Argilla: the case ---------------------------------------------------------------------------

def argilla_case_records(rg):
    """argilla-response-status-and-names/make_export.py's records: several users' responses,
    some discarded, some drafts."""
    u = [uuid.UUID(int=i) for i in range(1, 5)]

    def r(value, user, status, question="sentiment"):
        return rg.Response(question, value, user_id=u[user], status=status)

    answers = {
        "a1": [r("NEGATIVE", 0, "submitted"), r("NEGATIVE", 1, "submitted"), r("POSITIVE", 2, "submitted")],
        "a2": [r("POSITIVE", 0, "submitted"), r("NEGATIVE", 1, "discarded"), r("NEGATIVE", 2, "discarded")],
        "a3": [r("NEUTRAL", 0, "draft")],
        "a4": [r("NEGATIVE", 0, "submitted"), r("NEUTRAL", 1, "submitted")],
        "a5": [r("NEUTRAL", 0, "submitted"), r("NEGATIVE", 1, "draft"), r("NEGATIVE", 2, "draft")],
    }
    return [rg.Record(id=rid, fields={"text": TEXTS[i]}, responses=resp)
            for i, (rid, resp) in enumerate(answers.items())]


def _values(gold: pd.DataFrame, field: str) -> dict:
    return {rid: (v if isinstance(v, (str, list)) else None) for rid, v in zip(gold["id"], gold[field])}


def test_argilla_case_only_submitted_answers_are_gold_where_the_export_keeps_the_status(tmp_path):
    from argilla.records._io import GenericIO

    with offline_argilla() as (rg, _):
        records = argilla_case_records(rg)
        nested, flat_rows = GenericIO.to_list(records, flatten=False), GenericIO.to_list(records, flatten=True)
    (tmp_path / "records_to_json.json").write_text(json.dumps(nested))
    (tmp_path / "records_flat.json").write_text(json.dumps(flat_rows))
    # to_datasets() is these flattened rows in a table; saved as Parquet (to_hub writes Parquet)
    pd.DataFrame(flat_rows).to_parquet(tmp_path / "records_flat.parquet")
    want = {"a1": "NEGATIVE", "a2": "POSITIVE", "a3": None, "a4": None, "a5": "NEUTRAL"}
    output = write_output(tmp_path / "pred.parquet", SENTIMENT_YAML, {rid: {"sentiment": "NEGATIVE"} for rid in want})
    for name in ("records_flat.json", "records_flat.parquet"):
        gold = read_gold(tmp_path / name)
        assert _values(gold, "sentiment") == want, name
        assert gold.attrs[GOLD_ATTR]["status"] == "read" and gold.attrs[GOLD_ATTR]["warnings"] == []
        pcd("eval", output, tmp_path / name, "--json", tmp_path / "eval.json")
        report = json.loads((tmp_path / "eval.json").read_text())
        field = report["fields"]["sentiment"]
        assert field["n"] == 3 and field["accuracy"] == pytest.approx(1 / 3)  # a1 right; a2, a5 wrong
        assert (report["gold_rows"], report["gold_rows_with_answer"]) == (5, 4)  # a3: a draft only
        # several submitted answers on a1 (2-1) and a4 (1-1, the tie)
        assert report["agreement"]["sentiment"] == {"rows": 2, "disagree": 2, "ties": 1, "tie_ids": ["a4"],
                                                    "agreement": pytest.approx((1 / 3 + 0) / 2)}
        assert not any("status" in w for w in report["warnings"])
    # records.to_json / to_disk keep no status: every response counts, and pcd says so
    gold = read_gold(tmp_path / "records_to_json.json")
    assert _values(gold, "sentiment") == {"a1": "NEGATIVE", "a2": "NEGATIVE", "a3": "NEUTRAL", "a4": None,
                                          "a5": "NEGATIVE"}
    assert gold.attrs[GOLD_ATTR]["status"] == "absent"
    result = pcd("eval", output, tmp_path / "records_to_json.json")
    assert "this Argilla export keeps no response status (dataset.records.to_json and dataset.to_disk write only " \
           "each response's value and user): draft and discarded answers cannot be told from submitted ones" \
           in flat(result.stdout)
    assert "dataset.records.to_list(flatten=True) as JSON" in flat(result.stdout)


def test_review_to_argilla_meets_the_server_rules(tmp_path):
    """argilla-response-status-and-names (B): 'Sentiment', 'needs.reply' renamed with a note, the
    answers read back under the schema's names; a 501-option question refused before writing."""
    names_yaml = ("name: reviews\nfields:\n  Sentiment: {type: enum, labels: [NEGATIVE, NEUTRAL, POSITIVE]}\n"
                  "  needs.reply: {type: boolean}\n")
    ids = ["a1", "a2", "a3"]
    labels = {"a1": ("NEGATIVE", "true"), "a2": ("POSITIVE", "false"), "a3": ("NEUTRAL", "false")}
    output = write_output(tmp_path / "pred.parquet", names_yaml,
                          {rid: {"Sentiment": s, "needs.reply": n} for rid, (s, n) in labels.items()})
    source = tmp_path / "input.jsonl"
    source.write_text("".join(json.dumps({"id": rid, "text": TEXTS[i]}) + "\n" for i, rid in enumerate(ids)))
    folder = tmp_path / "review_ds"
    result = pcd("review", output, source, "--to", "argilla", "-o", folder)
    assert "note: Argilla's server accepts lower case names only (letters, digits, _ and -): question " \
           "'Sentiment' is 'sentiment', 'needs.reply' is 'needs_reply'" in flat(result.stdout)
    settings = json.loads((folder / ".argilla" / "settings.json").read_text())
    names = {kind: [item["name"] for item in settings[kind]] for kind in ("fields", "questions", "metadata")}
    assert names == {"fields": ["text"], "questions": ["sentiment", "needs_reply"],
                     "metadata": ["pcd_score", "sentiment__prob", "needs_reply__prob"]}
    assert all(ARGILLA_NAME.match(n) for ns in names.values() for n in ns)
    assert [q["title"] for q in settings["questions"]] == ["Sentiment", "needs.reply"]
    records = json.loads((folder / "records.json").read_text())
    assert set(records[0]["suggestions"]) == {"sentiment", "needs_reply"}
    assert {"sentiment__probs", "needs_reply__probs"} <= set(records[0]["metadata"])

    # the annotators answer in Argilla: the answers come back under the schema's names
    from argilla.records._io import JsonIO

    with offline_argilla() as (rg, _):
        read = JsonIO._records_from_json(folder / "records.json")
        user = uuid.UUID(int=1)
        gold_labels = {"a1": ("NEGATIVE", "true"), "a2": ("NEUTRAL", "false"), "a3": ("NEUTRAL", "true")}
        for record in read:
            s, n = gold_labels[record.id]
            record.responses.add(rg.Response("sentiment", s, user_id=user, status="submitted"))
            record.responses.add(rg.Response("needs_reply", n, user_id=user, status="submitted"))
        from argilla.records._io import GenericIO

        (tmp_path / "flat.json").write_text(json.dumps(GenericIO.to_list(read, flatten=True)))
    pcd("eval", output, tmp_path / "flat.json", "--json", tmp_path / "eval.json")
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["fields"]["Sentiment"]["accuracy"] == pytest.approx(2 / 3)  # a2 wrong
    assert report["fields"]["needs.reply"]["accuracy"] == pytest.approx(2 / 3)  # a3 wrong
    assert report["fields_without_gold"] == []

    # 0..499 plus null: 501 options, more than a label question may have: refused, nothing written
    too_many = "name: reviews\nfields:\n  score: {type: integer, minimum: 0, maximum: 499, nullable: true}\n"
    (tmp_path / "big").mkdir()
    big = write_output(tmp_path / "big" / "pred.parquet", too_many, {rid: {"score": "7"} for rid in ids})
    result = pcd("review", big, source, "--to", "argilla", "-o", tmp_path / "big_ds", code=2)
    assert "field 'score' has 501 labels; Argilla's server accepts at most 500 options in a label question; " \
           "review it with --to label-studio or --to csv" in flat(result.stderr)
    assert not (tmp_path / "big_ds").exists()
    pcd("review", big, source, "--to", "label-studio", "-o", tmp_path / "big.json")  # Label Studio takes it


def test_argilla_names_rename_or_refuse():
    def spec(name, n=3):
        return FieldSpec(name, tuple(str(i) for i in range(n)), False, "enum")

    assert argilla_names([spec("Sentiment"), spec("needs.reply"), spec("Topic Name"), spec("ok-1_x")]) == {
        "Sentiment": "sentiment", "needs.reply": "needs_reply", "Topic Name": "topic_name", "ok-1_x": "ok-1_x"}
    assert argilla_names([spec("many", 500)]) == {"many": "many"}  # the limit itself is fine
    with pytest.raises(InputError, match="'many' has 501 labels; Argilla's server accepts at most 500"):
        argilla_names([spec("many", 501)])
    with pytest.raises(InputError, match="fields 'Sentiment' and 'sentiment' are both 'sentiment' in Argilla"):
        argilla_names([spec("Sentiment"), spec("sentiment")])
    with pytest.raises(InputError, match="field '__': Argilla's server accepts only names"):
        argilla_names([spec("__")])


# -- "none of these" on a multi-select field ------------------------------------------------------

MULTI_YAML = ("name: tickets\nfields:\n  sentiment: {type: enum, labels: [NEGATIVE, NEUTRAL, POSITIVE]}\n"
              "  tags: {type: multi, labels: [outage, billing, security]}\n")


def test_none_of_these_comes_back_as_an_empty_list_from_label_studio_and_argilla(tmp_path):
    predicted = {"t1": {"sentiment": "NEGATIVE", "tags": ["outage"]}, "t2": {"sentiment": "NEUTRAL", "tags": []},
                 "t3": {"sentiment": "POSITIVE", "tags": ["billing"]}}
    output = write_output(tmp_path / "pred.parquet", MULTI_YAML, predicted)
    # Label Studio writes no result for a Choices left empty: t2 and t3 are answered "none of these"
    a = ls_annotation
    tasks = [{"id": i + 1, "data": {"text": f"ticket {rid}", "id": rid}, "annotations": answers}
             for i, (rid, answers) in enumerate({
                 "t1": [dict(a(1, 1, "t", ["NEGATIVE"]), result=a(1, 1, "t", ["NEGATIVE"])["result"]
                             + a(9, 1, "t", ["outage", "security"], field="tags")["result"])],
                 "t2": [a(2, 1, "t", ["NEUTRAL"])],
                 "t3": [a(3, 1, "t", ["POSITIVE"]), a(4, 2, "t", ["POSITIVE"])],
             }.items())]
    tasks.append({"id": 9, "data": {"text": "ticket t4", "id": "t4"}, "annotations": [
        a(5, 1, "t", None, cancelled=True)]})  # skipped: no gold at all, not an empty list
    (tmp_path / "ls.json").write_text(json.dumps(tasks))
    pcd("eval", output, tmp_path / "ls.json", "--json", tmp_path / "ls.eval.json")
    tags = json.loads((tmp_path / "ls.eval.json").read_text())["multi_fields"]["tags"]
    assert tags["n"] == 3 and tags["gold_null"] == 0
    assert tags["subset_accuracy"] == pytest.approx(1 / 3)  # t2 right ([] both); t1, t3 wrong
    report = json.loads((tmp_path / "ls.eval.json").read_text())
    assert report["agreement"]["tags"] == {"rows": 1, "disagree": 0, "ties": 0, "tie_ids": [], "agreement": 1.0}

    # Argilla: a submitted response without the (not required) multi-select question is "none"
    with offline_argilla() as (rg, _):
        from argilla.records._io import GenericIO

        u1, u2 = uuid.UUID(int=1), uuid.UUID(int=2)
        records = [
            rg.Record(id="t1", fields={"text": "ticket t1"}, responses=[
                rg.Response("sentiment", "NEGATIVE", user_id=u1, status="submitted"),
                rg.Response("tags", ["outage"], user_id=u1, status="submitted")]),
            rg.Record(id="t2", fields={"text": "ticket t2"}, responses=[
                rg.Response("sentiment", "NEUTRAL", user_id=u1, status="submitted")]),
            rg.Record(id="t3", fields={"text": "ticket t3"}, responses=[  # a draft only: no answer
                rg.Response("sentiment", "POSITIVE", user_id=u2, status="draft")]),
        ]
        (tmp_path / "argilla.json").write_text(json.dumps(GenericIO.to_list(records, flatten=True)))
    pcd("eval", output, tmp_path / "argilla.json", "--json", tmp_path / "ar.eval.json")
    report = json.loads((tmp_path / "ar.eval.json").read_text())
    tags = report["multi_fields"]["tags"]
    assert (tags["n"], tags["gold_null"], tags["subset_accuracy"]) == (2, 1, 1.0)  # t1, t2 right; t3 none
    assert (report["gold_rows"], report["gold_rows_with_answer"]) == (3, 2)


def test_multi_select_questions_are_optional_in_argilla(tmp_path):
    output = write_output(tmp_path / "pred.parquet", MULTI_YAML, {"t1": {"sentiment": "NEGATIVE", "tags": []}})
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "t1", "text": "ticket"}) + "\n")
    pcd("review", output, tmp_path / "in.jsonl", "--to", "argilla", "-o", tmp_path / "ds")
    settings = json.loads((tmp_path / "ds" / ".argilla" / "settings.json").read_text())
    assert {q["name"]: q["required"] for q in settings["questions"]} == {"sentiment": True, "tags": False}


# -- an output whose ids are row numbers ---------------------------------------------------------

def test_eval_reads_the_row_ids_pcd_review_wrote(tmp_path):
    case = Case(tmp_path / "rows", id_column="row")
    out = tmp_path / "review.json"
    pcd("review", case.output, case.input, "--to", "label-studio", "-o", out, "--top", 10)
    tasks = json.loads(out.read_text())
    assert all(set(t["data"]) == {"text", "row"} for t in tasks)
    for number, task in enumerate(tasks, start=1):
        i = task["data"]["row"]
        task.update(id=number, annotations=[{"id": number, "completed_by": 1, "was_cancelled": False, "result": [
            {"from_name": "sentiment", "to_name": "text", "type": "choices", "value": {"choices": [case.gold[i]]}}]}])
    export = tmp_path / "export.json"
    export.write_text(json.dumps(tasks))
    pcd("eval", case.output, export, "--json", tmp_path / "eval.json")  # no --id-field row
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["id_column"] == "row" and report["matched"] == 10
    reviewed = [case.ids[t["data"]["row"]] for t in tasks]
    assert report["fields"]["sentiment"]["accuracy"] == pytest.approx(case.accuracy(reviewed, "sentiment"))
    assert report["fields_without_gold"] == ["urgent"]


def test_tune_reads_argilla_names_and_none_of_these_as_eval_does(tmp_path):
    from pcd_cli.io.readers import InputSpec
    from pcd_cli.tune import gold_records

    (tmp_path / "schema.yaml").write_text("name: t\nfields:\n  Sentiment: {type: enum, labels: [NEGATIVE, POSITIVE]}\n"
                                          "  tags: {type: multi, labels: [outage, billing]}\n")
    schema = load_schema(tmp_path / "schema.yaml")
    _two_record_flat_export(tmp_path / "flat.json", tag="outage")
    gold = read_gold(tmp_path / "flat.json")
    found, labels, skipped = gold_records(gold, schema, InputSpec(id_field="id"))
    assert [r.id for r in found] == ["t1", "t2"] and skipped == []
    # Sentiment (0 NEGATIVE), then per option 0 = chosen: t2 answered without tags: none chosen
    assert labels == [[0, 0, 1], [1, 1, 1]]


def test_bench_gold_reads_argilla_names():
    from pcd_cli.bench import BenchReport, BenchRow, gold_accuracy
    from pcd_cli.schema.load import parse_schema

    schema = parse_schema({"fields": {"Sentiment": {"type": "enum", "labels": ["NEGATIVE", "POSITIVE"]}}})
    report = BenchReport("s", "m", "cpu", 2, 10, rows=[
        BenchRow("a", "pcd", 0.1, 1, 0, True, True, (), 1.0, {"Sentiment": "NEGATIVE"}),
        BenchRow("b", "pcd", 0.1, 1, 0, True, True, (), 1.0, {"Sentiment": "NEGATIVE"})])
    gold = pd.DataFrame({"id": ["a", "b"], "sentiment": ["NEGATIVE", "POSITIVE"]})  # as Argilla names it
    assert gold_accuracy(report, gold, schema)["Sentiment"]["pcd"] == {"accuracy": 0.5, "n": 2, "invalid": 0}


def test_the_text_never_takes_a_field_name_in_the_label_studio_config():
    from label_studio_sdk.label_interface import LabelInterface

    from pcd_cli.quality.review import text_name

    fields = [FieldSpec(name, ("a", "b"), False, "enum") for name in ("Text", "record_text")]
    assert text_name(fields) == "record_text_2"
    LabelInterface(label_studio_config(fields)).validate()  # the SDK's (and server's) unique-name rule
    assert text_name([FieldSpec("sentiment", ("a", "b"), False, "enum")]) == "text"


def test_examples_read_none_of_these_and_argilla_names(tmp_path):
    from pcd_cli.decoding.examples import draw_examples
    from pcd_cli.io.readers import InputSpec

    (tmp_path / "schema.yaml").write_text("name: t\nfields:\n  Sentiment: {type: enum, labels: [NEGATIVE, POSITIVE]}\n"
                                          "  tags: {type: multi, labels: [outage, billing]}\n")
    schema = load_schema(tmp_path / "schema.yaml")
    a = ls_annotation
    tasks = [{"id": 1, "data": {"text": "down and billed", "id": "t1"}, "annotations": [dict(
                 a(1, 1, "t", ["NEGATIVE"], field="Sentiment"),
                 result=a(1, 1, "t", ["NEGATIVE"], field="Sentiment")["result"]
                 + a(2, 1, "t", ["outage", "billing"], field="tags")["result"])]},
             {"id": 2, "data": {"text": "all fine", "id": "t2"},  # no tags ticked: none of these
              "annotations": [a(3, 1, "t", ["POSITIVE"], field="Sentiment")]}]
    (tmp_path / "ls.json").write_text(json.dumps(tasks))
    examples = draw_examples(tmp_path / "ls.json", schema, InputSpec(id_field="id"), shots=2)
    # Sentiment index, then per option 0 = chosen, 1 = not
    assert {e.text: e.labels for e in examples} == {"down and billed": (0, 0, 0), "all fine": (1, 1, 1)}
    _two_record_flat_export(tmp_path / "ar.json", tag="billing")
    examples = draw_examples(tmp_path / "ar.json", schema, InputSpec(id_field="id"), shots=2)
    assert {e.text: e.labels for e in examples} == {"down": (0, 1, 0), "fine": (1, 1, 1)}


def _two_record_flat_export(path, *, tag: str) -> None:
    """An Argilla flattened export (``to_list(flatten=True)``) of two submitted records: t1 'down'
    (NEGATIVE, tags [tag]) and t2 'fine' (POSITIVE, tags left out: "none of these")."""
    with offline_argilla() as (rg, _):
        from argilla.records._io import GenericIO

        u1 = uuid.UUID(int=1)
        records = [rg.Record(id="t1", fields={"text": "down"}, responses=[
                       rg.Response("sentiment", "NEGATIVE", user_id=u1, status="submitted"),
                       rg.Response("tags", [tag], user_id=u1, status="submitted")]),
                   rg.Record(id="t2", fields={"text": "fine"}, responses=[
                       rg.Response("sentiment", "POSITIVE", user_id=u1, status="submitted")])]
        path.write_text(json.dumps(GenericIO.to_list(records, flatten=True)))
