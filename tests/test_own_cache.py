"""The suite runs with a home and cache of its own (issue #45 kind 5): after ``pcd bench`` measured
bfloat16 faster on the machine (``~/.cache/pcd/dtype-speed.json``), ``make test`` failed two tests
of tests/engines/test_cron_safe_runs.py on an extra ``note`` event. The user's home here is a
folder of this test's (``HOME``), never the real one."""

from __future__ import annotations

import json
from pathlib import Path

from .helpers import own_cache, pcd

ROOT = Path(__file__).resolve().parents[1]
AIRLINE = ROOT / "schemas" / "airline_sentiment.yaml"
TWEETS = ROOT / "sample_data" / "airline_tweets.jsonl"


def _events(out: Path) -> list[str]:
    result = pcd("label", TWEETS, "-s", AIRLINE, "--limit", 2, "-o", out, "--log-format", "json")
    return [json.loads(line)["event"] for line in result.stderr.splitlines()]


def test_a_measurement_in_the_users_cache_changes_no_run_of_the_suite(tmp_path, monkeypatch, suite_cache,
                                                                      embedded_backend):
    import pcd_cli.backends.dtype_speed as dtype_speed

    monkeypatch.setattr(dtype_speed, "cpu_has_bfloat16", lambda: True)  # whatever this CPU has
    # A user's machine: ~/.cache/pcd holds the converted model and pcd bench's measurement.
    home = tmp_path / "user"
    (home / ".cache" / "pcd").mkdir(parents=True)
    (home / ".cache" / "pcd" / "models").symlink_to(suite_cache / "pcd" / "models")
    planted = home / ".cache" / "pcd" / "dtype-speed.json"
    planted.write_text(json.dumps({embedded_backend.model_id: {
        "speedup": 1.8, "labels_equal": 9, "decisions": 10, "max_abs_dprob": 0.05,
        "schema": "airline_sentiment", "records": 10, "measured_at": "2026-12-01T00:00:00+00:00"}}))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME")
    # Outside the suite's isolation, pcd reads it (the file is where the user's would be) ...
    assert _events(tmp_path / "user.parquet") == ["checkpoint", "done", "note"]
    # ... inside it, the run is the one of a machine without history, and the user's file is untouched.
    for name, value in own_cache(tmp_path / "suite").items():
        monkeypatch.setenv(name, value)
    assert _events(tmp_path / "suite.parquet") == ["checkpoint", "done"]
    assert not (tmp_path / "suite" / "cache" / "pcd" / "dtype-speed.json").exists()
    assert json.loads(planted.read_text())[embedded_backend.model_id]["speedup"] == 1.8
    # The converted model files are the user's (linked, not converted again), and ~/.cache is the suite's.
    assert (tmp_path / "suite" / "cache" / "pcd" / "models").resolve() == (home / ".cache" / "pcd" / "models").resolve()
    assert (tmp_path / "suite" / "home" / ".cache").resolve() == (tmp_path / "suite" / "cache").resolve()


def test_the_suite_itself_runs_on_its_own_cache(suite_cache):
    from pcd_cli.backends.torch_backend import cache_dir

    assert cache_dir() == suite_cache / "pcd"
    assert Path("~/.cache").expanduser().resolve() == suite_cache.resolve()
    assert not (cache_dir() / "dtype-speed.json").exists()
