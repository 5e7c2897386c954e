"""Inputs and outputs where exports land (issue #43 items 5 and 8): local folders, globs, hive
partitions and object-storage URIs through ``pcd_cli.io.storage``, against a real S3 store
(SeaweedFS, the session's ``s3_store``), never a mock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcd_cli.errors import InputError, MachineError
from pcd_cli.io import publishing, storage

ROOT = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> dict[str, bytes]:
    """A nightly export: two hive partitions, part files out of name order, the files a writer
    leaves beside them (``_SUCCESS``, ``.crc``), a file of another kind."""
    files = {}
    for date, parts in (("2026-12-05", {"part-10.parquet": [3, 4], "part-2.parquet": [1, 2]}),
                        ("2026-12-04", {"part-0.parquet": [0]})):
        for name, ids in parts.items():
            sink = pa.BufferOutputStream()
            pq.write_table(pa.table({"id": [f"t{i}" for i in ids], "body": [f"text {i}" for i in ids]}), sink)
            files[f"exports/date={date}/{name}"] = sink.getvalue().to_pybytes()
    files["exports/date=2026-12-05/_SUCCESS"] = b""
    files["exports/date=2026-12-05/.part-2.parquet.crc"] = b"crc"
    files["exports/README.txt"] = b"not data"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


EXPECTED_ORDER = ["exports/date=2026-12-04/part-0.parquet", "exports/date=2026-12-05/part-10.parquet",
                  "exports/date=2026-12-05/part-2.parquet"]


def test_a_folder_lists_its_files_in_path_order_with_their_partitions(tmp_path, monkeypatch):
    _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    listed = storage.list_files("exports", extensions=(".parquet",))
    assert list(listed.files) == EXPECTED_ORDER  # '_SUCCESS', '.crc' and README.txt left out
    assert listed.partitions == ({"date": "2026-12-04"}, {"date": "2026-12-05"}, {"date": "2026-12-05"})
    # the partition of the folder given is the rows' too; file:// names the same files
    one = storage.list_files(f"file://{tmp_path}/exports/date=2026-12-05/", extensions=(".parquet",))
    assert [Path(f).name for f in one.files] == ["part-10.parquet", "part-2.parquet"]
    assert one.partitions == ({"date": "2026-12-05"},) * 2
    assert one.location.local is not None
    # a glob: '**' at any depth, '*' within a name; the order is the folder's
    assert list(storage.list_files("exports/**/*.parquet").files) == EXPECTED_ORDER
    assert list(storage.list_files("exports/date=*/part-1*.parquet").files) == [EXPECTED_ORDER[1]]


def test_nothing_there_is_one_line_naming_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    cases = {"missing": "no such input file, folder or glob", "empty": "(it is empty)",
             "other": "holds no .jsonl, .csv or .parquet file (it holds 1 other file)", "x/*.csv": "no file matches"}
    for target, message in cases.items():
        with pytest.raises(InputError) as err:
            storage.list_files(target, extensions=(".jsonl", ".csv", ".parquet"))
        assert message in str(err.value) and repr(target) in str(err.value)
    with pytest.raises(InputError, match="cannot open this URI"):
        storage.open_location("nosuchscheme://bucket/x")


def test_reuse_messages_name_reuse_not_the_input(tmp_path, monkeypatch):
    """list_files' messages follow its option: --reuse is no input and has no --format."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    cases = {"missing": "--reuse 'missing': no such file, folder or glob",
             "empty": "--reuse 'empty': the folder holds no .parquet file (it is empty); give a .parquet file, "
                      "or a folder or glob of them"}
    for target, message in cases.items():
        with pytest.raises(InputError) as err:
            storage.list_files(target, extensions=(".parquet",), option="--reuse", what=".parquet")
        assert str(err.value) == message
        assert "--format" not in str(err.value) and "input" not in str(err.value)
    with pytest.raises(InputError) as err:  # the input's own wording stays
        storage.list_files("empty", extensions=(".jsonl",))
    assert str(err.value).endswith("(it is empty); give a folder of them, or pass --format")


@pytest.mark.parametrize("typed, meant", [
    ("s3:/pcd-test/exports/", "s3://pcd-test/exports/"), ("gs:/b/x.parquet", "gs://b/x.parquet"),
    ("GCS:/b/x", "GCS://b/x"), ("hdfs:/host/x", "hdfs://host/x"), ("abfs:/c/x", "abfs://c/x"),
    ("file:/tmp/exports", "file:///tmp/exports")])
def test_a_uri_with_one_slash_is_refused_naming_the_uri_meant(typed, meant):
    """Every value is classified by ``uri_scheme`` (inputs, --reuse, -o: is_remote, local_path,
    list_files, canonical), which refuses a known scheme with one slash rather than read it as a
    local folder named ``s3:`` (pyarrow's 'Expected a local filesystem path, got a URI')."""
    message = f"{typed!r} looks like a URI with one slash after {typed.split('/')[0]!r}: did you mean {meant!r}?"
    for classify in (storage.uri_scheme, storage.is_remote, storage.local_path, storage.canonical, storage.list_files):
        with pytest.raises(InputError) as err:
            classify(typed)
        assert str(err.value) == message
    # not a known scheme, a drive letter, a folder named 's3:' below another or reached as ./s3:
    for path in ("C:/data/x.jsonl", "notascheme:/x", "exports/s3:/x", "./s3:/x"):
        assert storage.uri_scheme(path) is None


