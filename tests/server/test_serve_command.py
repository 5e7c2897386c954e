"""The ``pcd serve`` command (issue #27 items 1 and 6): its exits before anything is served, the
schema and key options, and one real run on the embedded model ended by SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pcd_cli.cli import app
from pcd_cli.errors import InputError
from pcd_cli.server.command import api_keys, calibrations, is_loopback, schema_sources

ROOT = Path(__file__).resolve().parents[2]
SMS = str(ROOT / "schemas" / "sms_spam.yaml")


def test_without_the_serve_extra_it_exits_3_with_the_pip_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn now raises ImportError
    result = CliRunner().invoke(app, ["serve", "--schema", f"sms={SMS}"])
    assert result.exit_code == 3
    assert "pip install 'pcd-cli[serve]'" in result.output


def test_a_public_host_without_a_key_exits_2(monkeypatch):
    monkeypatch.delenv("PCD_API_KEY", raising=False)
    result = CliRunner().invoke(app, ["serve", "--schema", f"sms={SMS}", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "--allow-public-without-key" in result.output and "--api-key" in result.output


def test_bad_schema_options_exit_2(tmp_path):
    for args, words in [(["--schema", str(tmp_path / "none.yaml")], "no such file or folder"),
                        (["--schema", f"a={SMS}", "--schema", f"a={SMS}"], "given twice"),
                        (["--schema", str(tmp_path)], "holds no .yaml"),
                        (["--schema", f"sms={SMS}", "--calibration", f"other={SMS}"], "no served schema")]:
        result = CliRunner().invoke(app, ["serve", *args])
        assert result.exit_code == 2, (args, result.output)
        assert words in result.output, (args, result.output)


def test_schema_sources_names_and_folders(tmp_path):
    (tmp_path / "a.yaml").write_text(Path(SMS).read_text())
    (tmp_path / "b.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("x")
    assert schema_sources([str(tmp_path), f"sms={SMS}"]) == {"a": tmp_path / "a.yaml", "b": tmp_path / "b.json",
                                                             "sms": Path(SMS)}
    assert schema_sources([SMS]) == {"sms_spam": Path(SMS)}
    assert calibrations([SMS], ["only"]) == {"only": SMS}
    with pytest.raises(InputError, match="several schemas"):
        calibrations([SMS], ["a", "b"])


def test_api_keys_from_options_file_and_environment(tmp_path, monkeypatch):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nk-file-1\n\n  k-file-2  \n")
    monkeypatch.setenv("PCD_API_KEY", "k-env")
    assert api_keys(["k-opt", "k-file-1"], keys) == ("k-opt", "k-file-1", "k-file-2", "k-env")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(InputError, match="holds no key"):
        api_keys([], tmp_path / "empty")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")


def test_pcd_serve_on_the_embedded_model_answers_and_drains_on_sigterm():
    httpx = pytest.importorskip("httpx")
    proc = subprocess.Popen([sys.executable, "-m", "pcd_cli.cli", "serve", "--schema", f"sms={SMS}", "--port", "0",
                             "--device", "cpu"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        found = None
        while found is None:
            line = proc.stderr.readline()
            assert line, "pcd serve ended before listening"
            found = re.search(r"listening on http://127.0.0.1:(\d+)", line)
        port = int(found.group(1))
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/health", timeout=30).status_code == 200  # bound before the model loads
        end = time.monotonic() + 120
        while httpx.get(url + "/ready", timeout=30).status_code != 200:
            assert time.monotonic() < end and proc.poll() is None
            time.sleep(0.2)
        r = httpx.post(url + "/v1/label", json={"schema": "sms", "records": ["WIN a FREE prize now, call 0800"]},
                       timeout=60)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = proc.stderr.read()
    assert r.status_code == 200 and r.json()["rows"][0]["row"] == 0
    assert code == 0, log
    assert "prize" not in log  # record text never logged


def test_server_log_lines_go_to_the_current_stderr_never_a_closed_one(monkeypatch):
    """The server's log handler writes to whatever sys.stderr is at the time: after the stream it
    started with is closed (a test runner's capture, a swapped daemon stream) a line is written to
    the new one, with no "--- Logging error ---"."""
    import io
    import logging

    from pcd_cli.server.command import _logging

    for name in ("pcd.server", "uvicorn.error"):  # restored after the test, as the other tests left them
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "propagate", logger.propagate)
        monkeypatch.setattr(logger, "level", logger.level)
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    _logging(quiet=False)
    logging.getLogger("pcd.server").warning("one")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("pcd.server").warning("two")
    assert second.getvalue().rstrip().endswith("WARNING pcd.server: two")
    assert "Logging error" not in second.getvalue()
