"""Cron-safe runs (issue #5): truncation, checkpoints and resume, determinism, stop requests.

In-process tests use a tiny random Llama (fast, exact float32); the kill/resume and signal
tests run ``pcd label`` as a real subprocess on the embedded model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcd_cli.api import Labeler
from pcd_cli.engines.checkpoint import work_dir_for
from pcd_cli.decoding.decode import TRUNCATION_MARK
from pcd_cli.results import Record, RecordFailure
from pcd_cli.engines.summary import Resumed
from pcd_cli.errors import Interrupted, TooManyErrors
from pcd_cli.io.readers import InputSpec, read_records
from pcd_cli.engines.local import label_file
from pcd_cli.decoding.oracle import oracle_field
from pcd_cli.schema.load import parse_schema

from ..helpers import ORACLE_SCHEMA, copy_case, pcd, tiny_backend

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "sample_data"
AIRLINE = ROOT / "schemas" / "airline_sentiment.yaml"
SCHEMA = parse_schema(ORACLE_SCHEMA)


@pytest.fixture(scope="module")
def backend():
    return tiny_backend(chat_template=True, seed=3)


def _texts(n: int) -> list[str]:
    rows = [json.loads(line) for line in (DATA / "airline_tweets.jsonl").read_text().splitlines()]
    return [r["text"] for r in rows[:n]]


def _write_input(path: Path, n: int, bad_every: int = 0) -> Path:
    lines = []
    for i, text in enumerate(_texts(n)):
        lines.append("{not json" if bad_every and i % bad_every == bad_every - 1 else
                     json.dumps({"id": f"r{i}", "text": text}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(backend, src: Path, out: Path, **kw):
    labeler_kw = {k: kw.pop(k) for k in ("max_tokens_per_pass", "truncate", "trace") if k in kw}
    labeler = Labeler(SCHEMA, backend=backend, **labeler_kw)
    return label_file(labeler, src, InputSpec(id_field="id"), output=out, errors_path=out.with_suffix(".errors.jsonl"),
                      progress=False, **kw)


def _stop_after_chunks(n: int):
    """A should_stop that turns true after ``n`` chunks (it is polled once before the first)."""
    polls = []
    return lambda: polls.append(1) or len(polls) > n


def _columns(path: Path) -> dict:
    return pq.read_table(path).to_pydict()


# -- truncation -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def short_context_backend():
    be = tiny_backend(chat_template=True, seed=4)
    be.max_positions = 420  # the prompt head and answer take ~300 of these
    return be


LONG = "START " + " ".join(f"word{i}" for i in range(400)) + " END"


@pytest.mark.parametrize("side", ["middle", "head", "tail"])
def test_truncation_keeps_the_named_parts_and_matches_the_oracle(short_context_backend, side):
    be = short_context_backend
    labeler = Labeler(SCHEMA, backend=be, truncate=side, trace=True)
    short, long_ = labeler.label([{"id": "s", "text": "Call me back today please."}, {"id": "l", "text": LONG}])
    assert not short.truncated and long_.truncated
    context = long_.traces[0]["context"]
    kept = context[context.index("START") if "START" in context else 0:]
    assert ("START" in context) == (side != "head")
    assert ("END" in context) == (side != "tail")
    assert (TRUNCATION_MARK.strip() in context) == (side == "middle")
    assert len(be.tokenizer.encode(context)) <= be.max_positions - 10  # room left for the answer lines
    assert len(kept) < len(LONG)
    for fres, trace in zip(long_.fields, long_.traces):  # the cut text is decoded exactly
        field = SCHEMA.fields[SCHEMA.field_index(trace["field"])]
        lines = [(field.labels.index(line["label"]), line["text"]) for line in trace["lines"]]
        probs, mass = oracle_field(be, trace["context"], field, lines, "marginal")
        fres = long_.fields[SCHEMA.field_index(trace["field"])]
        assert np.abs(np.array(fres.probs) - probs).max() < 1e-4 and abs(fres.mass - mass) < 1e-4


def test_truncate_error_fails_the_record_alone(short_context_backend, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "l", "text": LONG}) + "\n" + json.dumps({"id": "s", "text": "hi there"}) + "\n")
    out = tmp_path / "o.parquet"
    stats = _run(short_context_backend, src, out, truncate="error")
    assert (stats.read, stats.records, stats.failures, stats.truncated) == (2, 1, 1, 0)
    errors = [orjson.loads(line) for line in out.with_suffix(".errors.jsonl").read_bytes().splitlines()]
    assert [(e["row"], e["line"], e["record"]) for e in errors] == [(0, 1, "l")]
    assert "too long for the model" in errors[0]["error"] and "--truncate" in errors[0]["error"]
    stats = _run(short_context_backend, src, out)  # default: middle
    assert (stats.records, stats.failures, stats.truncated) == (2, 0, 1)
    assert _columns(out)["__truncated"] == [True, False]
    assert pq.read_schema(out).metadata[b"pcd.records_truncated"] == b"1"


# -- determinism ------------------------------------------------------------------------------

def test_same_job_twice_is_bit_identical_and_budgets_change_only_rounding(backend, tmp_path):
    src = _write_input(tmp_path / "in.jsonl", 30, bad_every=7)
    runs = {}
    for name, kw in {"a": {}, "again": {}, "budget64": {"max_tokens_per_pass": 64},
                     "budget4096": {"max_tokens_per_pass": 4096},
                     "batches": {"batch_records": 5, "chunk_records": 3}}.items():
        out = tmp_path / f"{name}.parquet"
        _run(backend, src, out, **kw)
        runs[name] = _columns(out)
    assert runs["a"] == runs["again"]  # bit-identical, probabilities included
    assert len(runs["a"]["id"]) == 26
    for name in ("budget64", "budget4096", "batches"):
        other = runs[name]
        for col, values in runs["a"].items():
            if col.endswith(("__prob", "__mass")):
                assert np.abs(np.array(values) - np.array(other[col])).max() < 1e-5, (name, col)
            else:
                assert values == other[col], (name, col)


# -- checkpoints, resume, stops ---------------------------------------------------------------

def test_stop_request_commits_and_resume_finishes_identically(backend, tmp_path):
    src = _write_input(tmp_path / "in.jsonl", 20, bad_every=6)
    reference = tmp_path / "ref.parquet"
    _run(backend, src, reference, batch_records=4, chunk_records=4)
    out = tmp_path / "o.parquet"
    polls = []
    with pytest.raises(Interrupted) as info:
        _run(backend, src, out, batch_records=4, chunk_records=4, should_stop=lambda: polls.append(1) or len(polls) >= 3)  # polled once before reading
    assert info.value.stats.read == 8 and info.value.work_dir == work_dir_for(out)
    assert not out.exists() and not out.with_suffix(".errors.jsonl").exists()
    manifest = orjson.loads((work_dir_for(out) / "manifest.json").read_bytes())
    first_8_lines = b"".join(src.read_bytes().splitlines(keepends=True)[:8])
    first = info.value.stats  # what the stopped run cost, all of it committed with its 8 rows
    cost = {k: manifest["progress"].pop(k) for k in ("model_rows", "forward_passes", "seconds")}
    assert cost["model_rows"] == first.model_rows == 7 and cost["forward_passes"] == first.forward_passes > 0
    assert 0 < cost["seconds"] <= first.seconds
    assert manifest["progress"] == {"parts": 2, "rows": 8, "records": 7, "failures": 1, "truncated": 0,
                                    "input_sha256": hashlib.sha256(first_8_lines).hexdigest(),
                                    "reused": 0, "deduplicated": 0, "redo": 0, "partly_reused": 0}
    events = []
    stats = _run(backend, src, out, batch_records=4, chunk_records=4, resume=True,
                 on_event=lambda name, fields: events.append((name, fields.get("rows"))))
    assert events[0] == ("resumed", 8) and events[-1] == ("checkpoint", 20)
    assert (stats.read, stats.records, stats.failures, stats.decoded) == (20, 17, 3, 10)
    # the whole night's cost, not only the part after the resume (issue #51 item 6)
    assert stats.resumed == Resumed(8, 7, cost["forward_passes"], cost["seconds"]) and stats.model_rows == 10
    assert stats.whole_cost() == (17, cost["forward_passes"] + stats.forward_passes, cost["seconds"] + stats.seconds)
    done = stats.to_dict()
    assert done["resumed"] == {"rows": 8, "decoded": 7, "forward_passes": cost["forward_passes"],
                               "seconds": round(cost["seconds"], 3)}
    assert done["whole_run"]["decoded"] == 17 and done["decoded"] == 10
    assert stats.resumed_line().startswith("resumed: 8 rows were done by an earlier run (7 decoded, ")
    assert "the whole run: 17 decoded, " in stats.resumed_line()
    assert _columns(out) == _columns(reference)
    assert out.with_suffix(".errors.jsonl").read_bytes() == reference.with_suffix(".errors.jsonl").read_bytes()
    assert not work_dir_for(out).exists()


def test_slow_rows_are_checkpointed_before_a_batch_fills(backend, tmp_path):
    """Issue #45: a 40-row run of slow records (--batch-size 256) committed nothing for 16 minutes.
    Past ``checkpoint_seconds`` the chunk's rows are committed, whatever --batch-size says; a run
    killed then keeps them, and its resume ends as the uninterrupted run."""
    src = _write_input(tmp_path / "in.jsonl", 40, bad_every=7)
    reference, events = tmp_path / "ref.parquet", []
    _run(backend, src, reference, on_event=lambda name, fields: events.append(fields["rows"]))
    assert events == [40]  # fast rows: one checkpoint at the end, as before

    class Killed(Exception):
        pass

    def killed_after_32(name, fields):
        events.append(fields["rows"])
        if fields["rows"] == 32:
            raise Killed

    events.clear()
    out = tmp_path / "o.parquet"
    with pytest.raises(Killed):  # every chunk (16 rows) is past the time: it is committed
        _run(backend, src, out, checkpoint_seconds=0.0, on_event=killed_after_32)
    assert events == [16, 32]
    assert orjson.loads((work_dir_for(out) / "manifest.json").read_bytes())["progress"]["rows"] == 32
    stats = _run(backend, src, out, resume=True)
    assert (stats.read, stats.failures) == (40, 5)
    assert _columns(out) == _columns(reference)


def test_resume_discards_uncommitted_parts_and_a_changed_job(backend, tmp_path):
    src = _write_input(tmp_path / "in.jsonl", 12)
    out = tmp_path / "o.parquet"
    with pytest.raises(Interrupted):
        _run(backend, src, out, batch_records=4, chunk_records=4, should_stop=_stop_after_chunks(1))
    work = work_dir_for(out)
    # a process killed between writing a part and the manifest leaves files the manifest does not count
    (work / "part-000001.parquet").write_bytes(b"half written")
    (work / "manifest.json.tmp").write_bytes(b"{")
    events = []
    _run(backend, src, out, batch_records=4, chunk_records=4, resume=True,
         on_event=lambda name, fields: events.append(name))
    assert events[0] == "resumed" and pq.read_table(out).num_rows == 12

    with pytest.raises(Interrupted):
        _run(backend, src, out, batch_records=4, chunk_records=4, should_stop=_stop_after_chunks(1))
    reasons = []
    _run(backend, src, out, batch_records=4, chunk_records=4, resume=True, all_probs=True,
         on_event=lambda name, fields: reasons.append(fields.get("reason")))
    assert "different all_probs" in reasons[0] and "starts over" in reasons[0]
    with pytest.raises(Interrupted):
        _run(backend, src, out, batch_records=4, chunk_records=4, should_stop=_stop_after_chunks(1))
    reasons.clear()
    _run(backend, src, out, on_event=lambda name, fields: reasons.append(fields.get("reason")))
    assert "pass --resume" in reasons[0]


def test_max_errors_stops_with_the_errors_so_far_and_resume_continues(backend, tmp_path):
    src = _write_input(tmp_path / "in.jsonl", 24, bad_every=3)  # rows 2, 5, 8, ... are bad
    out = tmp_path / "o.parquet"
    with pytest.raises(TooManyErrors) as info:
        _run(backend, src, out, batch_records=6, chunk_records=6, max_errors=2)
    assert info.value.stats.failures == 4  # checked per chunk: the chunk that crossed the limit is kept
    errors = [orjson.loads(line) for line in out.with_suffix(".errors.jsonl").read_bytes().splitlines()]
    assert [e["line"] for e in errors] == [3, 6, 9, 12]
    assert not out.exists()
    stats = _run(backend, src, out, batch_records=6, chunk_records=6, max_errors=100, resume=True)
    assert (stats.read, stats.records, stats.failures) == (24, 16, 8)
    errors = [orjson.loads(line) for line in out.with_suffix(".errors.jsonl").read_bytes().splitlines()]
    assert [e["row"] for e in errors] == list(range(2, 24, 3))


def test_a_second_run_on_the_same_output_is_refused(backend, tmp_path):
    src = _write_input(tmp_path / "in.jsonl", 4)
    out = tmp_path / "o.parquet"
    from pcd_cli.engines.checkpoint import WorkDir
    from pcd_cli.errors import InputError

    with WorkDir.open(out, {"x": 1}, None, resume=False):
        with pytest.raises(InputError, match="another pcd run is writing"):
            _run(backend, src, out)
    _run(backend, src, out)
    assert pq.read_table(out).num_rows == 4


def test_a_failure_while_taking_the_folder_releases_its_lock(tmp_path, monkeypatch):
    """WorkDir.open fails after taking the lock (the folder's manifest cannot be written): the lock
    file is closed and the next run takes the folder, never "another pcd run is writing"."""
    from pcd_cli.engines import checkpoint
    from pcd_cli.errors import MachineError

    out = tmp_path / "o.parquet"

    def full_disk(*_args, **_kwargs):
        raise MachineError("no space left on device")

    monkeypatch.setattr(checkpoint, "write_atomic", full_disk)
    with pytest.raises(MachineError, match="no space left") as failed:  # its traceback is kept alive below
        checkpoint.WorkDir.open(out, {"x": 1}, None, resume=False)
    monkeypatch.undo()
    with checkpoint.WorkDir.open(out, {"x": 1}, None, resume=False) as work:
        assert work.progress.rows == 0 and failed.value is not None


# -- real processes: SIGKILL and SIGTERM --------------------------------------------------------

def _pcd(*args) -> list[str]:
    return [sys.executable, "-m", "pcd_cli.cli", "label", *map(str, args)]


def _wait_for_parts(work: Path, parts: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if orjson.loads((work / "manifest.json").read_bytes())["progress"]["parts"] >= parts:
                return
        except (OSError, orjson.JSONDecodeError, KeyError):
            pass
        if proc.poll() is not None:
            pytest.fail(f"pcd ended early: {proc.returncode}\n{proc.stderr.read()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("no checkpoint appeared in time")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    src = tmp / "tweets.jsonl"
    lines = (DATA / "airline_tweets.jsonl").read_text().splitlines()[:40]
    lines[5] = "{broken"
    src.write_text("\n".join(lines) + "\n")
    out = tmp / "ref.parquet"
    _cli(src, "-s", AIRLINE, "--id-field", "id", "-o", out, "--batch-size", 8, "-q", code=0)  # in process: no import
    return src, out


@pytest.mark.parametrize("how", ["SIGKILL", pytest.param("SIGTERM", marks=pytest.mark.full)])
def test_killed_run_resumes_to_exactly_the_uninterrupted_output(tmp_path, uninterrupted, how):
    src, reference = uninterrupted
    out = tmp_path / "o.parquet"
    args = (src, "-s", AIRLINE, "--id-field", "id", "-o", out, "--batch-size", 8)
    proc = subprocess.Popen(_pcd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    work = work_dir_for(out)
    _wait_for_parts(work, 2, proc)
    os.kill(proc.pid, getattr(signal, how))
    _, stderr = proc.communicate(timeout=120)
    assert not out.exists()
    if how == "SIGKILL":
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 130
        assert "--resume" in stderr and str(work.name) in " ".join(stderr.split()).replace(" ", "")
    done = orjson.loads((work / "manifest.json").read_bytes())["progress"]["rows"]
    assert 16 <= done < 40
    result = subprocess.run(_pcd(*args, "--resume", "--log-format", "json"), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert events[0]["event"] == "resumed" and events[0]["rows"] == done
    finished = [e for e in events if e["event"] == "done"]
    after = events[events.index(finished[0]) + 1:]
    assert len(finished) == 1 and after and {e["event"] for e in after} == {"warning"}  # e.g. the one-label rule
    assert any("1 rows failed" in e["message"] for e in after), after
    assert (finished[0]["read"], finished[0]["labelled"], finished[0]["failed"]) == (40, 39, 1)
    assert pq.read_table(out).to_pydict() == pq.read_table(reference).to_pydict()  # bit-identical
    assert not work.exists()


# -- for cron: quiet, JSON logs, no bar off a terminal, early failures ----------------------------

def _cli(*args, code: int):
    return pcd("label", *args, code=code)


@pytest.mark.full  # about 45 s of pcd runs; test_quiet_json_log_keeps_the_done_summary stays in make test
def test_quiet_json_logs_and_progress_bar(tmp_path):
    src = DATA / "airline_tweets.jsonl"
    base = (src, "-s", AIRLINE, "--limit", 3)
    quiet = _cli(*base, "-o", tmp_path / "q.parquet", "-q", code=0)
    assert quiet.stdout == "" and quiet.stderr == ""
    plain = _cli(*base, "-o", tmp_path / "p.parquet", code=0)  # stderr is not a terminal here: no bar
    assert "rec/s" not in plain.stderr and "wrote 3 rows" in plain.stdout
    forced = _cli(*base, "-o", tmp_path / "f.parquet", "--progress", code=0)
    assert "rec/s" in forced.stderr
    logged = _cli(*base, "-o", tmp_path / "j.parquet", "--log-format", "json", code=0)
    assert logged.stdout == ""
    events = [json.loads(line) for line in logged.stderr.splitlines()]
    assert [e["event"] for e in events] == ["checkpoint", "done"]
    assert (events[0]["rows"], events[0]["records"], events[0]["failures"]) == (3, 3, 0)
    done = events[1]
    assert set(done) >= {"time", "level", "event", "output", "read", "labelled", "failed", "truncated", "fields"}
    assert (done["read"], done["labelled"], done["failed"]) == (3, 3, 0)
    assert sum(done["fields"]["sentiment"]["labels"].values()) == 3
    for name in ("q", "p", "f", "j"):
        assert pq.read_table(tmp_path / f"{name}.parquet").num_rows == 3


def test_quiet_json_log_keeps_the_done_summary(tmp_path):
    """Issue #45: ``--quiet --log-format json`` dropped the ``done`` event, the one machine-readable
    summary; quiet drops the info events (checkpoints) only."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "great flight"}\nnot json\n{"id": "b", "text": "lost my bag"}\n')
    result = _cli(src, "-s", AIRLINE, "-o", tmp_path / "o.parquet", "-q", "--log-format", "json", code=0)
    assert result.stdout == ""
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(e["event"], e["level"]) for e in events] == [("done", "info"), ("warning", "warning")]
    assert (events[0]["read"], events[0]["labelled"], events[0]["failed"]) == (3, 2, 1)
    assert events[0]["output"] == str(tmp_path / "o.parquet") and "1 rows failed" in events[1]["message"]