@pytest.mark.parametrize("option", ["INPUT", "-o", "--reuse"])
def test_pcd_label_refuses_a_one_slash_uri_in_each_place_before_any_model(tmp_path, monkeypatch, option):
    from tests.helpers import AIRLINE, flat, pcd

    monkeypatch.chdir(tmp_path)
    good = tmp_path / "in.jsonl"
    good.write_text('{"id": "a", "text": "fine"}\n')
    typo = "s3:/pcd-test/exports/x.parquet"
    args = {"INPUT": (typo, "-o", "out.parquet"), "-o": (good, "-o", typo),
            "--reuse": (good, "-o", "out.parquet", "--reuse", typo)}[option]
    result = pcd("label", *args, "-s", ROOT / AIRLINE, "--model", tmp_path / "no-model-needed", code=2)
    assert flat(result.stderr) == (f"error: {typo!r} looks like a URI with one slash after 's3:': did you mean "
                                   "'s3://pcd-test/exports/x.parquet'?")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no folder 's3:' made, nothing written


def test_a_staging_folder_is_removed_unless_a_run_there_can_be_resumed(tmp_path):
    staged = publishing.StagedOutput.plan("s3://b/out/2026-12-05.parquet", "s3://b/out/2026-12-05.errors.jsonl",
                                       tmp_path / "outputs")
    staged.clean()  # never made (refused before check_paths): nothing to do
    staged.folder.mkdir(parents=True)
    (staged.folder / publishing.STAGED_TARGETS).write_text("{}")
    work = staged.folder / f".{staged.output.name}.pcd-work"  # a stopped, killed or failed run's checkpoints
    work.mkdir()
    (work / "part-00000.parquet").write_bytes(b"x")
    staged.errors.write_text("{}\n")
    staged.clean()
    assert sorted(p.name for p in staged.folder.iterdir()) == [work.name, staged.errors.name, "publish.json"]
    import shutil

    shutil.rmtree(work)  # uploaded (WorkDir.finish) or nothing to resume (WorkDir.close)
    staged.clean()
    assert not staged.folder.exists() and (tmp_path / "outputs").is_dir()


def test_an_s3_prefix_lists_and_reads_as_the_same_local_folder(tmp_path, monkeypatch, s3_store):
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    files = _tree(tmp_path)
    for rel, data in files.items():
        s3_store.put(f"listing/{rel}", data)
    listed = storage.list_files(f"s3://{s3_store.bucket}/listing/exports/", extensions=(".parquet",))
    assert [listed.name(i) for i in range(len(listed.files))] == \
        [f"s3://{s3_store.bucket}/listing/{f}" for f in EXPECTED_ORDER]
    assert listed.partitions == ({"date": "2026-12-04"}, {"date": "2026-12-05"}, {"date": "2026-12-05"})
    remote = storage.open_dataset(f"s3://{s3_store.bucket}/listing/exports").to_table()
    local = storage.open_dataset(str(tmp_path / "exports")).to_table()
    assert remote.to_pylist() == local.to_pylist()
    assert remote.to_pylist()[:2] == [{"id": "t0", "body": "text 0", "date": "2026-12-04"},
                                      {"id": "t3", "body": "text 3", "date": "2026-12-05"}]
    glob = storage.list_files(f"s3://{s3_store.bucket}/listing/exports/*/part-2.parquet")
    assert glob.files == (f"{s3_store.bucket}/listing/{EXPECTED_ORDER[2]}",)


def test_store_problems_are_one_line_naming_the_uri_and_the_fix(monkeypatch, s3_store):
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    s3_store.put("problems/a.jsonl", b'{"text": "x"}\n')
    bucket = s3_store.bucket

    def refused(target: str, *words: str) -> str:
        with pytest.raises(InputError) as err:
            storage.list_files(target)
        message = str(err.value)
        assert message.startswith(repr(target)) and "\n" not in message, message
        for word in words:
            assert word in message, message
        return message

    refused("s3://no-such-bucket/exports/", "no such bucket 'no-such-bucket'", s3_store.endpoint)
    refused(f"s3://{bucket}/problems/nothing-here/", "no such object or prefix")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    refused(f"s3://{bucket}/problems/", "access denied with the credentials given", "AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    refused(f"s3://{bucket}/problems/", "no AWS credentials were found", "AWS_PROFILE")
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InputError, match="no such bucket"):
        publishing.check_output_uri("s3://no-such-bucket/out/x.parquet")
    publishing.check_output_uri(f"s3://{bucket}/out/x.parquet")
    assert s3_store.keys("out") == []  # the probe of the right to write is gone
    # mid-run, the same failure is the machine's (exit 5) and says --resume
    exc = storage.store_error(OSError("AWS Error NETWORK_CONNECTION during PutObject operation"), "s3://b/x",
                              option="-o", mid_run=True, what="cannot write")
    assert isinstance(exc, MachineError) and "--resume" in str(exc) and "AWS_ENDPOINT_URL" in str(exc)


