"""The live review loop measured: ``pcd serve --label-studio`` over the embedded model, driven with
the request bodies Label Studio sends (``label_studio/ml/api_connector.py``): predictions for
held-out tasks, N annotations by webhook (the records' own human labels stand in for the
annotators), ``START_TRAINING``, and predictions for the same held-out tasks from the new version.

    .venv/bin/python benchmarks/label_studio_loop.py --annotations 80 --json benchmarks/label_studio_loop.json
    .venv/bin/python benchmarks/label_studio_loop.py --annotations 200 --json benchmarks/label_studio_loop_tune.json

Held-out tasks: ``sample_data/<set>.jsonl`` (never annotated); annotations: the first N rows of
``sample_data/<set>.dev.jsonl``. Accuracy is the share of held-out tasks whose predicted choice is
the human label. The retrain time is the run's wall time from the trigger to the swap (what
``/versions`` records), on this machine's CPU; the predict times are each ``/predict`` call over
the held-out tasks, and the load average says how busy the machine was (others' work included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcd_cli.job import LabelJob  # noqa: E402
from pcd_cli.quality.data import FieldSpec  # noqa: E402
from pcd_cli.quality.review import label_studio_config  # noqa: E402
from pcd_cli.schema.load import load_schema  # noqa: E402
from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.label_studio import LabelStudioConfig  # noqa: E402
from pcd_cli.server.main import ServerThread  # noqa: E402
from pcd_cli.server.service import LabelService, ModelHost  # noqa: E402


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def accuracy(srv, body: dict, gold: list[str]) -> tuple[float, str, float]:
    started = time.perf_counter()
    response = httpx.post(srv.url + "/predict", json=body, timeout=600)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    seconds = time.perf_counter() - started
    assert len(results) == len(gold)
    right = sum(r["result"] and r["result"][0]["value"]["choices"][0] == g for r, g in zip(results, gold))
    return right / len(gold), results[0]["model_version"], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="airline_tweets")
    parser.add_argument("--schema", default="schemas/airline_sentiment.yaml")
    parser.add_argument("--field", default="sentiment")
    parser.add_argument("--annotations", type=int, default=80)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    schema = load_schema(ROOT / args.schema)
    field = next(f for f in schema.declared if f.name == args.field)
    config = label_studio_config([FieldSpec(field.name, tuple(field.labels), False, field.type)])
    held = rows(ROOT / "sample_data" / f"{args.set}.jsonl")
    dev = rows(ROOT / "sample_data" / f"{args.set}.dev.jsonl")[:args.annotations]
    project = {"id": 1, "created_at": "2026-12-04T22:00:00Z", "label_config": config}
    tasks = [{"id": 1000 + i, "data": {"text": r["text"], "id": r["id"]}, "project": 1} for i, r in enumerate(held)]
    predict = {"tasks": tasks, "project": "1.1796421540", "label_config": config, "params": {}}
    with tempfile.TemporaryDirectory() as state:
        job = LabelJob()
        service = LabelService(ModelHost(job), {"airline": (schema, job)})
        app = AppConfig(request_timeout_s=600, label_studio=LabelStudioConfig(state_dir=state))
        with ServerThread(service, app) as srv:
            while not service.ready.is_set():  # the model loads (minutes on a busy CPU)
                assert service.startup_error is None, service.startup_error
                time.sleep(1)
            backend = srv.server.config.app.state.label_studio
            setup = httpx.post(srv.url + "/setup", json={"project": "1.1796421540", "schema": config,
                                                          "hostname": "", "access_token": ""}, timeout=60).json()
            before, version_before, predict_s = accuracy(srv, predict, [r[args.field] for r in held])
            for i, r in enumerate(dev):
                annotation = {"id": 5000 + i, "task": 2000 + i, "completed_by": 1, "was_cancelled": False,
                              "ground_truth": False, "created_at": "2026-12-04T22:10:00Z",
                              "result": [{"from_name": field.name, "to_name": "text", "type": "choices",
                                          "value": {"choices": [r[args.field]]}}]}
                task = {"id": 2000 + i, "data": {"text": r["text"], "id": r["id"]}, "project": 1}
                hook = httpx.post(srv.url + "/webhook", json={"action": "ANNOTATION_CREATED", "annotation": annotation,
                                                              "task": task, "project": project}, timeout=10)
                assert hook.status_code == 200, hook.text
            started = time.perf_counter()
            assert httpx.post(srv.url + "/webhook", json={"action": "START_TRAINING", "project": project},
                              timeout=10).json()["training"] == "started"
            backend.wait_training(3600)
            wall = time.perf_counter() - started
            history = httpx.get(srv.url + "/versions", timeout=10).json()["schemas"]["airline"]["history"]
            after, version_after, predict_after_s = accuracy(srv, predict, [r[args.field] for r in held])
    run = history[-1]
    out = {
        "set": args.set, "held_out_tasks": len(held), "annotations": len(dev), "method": run["method"],
        "accepted": run["accepted"], "reason": run["reason"], "model_version_before": version_before,
        "setup_model_version": setup["model_version"], "model_version_after": version_after,
        "accuracy_before": round(before, 4), "accuracy_after": round(after, 4),
        "holdout_before": run["before"], "holdout_after": run["after"], "holdout_rows": run["holdout_rows"],
        "retrain_seconds": run["seconds"], "trigger_to_swap_seconds": round(wall, 2),
        "predict_seconds_before": round(predict_s, 2), "predict_seconds_after": round(predict_after_s, 2),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        "machine": f"{platform.machine()} {platform.system()}, CPU", "model": "embedded SmolLM2-135M-Instruct",
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