def test_schema_and_model_problems_fail_before_any_record_is_read(tmp_path, monkeypatch):
    import pcd_cli.engines.local

    def no_reading(*args, **kwargs):
        raise AssertionError("the input was read")

    monkeypatch.setattr(pcd_cli.engines.local, "RecordReader", no_reading)
    src = DATA / "airline_tweets.jsonl"
    out = tmp_path / "o.parquet"
    result = _cli(src, "-s", AIRLINE, "-o", out, "--model", tmp_path / "no-such-model", code=3)
    assert "no-such-model" in " ".join(result.stderr.split())
    bad = tmp_path / "bad.yaml"
    bad.write_text("fields:\n  x: {type: enum, labels: [A]}\n")
    result = _cli(src, "-s", bad, "-o", out, "--log-format", "json", code=2)
    event = json.loads(result.stderr.splitlines()[-1])
    assert event["level"] == "error" and "at least two labels" in event["message"]
    assert list(tmp_path.iterdir()) == [bad]


# -- readers never crash and account for every line (property-based) ----------------------------
# derandomize: CI sees the same examples on every run; to explore more, drop it and pass --hypothesis-seed=N.
PROPERTY = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])


CELL = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters='",\r\n\x0b\x0c\x1c\x1d\x1e'
                                                                                        '\x85\u2028\u2029'),
               max_size=12)
