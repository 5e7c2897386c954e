"""``pcd label`` where nightly exports land (issue #43 items 5, 6 and 8): a hive-partitioned
Parquet export read from S3 and the output written back there, against a real S3 store
(SeaweedFS, the session's ``s3_store``), compared with the same run on local disk; the store's
problems said before a model loads; an output in object storage whole or never, resumable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from tests.helpers import (AIRLINE, EXPORT_ARGS, EXPORT_DATE, EXPORT_ROWS, export_part, flat, jsonl_rows, pcd,
                           trace_contexts)

ROOT = Path(__file__).resolve().parents[2]
DATE, ROWS, ARGS, _part = EXPORT_DATE, EXPORT_ROWS, EXPORT_ARGS, export_part  # tests/helpers.py


def _export(root: Path | None, store, prefix: str) -> None:
    """The same nightly export on local disk under ``root`` and in the store under ``prefix``: two
    part files of one partition, and the marker file a writer leaves."""
    files = {f"exports/date={DATE}/part-{i:05d}.parquet": _part(rows) for i, rows in enumerate(ROWS)}
    files[f"exports/date={DATE}/_SUCCESS"] = b""
    for rel, data in files.items():
        if root is not None:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        store.put(f"{prefix}/{rel}", data)


def _read(store, key: str) -> bytes:
    with store.filesystem().open_input_stream(f"{store.bucket}/{key}") as fh:
        return fh.read()


def _table(data: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(data))


def _staging(uri: str) -> Path:
    """The local engine's staging folder of an ``-o`` URI (``StagedOutput``, in the suite's cache)."""
    import hashlib

    return Path(os.environ["XDG_CACHE_HOME"]) / "pcd" / "outputs" / hashlib.sha256(uri.encode()).hexdigest()[:16]


def test_an_s3_partition_labelled_into_s3_equals_the_local_run(tmp_path, monkeypatch, s3_store):
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    _export(tmp_path, s3_store, "nightly")
    local_out = tmp_path / "local.parquet"
    pcd("label", tmp_path / "exports" / f"date={DATE}", *ARGS, "-o", local_out, "--trace", tmp_path / "trace.jsonl")
    # the partition folder's value is a column of every row: the template put it in the text
    assert trace_contexts(tmp_path / "trace.jsonl")["t1"].count(f"{DATE}: The crew were lovely") == 1
    uri = f"s3://{s3_store.bucket}/nightly/out/{DATE}.parquet"
    pcd("label", f"s3://{s3_store.bucket}/nightly/exports/date={DATE}/", *ARGS, "-o", uri)
    assert s3_store.keys("nightly/out") == [f"nightly/out/{DATE}.errors.jsonl", f"nightly/out/{DATE}.parquet"]
    assert not _staging(uri).exists()  # uploaded: nothing of the run kept (one URI a night piles up no folders)
    remote, local = _table(_read(s3_store, f"nightly/out/{DATE}.parquet")), pq.read_table(local_out)
    assert remote.column_names == local.column_names and remote.num_rows == 4
    assert remote.to_pylist() == local.to_pylist()  # same values, bit for bit, in the same order
    assert remote.column("id").to_pylist() == ["t1", "t2", "t4", "t5"]
    meta = remote.schema.metadata
    assert {k: v for k, v in meta.items() if b"created" not in k and b"pcd.input" not in k} == \
        {k: v for k, v in local.schema.metadata.items() if b"created" not in k and b"pcd.input" not in k}
    # what was read, whole: the URI (not only 'date=...'), its files in order, the partition (issue #51 item 6)
    prefix = f"s3://{s3_store.bucket}/nightly/exports/date={DATE}"
    assert meta[b"pcd.input"].decode() == prefix
    assert json.loads(meta[b"pcd.input_files"]) == [f"{prefix}/part-0000{i}.parquet" for i in range(2)]
    assert json.loads(meta[b"pcd.input_partitions"]) == {"date": [DATE]}
    local_meta = local.schema.metadata
    assert local_meta[b"pcd.input"].decode() == str((tmp_path / "exports" / f"date={DATE}").resolve())
    assert local_meta[b"pcd.input_partitions"] == meta[b"pcd.input_partitions"]
    errors = [orjson.loads(line) for line in _read(s3_store, f"nightly/out/{DATE}.errors.jsonl").splitlines()]
    local_errors = jsonl_rows(tmp_path / "local.errors.jsonl")
    assert [e["file"] for e in errors] == [f"s3://{s3_store.bucket}/nightly/exports/date={DATE}/part-00000.parquet"]
    assert [e | {"file": None} for e in errors] == [e | {"file": None} for e in local_errors]
    assert errors[0]["record"] == "t3" and "'body'" in errors[0]["error"]
    # the next night reuses that output from the bucket: every row copied, none decoded, same values
    again = f"s3://{s3_store.bucket}/nightly/out/{DATE}.again.parquet"
    done = pcd("label", f"s3://{s3_store.bucket}/nightly/exports/date={DATE}/", *ARGS[:-1], "--reuse", uri,
               "-o", again, "--log-format", "json")
    event = next(json.loads(line) for line in done.stderr.splitlines() if '"event":"done"' in line.replace(" ", ""))
    assert event["reused"] == 4, event
    assert _table(_read(s3_store, f"nightly/out/{DATE}.again.parquet")).select(local.column_names).to_pylist() \
        == local.to_pylist()
    assert not _staging(again).exists()


def test_store_problems_exit_2_naming_the_uri_before_a_model_loads(tmp_path, s3_store):
    env = dict(s3_store.env)
    bucket = s3_store.bucket
    _export(None, s3_store, "problems")
    s3_store.put(f"problems/exports/date={DATE}/part-00002.parquet", b"not parquet at all")
    s3_store.put("problems/empty/_SUCCESS", b"")
    good = tmp_path / "in.jsonl"
    good.write_text('{"id": "a", "body": "fine"}\n')
    cases = [
        ((f"s3://{bucket}/problems/exports/date={DATE}/", "-o", tmp_path / "o.parquet"), env,
         [f"s3://{bucket}/problems/exports/date={DATE}/part-00002.parquet", "not a readable Parquet file"]),
        ((f"s3://{bucket}/problems/empty/", "-o", tmp_path / "o.parquet"), env,
         ["the folder holds no", "(it holds 1 other file)"]),
        (("s3://no-such-bucket/exports/", "-o", tmp_path / "o.parquet"), env,
         ["'s3://no-such-bucket/exports/'", "no such bucket 'no-such-bucket'"]),
        ((f"s3://{bucket}/problems/exports/", "-o", tmp_path / "o.parquet"),
         env | {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None},
         ["no AWS credentials were found", "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"]),
        ((good, "-o", "s3://no-such-bucket/out/x.parquet"), env,
         ["-o 's3://no-such-bucket/out/x.parquet'", "no such bucket"]),
        ((good, "-o", f"s3://{bucket}/problems/out/x.parquet"), env | {"AWS_SECRET_ACCESS_KEY": "wrong"},
         ["access denied with the credentials given"]),
        ((f"s3://{bucket}/problems/exports/",), env, ["name the output with -o"]),
        ((good, "-o", f"s3://{bucket}/problems/out/y.parquet", "--reuse", tmp_path / "empty"), env,
         [f"--reuse '{tmp_path / 'empty'}': the folder holds no .parquet file (it is empty); give a .parquet "
          "file, or a folder or glob of them"]),
        ((good, "-o", f"s3://{bucket}/problems/out/y.parquet", "--reuse", tmp_path / "missing"), env,
         [f"--reuse '{tmp_path / 'missing'}': no such file, folder or glob"]),
    ]
    (tmp_path / "empty").mkdir()
    for args, case_env, words in cases:
        result = pcd("label", *args, "-s", AIRLINE, "--text-field", "body", "--model", tmp_path / "no-model-needed",
                     code=2, env=case_env)
        message = flat(result.stderr)
        assert message.startswith("error:") and "Traceback" not in result.stderr, result.stderr
        for word in words:
            assert word in message, (args, message)
        if "--reuse" in map(str, args):
            assert "--format" not in message and "input" not in message, message
    assert s3_store.keys("problems/out") == []
    # refused before labelling: no staging folder left behind (not even an empty one)
    for uri in ("s3://no-such-bucket/out/x.parquet", f"s3://{bucket}/problems/out/x.parquet",
                f"s3://{bucket}/problems/out/y.parquet"):
        assert not _staging(uri).exists(), uri


def _events(proc: subprocess.Popen, until: str, timeout: float = 300.0) -> list[dict]:
    """JSON log events of a running pcd until one named ``until`` (the process keeps running)."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        try:
            seen.append(json.loads(line))
        except ValueError:
            continue
        if seen[-1].get("event") == until:
            return seen
    raise AssertionError(f"no {until!r} event; saw {seen}")