def test_an_unreachable_endpoint_is_named(monkeypatch, s3_store):
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    from tests.s3_server import free_ports

    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    with pytest.raises(InputError) as err:
        storage.list_files("s3://bucket/exports/")
    assert f"the store at {dead} cannot be reached" in str(err.value)
    assert "check AWS_ENDPOINT_URL" in str(err.value)


def test_an_upload_appears_whole_or_never(tmp_path, s3_store):
    """The uploader reads its source from a pipe; killed (SIGKILL) after sending part of it, it
    leaves no object at the URI, and yesterday's object there stays as it was; the next upload
    replaces it and removes the killed one's temporary key."""
    env = os.environ | s3_store.env
    uri = s3_store.put("atomic/out.parquet", b"yesterday")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = ("import sys; from pathlib import Path; from pcd_cli.io.publishing import upload_atomic; "
            "upload_atomic(Path(sys.argv[1]), sys.argv[2])")
    proc = subprocess.Popen([sys.executable, "-c", code, str(fifo), uri], env=env, cwd=ROOT)
    try:
        with fifo.open("wb") as pipe:
            pipe.write(b"x" * (9 << 20))  # more than the uploader's first read
            pipe.flush()
            time.sleep(1.0)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    except BrokenPipeError:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    fs = s3_store.filesystem()
    with fs.open_input_stream(f"{s3_store.bucket}/atomic/out.parquet") as fh:
        assert fh.read() == b"yesterday"
    source = tmp_path / "today.parquet"
    source.write_bytes(b"today")
    subprocess.run([sys.executable, "-c", code, str(source), uri], env=env, cwd=ROOT, check=True)
    with fs.open_input_stream(f"{s3_store.bucket}/atomic/out.parquet") as fh:
        assert fh.read() == b"today"
    assert s3_store.keys("atomic") == ["atomic/out.parquet"]


def test_a_staged_output_whose_record_vanished_is_not_reported_uploaded(tmp_path):
    """Another run for the same -o, refused before labelling, cleans the staging folder while this
    one labels: publishing must fail (exit 5) rather than return as if there were nothing to upload."""
    from pcd_cli.errors import MachineError
    from pcd_cli.io.publishing import publish_staged

    folder = tmp_path / "outputs" / "0123456789abcdef"
    folder.mkdir(parents=True)
    (folder / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(MachineError, match="staging record .*publish.json is gone"):
        publish_staged(folder / "x.parquet")
    plain = tmp_path / "out" / "x.parquet"
    plain.parent.mkdir()
    plain.write_bytes(b"PAR1")
    assert publish_staged(plain) is None  # a local output: nothing to upload


def test_a_store_failure_is_exit_2_before_the_run_and_exit_5_once_it_started():
    """``store_error`` is a ``StoreError`` (an ``InputError``, exit 2) wherever it is raised;
    inside ``run_started`` (issue #51 item 3) it leaves as a ``MachineError`` (exit 5) with the URI,
    the fix, then the hint, then the store's own words: the local engine's "rerun with --resume",
    Ray's "run the command again". It crosses a process whole (a Ray worker's read)."""
    import pickle

    from pcd_cli.errors import StoreError, exit_code

    cause = OSError("When reading information for key 'x/part-4.parquet' in bucket 'b': AWS Error "
                    "NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to server")
    before = storage.store_error(cause, "s3://b/x/part-4.parquet")
    assert type(before) is StoreError and exit_code(before) == 2
    assert str(before).startswith("'s3://b/x/part-4.parquet': cannot read: the store cannot be reached (When reading")
    for hint, words in ((storage.RESUME_HINT, "then rerun with --resume (the rows finished so far are kept)"),
                        (storage.RERUN_HINT, "then run the command again (a Ray run keeps no checkpoints")):
        with pytest.raises(MachineError) as info:
            with storage.run_started(hint):
                raise pickle.loads(pickle.dumps(before))
        said = str(info.value)
        assert exit_code(info.value) == 5
        assert said.startswith("'s3://b/x/part-4.parquet': cannot read: the store cannot be reached; check "
                               "AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and the network, " + words)
        assert said.endswith("curlCode: 7, Could not connect to server)") and said.count("--resume") == \
            (hint == storage.RESUME_HINT)
    # a mid-run MachineError saying --resume (the upload) reads as Ray says it; other errors pass as they are
    upload = storage.store_error(cause, "s3://b/out.parquet", option="-o", mid_run=True, what="cannot write")
    with pytest.raises(MachineError, match="then run the command again") as info:
        with storage.run_started(storage.RERUN_HINT):
            raise upload
    assert "--resume" not in str(info.value)
    with pytest.raises(InputError, match="not a readable Parquet file"):
        with storage.run_started():
            raise InputError("'x.parquet': not a readable Parquet file")