RAW = st.binary(max_size=40).map(lambda b: b.replace(b'"', b"").replace(b",", b"").replace(b"\r", b"")
                                 .replace(b"\n", b""))


def _items(path: Path, spec: InputSpec) -> list:
    return [item for batch in read_records(path, spec, batch_size=3) for item in batch]


@settings(max_examples=150, **PROPERTY)
@given(st.lists(st.binary(max_size=60), max_size=12), st.booleans())
def test_jsonl_reader_accounts_for_every_nonblank_line(tmp_path, lines, bom):
    data = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(line.replace(b"\n", b"") for line in lines)
    path = tmp_path / "r.jsonl"
    path.write_bytes(data)
    items = _items(path, InputSpec(id_field="id"))
    physical = data.split(b"\n") if data else []
    if physical and physical[0].startswith(b"\xef\xbb\xbf"):  # a byte order mark is not content
        physical[0] = physical[0][3:]
    nonblank = [n for n, line in enumerate(physical, start=1) if line.strip()]
    assert [item.line for item in items] == nonblank
    assert [item.row for item in items] == list(range(len(items)))
    assert all(isinstance(item, (Record, RecordFailure)) for item in items)


@settings(max_examples=150, **PROPERTY)
@given(st.lists(st.lists(st.one_of(CELL.map(str.encode), RAW), min_size=1, max_size=4), max_size=10))
def test_csv_reader_gives_one_item_per_nonblank_line(tmp_path, rows):
    lines = [b",".join(cells) for cells in rows]
    path = tmp_path / "r.csv"
    path.write_bytes(b"id,text\n" + b"\n".join(lines))
    items = _items(path, InputSpec(id_field="id"))
    nonblank = [n for n, line in enumerate(lines, start=2) if line != b""]
    assert [item.line for item in items] == nonblank
    assert [item.row for item in items] == list(range(len(items)))
    for item, n in zip(items, nonblank):
        cells = lines[n - 2].split(b",")
        if isinstance(item, Record):
            assert len(cells) == 2 and item.id == cells[0].decode() and item.text == cells[1].decode().strip()
        else:
            assert (len(cells) != 2 or not cells[0] or not cells[1].decode("utf-8", "replace").strip()
                    or _invalid_utf8(b",".join(cells))), (lines[n - 2], item)


