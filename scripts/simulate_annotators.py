"""Stand in for the people of a review loop (``make demo``): answer the Label Studio tasks that
``pcd review --to label-studio`` wrote with the records' own human labels, and write what Label
Studio's ``Export -> JSON`` gives after annotating them.

    python scripts/simulate_annotators.py out/airline.review.json sample_data/airline_tweets.jsonl \
        -o out/airline.review.export.json

Each task gets Label Studio's task ``id`` (1, 2, ...) and one submitted annotation whose result
holds, per field of the tasks' predictions, the label the gold file gives that record (matched
on ``data.<id>``; booleans as "true"/"false"); a field the gold file leaves empty is left
unanswered, a record it lacks gets no annotation. It prints how many annotations changed the
model's label. Plain JSON in, plain JSON out: no Label Studio needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def annotate(tasks: list[dict], gold: dict[str, dict], id_key: str) -> tuple[list[dict], int, int]:
    """The tasks as a Label Studio JSON export, each answered from ``gold`` (``{id: row}``).

    Returns:
        (the exported tasks, annotations written, annotations that changed a predicted label).
    """
    exported, answered, changed = [], 0, 0
    for number, task in enumerate(tasks, start=1):
        task = dict(task, id=number, annotations=[])
        row = gold.get(str(task["data"].get(id_key)))
        predicted = (task.get("predictions") or [{}])[0].get("result", [])
        result = []
        for r in predicted:
            value = None if row is None else row.get(r["from_name"])
            if value is None or value == "":
                continue
            label = ("true" if value else "false") if isinstance(value, bool) else str(value)
            changed += label != r["value"]["choices"][0]
            result.append({"id": f"{number}-{r['from_name']}", "from_name": r["from_name"], "to_name": r["to_name"],
                           "type": "choices", "value": {"choices": [label]}, "origin": "manual"})
        if row is not None:
            answered += 1
            task["annotations"] = [{"id": number, "completed_by": 1, "result": result, "was_cancelled": False,
                                    "ground_truth": False, "created_at": "2025-01-01T00:00:00.000000Z",
                                    "updated_at": "2025-01-01T00:00:00.000000Z", "lead_time": 1.0, "task": number}]
        exported.append(task)
    return exported, answered, changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", type=Path, help="the tasks pcd review --to label-studio wrote")
    parser.add_argument("gold", type=Path, help="JSONL with the id and the human label of each field")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the export to write (JSON)")
    parser.add_argument("--id-field", default="id", help="the id key in data and in the gold rows")
    args = parser.parse_args(argv)
    tasks = json.loads(args.tasks.read_text(encoding="utf-8"))
    gold = {}
    with args.gold.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                gold[str(row[args.id_field])] = row
    exported, answered, changed = annotate(tasks, gold, args.id_field)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(exported, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"simulated annotators: {answered} of {len(tasks)} tasks answered with the records' own human labels, "
          f"{changed} predicted labels corrected; wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
