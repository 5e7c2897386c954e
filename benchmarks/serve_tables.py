"""Write benchmarks/serve_results.md: the measurements of ``pcd serve`` (benchmarks/serve_notes.md)
with every ``<!-- table: NAME -->`` line replaced by the table NAME rendered from the JSON the
benchmark scripts wrote (benchmarks/isolation.json and isolation_one_schema_per_question.json from
benchmarks/isolation.py; jevbench_mini.json and jevbench_mini_bat_after.json from
benchmarks/jevbench.py; serve_load.json from benchmarks/serve_load.py). No model, no network:
``python benchmarks/serve_tables.py`` (``--check`` exits 1 when benchmarks/serve_results.md is not
what it would write; tests/test_docs.py runs that check)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from generated_page import render_or_check  # benchmarks/ (the script's folder)

HERE = Path(__file__).resolve().parent
NOTES = HERE / "serve_notes.md"
OUTPUT = HERE / "serve_results.md"
MARKER = re.compile(r"^<!-- table: (\w+) -->$", re.M)

#: The shared-catalog server's figures on the same relations, from issue #35 (measured before the
#: isolated prompt existed, so no JSON of this tree holds them).
SHARED_CATALOG = {"batch_solo": "22, 0.59", "duplicate_question": "18", "batch_order": "174", "batch_content": "",
                  "batch_size_sweep": "", "option_permutation": "(0.96 on the demo case)"}
#: What each JevBench dimension tests, for pcd.
DIMENSIONS = {"BAT": ("batch independence", "the prompt: isolation makes it exact"),
              "LOG": ("logical coherence", "the model (bounds {LOG.bounds}, monotonicity {LOG.monotonicity})"),
              "REP": ("representation consistency", "`option_permutation` and `key_rename` 100 (the prompt); "
                                                    "paraphrases, renames, types: the model"),
              "CHO": ("choice-set coherence", "the model"),
              "MEA": ("probability measure coherence", "the model (complements, partitions, marginals)")}


def _load(name: str) -> dict:
    return json.loads((HERE / name).read_text(encoding="utf-8"))


def _n(x: float) -> str:
    """A count or milliseconds, rounded, with thousands separators."""
    return f"{round(x):,}"


def isolation() -> str:
    """The isolation costs: tokens, passes, decode calls and milliseconds per request."""
    now, before = _load("isolation.json")["results"], _load("isolation_one_schema_per_question.json")["results"]
    plans = [("shared", now["shared"]), ("isolated, state read once (branches)", now["isolated"]),
             ("isolated, one schema per question (previous)", before["isolated"])]
    rows = ["| request | prompt | tokens fed | passes | decode calls | ms, one at a time | ms, 8 concurrent "
            "| first request (compiling) |", "|---|---|---|---|---|---|---|---|"]
    for name, plan in plans:
        s, c = plan["support"]["one_at_a_time"], plan["support"]["concurrent"]
        rows.append(f"| 4 questions, one ticket | {name} | {_n(s['tokens_per_request'])} | {_n(s['passes_per_request'])} "
                    f"| {_n(s['decode_calls_per_request'])} | {_n(s['ms_per_request'])} | {_n(c['ms_per_request'])} "
                    f"| {_n(plan['support']['cold_first_request_ms'])} |")
    for name, plan in plans:
        d = plan["daft_25_rows"]
        rows.append(f"| Daft batch, 25 rows | {name} | {_n(d['tokens_per_request'])} | {_n(d['passes_per_request'])} "
                    f"| {_n(d['decode_calls_per_request'])} | {_n(d['ms_per_request'])} | "
                    f"| {_n(d['cold_first_request_ms'])} |")
    return "\n".join(rows)


def jevbench_relations() -> str:
    """The batch and option-order relations on jevbench-mini, isolated prompt against the shared one."""
    outcomes = _load("jevbench_mini_bat_after.json")["outcomes_by_relation"]
    rows = ["| relation | tests | shared catalog (issue #35): violations, max TV | isolated: violations "
            "| isolated: max deviation |", "|---|---|---|---|---|"]
    for relation, shared in SHARED_CATALOG.items():
        o = outcomes[relation]
        dev = o["max_deviation"]
        note = {"duplicate_question": " (decoded once)", "batch_order": " (the same compiled schema)"}.get(relation, "")
        rows.append(f"| `{relation}` | {o['tests']} | {shared} | {o['violations']} | "
                    f"{'0' if dev == 0 else f'{dev:.1e}'.replace('e-0', 'e-')}{note} |")
    return "\n".join(rows)


def jevbench_dimensions() -> str:
    """jevbench-mini's overall score (with JevBench's interval) and its five dimensions."""
    run = _load("jevbench_mini.json")
    interval = re.search(r"overall [\d.]+ (\[[\d-]+\])", run["table_dimension"]).group(1)
    groups = {k: f"{100 * v:.1f}" for k, v in run["groups"].items()}
    rows = ["| dimension | pcd | what it tests |", "|---|---|---|",
            f"| overall | **{100 * run['overall']:.1f}** {interval} | |"]
    for dim in sorted(DIMENSIONS, key=lambda d: -run["dimensions"][d]):
        name, what = DIMENSIONS[dim]
        score = f"{100 * run['dimensions'][dim]:.1f}"
        rows.append(f"| {dim}, {name} | {'**' + score + '**' if dim == 'BAT' else score} | "
                    f"{re.sub(r'{([A-Z]+[.][a-z]+)}', lambda m: groups[m.group(1)], what)} |")
    return "\n".join(rows)


def load_grid() -> str:
    """``benchmarks/serve_load.py``'s printed grid, as its JSON keeps it (the machine line left to the prose)."""
    return "```\n" + "\n".join(_load("serve_load.json")["table"][1:]) + "\n```"


TABLES = {"isolation": isolation, "jevbench_relations": jevbench_relations,
          "jevbench_dimensions": jevbench_dimensions, "load_grid": load_grid}


def render() -> str:
    """benchmarks/serve_notes.md with each table marker replaced by its table."""
    notes = NOTES.read_text(encoding="utf-8")
    return MARKER.sub(lambda m: TABLES[m.group(1)](), notes)


def main(argv=None) -> int:
    return render_or_check(render, OUTPUT, argv, description=__doc__.splitlines()[0],
                           script="benchmarks/serve_tables.py")


if __name__ == "__main__":
    sys.exit(main())
