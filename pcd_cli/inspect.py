"""``pcd inspect-schema``: what a schema looks like to one tokenizer, before any record is read.

Reports the layout chosen and the seams each layout would move, the head length, and per
field: trunk and forest sizes, decision points, labels that collide on their first token
after the trunk (followed, never broken by list order), the deepest decision, lines that
do not decode back to their text, and case-only label differences.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from .compile import CompiledSchema
from .prompt import LAYOUTS
from .schema import Schema


@dataclass(frozen=True)
class FieldReport:
    name: str
    type: str
    labels: int
    trunk_tokens: int
    forest_tokens: int
    decision_points: int
    first_token_collisions: int  #: labels whose canonical spelling shares its first token after the trunk
    deepest_decision: int  #: most tokens read after the trunk on one path
    not_round_trip: tuple[str, ...]  #: labels whose line does not decode back to its text


@dataclass(frozen=True)
class SchemaReport:
    schema: str
    model: str
    layout: str
    seam_moves: dict[str, int]
    head_tokens: int
    chat_template: bool
    fields: tuple[FieldReport, ...]
    warnings: tuple[str, ...]


def inspect(schema: Schema, *, model: str | None = None, scoring: str = "marginal", tokenizer=None) -> SchemaReport:
    """Compile ``schema`` for ``model``'s tokenizer and report its shape (loads no weights).

    Raises:
        ModelError: the tokenizer cannot be loaded. CompileError: see ``CompiledSchema``.
    """
    model_id = model or "default"
    if tokenizer is None:
        from .backends.torch_backend import load_tokenizer

        model_id, tokenizer = load_tokenizer(model)
    moves = {}
    for layout in LAYOUTS:
        moves[layout.name] = CompiledSchema(schema, tokenizer, scoring=scoring, layout=layout).seam_moves()
    compiled = CompiledSchema(schema, tokenizer, scoring=scoring)
    reports = []
    for plan in compiled.default_plans():
        for forest in plan.forests:
            field = schema.fields[forest.field_index]
            trunk = forest.trunk_len
            canonical = dict(reversed(forest.lines))  # label -> its canonical (first) spelling's line
            start = len(plan.context_ids) + trunk
            first = {label: tuple(tokenizer.encode(plan.context_text + line)[start:start + 1])
                     for label, line in canonical.items()}
            by_token = Counter(first.values())
            collisions = sum(by_token[token] > 1 for token in first.values())
            bad = tuple(sorted({field.labels[label] for label, line in forest.lines
                                if tokenizer.decode(tokenizer.encode(plan.context_text + line))
                                != plan.context_text + line}))
            reports.append(FieldReport(
                name=field.name, type=field.type, labels=len(field.labels), trunk_tokens=trunk,
                forest_tokens=len(forest.ids), decision_points=len(forest.query_rows),
                first_token_collisions=collisions,
                deepest_decision=max(len(t.edges) for t in forest.terminals), not_round_trip=bad))
    order = {f.name: i for i, f in enumerate(schema.fields)}
    reports.sort(key=lambda r: order[r.name])
    return SchemaReport(schema=schema.name, model=model_id, layout=compiled.layout.name, seam_moves=moves,
                        head_tokens=len(compiled.prompt.head_ids), chat_template=compiled.prompt.chat_template,
                        fields=tuple(reports), warnings=schema.warnings)


def render_inspection(report: SchemaReport, console: Console) -> None:
    """Print a report as rich tables, with advice lines for the traps found."""
    moves = ", ".join(f"{k}: {v}" for k, v in report.seam_moves.items())
    console.print(f"schema [bold]{report.schema}[/] on {report.model}: layout [bold]{report.layout}[/] "
                  f"(seam tokens moved back per layout: {moves}); head {report.head_tokens} tokens; "
                  f"chat template: {'yes' if report.chat_template else 'no (plain-text prompt)'}", highlight=False)
    table = Table()
    for col in ("field", "type", "labels", "trunk", "forest tokens", "decision points", "first-token collisions",
                "deepest decision"):
        table.add_column(col, justify="left" if col in ("field", "type") else "right")
    for f in report.fields:
        table.add_row(f.name, f.type, str(f.labels), str(f.trunk_tokens), str(f.forest_tokens),
                      str(f.decision_points), str(f.first_token_collisions), str(f.deepest_decision))
    console.print(table)
    for f in report.fields:
        if f.first_token_collisions:
            console.print(f"note: {f.name}: {f.first_token_collisions} labels share their first token with another; "
                          "pcd follows the branches to tell them apart", highlight=False)
        if f.deepest_decision > 3:
            console.print(f"advice: {f.name}: a label is only identified {f.deepest_decision} tokens in; "
                          "if you control the labels, put the meaning first (e.g. Fasteners_095, not CAT_095_...)",
                          highlight=False)
        if f.not_round_trip:
            console.print(f"warning: {f.name}: lines of {', '.join(map(repr, f.not_round_trip))} do not decode "
                          "back to their text with this tokenizer", highlight=False)
    for w in report.warnings:
        console.print(f"warning: {w}", highlight=False)
