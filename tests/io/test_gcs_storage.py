"""``gs://`` inputs, ``--reuse`` and ``-o`` (issue #43 item 5) against a real GCS-compatible store:
fake-gcs-server (``tests/gcs_server.py``), started for this module on 127.0.0.1 with a free port,
reached through pyarrow's own GCS client as a user reaches Google or an emulator (docs/inputs.md):
the standard variables (``CLOUD_STORAGE_EMULATOR_ENDPOINT``, ``GOOGLE_APPLICATION_CREDENTIALS``)
with plain ``gs://bucket/key`` URIs, or the settings in the URI's query
(``gs://anonymous@bucket/key?endpoint_override=HOST:PORT&scheme=http``). The S3 tests
(``tests/io/test_storage.py``, ``tests/engines/test_object_storage.py``) cover the rest of the
object-storage code, which is the same for every scheme; an emulator checks no credentials, so
"access denied" is tested on S3 only."""

from __future__ import annotations

import json
import time

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcd_cli.errors import InputError
from pcd_cli.io import publishing, schemes, storage
from tests import gcs_server
from tests.helpers import AIRLINE, EXPORT_ARGS, EXPORT_DATE, EXPORT_ROWS, export_part, flat, jsonl_rows, pcd
from tests.io.test_storage import EXPECTED_ORDER, _tree

#: The standard variables a test may set; each test states the ones it uses.
GCS_VARIABLES = ("CLOUD_STORAGE_EMULATOR_ENDPOINT", "GOOGLE_APPLICATION_CREDENTIALS")


@pytest.fixture(scope="module")
def gcs_store(tmp_path_factory):
    """fake-gcs-server for this module, stopped after it and checked that nothing is left running."""
    store = gcs_server.start(tmp_path_factory.mktemp("fake-gcs"))
    try:
        yield store
    finally:
        gcs_server.stop(store)
        assert store.process.poll() is not None
        assert not gcs_server.still_listening([store.port]), "fake-gcs-server left its port open"


def _use(monkeypatch, variables: dict[str, str], *, unset: tuple[str, ...] = GCS_VARIABLES) -> None:
    for name in unset:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def test_a_gs_prefix_lists_and_reads_as_the_same_local_folder(tmp_path, monkeypatch, gcs_store):
    files = _tree(tmp_path)
    for rel, data in files.items():
        gcs_store.put(f"listing/{rel}", data)
    local = storage.open_dataset(str(tmp_path / "exports")).to_table().to_pylist()
    bucket = gcs_store.bucket
    # the standard variables, plain URIs; then the settings in the URI and no variable: the same
    for how, target in (("variables", f"gs://{bucket}/listing/exports/"),
                        ("query", gcs_store.uri("listing/exports/"))):
        _use(monkeypatch, gcs_store.env if how == "variables" else gcs_store.isolation)
        listed = storage.list_files(target, extensions=(".parquet",))
        assert [listed.name(i) for i in range(len(listed.files))] == \
            [f"gs://{bucket}/listing/{f}" for f in EXPECTED_ORDER], how  # '_SUCCESS', '.crc', README left out
        assert listed.partitions == ({"date": "2026-12-04"}, {"date": "2026-12-05"}, {"date": "2026-12-05"})
        remote = storage.open_dataset(target).to_table().to_pylist()
        assert remote == local, how
        assert remote[:2] == [{"id": "t0", "body": "text 0", "date": "2026-12-04"},
                              {"id": "t3", "body": "text 3", "date": "2026-12-05"}]
        # glob wildcards are no URI syntax: '?' and '[...]' stay the glob's, the query the store's
        glob = target.replace("exports/", "exports/*/part-?.parquet")
        assert [listed.location.name(f) for f in storage.list_files(glob).files] == \
            [f"gs://{bucket}/listing/{EXPECTED_ORDER[i]}" for i in (0, 2)], how
        assert storage.is_glob(glob) and not storage.is_glob(gcs_store.uri("listing/x.parquet"))
        ranged = target.replace("exports/", "exports/**/part-[01]*.parquet")
        assert storage.list_files(ranged).files == tuple(f"{bucket}/listing/{EXPECTED_ORDER[i]}" for i in (0, 1))


