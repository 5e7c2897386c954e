"""``pcd label --engine ray`` against the local engine, on a local Ray started here (2 CPUs, no dashboard).

Ray is started once for the module and stopped at the end; the tiny random model is saved
to a folder that every actor loads by itself (no weights travel). Never any other address.
"""

from __future__ import annotations

import json
import sys

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from pcd_cli.engines.ray_engine import EXIT_ONCE_ENV

from ..helpers import ORACLE_SCHEMA, airline_texts, pcd, tiny_backend


TEXTS = airline_texts(10)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny random model saved to a folder, a schema, and the same rows as JSONL, CSV and Parquet parts."""
    root = tmp_path_factory.mktemp("ray")
    backend = tiny_backend(chat_template=True)
    model_dir = root / "tiny-model"
    backend.model.save_pretrained(model_dir)
    backend.tokenizer._tok.save_pretrained(model_dir)
    schema = root / "oracle.json"
    schema.write_text(json.dumps(ORACLE_SCHEMA))
    rows = [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)]
    jsonl = root / "rows.jsonl"
    jsonl.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    table = pa.Table.from_pylist(rows)
    pacsv.write_csv(table, root / "rows.csv")
    parts = root / "parts"
    parts.mkdir()
    for k, start in enumerate(range(0, len(rows), 4)):
        pq.write_table(table.slice(start, 4), parts / f"part-{k}.parquet")
    return {"root": root, "model": str(model_dir), "schema": str(schema), "jsonl": jsonl,
            "csv": root / "rows.csv", "parts": parts}


def _label(args, env=None):
    return pcd("label", *args, code=None, env={"RAY_ADDRESS": None, **(env or {})})


def _local(files, source, out, extra=()):
    result = _label([source, "--schema", files["schema"], "--model", files["model"], "--device", "cpu",
                     "--all-probs", "-o", out, "--no-progress", *extra])
    assert result.exit_code == 0, result.output
    return pq.read_table(out)


def _ray(files, source, out, workers, extra=(), code=0):
    result = _label([source, "--schema", files["schema"], "--model", files["model"], "--device", "cpu",
                     "--all-probs", "-o", out, "--no-progress", "--engine", "ray", "--workers", workers,
                     "--batch-size", 3, *extra])
    assert result.exit_code == code, result.output
    return result


def assert_same(local: pa.Table, remote: pa.Table, *, skip_meta=("pcd.created_utc",)):
    assert remote.schema.names == local.schema.names
    assert remote.schema.types == local.schema.types
    lm, rm = local.schema.metadata, remote.schema.metadata
    assert {k: v for k, v in rm.items() if k.decode() not in skip_meta} == \
        {k: v for k, v in lm.items() if k.decode() not in skip_meta}
    a, b = local.to_pylist(), remote.to_pylist()
    assert [r[local.schema.names[0]] for r in b] == [r[local.schema.names[0]] for r in a]  # same rows, same order
    for x, y in zip(a, b):
        for name, value in x.items():
            if name.endswith(("__prob", "__raw_prob", "__mass", "__order_spread", "__joint_prob")):
                assert y[name] == pytest.approx(value, abs=1e-5), (x[name], name)
            elif name.endswith("__probs"):
                assert [k for k, _ in y[name]] == [k for k, _ in value]
                assert [p for _, p in y[name]] == pytest.approx([p for _, p in value], abs=1e-5)
            else:
                assert y[name] == value, name


@pytest.mark.parametrize("source, workers, id_field", [
    pytest.param("jsonl", 1, True, marks=pytest.mark.full), pytest.param("csv", 2, False, marks=pytest.mark.full),
    ("parts", 2, True)])
def test_ray_matches_local(local_ray, files, tmp_path, source, workers, id_field):
    extra = ["--id-field", "id"] if id_field else []
    local = _local(files, files["jsonl"] if source == "parts" else files[source], tmp_path / "local.parquet", extra)
    result = _ray(files, files[source], tmp_path / "ray.parquet", workers, extra)
    assert f"{len(TEXTS)} rows read: {len(TEXTS)} records labelled, 0 failed" in result.output
    assert (tmp_path / "ray.parquet").is_dir()
    remote = pq.read_table(tmp_path / "ray.parquet")
    assert remote.num_rows == len(TEXTS)
    assert_same(local, remote, skip_meta=("pcd.created_utc",) + (("pcd.input", "pcd.input_files") if source == "parts"
                                                                else ()))
    if source == "parts":  # the folder whole, and its files in the order read (as the local engine names them)
        assert remote.schema.metadata[b"pcd.input"].decode() == str(files["parts"].resolve())
        assert json.loads(remote.schema.metadata[b"pcd.input_files"]) == \
            sorted(str(f.resolve()) for f in files["parts"].glob("part-*.parquet"))
    assert remote.schema.metadata[b"pcd.records_read"] == str(len(TEXTS)).encode()
    assert not list(tmp_path.glob(".*"))  # no temporary folder left


def test_bad_rows_same_errors_as_local(local_ray, files, tmp_path):
    good = files["jsonl"].read_bytes().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join([good[0], b"{not json", good[1], b'{"id": "x", "text": "  "}', b"[1, 2]",
                                b'{"text": "no id"}', good[2], b'{"id": "b", "text": "\xff\xfe"}', good[3]]) + b"\n")
    extra = ["--id-field", "id"]
    local = _local(files, bad, tmp_path / "local.parquet", extra)
    earlier = tmp_path / "ray.parquet"
    result = _ray(files, bad, earlier, 1, extra)
    assert "9 rows read: 4 records labelled, 5 failed" in result.output
    assert_same(local, pq.read_table(earlier))
    local_errors = (tmp_path / "local.errors.jsonl").read_bytes().splitlines()
    ray_errors = (tmp_path / "ray.errors.jsonl").read_bytes().splitlines()
    assert ray_errors == local_errors
    assert [orjson.loads(e)["line"] for e in ray_errors] == [2, 4, 5, 6, 8]


@pytest.mark.full  # 24 s; a worker past its retries stays in make test
def test_actor_killed_once_output_complete(local_ray, files, tmp_path, monkeypatch):
    marker = tmp_path / "killed-once"
    monkeypatch.setenv(EXIT_ONCE_ENV, str(marker))  # the first batch's actor calls os._exit(1)
    local = _local(files, files["jsonl"], tmp_path / "local.parquet", ["--id-field", "id"])
    result = _ray(files, files["jsonl"], tmp_path / "ray.parquet", 1, ["--id-field", "id"])
    assert marker.exists()  # an actor did die
    assert f"{len(TEXTS)} rows read: {len(TEXTS)} records labelled, 0 failed" in result.output
    remote = pq.read_table(tmp_path / "ray.parquet")
    assert sorted(remote.column("id").to_pylist()) == sorted(f"t{i}" for i in range(len(TEXTS)))  # each row once
    assert_same(local, remote)


def test_past_the_retries_fails_and_keeps_earlier_output(local_ray, files, tmp_path, monkeypatch):
    from pcd_cli.engines.ray_engine import label_files
    from pcd_cli.errors import EngineError
    from pcd_cli.io.readers import InputSpec
    from pcd_cli.job import LabelJob
    from pcd_cli.schema.load import load_schema

    out = tmp_path / "ray.parquet"
    out.mkdir()
    (out / "part-earlier.parquet").write_bytes(b"earlier")
    monkeypatch.setenv(EXIT_ONCE_ENV, str(tmp_path / "killed"))
    with pytest.raises(EngineError, match="the label step failed on Ray .* up to 0 times.*ActorDiedError"):
        label_files(files["jsonl"], load_schema(files["schema"]), InputSpec(id_field="id"),
                    LabelJob(model=files["model"], device="cpu", id_field="id"), output=out,
                    errors_path=tmp_path / "ray.errors.jsonl", max_retries=0)
    assert [p.name for p in out.iterdir()] == ["part-earlier.parquet"]
    assert (out / "part-earlier.parquet").read_bytes() == b"earlier"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_label_dataset_api(local_ray, files, tmp_path):
    import ray

    from pcd_cli.engines.ray_engine import label_dataset

    local = _local(files, files["jsonl"], tmp_path / "local.parquet", ["--id-field", "id"]).to_pylist()
    rows = [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS[:4])] + [{"id": "x", "text": None}]
    ds = label_dataset(ray.data.from_items(rows), files["schema"], id_field="id", model=files["model"],
                       device="cpu", batch_size=2)
    got = sorted(ds.take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in got] == ["t0", "t1", "t2", "t3", "x"]
    assert got[-1]["__error"] == "record 'x': text field 'text' is missing or null"
    assert got[-1]["urgent"] is None
    for want, row in zip(local[:4], got[:4]):
        assert row["__error"] is None
        assert [row[f] for f in ORACLE_SCHEMA["fields"]] == [want[f] for f in ORACLE_SCHEMA["fields"]]
        assert row["urgent__prob"] == pytest.approx(want["urgent__prob"], abs=1e-5)


def test_without_ray_exit_3_with_install_line(files, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed: `import ray` fails
    result = _label([files["jsonl"], "--schema", files["schema"], "-o", tmp_path / "out.parquet", "--engine", "ray"])
    assert result.exit_code == 3, result.output
    assert "pip install 'pcd-cli[ray]'" in result.output
    assert not (tmp_path / "out.parquet").exists()


def test_resume_is_local_only(files, tmp_path):
    result = _label([files["jsonl"], "--schema", files["schema"], "-o", tmp_path / "out.parquet", "--engine", "ray",
                     "--resume"])
    assert result.exit_code == 2
    assert "--resume is for the local engine only" in result.output


def test_worker_options_need_engine_ray(files, tmp_path):
    result = _label([files["jsonl"], "--schema", files["schema"], "-o", tmp_path / "out.parquet", "--workers", 2])
    assert result.exit_code == 2
    assert "--workers, --worker-cpus and --worker-gpus apply to --engine ray only" in result.output


def test_glob_input_needs_an_output_folder(files):
    result = _label([str(files["parts"] / "*.parquet"), "--schema", files["schema"], "--engine", "ray"])
    assert result.exit_code == 2
    assert "name the output folder with -o (a glob or an object-storage input has no folder" in result.output


def _ray_processes() -> dict[int, str]:
    import psutil

    found = {}
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        line = " ".join(p.info["cmdline"] or []) or (p.info["name"] or "")
        if "ray::" in line or "raylet" in line or "gcs_server" in line or "default_worker.py" in line:
            found[p.info["pid"]] = line[:100]
    return found


@pytest.mark.parametrize("outcome", ["finished", pytest.param("failed", marks=pytest.mark.full)])
def test_a_run_leaves_no_ray_process_behind(files, tmp_path, outcome):
    """The local Ray that ``pcd label --engine ray`` starts itself, and every worker, is gone
    when the command returns (issue #20: an orphaned MapWorker held 1.3 GB after exit 0)."""
    import subprocess

    before = _ray_processes()
    model = files["model"] if outcome == "finished" else tmp_path / "not-a-model"
    if outcome == "failed":
        model.mkdir()
        (model / "config.json").write_text("{}")  # a folder the workers cannot load: the run fails
    result = subprocess.run([sys.executable, "-m", "pcd_cli.cli", "label", str(files["jsonl"]), "--schema",
                             str(files["schema"]), "--model", str(model), "-o", str(tmp_path / "out"),
                             "--engine", "ray", "--workers", "1", "-q"], capture_output=True, text=True, timeout=300)
    assert (result.returncode == 0) == (outcome == "finished"), result.stderr[-2000:]
    left = {pid: line for pid, line in _ray_processes().items() if pid not in before}
    assert left == {}


def test_the_bfloat16_note_is_said_once_by_a_ray_run_as_by_the_local_engine(local_ray, files, tmp_path, monkeypatch):
    """The note is computed where the model runs (each worker, on its own machine's CPU and
    measurement) and said once, as ``pcd label`` says it (tests/backends/test_dtype_speed.py)."""
    from pcd_cli.backends import dtype_speed, load_backend

    if not dtype_speed.cpu_has_bfloat16():
        pytest.skip("this CPU has no bfloat16: the note is never said here (the rule: tests/backends/test_dtype_speed.py)")
    model_id = load_backend(files["model"], device="cpu").model_id
    monkeypatch.setenv("XDG_CACHE_HOME", str(local_ray))  # the workers' cache folder
    dtype_speed.record_measurement(model_id, {"speedup": 1.68, "labels_equal": 30, "decisions": 30,
                                              "max_abs_dprob": 0.063}, schema="tweets", records=30)
    said = _ray(files, files["jsonl"], tmp_path / "out.parquet", 2).output  # two workers, one note
    assert said.count("pcd bench measured --dtype bfloat16 1.68x faster for this model") == 1, said


@pytest.mark.full  # 25 s; the lender and dedup counts are tested on the local engine, Ray's parts in test_ray_matches_local
def test_ray_reuse_and_dedup_same_values_and_counts_as_local(local_ray, files, tmp_path):
    """Issue #43 item 6 on its example at small size: night 2 (2 edited, 2 new, 2 copies of those,
    a copy of an unchanged text) with ``--reuse`` night 1 gives on Ray (2 workers, 3-row batches:
    copies in other batches than their first) the local engine's rows, values and counts."""
    texts = airline_texts(12)
    night1 = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    night2 = [dict(r) for r in night1]
    night2[3]["text"] += " (edited: still waiting)"
    night2[9]["text"] = "Different text now: " + night2[9]["text"]
    night2 += [{"id": "t12", "text": "New ticket: my bag never arrived"},
               {"id": "t13", "text": "New ticket: refund me for the cancelled flight"},
               {"id": "t14", "text": night2[3]["text"]},  # the edited text again: deduplicated
               {"id": "t15", "text": "New ticket: my bag never arrived"},  # deduplicated
               {"id": "t16", "text": texts[5]}]  # an unchanged text again: reused
    for name, rows in (("night1", night1), ("night2", night2)):
        (tmp_path / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    extra = ["--id-field", "id"]
    first = _local(files, tmp_path / "night1.jsonl", tmp_path / "n1.parquet", extra)
    reuse = ["--reuse", tmp_path / "n1.parquet", "--log-format", "json", *extra]

    def done(result):
        return [json.loads(line) for line in result.stderr.splitlines() if '"done"' in line][0]

    local_run = _label([tmp_path / "night2.jsonl", "--schema", files["schema"], "--model", files["model"], "--device",
                        "cpu", "--all-probs", "-o", tmp_path / "local.parquet", "--no-progress", *reuse])
    assert local_run.exit_code == 0, local_run.output
    ray_run = _ray(files, tmp_path / "night2.jsonl", tmp_path / "ray.parquet", 2, reuse)
    want, got = done(local_run), done(ray_run)
    assert (got["reused"], got["deduplicated"], got["labelled"]) == (want["reused"], want["deduplicated"],
                                                                     want["labelled"]) == (11, 2, 17)
    assert got["decoded"] == want["decoded"] == 4  # through the model: the rows neither reused nor deduplicated
    assert any("rows of the same job to copy from" in line for line in ray_run.stderr.splitlines())
    local, remote = pq.read_table(tmp_path / "local.parquet"), pq.read_table(tmp_path / "ray.parquet")
    assert_same(local, remote)  # rows, order, values (1e-5), metadata: pcd.reused, pcd.records_reused/deduplicated
    by_id = {r["id"]: r for r in first.to_pylist()}
    rows = {r["id"]: r for r in remote.to_pylist()}
    for rid in [f"t{i}" for i in range(12) if i not in (3, 9)]:
        assert rows[rid] == by_id[rid]  # reused: night 1's row, every column, bit for bit
    assert {k: v for k, v in rows["t16"].items() if k != "id"} == {k: v for k, v in by_id["t5"].items() if k != "id"}
    for copy, of in (("t14", "t3"), ("t15", "t12")):  # a copy: its first copy's values under its own id
        assert {k: v for k, v in rows[copy].items() if k != "id"} == {k: v for k, v in rows[of].items() if k != "id"}
    # only the 4 changed texts were decoded: fewer passes per record than a fresh Ray run of night 2
    fresh = done(_ray(files, tmp_path / "night2.jsonl", tmp_path / "fresh.parquet", 2, ["--log-format", "json", *extra]))
    assert 0 < got["forward_passes_per_record"] < fresh["forward_passes_per_record"]


@pytest.mark.full  # 13 s; per-field reuse is tested on the local engine, Ray's parts in test_ray_matches_local
def test_ray_reuses_per_field_as_the_local_engine(local_ray, files, tmp_path):
    """Issue #43 items 4 and 6: with isolate_fields, a schema that gained a field reuses the other
    fields per row on Ray as the local engine does: same rows, values (1e-5), counts
    (``partly_reused``) and ``pcd.reused`` naming the fields lent."""
    fields = dict(ORACLE_SCHEMA["fields"])
    for name, keep in (("before", ["urgent", "deadline"]), ("after", ["urgent", "deadline", "refund"])):
        (tmp_path / f"{name}.json").write_text(json.dumps({"name": "iso", "isolate_fields": True,
                                                           "fields": {k: fields[k] for k in keep}}))
    texts = airline_texts(8)
    night = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    (tmp_path / "night.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in night))
    before = dict(files, schema=tmp_path / "before.json")
    after = dict(files, schema=tmp_path / "after.json")
    first = _local(before, tmp_path / "night.jsonl", tmp_path / "n1.parquet", ["--id-field", "id"])
    extra = ["--id-field", "id", "--reuse", tmp_path / "n1.parquet", "--log-format", "json"]
    _local(after, tmp_path / "night.jsonl", tmp_path / "local.parquet", extra)
    ray_run = _ray(after, tmp_path / "night.jsonl", tmp_path / "ray.parquet", 2, extra)
    done = [json.loads(line) for line in ray_run.stderr.splitlines() if '"done"' in line][0]
    assert (done["partly_reused"], done["reused"], done["labelled"]) == (8, 0, 8)
    assert any("only 'refund' decoded" in line for line in ray_run.stderr.splitlines())
    local, remote = pq.read_table(tmp_path / "local.parquet"), pq.read_table(tmp_path / "ray.parquet")
    assert_same(local, remote)  # pcd.reused (with the fields lent) and pcd.records_partly_reused included
    assert json.loads(remote.schema.metadata[b"pcd.reused"])[0]["fields"] == ["urgent", "deadline"]
    by_id = {r["id"]: r for r in first.to_pylist()}
    for row in remote.to_pylist():
        assert {k: v for k, v in row.items() if k.split("__")[0] in ("urgent", "deadline")} == \
            {k: v for k, v in by_id[row["id"]].items() if k.split("__")[0] in ("urgent", "deadline")}


def test_ray_s3_output_needs_a_parquet_key(files, tmp_path):
    """``-o`` in object storage on Ray is one Parquet object: a prefix, or a key without
    ``.parquet``, is refused before Ray starts or the store is asked (one line with the fix)."""
    for uri, fix in (("s3://bucket/labels/", "s3://bucket/labels/labels.parquet"),
                     ("s3://bucket/labels/2026-12-05", "s3://bucket/labels/2026-12-05.parquet")):
        result = _label([files["jsonl"], "--schema", files["schema"], "-o", uri, "--engine", "ray",
                         "--model", tmp_path / "no-model-needed"])
        assert result.exit_code == 2, result.output
        message = " ".join(result.output.split())
        assert f"-o '{uri}': --engine ray writes an output in object storage as one Parquet object" in message
        assert f"name a .parquet key, e.g. '{fix}'" in message

