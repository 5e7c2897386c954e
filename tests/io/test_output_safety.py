"""Issue #20, the machine's side of a cron job: outputs that are symlinks, full disks and other
environment failures (exit 5, nothing half-written, ``--resume`` completes), every check that
needs no model before the model loads (lock, encoding, output folder, empty input), pipes
closed by their reader, and NaN literals. In-process runs use a tiny random Llama; the CLI
checks run ``pcd`` with the embedded model only where the model must not load.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from pcd_cli.api import Labeler
from pcd_cli.engines.checkpoint import work_dir_for
from pcd_cli.cli import EXIT_BROKEN_PIPE, EXIT_MACHINE
from pcd_cli.errors import InputError, MachineError
from pcd_cli.io.files import AtomicFile, check_writable, clear_stale, write_atomic, write_target
from pcd_cli.io.readers import InputSpec, RecordReader, check_input
from pcd_cli.engines.local import label_file
from pcd_cli.quality.calibration import Calibration
from pcd_cli.schema.load import parse_schema

from ..helpers import CASES, ORACLE_SCHEMA, label_case, pcd, tiny_backend

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = parse_schema(ORACLE_SCHEMA)
SCHEMA_FILE = ROOT / "schemas" / "airline_sentiment.yaml"
SPEC = InputSpec(id_field="id")


@pytest.fixture(scope="module")
def labeler():
    return Labeler(SCHEMA, backend=tiny_backend(chat_template=True, seed=5))


def _input(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "text": f"message number {i}"}) + "\n" for i in range(n)))
    return path


def _ids(path: Path) -> list:
    return pq.read_table(path).column("id").to_pylist()


def _pcd(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcd_cli.cli", *map(str, args)], capture_output=True, text=True, **kw)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


# --- symlinks: written through, atomically, the link kept ---------------------------------------------------


def test_symlinked_output_and_errors_are_written_through_and_the_links_stay(labeler, tmp_path):
    shared, job = tmp_path / "shared", tmp_path / "job"
    shared.mkdir(), job.mkdir()
    src = _input(tmp_path / "in.jsonl", 3)
    label_file(labeler, _input(tmp_path / "old.jsonl", 1), SPEC, output=shared / "labels.parquet",
               errors_path=shared / "errors.jsonl")
    (shared / "errors.jsonl").write_text('{"row": 0, "error": "yesterday"}\n')
    (job / "latest.parquet").symlink_to("../shared/labels.parquet")
    (job / "latest.errors.jsonl").symlink_to("../shared/errors.jsonl")
    label_file(labeler, src, SPEC, output=job / "latest.parquet", errors_path=job / "latest.errors.jsonl")
    assert (job / "latest.parquet").is_symlink() and (job / "latest.errors.jsonl").is_symlink()
    assert _ids(shared / "labels.parquet") == ["r0", "r1", "r2"]  # what the dashboard reads is today's
    assert (shared / "errors.jsonl").read_bytes() == b""  # no failures today: the target is emptied, kept
    assert _leftovers(tmp_path) == []


def test_every_writer_goes_through_a_link_a_chain_and_a_dangling_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "a").symlink_to(tmp_path / "real" / "calib.json")  # dangling: the target does not exist yet
    (tmp_path / "b").symlink_to(tmp_path / "a")  # a chain of two links
    assert write_target(tmp_path / "b") == (tmp_path / "real" / "calib.json").resolve()
    write_atomic(tmp_path / "b", b"one")
    assert (tmp_path / "b").is_symlink() and (tmp_path / "a").is_symlink()
    assert (tmp_path / "real" / "calib.json").read_bytes() == b"one"
    calibration = Calibration("0", "m", "s", "h", "marginal", {})
    calibration.save(tmp_path / "b")
    assert (tmp_path / "real" / "calib.json").read_bytes() == calibration.to_json()
    clear_stale(tmp_path / "b")  # a symlink is emptied at its target, not removed
    assert (tmp_path / "b").is_symlink() and (tmp_path / "real" / "calib.json").read_bytes() == b""
    (tmp_path / "plain").write_text("old errors")
    clear_stale(tmp_path / "plain")  # a regular file is removed
    assert not (tmp_path / "plain").exists()


def test_eval_json_and_plots_follow_symlinks(tmp_path):
    pytest.importorskip("matplotlib")
    from pcd_cli.quality.plots import _save
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (tmp_path / "site").mkdir()
    (tmp_path / "plot.png").symlink_to(tmp_path / "site" / "today.png")
    fig = plt.figure()
    _save(plt, fig, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").is_symlink()
    assert (tmp_path / "site" / "today.png").read_bytes()[:4] == b"\x89PNG"
    from pcd_cli.console import write_json

    (tmp_path / "report.json").symlink_to(tmp_path / "site" / "report.json")
    write_json(tmp_path / "report.json", {"accuracy": 0.5})
    assert json.loads((tmp_path / "site" / "report.json").read_text()) == {"accuracy": 0.5}
    assert (tmp_path / "report.json").is_symlink()


# --- the environment: exit 5, nothing half-written, resume completes --------------------------------------


def test_an_os_error_while_writing_leaves_nothing_and_names_the_path(tmp_path, monkeypatch):
    (tmp_path / "out.json").write_bytes(b"yesterday")
    real_replace = os.replace

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(MachineError, match=r"'.*out\.json': cannot write \(No space left on device\)"):
        write_atomic(tmp_path / "out.json", b"today")
    monkeypatch.setattr(os, "replace", real_replace)
    assert (tmp_path / "out.json").read_bytes() == b"yesterday"
    assert _leftovers(tmp_path) == []
    dest = AtomicFile(tmp_path / "x.parquet")
    dest.abort()
    assert _leftovers(tmp_path) == []


def _fill_limited(tmp_path: Path, limit_kib: int, *extra) -> subprocess.CompletedProcess:
    """``pcd label`` under ``ulimit -f`` (files above the limit fail with EFBIG: Python ignores
    SIGXFSZ), the unprivileged way to make a write fail for real."""
    cmd = " ".join(f"'{a}'" for a in [sys.executable, "-m", "pcd_cli.cli", "label", *map(str, extra)])
    return subprocess.run(["bash", "-c", f"ulimit -f {limit_kib}; exec {cmd}"], capture_output=True, text=True,
                          cwd=tmp_path)


@pytest.mark.full  # make test fills a real tmpfs (test_a_disk_that_really_fills_up...) where it runs as root
def test_a_file_too_large_exits_5_and_keeps_yesterdays_output(tmp_path):
    rows = [{"id": f"r{i}", "text": "the flight was late again and the crew was rude " * 8 + str(i)} for i in range(12)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "out.parquet").write_bytes(b"yesterday's labels")
    # the trace holds each row's text: one part (4 rows, ~5 KiB) fits in 8 KiB, the whole (~16 KiB) does not
    result = _fill_limited(tmp_path, 8, "in.jsonl", "-s", SCHEMA_FILE, "--id-field", "id", "-o", "out.parquet",
                           "--batch-size", 4, "--trace", "trace.jsonl", "-q")
    assert result.returncode == EXIT_MACHINE, result.stderr
    assert result.stderr.strip() == "error: 'trace.jsonl': cannot write (File too large)"
    assert (tmp_path / "out.parquet").read_bytes() == b"yesterday's labels"
    assert _leftovers(tmp_path) == [] and not (tmp_path / "trace.jsonl").exists()
    assert len(list(work_dir_for(tmp_path / "out.parquet").glob("part-*.parquet"))) == 3  # kept for --resume


needs_mount = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                                 reason="mounting a small tmpfs needs root")


@needs_mount
def test_a_disk_that_really_fills_up_exits_5_and_resume_completes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)]).returncode:
        pytest.skip("this machine refuses a tmpfs mount")
    try:
        _input(tmp_path / "in.jsonl", 48)
        (disk / "out.parquet").write_bytes(b"yesterday")
        (disk / "filler").write_bytes(b"\0" * (64 - 16) * 1024)  # 16 KiB left
        args = [tmp_path / "in.jsonl", "-s", SCHEMA_FILE, "--id-field", "id", "-o", disk / "out.parquet",
                "--batch-size", 16, "-q"]
        result = _pcd("label", *args)
        assert result.returncode == EXIT_MACHINE, result.stderr
        assert "No space left on device" in result.stderr and str(disk) in result.stderr
        assert (disk / "out.parquet").read_bytes() == b"yesterday"
        assert _leftovers(disk) == []
        (disk / "filler").unlink()
        resumed = _pcd("label", *args, "--resume")
        assert resumed.returncode == 0, resumed.stderr
        assert _ids(disk / "out.parquet") == [f"r{i}" for i in range(48)]
    finally:
        subprocess.run(["umount", str(disk)])


@needs_mount
@pytest.mark.parametrize("option", ["-o", "--errors", "--trace"])
def test_a_read_only_folder_is_refused_before_the_model_loads(tmp_path, option):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=16k", "tmpfs", str(ro)]).returncode:
        pytest.skip("this machine refuses a tmpfs mount")
    try:
        paths = {"-o": tmp_path / "o.parquet", "--errors": tmp_path / "o.errors.jsonl", "--trace": None}
        paths[option] = ro / "file"
        extra = [a for k, v in paths.items() if v is not None for a in (k, v)]
        code, out, seconds = _quick_label(_input(tmp_path / "in.jsonl", 2), "-s", SCHEMA_FILE, *extra)
        assert code == 2 and f"{option} '{ro / 'file'}': cannot write in its folder (Read-only file system)" in out
        assert seconds < 5 and not work_dir_for(tmp_path / "o.parquet").exists()
    finally:
        subprocess.run(["umount", str(ro)])


# --- every check that needs no model, before the model loads ----------------------------------------------


def _quick_label(*args) -> tuple[int, str, float]:
    started = time.perf_counter()
    result = pcd("label", *args, code=None)
    return result.exit_code, " ".join(result.output.split()), time.perf_counter() - started


@pytest.mark.parametrize("encoding, name", [("utf-16", "UTF-16 (little-endian)"), ("utf-16-be", "UTF-16 (big-endian) "
                                            "without a byte order mark"), ("utf-32", "UTF-32 (little-endian)")])
@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_wide_encoding_is_refused_before_the_model_loads(tmp_path, encoding, name, suffix):
    body = ('{"id": "a", "text": "hello there"}\n' if suffix == ".jsonl" else "id,text\na,hello there\n")
    src = tmp_path / f"in{suffix}"
    src.write_bytes(body.encode(encoding))
    code, out, seconds = _quick_label(src, "-s", SCHEMA_FILE, "--id-field", "id", "-o", tmp_path / "o.parquet")
    assert code == 2 and f"is {name}; pcd reads UTF-8" in out and "iconv -f UTF-" in out
    assert seconds < 5 and not (tmp_path / "o.parquet").exists()


def test_nul_padding_and_blank_lines_are_not_rows(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"id": "a", "text": "hi"}\n\n  \n{"id": "b", "text": "yo"}\n' + b"\0" * 500)
    (tmp_path / "a.csv").write_bytes(b"id,text\na,hi\n\nb,yo\n" + b"\0" * 500)
    for name in ("a.jsonl", "a.csv"):
        items = [i for batch in RecordReader(tmp_path / name, SPEC) for i in batch]
        assert [(type(i).__name__, i.id) for i in items] == [("Record", "a"), ("Record", "b")]


def test_a_locked_output_is_refused_before_the_model_loads(tmp_path):
    work = work_dir_for(tmp_path / "o.parquet")
    work.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(work / "lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, out, seconds = _quick_label(_input(tmp_path / "in.jsonl", 2), "-s", SCHEMA_FILE, "--id-field", "id",
                                          "-o", tmp_path / "o.parquet", "--resume")
        assert code == 2 and "another pcd run is writing" in out and seconds < 5
        assert (work / "lock").exists()  # the live run's folder is untouched
    finally:
        holder.kill()
        holder.wait()
    code, out, _ = _quick_label(tmp_path / "in.jsonl", "-s", SCHEMA_FILE, "--id-field", "id",
                                "-o", tmp_path / "x" / "y.parquet", "--dtype", "nonsense")
    assert code == 2  # the lock of a dead process is not held (the kernel released it)


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\0" * 64])
def test_an_empty_input_writes_an_empty_output_without_loading_a_model(tmp_path, content):
    (tmp_path / "in.jsonl").write_bytes(content)
    (tmp_path / "o.errors.jsonl").write_text("yesterday's errors\n")
    code, out, seconds = _quick_label(tmp_path / "in.jsonl", "-s", SCHEMA_FILE, "--id-field", "id",
                                      "-o", tmp_path / "o.parquet", "--model", tmp_path / "no-such-model.gguf")
    assert code == 0, out
    assert "has no rows; wrote an empty" in out and seconds < 5
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.num_rows == 0 and table.column_names[:3] == ["id", "sentiment", "sentiment__prob"]
    assert b"not loaded" in table.schema.metadata[b"pcd.model"]
    assert not (tmp_path / "o.errors.jsonl").exists()


def test_a_missing_output_folder_is_created_and_said(tmp_path):
    assert check_writable("-o", tmp_path / "a" / "b" / "o.parquet") == tmp_path / "a"
    assert (tmp_path / "a" / "b").is_dir()
    assert check_writable("-o", tmp_path / "a" / "b" / "p.parquet") is None
    (tmp_path / "in.jsonl").write_bytes(b"")
    code, out, _ = _quick_label(tmp_path / "in.jsonl", "-s", SCHEMA_FILE, "-o", tmp_path / "new" / "o.parquet")
    assert code == 0 and f"created folder {str(tmp_path / 'new')!r}" in out
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match=r"--errors '.*file/e.jsonl': cannot create its folder \(.+\)"):
        check_writable("--errors", tmp_path / "file" / "e.jsonl")


# --- pipes and NaN ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["label", "--help"], ["--help"], ["eval", "--help"]])
def test_a_pipe_closed_by_its_reader_ends_quietly(args):
    shell = f"'{sys.executable}' -m pcd_cli.cli {' '.join(args)} | head -c 10 > /dev/null; echo ${{PIPESTATUS[0]}}"
    result = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"})
    assert result.stderr == ""  # no "internal error", no traceback, no "Exception ignored"
    assert int(result.stdout) in (0, EXIT_BROKEN_PIPE, 1)


def test_nan_literals_fail_the_row_only_where_pcd_reads_them(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "fine", "score": NaN, "rank": -Infinity}\n'
                                       '{"id": "b", "text": NaN}\n{"id": Infinity, "text": "x"}\n'
                                       '{"id": "c", "text": NaN, oops}\n')
    items = [i for batch in RecordReader(tmp_path / "in.jsonl", SPEC) for i in batch]
    assert type(items[0]).__name__ == "Record" and items[0].text == "fine"
    assert "text field 'text' is NaN (a NaN or Infinity literal" in items[1].error
    assert "id field 'id' is Infinity" in items[2].error or "'id' is Infinity" in items[2].error
    assert "not valid JSON" in items[3].error
    assert check_input(tmp_path / "in.jsonl", SPEC) is True


# -- case neg-inf-logprob-json of tests/data/cases.jsonl (schema and label cases from public bug
# reports of similar tools; formerly tests/test_cases.py)
def test_trace_and_results_are_strict_json(embedded_backend):
    _, _, result = label_case(embedded_backend, CASES["neg-inf-logprob-json"])
    for trace in result.traces:
        text = orjson.dumps(trace).decode()
        json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert all(np.isfinite(result.fields[0].probs))