def _invalid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@settings(max_examples=100, **PROPERTY)
@given(st.binary(max_size=200))
def test_csv_reader_never_crashes_on_random_bytes(tmp_path, data):
    path = tmp_path / "r.csv"
    path.write_bytes(b"id,text\n" + data)
    items = _items(path, InputSpec(id_field="id"))
    lines = [item.line for item in items]
    assert lines == sorted(set(lines)) and all(2 <= n <= data.count(b"\n") + data.count(b"\r") + 2 for n in lines)
    assert [item.row for item in items] == list(range(len(items)))


# -- found by trying to break it ------------------------------------------------------------------

def test_resume_past_max_errors_stops_again_without_decoding(backend, tmp_path):
    src = _write_input(tmp_path / "in.jsonl", 12, bad_every=2)
    out = tmp_path / "o.parquet"
    with pytest.raises(TooManyErrors):
        _run(backend, src, out, batch_records=12, chunk_records=12, max_errors=2)
    with pytest.raises(TooManyErrors) as info:  # a cron retry with the same limit must not pass
        _run(backend, src, out, batch_records=12, chunk_records=12, max_errors=2, resume=True)
    assert info.value.stats.failures == 6 and info.value.stats.decoded == 0 and not out.exists()


def test_an_earlier_runs_files_survive_until_the_new_output_is_complete(backend, tmp_path):
    src = _write_input(tmp_path / "in.jsonl", 6, bad_every=3)
    out = tmp_path / "o.parquet"
    _run(backend, src, out)
    errors = out.with_suffix(".errors.jsonl")
    before = (out.read_bytes(), errors.read_bytes())
    with pytest.raises(Interrupted):
        _run(backend, src, out, batch_records=2, chunk_records=2, should_stop=_stop_after_chunks(1))
    assert (out.read_bytes(), errors.read_bytes()) == before
    from pcd_cli.errors import NothingLabelled

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "x", "text": ""}\n')  # (a typo in the key's name is refused before: exit 2)
    with pytest.raises(NothingLabelled):  # a run where every row fails keeps the earlier good output
        _run(backend, broken, out)
    assert out.read_bytes() == before[0] and not work_dir_for(out).exists()
    assert orjson.loads(errors.read_bytes())["record"] == "x"
    clean = _write_input(tmp_path / "clean.jsonl", 4)
    _run(backend, clean, out)
    assert not errors.exists()  # the finished run had no failures: the old errors file is gone