def test_an_upload_to_gs_is_whole_and_its_settings_go_to_its_errors_file(tmp_path, monkeypatch, gcs_store):
    """``upload_atomic`` (a temporary key, then GCS's server-side rewrite) replaces yesterday's
    object, leaves no temporary key, and removes a killed upload's; an output URI's query goes to
    the errors file beside it, which the same run writes to the same store."""
    _use(monkeypatch, gcs_store.env)
    gcs_store.put("atomic/out.parquet", b"yesterday")
    gcs_store.put("atomic/.out.parquet.pcd-upload-0123456789ab", b"a killed upload's part")
    source = tmp_path / "out.parquet"
    source.write_bytes(b"today " * 100_000)
    publishing.upload_atomic(source, f"gs://{gcs_store.bucket}/atomic/out.parquet")
    assert gcs_store.read("atomic/out.parquet") == source.read_bytes()
    assert gcs_store.keys("atomic") == ["atomic/out.parquet"]
    # the settings in the URI, no variable: the errors file is beside it on the same store
    _use(monkeypatch, gcs_store.isolation)
    uri = gcs_store.uri("atomic/night.labels.parquet")
    errors = storage.sibling(uri, "night.errors.jsonl")
    assert errors == gcs_store.uri("atomic/night.errors.jsonl")
    assert storage.uri_name(uri) == "night.labels.parquet"
    staged = publishing.StagedOutput.plan(uri, errors, tmp_path / "staging")
    assert (staged.output.name, staged.errors.name) == ("night.labels.parquet", "night.errors.jsonl")
    publishing.check_output_uri(uri)
    publishing.upload_atomic(source, errors, option="--errors")
    publishing.upload_atomic(source, uri)
    assert gcs_store.keys("atomic") == ["atomic/night.errors.jsonl", "atomic/night.labels.parquet",
                                        "atomic/out.parquet"]