class _Proxy:
    """A TCP proxy on 127.0.0.1 to the store, that can be cut (a store's endpoint going away)."""

    def __init__(self, target_port: int):
        import socket
        import threading

        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.open: list = []
        self.cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self.cut.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        import socket

        self.cut.set()
        for s in [self.server, *self.open]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@pytest.mark.full  # four runs of the model, three in subprocesses (~2-4 min here); make test keeps the run above
def test_a_killed_run_leaves_no_object_and_a_failed_upload_resumes(tmp_path, s3_store):
    """SIGKILL mid-run leaves no object at the URI (and no temporary key beside it); the store's
    endpoint going away before the upload exits 5 saying --resume; --resume then uploads exactly
    what the uninterrupted local run wrote."""
    src = ROOT / "sample_data" / "airline_tweets.jsonl"
    reference = tmp_path / "reference.parquet"
    base = (src, "-s", AIRLINE, "--id-field", "id", "--limit", 40, "--batch-size", 8)
    pcd("label", *base, "-o", reference, "-q")
    fs = s3_store.filesystem()
    uri = f"s3://{s3_store.bucket}/killed/labels/today.parquet"
    proxy = _Proxy(int(s3_store.endpoint.rsplit(":", 1)[1]))
    env = os.environ | s3_store.env | {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
    cmd = [sys.executable, "-m", "pcd_cli.cli", "label", *map(str, base), "-o", uri, "--log-format", "json"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        _events(proc, "checkpoint")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    assert s3_store.keys("killed") == []  # no object, no temporary key
    work = _staging(uri) / ".today.parquet.pcd-work"
    assert (_staging(uri) / "publish.json").is_file() and work.is_dir()  # kept: --resume continues from it
    resumed = subprocess.Popen(cmd + ["--resume"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        _events(resumed, "resumed")
        proxy.close()  # the endpoint goes away: the run's one write, the upload at the end, fails
        _, stderr = resumed.communicate(timeout=300)
    finally:
        if resumed.poll() is None:
            resumed.kill()
            resumed.wait()
    assert resumed.returncode == 5, stderr
    error = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")][-1]
    message = error["message"]  # the first write of the finish names its URI: the errors file's (none to upload here)
    assert "'s3://pcd-test/killed/labels/today." in message and "cannot be reached" in message, message
    assert "rerun with --resume" in message
    assert s3_store.keys("killed") == []
    assert (_staging(uri) / "publish.json").is_file() and work.is_dir()  # the failed upload: kept for --resume
    done = pcd("label", *base, "-o", uri, "--resume", "--log-format", "json", env=s3_store.env)
    assert any(json.loads(line).get("event") == "resumed" for line in done.stderr.splitlines() if line.startswith("{"))
    assert s3_store.keys("killed") == ["killed/labels/today.parquet"]
    assert not _staging(uri).exists()  # uploaded at last: the staging folder goes
    with fs.open_input_stream(f"{s3_store.bucket}/killed/labels/today.parquet") as fh:
        assert _table(fh.read()).to_pylist() == pq.read_table(reference).to_pylist()


@pytest.fixture(scope="module")
def ray_with_store(tmp_path_factory, s3_store):
    """A local Ray for this module whose workers reach the session's S3 store (its AWS variables in
    their environment, as a cluster's nodes have their own credentials), stopped at its end."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    cache = tmp_path_factory.mktemp("ray-workers-cache")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"XDG_CACHE_HOME": str(cache), **s3_store.env}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny random model saved to a folder every Ray worker loads by itself, and the oracle schema."""
    from tests.helpers import ORACLE_SCHEMA, tiny_backend

    root = tmp_path_factory.mktemp("tiny")
    backend = tiny_backend(chat_template=True)
    backend.model.save_pretrained(root / "model")
    backend.tokenizer._tok.save_pretrained(root / "model")
    (root / "oracle.json").write_text(json.dumps(ORACLE_SCHEMA))
    return root / "model", root / "oracle.json"


@pytest.mark.full  # Ray and a real S3 server: make test keeps the local S3 run and the Ray S3 output below
def test_ray_reads_the_s3_partition_as_the_local_engine_does(ray_with_store, tiny, tmp_path, monkeypatch, s3_store):
    """--engine ray over the same URI: the same files in the same order, the partition column in
    the template, the same rows, values and errors as the local engine (the tiny model)."""
    from tests.engines.test_ray_engine import _label, assert_same

    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    _export(None, s3_store, "ray")
    source = f"s3://{s3_store.bucket}/ray/exports/date={DATE}/"
    model, schema = tiny
    common = [source, "--schema", schema, "--model", model, "--device", "cpu", "--id-field", "id",
              "--template", "{date}: {body}", "--no-progress"]
    local = _label([*common, "-o", tmp_path / "local.parquet"])
    assert local.exit_code == 0, local.output
    ray = _label([*common, "-o", tmp_path / "ray.parquet", "--engine", "ray", "--batch-size", 2])
    assert ray.exit_code == 0, ray.output
    assert_same(pq.read_table(tmp_path / "local.parquet"), pq.read_table(tmp_path / "ray.parquet"))
    assert jsonl_rows(tmp_path / "ray.errors.jsonl") == jsonl_rows(tmp_path / "local.errors.jsonl")
    refused = _label([*common, "-o", f"s3://{s3_store.bucket}/ray/out", "--engine", "ray"])  # a prefix, not an object
    assert refused.exit_code == 2 and f"name a .parquet key, e.g. 's3://{s3_store.bucket}/ray/out.parquet'" \
        in flat(refused.output)
    assert s3_store.keys("ray/out") == []


@pytest.mark.full  # 80 s here: Ray and a real S3 server; make test keeps the local S3 run, the store faults and exit 5
def test_ray_writes_an_s3_output_whole_as_the_local_engine(ray_with_store, tiny, tmp_path, monkeypatch, s3_store,
                                                           suite_cache):
    """Issue #43 items 5-6, the done-when line on ``--engine ray``: an S3 partition labelled into
    ``-o s3://.../<date>.parquet`` is one Parquet object equal to the local engine's output of the
    same partition (rows, order, values to 1e-5, columns, metadata: pcd.*, pcd.job_parts,
    ``__input_sha256``), its errors file beside it equal to the local one; yesterday's object and
    a killed upload's temporary key are replaced, no temporary key or staged file is left. A store
    that refuses the upload is exit 5 saying to run again (Ray has no --resume), the object of the
    run before left as it was; past --max-errors only the errors file is uploaded (exit 1); a
    missing bucket is exit 2 before any model loads."""
    import hashlib

    import pcd_cli.engines.ray_engine as ray_engine
    from tests.engines.test_ray_engine import _label, assert_same

    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    _export(None, s3_store, "rayout")
    model, schema = tiny
    common = [f"s3://{s3_store.bucket}/rayout/exports/date={DATE}/", "--schema", schema, "--model", model, "--device",
              "cpu", "--id-field", "id", "--template", "{date}: {body}", "--no-progress", "--all-probs"]
    local = _label([*common, "-o", tmp_path / "local.parquet"])
    assert local.exit_code == 0, local.output
    uri = f"s3://{s3_store.bucket}/rayout/out/{DATE}.parquet"
    s3_store.put(f"rayout/out/{DATE}.parquet", b"yesterday's object")
    s3_store.put(f"rayout/out/.{DATE}.parquet.pcd-upload-killed0001", b"half an upload")  # an upload killed earlier
    ray = _label([*common, "-o", uri, "--engine", "ray", "--workers", 2, "--batch-size", 2])
    assert ray.exit_code == 0, ray.output
    assert "5 rows read: 4 records labelled, 1 failed" in flat(ray.output)
    assert f"see s3://{s3_store.bucket}/rayout/out/{DATE}.errors.jsonl" in flat(ray.output)
    assert s3_store.keys("rayout/out") == [f"rayout/out/{DATE}.errors.jsonl", f"rayout/out/{DATE}.parquet"]
    data = _read(s3_store, f"rayout/out/{DATE}.parquet")
    want, got = pq.read_table(tmp_path / "local.parquet"), _table(data)
    assert got.column("id").to_pylist() == ["t1", "t2", "t4", "t5"]
    assert_same(want, got)  # rows, order, values (1e-5), columns, types, metadata (all but pcd.created_utc)
    assert "__input_sha256" in got.column_names and b"pcd.job_parts" in got.schema.metadata
    assert got.column("__input_sha256").to_pylist() == want.column("__input_sha256").to_pylist()
    errors = [orjson.loads(line) for line in _read(s3_store, f"rayout/out/{DATE}.errors.jsonl").splitlines()]
    assert errors == jsonl_rows(tmp_path / "local.errors.jsonl") and errors[0]["record"] == "t3"
    staging = suite_cache / "pcd" / "outputs" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    assert not staging.exists()  # nothing staged kept, the folder neither: Ray has no --resume

    # the store refuses the upload (the driver's credentials revoked once the labelling is done:
    # a real refusal by the store): exit 5, run again, the run before's objects as they were
    real = ray_engine.publish_staged

    def revoked(*args, **kwargs):
        os.environ["AWS_SECRET_ACCESS_KEY"] = "revoked"
        return real(*args, **kwargs)

    monkeypatch.setattr(ray_engine, "publish_staged", revoked)
    failed = _label([*common, "-o", uri, "--engine", "ray", "--batch-size", 2])
    monkeypatch.setattr(ray_engine, "publish_staged", real)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_store.env["AWS_SECRET_ACCESS_KEY"])
    assert failed.exit_code == 5, failed.output
    said = flat(failed.output)
    assert f"--errors 's3://{s3_store.bucket}/rayout/out/{DATE}.errors.jsonl': cannot write: access denied" in said
    assert "then run the command again" in said and "--resume" not in said
    assert s3_store.keys("rayout/out") == [f"rayout/out/{DATE}.errors.jsonl", f"rayout/out/{DATE}.parquet"]
    assert _read(s3_store, f"rayout/out/{DATE}.parquet") == data
    assert not staging.exists()  # a failed upload on Ray: nothing kept (no --resume)

    # more failures than --max-errors: exit 1, the errors file uploaded (it says why), the output not
    s3_store.filesystem().delete_file(f"{s3_store.bucket}/rayout/out/{DATE}.errors.jsonl")
    stopped = _label([*common, "-o", uri, "--engine", "ray", "--max-errors", 0])
    assert stopped.exit_code == 1, stopped.output
    assert f"they are in s3://{s3_store.bucket}/rayout/out/{DATE}.errors.jsonl" in flat(stopped.output)
    assert [orjson.loads(line) for line in _read(s3_store, f"rayout/out/{DATE}.errors.jsonl").splitlines()] == errors
    assert _read(s3_store, f"rayout/out/{DATE}.parquet") == data
    assert s3_store.keys("rayout/out") == [f"rayout/out/{DATE}.errors.jsonl", f"rayout/out/{DATE}.parquet"]
    assert not staging.exists()

    # a bucket that does not exist: exit 2 before Ray or a model (there is none at --model)
    missing = _label([*common[:3], "--model", tmp_path / "no-model", "--id-field", "id", "--engine", "ray",
                      "-o", "s3://no-such-bucket/out/labels.parquet"])
    assert missing.exit_code == 2, missing.output
    said = flat(missing.output)
    assert "-o 's3://no-such-bucket/out/labels.parquet'" in said and "no such bucket 'no-such-bucket'" in said


@pytest.mark.parametrize("lost", [pytest.param("after the model loaded", marks=pytest.mark.full),  # 20 s each
                                  "after the first checkpoint"])
def test_a_store_lost_after_the_run_started_is_exit_5_saying_resume(tmp_path, monkeypatch, lost):
    """The store itself goes away mid-run (its own SeaweedFS, stopped by pid; issue #51 item 3):
    right after the model loaded (the input is listed next) or after the first checkpoint (a later
    part is read next). Either way: exit 5, one line naming the URI, "cannot be reached" and
    "then rerun with --resume", the JSON error event carrying exit_code 5; never exit 2. The store
    back on the same data, --resume finishes the run with every row once, in listing order."""
    from pcd_cli.engines import checkpoint, local
    from tests import s3_server
    from tests.helpers import ORACLE_SCHEMA, save_tiny_model

    model, schema = tmp_path / "model", tmp_path / "oracle.json"
    save_tiny_model(model, seed=1)
    schema.write_text(json.dumps(ORACLE_SCHEMA))
    store = s3_server.start(tmp_path / "seaweedfs")
    try:
        for p in range(8):  # 8 parts of 5 rows: the first chunk (16 rows) reads parts 0 to 3
            store.put(f"lost/exports/part-{p}.parquet",
                      export_part([{"id": f"p{p}-{i}", "body": f"flight {p}{i} was late"} for i in range(5)]))
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        if lost == "after the model loaded":
            built = local.build_labeler

            def build_then_lose(*a, **k):
                labeler = built(*a, **k)
                s3_server.stop(store)
                return labeler

            monkeypatch.setattr(local, "build_labeler", build_then_lose)
        else:
            commit = checkpoint.WorkDir.commit

            def commit_then_lose(self, *a, **k):
                commit(self, *a, **k)
                s3_server.stop(store)

            monkeypatch.setattr(checkpoint.WorkDir, "commit", commit_then_lose)
        uri = f"s3://{store.bucket}/lost/exports/"
        args = ("label", uri, "-s", schema, "--model", model, "--id-field", "id", "--text-field", "body",
                "--batch-size", 5, "-o", tmp_path / "out.parquet", "--log-format", "json")
        result = pcd(*args, code=5)
        error = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")][-1]
        assert (error["level"], error["event"], error["exit_code"]) == ("error", "error", 5), error
        # the listing, or the part after the first chunk; what to do within the first 200 characters
        part = uri if lost == "after the model loaded" else f"{uri}part-4.parquet"
        assert error["message"].startswith(f"'{part}': cannot ")
        assert ("cannot be reached; check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and the network, then rerun "
                "with --resume (the rows finished so far are kept) (") in error["message"][:240]
        monkeypatch.undo()
        store = s3_server.start(tmp_path / "seaweedfs")  # back, on the same data
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        resumed = pcd(*args, "--resume", "--batch-size", 5)
        events = [json.loads(line) for line in resumed.stderr.splitlines() if line.startswith("{")]
        done = [e for e in events if e["event"] == "resumed"]  # the first chunk's 3 checkpoints were kept
        assert [e["rows"] for e in done] == ([] if lost == "after the model loaded" else [15])
    finally:
        s3_server.stop(store)
    ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
    assert ids == [f"p{p}-{i}" for p in range(8) for i in range(5)]