@pytest.mark.parametrize("option", ["errors_path", "trace_path", "output"])
def test_outputs_that_would_overwrite_the_input_are_refused(backend, tmp_path, option):
    from pcd_cli.errors import InputError

    src = _write_input(tmp_path / "in.jsonl", 3)
    kw = {"output": tmp_path / "o.parquet", "errors_path": tmp_path / "e.jsonl", option: src}
    labeler = Labeler(SCHEMA, backend=backend)
    with pytest.raises(InputError, match="is the input file"):
        label_file(labeler, src, InputSpec(id_field="id"), progress=False, **kw)
    assert src.read_text().count("\n") == 3


@pytest.mark.parametrize("id_field, clash", [("urgent__prob", "'urgent__prob' of field 'urgent' clashes with the id"),
                                             ("__truncated", "'__truncated' clashes with pcd's output column"),
                                             ("tool__mass", "'tool__mass' of field 'tool' clashes with the id")])
def test_id_column_clashing_with_an_output_column_is_refused(id_field, clash):
    from pcd_cli.errors import SchemaError
    from pcd_cli.io.output import check_columns

    with pytest.raises(SchemaError, match=clash):
        check_columns(SCHEMA, id_field)
    check_columns(SCHEMA, "id")
    truncated = parse_schema({"fields": {"__truncated": {"type": "boolean"}, "x": {"type": "boolean"}}})
    with pytest.raises(SchemaError, match="clashes with pcd's truncation column"):
        check_columns(truncated, "row")