def test_gcs_problems_are_one_line_naming_the_uri_and_the_fix(tmp_path, monkeypatch, gcs_store):
    """No bucket, no prefix, an unreachable endpoint, no credentials, an unreadable key file: each
    one line with the fix, within pcd's retry limit for GCS (the client's own is 15 minutes)."""
    gcs_store.put("problems/a.jsonl", b'{"text": "x"}\n')
    bucket = gcs_store.bucket
    monkeypatch.setattr(schemes, "GCS_RETRY_SECONDS", 1)

    def refused(target: str, *words: str) -> str:
        start = time.monotonic()
        with pytest.raises(InputError) as err:
            storage.list_files(target)
        message = str(err.value)
        assert message.startswith(repr(target)) and "\n" not in message, message
        for word in words:
            assert word in message, message
        assert time.monotonic() - start < 20, message
        return message

    _use(monkeypatch, gcs_store.env)
    refused("gs://no-such-bucket/exports/", "no such bucket 'no-such-bucket' at " + gcs_store.endpoint,
            "CLOUD_STORAGE_EMULATOR_ENDPOINT")
    refused(f"gs://{bucket}/problems/nothing-here/", "no such object or prefix")
    with pytest.raises(InputError, match="no such bucket"):
        publishing.check_output_uri("gs://no-such-bucket/out/x.parquet")
    dead = f"127.0.0.1:{gcs_store.dead_port}"
    elsewhere = f"gs://anonymous@{bucket}/problems/?endpoint_override={dead}&scheme=http"
    # the variable, when set, wins over the URI's endpoint (google-cloud-cpp; docs/inputs.md says so)
    assert storage.list_files(elsewhere).files == (f"{bucket}/problems/a.jsonl",)
    _use(monkeypatch, gcs_store.isolation)
    refused(elsewhere, f"the store at {dead} cannot be reached", "Could not connect", "?endpoint_override=")
    _use(monkeypatch, gcs_store.isolation | {"CLOUD_STORAGE_EMULATOR_ENDPOINT": f"http://{dead}"})
    refused(f"gs://anonymous@{bucket}/problems/", f"the store at http://{dead} cannot be reached")
    # no credentials anywhere (no variable, no gcloud folder, no metadata server)
    _use(monkeypatch, gcs_store.isolation | {"CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs_store.endpoint})
    refused(f"gs://{bucket}/problems/", "no Google credentials were found", "set GOOGLE_APPLICATION_CREDENTIALS",
            "gs://anonymous@bucket/")
    # a key file that is not there: pyarrow raises a bare ArrowException, still one line
    missing = tmp_path / "no-key.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(missing))
    refused(f"gs://{bucket}/problems/", f"GOOGLE_APPLICATION_CREDENTIALS={missing} gave no access token",
            "Cannot open credentials file")
    # pcd's retry limit is the default, a URI's own wins
    assert storage.open_location(f"gs://{bucket}/x").filesystem.__reduce__()[1][0]["retry_time_limit"].seconds == 1
    assert storage.open_location(f"gs://{bucket}/x?retry_limit_seconds=7").filesystem.__reduce__()[1][0][
        "retry_time_limit"].seconds == 7


DATE, ROWS, ARGS, _part = EXPORT_DATE, EXPORT_ROWS, EXPORT_ARGS, export_part  # tests/helpers.py


@pytest.mark.full  # three pcd runs in subprocesses against fake-gcs-server; make test keeps the GCS reads, uploads and errors above
def test_a_gs_partition_labelled_into_gs_equals_the_local_run_and_is_reused(tmp_path, gcs_store):
    """``pcd label gs://.../date=.../ -o gs://...``, then the next night ``--reuse`` of that output
    from the bucket: the local run's rows and errors file; the second run copies every row. The
    first run uses the standard variables, the second the settings in its URIs."""
    files = {f"nightly/exports/date={DATE}/part-{i:05d}.parquet": _part(rows) for i, rows in enumerate(ROWS)}
    files[f"nightly/exports/date={DATE}/_SUCCESS"] = b""
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
        gcs_store.put(rel, data)
    local_out = tmp_path / "local.parquet"
    pcd("label", tmp_path / "nightly" / "exports" / f"date={DATE}", *ARGS, "-o", local_out)
    local = pq.read_table(local_out)
    bucket = gcs_store.bucket
    out = f"gs://{bucket}/nightly/out/{DATE}.parquet"
    pcd("label", f"gs://{bucket}/nightly/exports/date={DATE}/", *ARGS, "-o", out, env=gcs_store.env)
    assert gcs_store.keys("nightly/out") == [f"nightly/out/{DATE}.errors.jsonl", f"nightly/out/{DATE}.parquet"]
    remote = pq.read_table(pa.BufferReader(gcs_store.read(f"nightly/out/{DATE}.parquet")))
    assert remote.column("id").to_pylist() == ["t1", "t2", "t4", "t5"]
    assert remote.to_pylist() == local.to_pylist()  # same values, bit for bit, in the same order
    errors = [orjson.loads(line) for line in gcs_store.read(f"nightly/out/{DATE}.errors.jsonl").splitlines()]
    assert [e["file"] for e in errors] == [f"gs://{bucket}/nightly/exports/date={DATE}/part-00000.parquet"]
    assert [e | {"file": None} for e in errors] == \
        [e | {"file": None} for e in jsonl_rows(tmp_path / "local.errors.jsonl")]
    # the next night: no variable, the store's settings in each URI
    plain = {name: None for name in GCS_VARIABLES}
    done = pcd("label", gcs_store.uri(f"nightly/exports/date={DATE}/"), *ARGS[:-1],
               "--reuse", gcs_store.uri(f"nightly/out/{DATE}.parquet"), "-o", gcs_store.uri("nightly/again/x.parquet"),
               "--log-format", "json", env=gcs_store.isolation | plain)
    event = next(json.loads(line) for line in done.stderr.splitlines() if '"event":"done"' in line.replace(" ", ""))
    assert event["reused"] == 4, event
    assert gcs_store.keys("nightly/again") == ["nightly/again/x.errors.jsonl", "nightly/again/x.parquet"]
    again = pq.read_table(pa.BufferReader(gcs_store.read("nightly/again/x.parquet")))
    assert again.select(local.column_names).to_pylist() == local.to_pylist()
    # a missing bucket is refused before any model loads (no model is there to load)
    refused = pcd("label", f"gs://{bucket}/nightly/exports/", "-s", AIRLINE, "--text-field", "body",
                  "--model", tmp_path / "no-model-needed", "-o", "gs://no-such-bucket/out/x.parquet", code=2,
                  env=gcs_store.env)
    assert "-o 'gs://no-such-bucket/out/x.parquet'" in flat(refused.stderr) and "no such bucket" in refused.stderr

