"""The nightly crontab line of docs/labelling.md works as a new user pastes it (issue #51 item 6).

Cron runs the line's command with ``/bin/sh``, ``PATH=/usr/bin:/bin``, ``HOME``, ``LOGNAME`` and
``SHELL``, and nothing else of the user's setup: a bare ``pcd`` was exit 127 there. The test takes
the line from the docs, puts ``/srv/tickets`` in a temporary folder (its ``.venv`` the venv running
the tests), and runs the command under ``env -i`` with only what cron sets, twice: the first night
(``--reuse`` left out, as the docs say) and the second night as written, which reuses every row.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
SRV = "/srv/tickets"
#: What cron gives a job (cron(8)): no variable of the user's shell.
CRON_PATH = "/usr/bin:/bin"


def _crontab_lines() -> list[str]:
    text = (ROOT / "docs" / "labelling.md").read_text()
    return [line for line in re.findall(r"^0 2 \* \* \* .*$", text, flags=re.M)]


def _cron(command: str, home: str) -> subprocess.CompletedProcess:
    """``command`` as cron runs it: ``/bin/sh -c`` under ``env -i`` with cron's variables only."""
    return subprocess.run(["env", "-i", f"HOME={home}", "LOGNAME=pcd", "SHELL=/bin/sh", f"PATH={CRON_PATH}",
                           "/bin/sh", "-c", command], capture_output=True, text=True, timeout=600)


def test_the_docs_crontab_lines_name_the_venv_the_store_settings_and_a_log():
    local, bucket = _crontab_lines()
    for line in (local, bucket):
        fields = line.split(" ", 5)
        command = fields[5]
        assert re.search(r"(^|&& )/srv/tickets/\.venv/bin/pcd label ", command), line  # never a bare pcd
        assert not re.search(r"(^|[;&|] *)pcd ", command), line
        assert command.endswith(">>logs/pcd.log 2>&1") and "mkdir -p logs" in command
        assert "%" not in command.replace("\\%", ""), "an unescaped % ends a crontab command"
    assert "set -a && . /srv/tickets/s3.env && set +a && " in bucket and "s3://" in bucket
    assert "s3.env" not in local


@pytest.mark.full  # two pcd processes loading the embedded model (~30 s quiet, 2 min on a loaded 2-core machine)
def test_the_docs_crontab_line_runs_under_env_i_two_nights(tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "pcd").is_file():
        pytest.skip(f"no pcd script in {venv}/bin (the tests run outside pcd's venv)")
    command = _crontab_lines()[0].split(" ", 5)[5].replace("\\%", "%")
    srv = tmp_path / "srv" / "tickets"
    (srv / "exports").mkdir(parents=True)
    (srv / "schemas").mkdir()
    (srv / ".venv").symlink_to(venv, target_is_directory=True)
    # the line's schema name, a one-field schema in it: the line is under test, not the 28 fields' decoding time
    shutil.copy(ROOT / "schemas" / "sms_spam.yaml", srv / "schemas" / "support_triage.yaml")
    home = os.environ["HOME"]  # the suite's own home (conftest): the converted model shared, nothing else
    day = lambda when: _cron(f"date -d {when} +%F", home).stdout.strip()  # noqa: E731 - cron's own clock and zone
    today, yesterday = day("today"), day("yesterday")
    rows = [{"id": "T-1", "text": "Our EU API returns 503 since 09:10 UTC; 40 trucks are stuck."},
            {"id": "T-2", "text": "Please refund the duplicate charge on invoice 2291."}]
    (srv / "exports" / f"{today}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = command.replace(SRV, str(srv))
    first_night = re.sub(r" --reuse \S*\$\([^)]*\)\S*", "", command)  # the docs: on the first night, leave --reuse out
    assert first_night != command
    night = _cron(first_night, home)
    log = srv / "logs" / "pcd.log"
    assert night.returncode == 0, (night, log.read_text() if log.exists() else "no log")
    (srv / "labels" / f"{today}.parquet").rename(srv / "labels" / f"{yesterday}.parquet")
    night = _cron(command, home)  # the line as pasted
    log = (srv / "logs" / "pcd.log").read_text()
    assert night.returncode == 0 and night.stdout == night.stderr == "", (night, log)
    events = [json.loads(line) for line in log.splitlines()]
    done = [e for e in events if e["event"] == "done"]
    assert len(done) == 2 and all(e["level"] != "error" for e in events)
    assert (done[1]["read"], done[1]["labelled"], done[1]["reused"]) == (2, 2, 2)  # night 2: nothing decoded
    assert done[1]["output"] == f"labels/{today}.parquet"
    written = pq.read_table(srv / "labels" / f"{today}.parquet")
    assert written.column("id").to_pylist() == ["T-1", "T-2"]
    assert written.to_pylist() == pq.read_table(srv / "labels" / f"{yesterday}.parquet").to_pylist()
