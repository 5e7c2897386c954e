"""What field isolation costs ``pcd label`` on the 28-field triage preset (issue #35 item 3): the
shared-catalog prompt (one schema, every field in one catalog, two passes per record) against
``--isolate-fields`` (every field its own branch after the record, the record read once) and
against every field as its own one-field schema (the record read once per field), same records,
same model.

    python benchmarks/isolation_triage.py [--records 8] [--json benchmarks/isolation_triage.json]

On the embedded model (CPU, float32), ``schemas/support_triage.yaml`` over the first ``--records``
tickets of ``sample_data/support_tickets.jsonl`` (text ``Subject: {subject}\\n\\n{body}``). A field's
one-field schema keeps its spec (``depends_on`` dropped: a field alone sees no other answer; the
schema's rules, which act between fields, do not apply) and, for an enum, lists its labels sorted.
Reported: tokens fed per record (records and answer forests; prompt heads apart), prompt-head tokens
prefilled once per schema, forward passes per record, ms per record (compiling excluded), compile
seconds, and how many labels differ from the shared prompt's. ``isolate_fields`` runs the preset
with ``depends_on`` dropped and each enum's labels sorted (as the one-field schemas).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcd_cli.api import Labeler  # noqa: E402
from pcd_cli.backends import load_backend  # noqa: E402
from pcd_cli.results import Record  # noqa: E402
from pcd_cli.schema.load import parse_schema  # noqa: E402

TEMPLATE = "Subject: {subject}\n\n{body}"


def one_field_schemas(data: dict) -> list[dict]:
    """The preset cut into one schema per field (enum labels sorted; ``depends_on`` dropped)."""
    out = []
    for name, spec in data["fields"].items():
        spec = {k: v for k, v in spec.items() if k != "depends_on"}
        if spec.get("type") == "enum" and "labels" in spec:
            spec["labels"] = sorted(spec["labels"])
        out.append({"name": f"{data['name']}.{name}", "instructions": data.get("instructions"),
                    "fields": {name: spec}})
    return out


def isolated_preset(data: dict) -> dict:
    """The preset with ``isolate_fields: true`` (``depends_on`` dropped, enum labels sorted)."""
    fields = {}
    for one in one_field_schemas(data):
        fields.update(one["fields"])
    return {"name": data["name"], "instructions": data.get("instructions"), "fields": fields, "isolate_fields": True}


def run(labelers: list, records: list[Record]) -> tuple[dict, list]:
    passes = sum(lab.forward_passes for lab in labelers)
    tokens = sum(lab.decoder.tokens_fed for lab in labelers)
    started = time.perf_counter()
    results = [lab.label_batch(records) for lab in labelers]
    seconds = time.perf_counter() - started
    n = len(records)
    return ({"ms_per_record": round(1000 * seconds / n, 1),
             "tokens_per_record": round((sum(lab.decoder.tokens_fed for lab in labelers) - tokens) / n, 1),
             "passes_per_record": round((sum(lab.forward_passes for lab in labelers) - passes) / n, 2),
             "head_tokens": sum(lab.decoder.head_len for lab in labelers)}, results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=8)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "isolation_triage.json")
    args = parser.parse_args()
    backend = load_backend(None, device="cpu", dtype="float32")
    data = yaml.safe_load((ROOT / "schemas" / "support_triage.yaml").read_text())
    rows = [json.loads(line) for line in (ROOT / "sample_data" / "support_tickets.jsonl").read_text().splitlines()
            if line.strip()][: args.records]
    records = [Record(r["id"], TEMPLATE.format(**r)) for r in rows]
    started = time.perf_counter()
    shared = Labeler(parse_schema(data), backend=backend)
    shared_compile = time.perf_counter() - started
    started = time.perf_counter()
    isolated = [Labeler(parse_schema(d), backend=backend) for d in one_field_schemas(data)]
    isolated_compile = time.perf_counter() - started
    started = time.perf_counter()
    branches = Labeler(parse_schema(isolated_preset(data)), backend=backend)
    branches_compile = time.perf_counter() - started
    s, shared_out = run([shared], records)
    i, isolated_out = run(isolated, records)
    b, branches_out = run([branches], records)
    names = [f.name for f in shared.schema.fields]
    by_name = {lab.schema.fields[k].name: (j, k) for j, lab in enumerate(isolated) for k in range(len(lab.schema.fields))}
    differ = branch_differ = 0
    worst = 0.0  # a field's probabilities: its isolated branch vs its one-field schema alone
    for r, rec in enumerate(records):
        for f, name in enumerate(names):
            j, k = by_name[name]
            differ += shared_out[0][r].fields[f].value != isolated_out[j][r].fields[k].value
            branch_differ += shared_out[0][r].fields[f].value != branches_out[0][r].fields[f].value
            worst = max(worst, max(abs(x - y) for x, y in zip(branches_out[0][r].fields[f].probs,
                                                               isolated_out[j][r].fields[k].probs)))
    out = {"model": backend.model_id, "schema": "schemas/support_triage.yaml", "records": len(records),
           "decisions": len(records) * len(names),
           "shared": {**s, "compile_s": round(shared_compile, 2)},
           "isolated": {**i, "compile_s": round(isolated_compile, 2), "schemas": len(isolated)},
           "ratios": {"tokens": round(i["tokens_per_record"] / s["tokens_per_record"], 2),
                      "ms": round(i["ms_per_record"] / s["ms_per_record"], 2),
                      "passes": round(i["passes_per_record"] / s["passes_per_record"], 2)},
           "labels_that_differ": differ,
           "isolate_fields": {**b, "compile_s": round(branches_compile, 2),
                              "ratios": {"tokens": round(b["tokens_per_record"] / s["tokens_per_record"], 2),
                                         "ms": round(b["ms_per_record"] / s["ms_per_record"], 2),
                                         "passes": round(b["passes_per_record"] / s["passes_per_record"], 2)},
                              "labels_that_differ_from_shared": branch_differ,
                              "max_abs_diff_vs_one_field_schemas": worst,
                              "note": "the one-field schemas put the field's catalog in the head, isolate_fields "
                                      "after the record: two prompts, so their probabilities differ"}}
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
