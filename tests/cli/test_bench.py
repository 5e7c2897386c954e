"""pcd bench: the generated-JSON checker, the summary, and one small real run."""

from __future__ import annotations

import json

import pytest

from pcd_cli.bench import BenchRow, check_generated, run_bench, summarize
from pcd_cli.io.readers import InputSpec
from pcd_cli.schema.load import parse_schema

SCHEMA = parse_schema({"fields": {"spam": {"type": "boolean"},
                                  "lang": {"type": "enum", "labels": ["en", "fr"]}}})


@pytest.mark.parametrize("text, hit_cap, parsed, problems, values", [
    ('{\n  "spam": true,\n  "lang": "fr"\n}', False, True, [], {"spam": True, "lang": "fr"}),
    ('{\n  "spam": "true",\n  "lang": "fr"\n}', False, True, ["quoted boolean spam"], {"spam": True, "lang": "fr"}),
    ('{\n  "spam": false\n}', False, True, ["missing key lang"], {"spam": False}),
    ('{"spam": false, "lang": "de", "x": 1}', False, True, ["invalid value lang='de'", "unexpected key x"],
     {"spam": False, "lang": "de"}),
    ('{\n  "spam": false,\n  "lang": "en"\n}trailing words', False, True, [], {"spam": False, "lang": "en"}),
    ('{\n  "spam": false,\n  "desc": "desc_desc_desc', True, False, ["runaway: hit the token cap"], {}),
    ('{\n  "spam": fals', False, False, ["unparseable JSON"], {}),
])
def test_check_generated(text, hit_cap, parsed, problems, values):
    assert check_generated(SCHEMA, text, hit_cap) == (parsed, values, problems)


def test_summary_ratios_are_median_latency_ratios():
    rows = [BenchRow("a", "pcd", 0.1, 2, 0, True, True, (), 1.0, {}),
            BenchRow("b", "pcd", 0.3, 2, 0, True, True, (), 1.0, {}),
            BenchRow("a", "generate", 2.0, 20, 20, True, True, (), 1.0, {}),
            BenchRow("b", "generate", 4.0, 20, 20, False, False, ("unparseable JSON",), 0.0, {}),
            BenchRow("a", "generate_cached", 1.0, 19, 20, True, True, (), 0.5, {}),
            BenchRow("b", "generate_cached", 1.0, 19, 20, True, False, ("missing key x",), 0.5, {})]
    s = summarize(rows)
    assert s["passes_per_record"] == 2
    assert s["speedup_vs_generate"] == pytest.approx(3.0 / 0.2)
    assert s["speedup_vs_generate_cached"] == pytest.approx(1.0 / 0.2)
    assert s["generate_valid_rate"] == 0.5 and s["generate_cached_valid_rate"] == 0.5
    assert s["generate_cached_agreement_with_pcd"] == 0.5


@pytest.mark.full  # 33 s: the bench's three methods end to end (its ratios and checks are tested above)
def test_bench_runs_all_three_methods(embedded_backend, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in ["Win a free prize now!", "Lunch at 12?"]))
    report = run_bench(SCHEMA, path, InputSpec(limit=2), backend=embedded_backend, max_new_tokens=6)
    assert [(r.record, r.method) for r in report.rows] == [
        (rec, m) for rec in ("0", "1") for m in ("pcd", "generate", "generate_cached")]
    for r in report.rows:
        if r.method == "pcd":
            assert r.forward_passes == 2 and r.valid
        else:  # six tokens cannot hold the object: counted passes, and a failure, not a drop
            assert r.output_tokens <= 6 and 1 <= r.forward_passes <= 6
            assert not r.valid and r.problems
    s = report.summary
    assert s["passes_per_record"] == 2 and s["generate_valid_rate"] == 0.0
    assert s["speedup_vs_generate"] > 0 and s["peak_rss_mb"] > 100


def test_gold_accuracy_counts_invalid_generations_as_wrong():
    import pandas as pd

    from pcd_cli.bench import BenchReport, gold_accuracy

    report = BenchReport("s", "m", "cpu", 3, 10, rows=[
        BenchRow("a", "pcd", 0.1, 2, 0, True, True, (), 1.0, {"spam": True, "lang": "en"}),
        BenchRow("b", "pcd", 0.1, 2, 0, True, True, (), 1.0, {"spam": False, "lang": "fr"}),
        BenchRow("c", "pcd", 0.1, 2, 0, True, True, (), 1.0, {"spam": False, "lang": "en"}),
        BenchRow("a", "generate", 1.0, 9, 9, True, True, (), 1.0, {"spam": True, "lang": "en"}),
        BenchRow("b", "generate", 1.0, 9, 9, True, False, ("invalid value lang='de'",), 0.5,
                 {"spam": False, "lang": "de"}),
        BenchRow("c", "generate", 1.0, 9, 9, False, False, ("unparseable JSON",), 0.0, {})])
    gold = pd.DataFrame({"id": ["a", "b", "c", "d"], "spam": ["true", False, True, True],
                         "lang": ["en", "fr", None, "en"]})
    acc = gold_accuracy(report, gold, SCHEMA)
    assert acc["spam"]["pcd"] == {"accuracy": 2 / 3, "n": 3, "invalid": 0}
    assert acc["spam"]["generate"] == {"accuracy": 2 / 3, "n": 3, "invalid": 1}
    assert acc["lang"]["pcd"] == {"accuracy": 1.0, "n": 2, "invalid": 0}
    assert acc["lang"]["generate"] == {"accuracy": 0.5, "n": 2, "invalid": 1}


def test_an_isolated_schema_is_refused_before_the_model_loads(tmp_path):
    """The baselines generate one object from one prompt; an isolated schema has one per field."""
    from pcd_cli.errors import InputError

    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"text": "x"}) + "\n")
    isolated = parse_schema({"fields": {"spam": {"type": "boolean"}}, "isolate_fields": True})
    with pytest.raises(InputError, match="isolate_fields has one prompt per field"):
        run_bench(isolated, path, InputSpec(limit=1), model=str(tmp_path / "no-such-model"))
