"""Records/s of the local engine against the Ray engine with 1 and 2 workers (issue #11).

    python benchmarks/ray_engine.py [--model M] [--json benchmarks/ray_results.json]

On the 120 airline tweets and the 14 support tickets (embedded model, CPU). A local Ray is
started once (2 CPUs here, no dashboard); its start-up time is printed on its own line and
is not in any rate. Per run:

* ``label s``: the labelling alone. Local: decoding, after the model is loaded. Ray: the
  label step, which includes each actor starting, loading the model and prefilling the head
  (that is what a Ray run pays per worker).
* ``wall s``: the whole run as a user waits for it (local: model load included; Ray:
  read, label, collect and write steps, Ray already running).

Not a test: the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pcd_cli.api import Labeler
from pcd_cli.io.readers import InputSpec
from pcd_cli.engines.local import label_file
from pcd_cli.schema.load import load_schema

ROOT = Path(__file__).resolve().parent.parent
SETS = [
    ("airline tweets", "sample_data/airline_tweets.jsonl", "schemas/airline_sentiment.yaml", None, 16),
    ("triage tickets", "sample_data/support_tickets.jsonl", "schemas/support_triage.yaml",
     "Subject: {subject}\\n\\n{body}", 4),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import ray

    from pcd_cli.engines.ray_engine import label_files

    console = Console()
    started = time.perf_counter()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    startup = time.perf_counter() - started
    console.print(f"Ray start-up (local, {os.cpu_count()} CPUs, no dashboard): {startup:.1f} s")
    rows = []
    try:
        for name, data, schema_path, template, batch in SETS:
            schema = load_schema(ROOT / schema_path)
            spec = InputSpec(template=template, id_field="id")
            options = {"model": args.model, "device": "cpu", "template": template}
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                labeler = Labeler(schema, **options)
                stats = label_file(labeler, ROOT / data, spec, output=Path(tmp, "local.parquet"),
                                   errors_path=Path(tmp, "local.errors.jsonl"), progress=False)
                rows.append({"set": name, "engine": "local", "workers": 1, "records": stats.records,
                             "label_s": stats.seconds, "wall_s": time.perf_counter() - t0})
                for workers in (1, 2):
                    t0 = time.perf_counter()
                    run = label_files(ROOT / data, schema, spec, options, output=Path(tmp, f"ray{workers}.parquet"),
                                      errors_path=Path(tmp, f"ray{workers}.errors.jsonl"), workers=workers,
                                      batch_size=batch)
                    rows.append({"set": name, "engine": "ray", "workers": workers, "records": run.stats.records,
                                 "label_s": run.stats.seconds, "wall_s": time.perf_counter() - t0})
    finally:
        ray.shutdown()
    table = Table(title="records/s: local engine vs Ray engine (this machine, shared)")
    for col in ("set", "engine", "workers", "records", "label s", "records/s (label)", "wall s", "records/s (wall)"):
        table.add_column(col, justify="left" if col in ("set", "engine") else "right")
    for r in rows:
        table.add_row(r["set"], r["engine"], str(r["workers"]), str(r["records"]), f"{r['label_s']:.1f}",
                      f"{r['records'] / r['label_s']:.2f}", f"{r['wall_s']:.1f}", f"{r['records'] / r['wall_s']:.2f}")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"ray_startup_s": startup, "cpus": os.cpu_count(), "runs": rows}, indent=2))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