def test_id_column_named_like_a_probs_column_without_all_probs(backend, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"urgent__probs": "a", "text": "call me"}) + "\n")
    out = tmp_path / "o.parquet"
    labeler = Labeler(SCHEMA, backend=backend)
    label_file(labeler, src, InputSpec(id_field="urgent__probs"), output=out, errors_path=tmp_path / "e.jsonl",
               progress=False)
    assert pq.read_table(out).column("urgent__probs").to_pylist() == ["a"]


def test_unwritable_folders_are_refused_up_front(tmp_path):
    from pcd_cli.errors import InputError
    from pcd_cli.engines.local import check_paths

    src = _write_input(tmp_path / "in.jsonl", 1)
    with pytest.raises(InputError, match="--errors '/proc/e.jsonl': cannot write in its folder"):
        check_paths(src, tmp_path / "o.parquet", Path("/proc/e.jsonl"), None)
    with pytest.raises(InputError, match="--trace '/dev/null/t.jsonl': cannot create its folder"):
        check_paths(src, tmp_path / "o.parquet", tmp_path / "e.jsonl", Path("/dev/null/t.jsonl"))
    check_paths(src, tmp_path / "o.parquet", tmp_path / "e.jsonl", tmp_path / "sub" / "t.jsonl")
    assert (tmp_path / "sub").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "sub"]


