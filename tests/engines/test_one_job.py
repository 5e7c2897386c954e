"""One labelling job, whatever the front-end (issue #34): ``pcd label``, ``pcd serve``'s
``/v1/label`` and ``pcd label --engine ray`` build the same ``LabelJob`` from the same options, so
for the same records they write the same columns (names, types, order) and values, apply a tuned
adapter folder's own calibration alike, and give the same warnings (codes and messages).

Every front-end runs through its real command line: ``pcd serve``'s options go through the CLI
into ``serve_command``, whose HTTP server is started in this process on 127.0.0.1 (a free port)
instead of blocking; ``--engine ray`` joins a local Ray started once for the module.
"""

from __future__ import annotations

import json

import orjson
import pyarrow.parquet as pq
import pytest

from pcd_cli.api import planned_output_schema
from pcd_cli.engines.reuse import INPUT_KEY_COLUMN
from pcd_cli.job import CALIBRATION_WORSE, TUNE_MISMATCH, TUNED_CALIBRATION_SKIPPED, LabelJob

from ..helpers import keyword_rows, keyword_tune_files, pcd
from .test_ray_engine import assert_same

#: Option sets that change the output's columns or the calibration that applies: the tuned
#: folder's calibration (a temperature at its bound: a warning), abstention with order spread and
#: no calibration (a prompt the tune did not read: a warning), and another scoring mode than the
#: tune's (its calibration left out: two warnings).
OPTION_SETS = {
    "tuned-calibration": [],
    "abstain-permute-raw": ["--abstain-below", "0.6", "--permutations", "2", "--no-calibration"],
    "other-scoring": ["--scoring", "exact"],
}
EXPECTED_CODES = {
    "tuned-calibration": {CALIBRATION_WORSE},
    "abstain-permute-raw": {TUNE_MISMATCH},  # the tune read one ordering, this run reads two
    "other-scoring": {TUNE_MISMATCH, TUNED_CALIBRATION_SKIPPED},
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A tiny model folder, an adapter tuned on it by ``pcd tune --adapter-only`` (with its
    ``pcd-calibration.json``), the keyword schema and 8 rows it never saw."""
    root = keyword_tune_files(tmp_path_factory.mktemp("one-job"), rows=60)
    pcd("tune", root / "gold.jsonl", "-s", root / "keyword.json", "-o", root / "adapter", "--model",
        root / "tiny-model", "--device", "cpu", "--epochs", "1", "--rank", "4", "--holdout", "0.3",
        "--adapter-only", "--no-progress")
    assert (root / "adapter" / "pcd-calibration.json").is_file()
    rows = [{"id": f"n{i}", "text": r["text"].replace("number", "ref")} for i, r in enumerate(keyword_rows(8))]
    (root / "rows.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (root / "empty.jsonl").write_bytes(b"")
    return root


def _model_args(root):
    return ["--model", root / "tiny-model", "--adapter", root / "adapter", "--device", "cpu"]


def _warnings(stderr: str) -> list[tuple[str, str]]:
    """(code, message) of each ``warning`` event of a ``--log-format json`` run, in order."""
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [(e["code"], e["message"]) for e in events if e["event"] == "warning" and "code" in e]


def _label(root, source, out, extra, engine=()):
    result = pcd("label", source, "-s", root / "keyword.json", *_model_args(root), "--id-field", "id",
                 "--all-probs", "-o", out, "--no-progress", "--log-format", "json", *engine, *extra,
                 env={"RAY_ADDRESS": None})
    return pq.read_table(out), _warnings(result.stderr)


def _serve(root, extra, monkeypatch, records):
    """``pcd serve`` with ``extra`` through its CLI; the server runs in a thread while the test
    posts ``records`` to ``/v1/label`` and reads ``/v1/schemas``."""
    import httpx

    from pcd_cli.server.main import ServerThread

    got = {}

    def in_thread(service, app_config, *, host, port, shutdown_timeout_s):
        with ServerThread(service, app_config) as srv:
            got["label"] = httpx.post(srv.url + "/v1/label", json={"schema": "keyword", "records": records,
                                                                   "all_probs": True}, timeout=120)
            got["schemas"] = httpx.get(srv.url + "/v1/schemas", timeout=10).json()
        return 0

    monkeypatch.setattr("pcd_cli.server.main.serve", in_thread)
    pcd("serve", "--schema", f"keyword={root / 'keyword.json'}", *_model_args(root), "--quiet", *extra)
    assert got["label"].status_code == 200, got["label"].text
    return got["label"].json(), got["schemas"]["schemas"][0]["warnings"]


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_label_serve_and_ray_write_the_same_columns_values_and_warnings(name, tuned, tmp_path, monkeypatch,
                                                                        local_ray):
    extra = OPTION_SETS[name]
    local, local_warnings = _label(tuned, tuned / "rows.jsonl", tmp_path / "local.parquet", extra)
    assert {code for code, _ in local_warnings} == EXPECTED_CODES[name]
    names = local.schema.names
    assert ("refund__raw_prob" in names) == (name == "tuned-calibration")  # the adapter folder's calibration
    assert ("refund__abstained" in names and "refund__order_spread" in names) == (name == "abstain-permute-raw")

    remote, ray_warnings = _label(tuned, tuned / "rows.jsonl", tmp_path / "ray.parquet", extra,
                                  engine=["--engine", "ray", "--batch-size", "3"])
    assert_same(local, remote)
    assert ray_warnings == local_warnings

    records = [json.loads(line) for line in (tuned / "rows.jsonl").read_text().splitlines()]
    body, served_warnings = _serve(tuned, extra, monkeypatch, records)
    expected = local.drop_columns([INPUT_KEY_COLUMN]).to_pylist()  # a file's per-row content key (--reuse)
    for row in expected:
        row["refund__probs"] = dict(row["refund__probs"])
    assert list(body["rows"][0]) == names[:-1]  # same columns, same order
    assert body["rows"] == expected  # same values, bit for bit (a request alone on an idle server)
    assert [(w["code"], w["message"]) for w in served_warnings] == local_warnings
    written = {k.decode(): v.decode() for k, v in local.schema.metadata.items()}
    for key in ("pcd.calibration_sha256", "pcd.tuned", "pcd.abstain_fields", "pcd.permutations", "pcd.scoring"):
        assert body["metadata"].get(key) == written.get(key), key


@pytest.mark.parametrize("name", ["tuned-calibration", pytest.param("abstain-permute-raw", marks=pytest.mark.full)])
def test_an_empty_input_gets_the_columns_of_a_run_with_rows(name, tuned, tmp_path, local_ray):
    extra = OPTION_SETS[name]
    with_rows, _ = _label(tuned, tuned / "rows.jsonl", tmp_path / "rows.parquet", extra)
    empty, _ = _label(tuned, tuned / "empty.jsonl", tmp_path / "empty.parquet", extra)
    assert empty.num_rows == 0
    assert empty.schema.names == with_rows.schema.names and empty.schema.types == with_rows.schema.types
    on_ray, _ = _label(tuned, tuned / "empty.jsonl", tmp_path / "empty-ray.parquet", extra,
                       engine=["--engine", "ray"])
    assert on_ray.num_rows == 0
    assert on_ray.schema.names == with_rows.schema.names and on_ray.schema.types == with_rows.schema.types


def test_the_job_is_one_frozen_value_that_names_a_conflict():
    job = LabelJob(model="m", abstain_below=0.5)
    with pytest.raises(AttributeError):
        job.model = "other"  # frozen
    assert LabelJob(calibration=None, tuned_calibration=False).for_questions().calibration is None
    from pcd_cli.errors import InputError

    with pytest.raises(InputError, match="--calibration and --no-calibration exclude each other"):
        LabelJob(calibration="cal.json", tuned_calibration=False)
    assert set(LabelJob.options()) >= {"model", "adapter", "calibration", "tuned_calibration", "scoring", "template",
                                       "text_field", "id_field", "truncate", "permutations", "prior_correction",
                                       "abstain_below", "abstain_unless_single", "examples", "shots", "seed",
                                       "max_tokens_per_pass"}


def test_abstain_unless_single_without_label_sets_is_refused_alike_with_and_without_rows(tuned, tmp_path):
    from pcd_cli.errors import CalibrationError
    from pcd_cli.schema.load import load_schema

    job = LabelJob(model=str(tuned / "tiny-model"), adapter=str(tuned / "adapter"), abstain_unless_single=True)
    with pytest.raises(CalibrationError, match="needs label sets"):
        planned_output_schema(load_schema(tuned / "keyword.json"), job, all_probs=False)
    for source in ("rows.jsonl", "empty.jsonl"):
        result = pcd("label", tuned / source, "-s", tuned / "keyword.json", *_model_args(tuned),
                     "--abstain-unless-single", "-o", tmp_path / f"{source}.parquet", code=2)
        assert "needs label sets" in result.stderr


def test_the_labeler_takes_the_job_whole_or_its_fields_as_keywords():
    """``Labeler(schema, job)`` and ``Labeler(schema, **fields)`` are one labeler (issue #42 item 6):
    the same options, results and metadata; a keyword that is no ``LabelJob`` field is refused by
    name; ``examples`` given as ``Example`` values (the keyword before the job existed) are the
    job's drawn examples."""
    from pcd_cli.api import Labeler
    from pcd_cli.schema.load import load_schema

    from ..helpers import tiny_backend

    schema, backend = load_schema("schemas/sms_spam.yaml"), tiny_backend(seed=3)
    options = dict(scoring="exact", permutations=2, abstain_below=0.6, truncate="head", max_tokens_per_pass=256)
    whole = Labeler(schema, LabelJob(**options), backend=backend)
    keywords = Labeler(schema, backend=backend, **options)
    assert whole.job == keywords.job == LabelJob(**options)
    assert (whole.compiled.scoring, whole.permutations, whole.decoder.truncate, whole.decoder.budget) == \
        ("exact", 2, "head", 256)
    assert whole.abstain_thresholds == {"is_spam": 0.6}
    texts = ["WIN A FREE PRIZE now", "see you at 6?"]
    assert list(whole.label(texts)) == list(keywords.label(texts))
    assert {k: v for k, v in whole.metadata().items() if k != "pcd.created_utc"} == \
        {k: v for k, v in keywords.metadata().items() if k != "pcd.created_utc"}
    over = Labeler(schema, LabelJob(**options), backend=backend, scoring="marginal")  # a keyword wins over the job
    assert over.compiled.scoring == "marginal" and over.job.permutations == 2
    with pytest.raises(TypeError, match="'scorng'.*LabelJob"):
        Labeler(schema, backend=backend, scorng="exact")
    none = Labeler(schema, backend=backend, examples=())
    assert none.examples == () and none.job.drawn_examples == () and none.job.examples is None


def test_pcd_label_builds_its_job_from_every_job_option_it_declares(monkeypatch, tmp_path):
    """``pcd label`` has an option for every ``LabelJob`` field (``--no-calibration`` for
    ``tuned_calibration``) and builds its job from them in ``cli._label_job``: the job
    ``run_label_job`` receives holds each value given."""
    import typer.main

    from pcd_cli.cli import app
    from pcd_cli.errors import InputError

    command = typer.main.get_command(app).commands["label"]
    declared = {p.name for p in command.params}
    assert set(LabelJob.options()) - declared == {"tuned_calibration"} and "no_calibration" in declared
    seen = []

    def run_label_job(schema, input, job, **_):
        seen.append(job)
        raise InputError("stop here")

    monkeypatch.setattr("pcd_cli.engines.local.run_label_job", run_label_job)
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "hi"}\n')
    pcd("label", source, "-s", "schemas/sms_spam.yaml", "-o", tmp_path / "out.parquet", "--scoring", "exact",
        "--backend", "torch", "--device", "cpu", "--permutations", "3", "--truncate", "tail", "--no-calibration",
        "--abstain-below", "0.4", "--shots", "2", "--seed", "7", "--max-tokens-per-pass", "128", "--template",
        "{text}!", "--trace", tmp_path / "trace.jsonl", code=2)
    assert seen == [LabelJob(scoring="exact", backend="torch", device="cpu", permutations=3, truncate="tail",
                             tuned_calibration=False, abstain_below=0.4, shots=2, seed=7, max_tokens_per_pass=128,
                             template="{text}!")]