def test_a_prompt_that_fills_the_context_fails_before_any_record(short_context_backend):
    from pcd_cli.errors import CompileError

    wordy = parse_schema({"fields": {"spam": {"type": "boolean", "description": "word " * 400}}})
    with pytest.raises(CompileError, match="leaving no room for any text"):
        Labeler(wordy, backend=short_context_backend)


def test_stray_temp_files_of_a_killed_assembly_are_removed(tmp_path):
    from pcd_cli.engines.checkpoint import WorkDir

    stray = tmp_path / ".o.parquet.abc123.tmp"
    stray.write_bytes(b"half a parquet")
    other = tmp_path / ".other.parquet.x.tmp"
    other.write_bytes(b"not ours")
    with WorkDir.open(tmp_path / "o.parquet", {"x": 1}, None, resume=True):
        pass
    assert not stray.exists() and other.exists()


def test_cli_all_rows_failing_and_empty_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "  "}\nnot json\n')
    result = _cli(bad, "-s", AIRLINE, "-o", tmp_path / "o.parquet", "-q", code=1)
    assert "no row could be labelled: all 2 failed" in result.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    result = _cli(empty, "-s", AIRLINE, "-o", tmp_path / "e.parquet", "-q", code=0)
    assert "has no rows" in result.stderr and pq.read_table(tmp_path / "e.parquet").num_rows == 0


def test_resume_with_another_batch_size_is_bit_identical(backend, tmp_path):
    """Chunks (packing neighbours) are counted from row 0 and not tied to --batch-size; a run
    that dies mid-chunk re-decodes that chunk's committed part on resume and drops it."""
    src = _write_input(tmp_path / "in.jsonl", 20, bad_every=6)
    reference = tmp_path / "ref.parquet"
    _run(backend, src, reference, batch_records=5, chunk_records=8)
    other = tmp_path / "other.parquet"
    _run(backend, src, other, batch_records=3, chunk_records=8)
    assert _columns(other) == _columns(reference)  # bit-identical, probabilities included

    class Crash(Exception):
        pass

    def crash_at_5(name, fields):
        if name == "checkpoint" and fields["rows"] == 5:
            raise Crash  # dies after the first checkpoint, in the middle of chunk 0..7

    out = tmp_path / "o.parquet"
    with pytest.raises(Crash):
        _run(backend, src, out, batch_records=5, chunk_records=8, on_event=crash_at_5)
    manifest = orjson.loads((work_dir_for(out) / "manifest.json").read_bytes())
    assert manifest["progress"]["rows"] == 5
    stats = _run(backend, src, out, batch_records=3, chunk_records=8, resume=True)
    assert stats.read == 20
    assert _columns(out) == _columns(reference)


# -- case resume-after-input-edited of the cases of tests/data/cases-round2/ (issue #12; formerly
# tests/test_cases_round2_inputs.py)
@pytest.mark.parametrize("edited", ["input.same_size_edit.jsonl",
                                    pytest.param("input.rows_inserted.jsonl", marks=pytest.mark.full)])  # 25 s each
def test_resume_after_input_edited(tmp_path, edited):
    case = copy_case("resume-after-input-edited", tmp_path)
    src, out = case / "input.jsonl", case / "B.parquet"
    args = (src, "-s", case / "schema.yaml", "--id-field", "id", "-o", out, "--batch-size", 1)
    pcd("label", *args, "--max-errors", 0, code=1)  # e3 is broken: the run stops after the chunk holding it
    manifest = orjson.loads((case / ".B.parquet.pcd-work" / "manifest.json").read_bytes())
    done = manifest["progress"]["rows"]  # the chunk in flight (16 rows, not tied to --batch-size) is committed
    assert done >= 3 and manifest["progress"]["failures"] >= 1
    stat = src.stat()
    shutil.copyfile(case / edited, src)  # the export is rewritten ...
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ... with its mtime kept (cp -p, rsync -t)
    resumed = pcd("label", *args, "--resume", "--log-format", "json")
    events = [json.loads(line) for line in resumed.stderr.splitlines()]
    assert events[0]["event"] == "discarded"
    assert f"the input's first {done} rows are not those the unfinished run labelled" in events[0]["reason"]
    assert f"{done} rows were discarded and the run starts over" in events[0]["reason"]
    assert "resumed" not in [e["event"] for e in events]
    fresh = case / "fresh.parquet"
    pcd("label", case / edited, "-s", case / "schema.yaml", "--id-field", "id", "-o", fresh, "--batch-size", 1)
    assert pq.read_table(out).to_pydict() == pq.read_table(fresh).to_pydict()  # no stale label spliced in
