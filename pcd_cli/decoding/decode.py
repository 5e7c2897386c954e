"""Compiled plan + backend -> per record and field: label, probability, candidate mass.

How a group of records is decoded (docs/how-it-works.md: decoding rule 8 and "One pass per wave:
the token forest"):

* The head's KV is prefilled once (``Decoder.__init__``) into a cache the decoder owns
  (a ``KVHandle``: the backend keeps no per-caller state, so decoders may share it).
* Records are packed into groups bounded by ``max_tokens_per_pass``. For each wave the
  group's tokens form one stream: per record, its context chain (wave 0: the record part
  up to the JSON opener; later waves: the answer lines just written) followed by the
  token forest of every field in the wave. Each token gets the position it would have in
  its own line and attends to the head, its own record's context and its own ancestors
  in its field's trie — nothing else (a block-diagonal, tree-shaped mask). The stream is
  cut into passes of at most ``max_tokens_per_pass`` tokens, parents always fed before
  children, so a forest too big for one pass is split and stays exact.
* After the last wave the cache is cropped back to the head.
* Long-context RoPE (``Backend.rope_variant``): a record is scored with the frequency set
  a plain forward over its complete text would use; records of different sets are never
  packed together, and each set has its own head cache.

A warm record therefore costs two forward passes (one per wave) when alone, and a
fraction of that when packed with others.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..errors import CompileError, RecordError
from ..results import FieldResult, Record, RecordFailure, RecordResult
from .compile import CompiledSchema, FieldForest, WavePlan
from .permute import combine
from .prompt import common_prefix_len

#: Default token budget of one pass. Packed records attend over each other's (masked) keys,
#: so a pass's attention grows with the square of its size: on CPU, ~512 tokens balances
#: per-pass overhead against that waste (benchmarks/speed.py measures it).
DEFAULT_MAX_TOKENS_PER_PASS = 512

#: Where an over-long text is cut (``Decoder.truncate``): the named part is removed.
TRUNCATE_SIDES = ("middle", "head", "tail", "error")
#: Put where the middle of a text was cut out.
TRUNCATION_MARK = " [...] "
#: Tokens cut beyond the overflow, for the marker and re-tokenization at the cut.
TRUNCATION_SLACK = 8


@dataclass
class _Slot:
    record: Record
    prompt_text: str
    chain: list[int]
    ctx_ranges: list[tuple[int, int]] = field(default_factory=list)
    ctx_len: int = 0
    fed_context: tuple[int, ...] = ()
    context_text: str = ""
    truncated: bool = False
    needed: int = 0  # positions of the record's complete text (head, record, answer)
    variant: object = 0  # the backend's RoPE variant for that length
    error: str | None = None  # set when the model's log-probabilities are unusable
    results: dict[int, FieldResult] = field(default_factory=dict)
    traces: list[dict] = field(default_factory=list)
    written: tuple[int | None, ...] = ()  # pcd tune: the gold label index to write per field (None: the argmax)
    reads: dict[int, tuple[FieldForest, list]] = field(default_factory=dict)  # pcd tune: differentiable reads
    text: str = ""  # the record text the chain was built from (cut when truncated)
    compiled: CompiledSchema | None = None  # the ordering this slot decodes (--permutations); None: the decoder's
    #: --permutations: on the record's shared slot, one slot per label ordering; its chain holds
    #: the tokens every ordering's prompt shares (the record), fed once; it reads nothing.
    branches: list["_Slot"] = field(default_factory=list)
    base: "_Slot | None" = None  # on an ordering's slot: the shared slot
    stream: tuple[int, int] = (0, 0)  # where the slot's chain lies in the wave-0 stream (kv coordinates)
    #: pooled readout features (a negative layer ``-l``, ``Decoder.feature_layers``): the mean of
    #: layer ``l``'s hidden states over the slot's wave-0 chain, ``{-l: float64 (hidden,)}``
    pooled: dict = field(default_factory=dict)


def concatenate(results: list[RecordResult]) -> RecordResult:
    """One record's isolated field branches (``Decoder(field_branches=...)``) -> its result: the
    branches' fields and traces in branch order (the schema's order)."""
    return RecordResult(id=results[0].id, fields=tuple(f for r in results for f in r.fields),
                        traces=tuple(t for r in results for t in r.traces), truncated=results[0].truncated)


def score_forest(forest: FieldForest, query_logprobs: Sequence[np.ndarray], n_labels: int
                 ) -> tuple[np.ndarray, float]:
    """Label probabilities and candidate mass of one field from its read log-probabilities.

    Args:
        query_logprobs: for each query row of the forest, the log-probabilities of its
            ``query_ids`` (natural log).
        n_labels: number of labels of the field.

    Returns:
        ``(probs, mass)``: float64 ``(n_labels,)`` summing to 1 (0 for impossible labels),
        and the candidate mass (sum of all terminal path probabilities; docs/how-it-works.md, decoding rule 7).
    """
    label_lp = np.full(n_labels, -np.inf)
    for term in forest.terminals:
        lp = sum(query_logprobs[q][c] for q, c in term.edges)
        label_lp[term.label] = np.logaddexp(label_lp[term.label], lp)
    top = label_lp.max()
    if not np.isfinite(top):
        return np.zeros(n_labels), 0.0
    log_mass = top + np.log(np.exp(label_lp - top).sum())
    probs = np.exp(label_lp - log_mass)
    return probs, float(min(1.0, np.exp(log_mass)))


#: The wave-0 plan of a record's shared slot (``orderings``): its chain only, nothing read.
_SHARED_PLAN = WavePlan(context_text="", context_ids=(), forests=())


class Decoder:
    """Decodes records on a backend whose KV cache holds the compiled prompt's head.

    Args:
        backend: see ``pcd_cli.backends`` for the contract.
        compiled: the schema compiled for the backend's tokenizer.
        max_tokens_per_pass: most tokens fed in one forward pass (bounds memory and the
            size of packed groups); at least 16.
        trace: keep, per record and field, the context, lines, probabilities and mass.
        orderings: ``--permutations``: the schema compiled for each label ordering
            (``pcd_cli.decoding.permute.compile_orderings``, ``compiled`` first). Each record's tokens
            shared by every ordering's prompt are fed once; each ordering's tail and fields
            are a branch attending to them; the results are combined (``permute.combine``).
        pack_records: pack several records into one pass (block-diagonal mask); ``False``
            decodes one record per group (for comparison; results agree to float rounding).
        field_branches: ``isolate_fields`` (issue #35): one compiled schema per declared field of
            the schema (its ``field_alone``, catalog after the record; ``compiled`` is the first),
            all with one head. Each record's tokens
            shared by the branches are fed once; each field's tail and answer is a branch that
            sees the head, the record and itself only; the results are the branches' fields in
            order. So a field's probabilities are those of its one-field schema alone, whatever
            other fields the schema has (equal within packing's float rounding).
        truncate: a text too long for the model's context (with the prompt and the deepest
            answer) is cut: ``middle`` keeps its start and end around ``TRUNCATION_MARK``,
            ``head`` drops its start, ``tail`` drops its end; the result is marked
            ``truncated``. ``error``: the record fails instead.

    Raises:
        ValueError: ``max_tokens_per_pass`` below 16 or an unknown ``truncate``.
        CompileError: the prompt and the answer alone fill the model's context.
    """

    def __init__(self, backend, compiled: CompiledSchema, *,
                 max_tokens_per_pass: int = DEFAULT_MAX_TOKENS_PER_PASS, trace: bool = False,
                 pack_records: bool = True, truncate: str = "middle",
                 orderings: Sequence[CompiledSchema] = (), field_branches: Sequence[CompiledSchema] = ()):
        if max_tokens_per_pass < 16:
            raise ValueError(f"max_tokens_per_pass must be at least 16, got {max_tokens_per_pass}")
        if truncate not in TRUNCATE_SIDES:
            raise ValueError(f"truncate must be one of {', '.join(TRUNCATE_SIDES)}, got {truncate!r}")
        self.truncate = truncate
        self.backend = backend
        self.compiled = compiled
        if orderings and field_branches:
            raise CompileError("isolate_fields and --permutations cannot be combined")
        if field_branches and field_branches[0] is not compiled:
            raise ValueError("field_branches: pass the first branch as compiled")
        #: ``field_branches``: the branches' results are concatenated in order, not combined
        self.isolated = bool(field_branches)
        #: ``--permutations``: the schema compiled once per label ordering (``pcd_cli.decoding.permute``),
        #: ``compiled`` first; the same head, the values listed after the record in each order.
        #: ``isolate_fields``: the field branches. Otherwise ``(compiled,)``.
        self.orderings = tuple(orderings) or tuple(field_branches) or (compiled,)
        if any(c.prompt.head_ids != compiled.prompt.head_ids for c in self.orderings):
            raise CompileError("the label orderings' prompts do not share their head" if not field_branches
                               else "the isolated fields' prompts do not share their head")
        self.budget = max_tokens_per_pass
        self.trace = trace
        self.pack_records = pack_records
        self.head_len = len(compiled.prompt.head_ids)
        self.record_passes = 0  # forward passes spent on records (the head prefill excluded)
        self._training = False  # set by ``training_reads``: passes under autograd, gold lines written
        self.tokens_fed = 0  # tokens fed in those passes
        estimates = [self._estimate_wave_costs(c) for c in (self.orderings if self.isolated else (compiled,))]
        waves = max(len(costs) for costs, _ in estimates)
        #: tokens per record and wave (every isolated branch's summed: they are one record's)
        self._wave_cost = [sum(costs[w] for costs, _ in estimates if w < len(costs)) for w in range(waves)]
        self._positions_after_record = max(p for _, p in estimates)
        #: tokens by which the longest branch's tail exceeds ``compiled``'s (isolated fields' catalogs)
        self._longer_tail = max(len(c.record_tail.tail_ids) for c in self.orderings) - len(compiled.record_tail.tail_ids)
        limit = getattr(backend, "max_positions", None)
        fixed = self.head_len + len(compiled.record_tail.tail_ids) + self._longer_tail + self._positions_after_record
        if limit and fixed >= limit:
            raise CompileError(f"the prompt ({self.head_len} tokens of instructions and catalog) and the answer "
                               f"need {fixed} of the model's {limit} positions, leaving no room for any text; "
                               "shorten the schema's descriptions or use a model with a longer context")
        #: head KV caches, one per RoPE variant in use (``Backend.rope_variant``)
        self.caches = {}
        self.cache = self._head_cache(backend.rope_variant(fixed))

    #: layers (1-based, ``Backend.forward_features``) whose hidden state is read at every field's
    #: decision point and kept on its ``FieldResult.features`` (``pcd calibrate --readout linear``);
    #: a negative ``-l`` is the mean of layer ``l``'s hidden states over the record's tokens (its
    #: wave-0 chain: the rendered record and the prompt up to the answer, after the cached head),
    #: read in the same passes (``pcd_cli.quality.readout``, "pooled")
    feature_layers: tuple[int, ...] = ()
    #: field name -> its linear readout (``pcd_cli.quality.readout.Readout``: ``layers`` and
    #: ``decide(features, probs) -> (label, probs)``), applied in the wave: the label it decides
    #: is the one later waves see (``depends_on``)
    readouts: dict = {}

    #: called (no arguments) before each forward pass of ``decode``, when set: ``pcd serve``'s
    #: worker stops a decode call nobody waits for any more (the callable raises, and the call
    #: ends with the cache cropped back to the head) or decodes other work between two passes
    #: (on another decoder: this one's cache holds the group in flight)
    between_passes = None

    def spare(self) -> "Decoder":
        """A decoder sharing this one's compiled plan, backend and options, with head caches of
        its own (prefilled on first use), so that both may be in the middle of a decode call at
        once (one thread calls them in turn: ``pcd serve`` decodes short records between a long
        record's passes). Its ``record_passes`` counts its own passes from 0."""
        twin = copy.copy(self)
        twin.caches = {}
        twin.record_passes = 0
        twin.tokens_fed = 0
        twin.between_passes = None
        twin.cache = None
        return twin

    def field_subset(self, indices: Sequence[int]) -> "Decoder":
        """A decoder of some of this one's isolated field branches (``field_branches``: the
        branches at ``indices``, in that order), for rows whose other fields are copied from an
        earlier output (``pcd label --reuse`` with ``isolate_fields``). It shares this decoder's
        head caches and options, and sizes a record's positions as this decoder does (the
        longest tail and answer of all its branches), so that it truncates, and picks the RoPE
        variant, exactly where this one would: each field's result is then what this decoder
        gives for it, within the packing bound (docs/how-it-works.md, decoding rule 9). Its
        ``record_passes`` counts its own passes from 0; one thread uses the two in turn.

        Raises:
            ValueError: this decoder has no field branches, or ``indices`` is empty or out of range.
        """
        if not self.isolated:
            raise ValueError("field_subset: only a decoder of isolated field branches (isolate_fields) has fields "
                             "to decode alone")
        if not indices or any(not 0 <= i < len(self.orderings) for i in indices):
            raise ValueError(f"field_subset: branch indices {list(indices)} out of range 0..{len(self.orderings) - 1}")
        part = copy.copy(self)
        part.orderings = tuple(self.orderings[i] for i in indices)
        part.compiled = part.orderings[0]
        part.record_passes = 0
        part.tokens_fed = 0
        part.between_passes = None
        # the same positions per record as this decoder: its longest branch tail, measured from
        # the subset's first branch
        longest_tail = len(self.compiled.record_tail.tail_ids) + self._longer_tail
        part._longer_tail = longest_tail - len(part.compiled.record_tail.tail_ids)
        estimates = [self._estimate_wave_costs(c) for c in part.orderings]
        waves = max(len(costs) for costs, _ in estimates)
        part._wave_cost = [sum(costs[w] for costs, _ in estimates if w < len(costs)) for w in range(waves)]
        return part

    def _head_cache(self, variant):
        """The head's KV cache for RoPE ``variant`` (prefilled on first use)."""
        if variant not in self.caches:
            self.caches[variant] = self.backend.prefill(self.compiled.prompt.head_ids, variant=variant)
        return self.caches[variant]

    # -- preparing and grouping ------------------------------------------------------------
    @staticmethod
    def _estimate_wave_costs(compiled: CompiledSchema) -> tuple[list[int], int]:
        """Tokens per record fed in each wave (wave 0 without the record part), and positions
        used after the record part (answer lines plus the deepest forest token), following in
        each field the label whose written answer line is longest in tokens, so that the
        estimate bounds every record's answers (it sizes the context and the passes)."""
        encode = compiled.tokenizer.encode
        text = compiled.prompt.tail_text
        prev = compiled.wave_plan(0, text)
        costs = [prev.n_tokens]
        advance = 0
        positions = max(max(f.depths) + 1 for f in prev.forests)
        for w in range(1, len(compiled.schema.waves)):
            longest = {fi: max(range(len(compiled.schema.fields[fi].labels)),
                               key=lambda label, fi=fi: len(encode(text + compiled.written_text({fi: label}))))
                       for fi in compiled.schema.waves[w - 1]}
            text += compiled.written_text(longest)
            plan = compiled.wave_plan(w, text)
            costs.append(plan.n_tokens + len(plan.context_ids) - len(prev.context_ids))
            advance += len(plan.context_ids) - len(prev.context_ids)
            positions = max(positions, advance + max(max(f.depths) + 1 for f in plan.forests))
            prev = plan
        return costs, positions

    def _prepare(self, record: Record) -> _Slot:
        slot = self._prepare_one(record)
        if len(self.orderings) == 1:
            return slot
        return self._branch(slot)

    def _branch(self, first: _Slot) -> _Slot:
        """The shared slot of one record and its ordering branches (``orderings``): the longest
        token prefix of every ordering's chain is fed once (the record and the text before the
        orderings differ); each branch feeds the rest of its chain, attending to that prefix.

        Raises:
            RecordError: a seam breaks for one of the orderings (``record_chain``).
        """
        record, text = first.record, first.text
        chains = [(first.prompt_text, first.chain)] + [c.record_chain(record.id, text) for c in self.orderings[1:]]
        shared = min(common_prefix_len(chains[0][1], chain) for _, chain in chains[1:])
        shared = min(shared, min(len(chain) for _, chain in chains) - 1)
        base = _Slot(record=record, prompt_text=first.prompt_text, chain=list(first.chain[:shared]),
                     truncated=first.truncated, text=text, variant=first.variant, needed=first.needed)
        for compiled, (full, chain) in zip(self.orderings, chains):
            base.branches.append(_Slot(record=record, prompt_text=full, chain=list(chain[shared:]),
                                       context_text=compiled.prompt.tail_text, truncated=first.truncated, text=text,
                                       variant=first.variant, compiled=compiled, base=base,
                                       needed=first.needed))
        return base

    def _prepare_one(self, record: Record) -> _Slot:
        slot, needed = self._slot(record, record.text)
        limit = getattr(self.backend, "max_positions", None)
        if not limit or needed <= limit:
            return slot
        if self.truncate == "error":
            raise RecordError(f"record {record.id!r}: too long for the model ({needed} tokens with the prompt and "
                              f"answer; the model's context is {limit}); shorten the text or use --truncate")
        tokenizer = self.backend.tokenizer
        text_ids = (tokenizer.encode_text if hasattr(tokenizer, "encode_text") else tokenizer.encode)(record.text)
        over = needed - limit
        for _ in range(4):  # re-tokenizing the cut text may take a few more tokens than counted
            keep = len(text_ids) - over - TRUNCATION_SLACK
            if keep <= 0:
                break
            slot, needed = self._slot(record, self._cut(text_ids, keep))
            if needed <= limit:
                slot.truncated = True
                return slot
            over += needed - limit
        raise RecordError(f"record {record.id!r}: the prompt and answer leave no room for the text in the model's "
                          f"context ({limit} tokens)")

    def _cut(self, text_ids: list[int], keep: int) -> str:
        """The text cut to about ``keep`` of its tokens, on the side named by ``self.truncate``."""
        decode = self.backend.tokenizer.decode
        if self.truncate == "head":
            text = decode(text_ids[-keep:])
        elif self.truncate == "tail":
            text = decode(text_ids[:keep])
        else:
            left, right = text_ids[: keep - keep // 2], text_ids[len(text_ids) - keep // 2:]
            text = decode(left).rstrip("\ufffd") + TRUNCATION_MARK + decode(right).lstrip("\ufffd")
        return text.strip("\ufffd").strip()

    def _slot(self, record: Record, text: str) -> tuple[_Slot, int]:
        """A record's slot for ``text``, and the positions it needs (head, record, answer)."""
        full, chain = self.compiled.record_chain(record.id, text)  # in context, seams checked (pcd_cli.decoding.seams)
        needed = self.head_len + len(chain) + self._positions_after_record + self._longer_tail
        return _Slot(record=record, prompt_text=full, chain=list(chain), context_text=self.compiled.prompt.tail_text,
                     needed=needed, variant=self.backend.rope_variant(needed), text=text,
                     compiled=self.compiled), needed

    def _groups(self, slots: list[_Slot]) -> list[list[_Slot]]:
        """Records packed greedily, in order, up to the token budget; records of different
        RoPE variants never share a group."""
        groups: list[list[_Slot]] = []
        for variant in dict.fromkeys(slot.variant for slot in slots):
            totals: list[int] = []
            first = len(groups)
            for slot in (s for s in slots if s.variant == variant):
                k = 1 if self.isolated else max(1, len(slot.branches))
                cost = ([len(slot.chain) + sum(len(b.chain) for b in slot.branches) + k * self._wave_cost[0]]
                        + [k * c for c in self._wave_cost[1:]])
                if (len(groups) > first and self.pack_records
                        and all(t + c <= self.budget for t, c in zip(totals, cost))):
                    groups[-1].append(slot)
                    totals = [t + c for t, c in zip(totals, cost)]
                else:
                    groups.append([slot])
                    totals = cost
        return groups

    # -- decoding ---------------------------------------------------------------------------
    def decode(self, records: Iterable[Record]) -> list[RecordResult | RecordFailure]:
        """Label ``records``; results come back in input order, one per record.

        A record that cannot be labelled (``RecordError``) becomes a ``RecordFailure``; the
        others are unaffected.
        """
        out: list[RecordResult | RecordFailure | None] = []
        slots: list[tuple[int, _Slot]] = []
        for record in records:
            out.append(None)
            try:
                slots.append((len(out) - 1, self._prepare(record)))
            except RecordError as exc:
                out[-1] = RecordFailure(record.id, str(exc))
        for group in self._groups([s for _, s in slots]):
            cache = self._head_cache(group[0].variant)
            try:
                self._decode_group([t for slot in group for t in [slot, *slot.branches]], cache)
            finally:
                self.backend.truncate(cache, self.head_len)
        for index, slot in slots:
            results = [self._result(b) for b in slot.branches] if slot.branches else [self._result(slot)]
            failed = next((r for r in results if isinstance(r, RecordFailure)), None)
            if failed is not None or len(results) == 1:
                out[index] = failed or results[0]
                continue
            out[index] = concatenate(results) if self.isolated else combine(results, self.compiled.schema)
        return out  # type: ignore[return-value]

    def _result(self, slot: _Slot) -> RecordResult | RecordFailure:
        if slot.error:
            return RecordFailure(slot.record.id, slot.error)
        fields = (slot.compiled or self.compiled).schema.fields
        return RecordResult(id=slot.record.id, fields=tuple(slot.results[i] for i in range(len(fields))),
                            traces=tuple(slot.traces), truncated=slot.truncated)

    def training_groups(self, records: Sequence[Record]) -> tuple[list[list[int]], list[RecordFailure]]:
        """How ``pcd tune`` batches ``records``: the groups ``decode`` would pack (record indices,
        bounded by the token budget), and the records that cannot be labelled at all."""
        slots, failures, index = [], [], {}
        for i, record in enumerate(records):
            try:
                slot = self._prepare(record)
            except RecordError as exc:
                failures.append(RecordFailure(record.id, str(exc), record.row, record.line))
                continue
            index[id(slot)] = i
            slots.append(slot)
        return [[index[id(s)] for s in group] for group in self._groups(slots)], failures

    def training_reads(self, records: Sequence[Record], written: Sequence[Sequence[int | None]]
                       ) -> list[dict[int, tuple[FieldForest, list]]]:
        """The decoder run for training (``pcd tune``; docs/how-it-works.md, "Training reads what
        labelling reads"): exactly ``decode``'s waves, stream, positions and masks for one group of ``records`` (one of ``training_groups``),
        fed with the backend's ``forward_train`` on top of the head prefilled again with
        ``prefill_train`` (once for the group: its weights change between steps), so that the
        read log-probabilities keep their autograd graph back to the head.

        Args:
            written: per record, per schema field, the label index whose answer line later
                waves see (the gold label: teacher forcing), or ``None`` to write the label the
                decoder would pick (its argmax), as ``decode`` does.

        Returns:
            per record, ``{field index: (forest, reads)}`` where ``reads[q]`` is the backend's
            tensor of log-probabilities of ``forest.query_ids[q]``; ``score_forest`` of their
            values equals ``decode``'s probabilities for the same written lines.

        Raises:
            RecordError: a record cannot be labelled (too long, seams).
            ValueError: the decoder has several label orderings (use
                ``training_reads_by_ordering``).
        """
        if len(self.orderings) > 1:
            raise ValueError("training_reads: this decoder has label orderings; use training_reads_by_ordering")
        return [per[0] for per in self.training_reads_by_ordering(records, written)]

    def training_reads_by_ordering(self, records: Sequence[Record], written: Sequence[Sequence[int | None]]
                                   ) -> list[list[dict[int, tuple[FieldForest, list]]]]:
        """``training_reads`` for every label ordering of the decoder (``pcd tune
        --permutations K``): the record's shared tokens fed once, each ordering a branch, as
        ``decode`` feeds them; every branch writes the same gold lines (``written``).

        Returns:
            per record, per ordering (``self.orderings`` order; one entry without orderings),
            ``{field index: (forest, reads)}`` as ``training_reads``; label indices are the
            schema's in every ordering.

        Raises:
            RecordError: a record cannot be labelled (too long, seams).
        """
        slots = []
        for record, labels in zip(records, written):
            slot = self._prepare(record)
            for s in [slot, *slot.branches]:
                s.written = tuple(labels)
            slots.append(slot)
        if len({slot.variant for slot in slots}) > 1:
            raise ValueError("training_reads: records of different RoPE variants in one group (use training_groups)")
        cache = self.backend.prefill_train(self.compiled.prompt.head_ids, variant=slots[0].variant)
        self._training = True
        try:
            self._decode_group([t for slot in slots for t in [slot, *slot.branches]], cache)
        finally:
            self._training = False
        return [[b.reads for b in slot.branches] if slot.branches else [slot.reads] for slot in slots]

    def _decode_group(self, group: list[_Slot], cache) -> None:
        """Decode ``group``'s slots wave by wave (a record's shared slot, when ``orderings``
        branch it, comes right before its branches and is fed in wave 0 only)."""
        for wave in range(max(len(c.schema.waves) for c in self.orderings)):
            if wave >= 1:  # a shared slot reads nothing; an isolated branch may have fewer waves
                group = [slot for slot in group if not slot.branches
                         and wave < len((slot.compiled or self.compiled).schema.waves)]
                if not group:
                    break
            plans = [_SHARED_PLAN if slot.branches else (slot.compiled or self.compiled).wave_plan(wave, slot.context_text)
                     for slot in group]
            self._run_wave(wave, group, plans, cache)
            for slot, plan in zip(group, plans):
                slot.context_text += (slot.compiled or self.compiled).written_text(
                    {f.field_index: slot.results[f.field_index].label for f in plan.forests})

    def _run_wave(self, wave: int, group: list[_Slot], plans: list[WavePlan], cache) -> None:
        H = self.head_len
        ids: list[int] = []
        pos: list[int] = []
        owner: list[int] = []  # slot index of each token
        chain_lo: list[int] = []
        chain_hi: list[int] = []
        pair_rows: list[int] = []
        pair_cols: list[int] = []
        queries: list[tuple[int, tuple[int, ...]]] = []  # (stream index, ids to read)
        field_queries: list[tuple[int, FieldForest, int]] = []  # (slot, forest, first query number)
        reading = not self._training and (self.feature_layers or self.readouts)
        feature_rows: list[int] = []  # stream index of each forest's decision point (the readout)
        feature_of: dict[tuple[int, int], int] = {}  # (slot, field index) -> its feature row number
        read_layers = self._read_layers() if reading else ()
        pooling = wave == 0 and any(layer < 0 for layer in read_layers)
        pool_rows: list[int] = []  # stream index of each wave-0 chain token (pooled features)
        pool_owner: list[int] = []  # and the slot it belongs to
        chains: list[tuple[int, int]] = []
        base = self.backend.cache_length(cache)  # kv index of the stream's first token
        for s, (slot, plan) in enumerate(zip(group, plans)):
            if wave == 0 and slot.base is not None:  # an ordering's branch: sees the record's shared tokens
                slot.ctx_ranges = [slot.base.stream]
                slot.ctx_len = len(slot.base.chain)
            if wave == 0:
                chain = slot.chain
            else:
                if plan.context_ids[: len(slot.fed_context)] != slot.fed_context:
                    raise CompileError("the answer lines written so far tokenize differently once the next "
                                       "line follows; this layout is unstable for this tokenizer")
                chain = list(plan.context_ids[len(slot.fed_context):])
            start = len(ids)
            for j, t in enumerate(chain):
                ids.append(t), pos.append(H + slot.ctx_len + j), owner.append(s)
                chain_lo.append(start), chain_hi.append(start + j + 1)
            end = len(ids)
            chains.append((start, end))
            if pooling:
                pool_rows.extend(range(start, end)), pool_owner.extend([s] * (end - start))
            slot.stream = (base + start, base + end)
            ctx_end = H + slot.ctx_len + len(chain)
            at: list[int] = []  # stream index of each token of the forest before (its shared trunk's source)
            for forest in plan.forests:
                k = forest.shared  # its first k tokens are the previous forest's, fed there
                new = len(forest.ids) - k
                at = at[:k] + list(range(len(ids), len(ids) + new))
                ids.extend(forest.ids[k:])
                pos.extend(ctx_end + d for d in forest.depths[k:])
                owner.extend([s] * new)
                chain_lo.extend([start] * new)
                chain_hi.extend([end] * new)
                for i, path in enumerate(forest.paths[k:], k):
                    pair_rows.extend([at[i]] * len(path))
                    pair_cols.extend(at[p] for p in path)
                field_queries.append((s, forest, len(queries)))
                if reading and (self.feature_layers or
                                (slot.compiled or self.compiled).schema.fields[forest.field_index].name in self.readouts):
                    feature_of[(s, forest.field_index)] = len(feature_rows)
                    feature_rows.append(at[forest.query_rows[0]])  # the trie's root: the last trunk token
                queries.extend((at[r], q) for r, q in zip(forest.query_rows, forest.query_ids))
        point_layers = tuple(layer for layer in read_layers if layer > 0) if feature_rows else ()
        pooled_layers = tuple(-layer for layer in read_layers if layer < 0) if pooling else ()
        layers = tuple(sorted({*point_layers, *pooled_layers}))  # what the backend reads
        query_lp, query_tensors, features, pool_sums = self._feed(
            cache, group, base, np.array(ids), np.array(pos), np.array(owner), np.array(chain_lo),
            np.array(chain_hi), np.array(pair_rows), np.array(pair_cols), queries,
            np.array(feature_rows, dtype=np.int64), layers,
            np.array(pool_rows, dtype=np.int64), np.array(pool_owner, dtype=np.int64))
        if pooling:
            self._pool(group, chains, pool_sums, layers, pooled_layers)
        for s, forest, first in field_queries:
            fi = forest.field_index
            n_q = len(forest.query_rows)
            read = query_lp[first:first + n_q]
            slot = group[s]
            fields = (slot.compiled or self.compiled).schema.fields
            if query_tensors is not None:
                slot.reads[fi] = (forest, query_tensors[first:first + n_q])
            if slot.error is None and any(np.isnan(row).any() for row in read):
                dtype = self.backend.dtype_name
                slot.error = (f"record {slot.record.id!r}, field {fields[fi].name!r}: the model's log-probabilities "
                              f"are not finite (NaN or infinite logits in {dtype}); "
                              + ("run with --dtype float32" if dtype != "float32"
                                 else "the model's weights or inputs overflow"))
            if slot.error is None:
                probs, mass = score_forest(forest, read, len(fields[fi].labels))
            else:  # the record is failed; later waves still need a line to write
                probs, mass = np.zeros(len(fields[fi].labels)), 0.0
            label = int(np.argmax(probs))
            if self._training and slot.written[fi] is not None:
                label = slot.written[fi]  # teacher forcing: later waves see the gold answer line
            read = None
            if (s, fi) in feature_of:
                read = {layer: features[feature_of[(s, fi)], layers.index(layer)] for layer in point_layers}
                read.update(slot.pooled)
            readout = self.readouts.get(fields[fi].name) if read is not None else None
            if readout is not None and slot.error is None:
                bad = readout.non_finite(read)  # record-means too
                if bad is not None:
                    slot.error = (f"record {slot.record.id!r}, field {fields[fi].name!r}: the model's hidden state "
                                  f"is not finite (NaN or infinite: {bad}, in {self.backend.dtype_name}), so the "
                                  "linear readout cannot read it"
                                  + ("; run with --dtype float32" if self.backend.dtype_name != "float32" else ""))
                else:
                    label, readout_probs = readout.decide(read, probs)
                    slot.results[fi] = FieldResult(label=label, value=fields[fi].value(label),
                                                   prob=float(readout_probs[label]), mass=mass,
                                                   probs=tuple(float(p) for p in readout_probs),
                                                   raw_probs=tuple(float(p) for p in probs), readout=True,
                                                   by_rule=bool(getattr(readout, "by_rule", False)),
                                                   features=read if self.feature_layers else None)
                    if self.trace:
                        slot.traces.append(self._trace(slot, forest, probs, mass))
                    continue
            slot.results[fi] = FieldResult(label=label, value=fields[fi].value(label), prob=float(probs[label]),
                                           mass=mass, probs=tuple(float(p) for p in probs),
                                           features=read if self.feature_layers else None)
            if self.trace:
                slot.traces.append(self._trace(slot, forest, probs, mass))
        for slot, plan, (start, end) in zip(group, plans, chains):
            slot.ctx_ranges.append((base + start, base + end))
            slot.ctx_len += end - start
            slot.fed_context = plan.context_ids

    def _pool(self, group: list[_Slot], chains, pool_sums: np.ndarray, layers, pooled_layers) -> None:
        """Wave 0's pooled features: each slot's mean hidden state over its chain (an ordering's
        branch: over the record's shared chain and its own, the tokens its prompt has), per
        pooled layer, as ``slot.pooled[-l]``."""
        at = {id(slot): s for s, slot in enumerate(group)}  # a branch's shared slot is in its group
        columns = np.array([layers.index(l) for l in pooled_layers])
        for s, slot in enumerate(group):
            own = [s] if slot.base is None else [at[id(slot.base)], s]
            total = sum(pool_sums[j][columns] for j in own)
            count = sum(chains[j][1] - chains[j][0] for j in own)
            slot.pooled = {-l: total[i] / max(count, 1) for i, l in enumerate(pooled_layers)}

    def _read_layers(self) -> tuple[int, ...]:
        """The layers read: ``feature_layers`` and every readout's, sorted (a negative ``-l``:
        layer ``l`` pooled over the record's tokens).

        Raises:
            CompileError: the backend cannot read hidden states (no ``forward_features``).
        """
        if not hasattr(self.backend, "forward_features"):
            raise CompileError(f"the {getattr(self.backend, 'kind', type(self.backend).__name__)} backend cannot "
                               "read the model's hidden state, which the linear readout needs")
        return tuple(sorted({*self.feature_layers, *(l for r in self.readouts.values() for l in r.layers)}))

    def _feed(self, cache, group, base, ids, pos, owner, chain_lo, chain_hi, pair_rows, pair_cols,
              queries, feature_rows=np.zeros(0, dtype=np.int64), layers: tuple[int, ...] = (),
              pool_rows=np.zeros(0, dtype=np.int64), pool_owner=np.zeros(0, dtype=np.int64)
              ) -> tuple[list[np.ndarray], list | None, np.ndarray | None, np.ndarray | None]:
        """Feed one wave's stream in passes of at most ``budget`` tokens; return the read log-probs
        (float64 arrays), when training the same reads as the backend's differentiable tensors,
        the hidden states of ``layers`` (positive, 1-based) at the stream indices ``feature_rows``
        (float64 ``(len(feature_rows), len(layers), hidden)``, read in the same passes; ``None``
        without), and their sums over the stream indices ``pool_rows`` per slot ``pool_owner``
        (float64 ``(len(group), len(layers), hidden)``, summed pass by pass so that only one
        pass's rows are ever held; ``None`` without)."""
        backend = self.backend
        n = len(ids)
        features = None
        pool_sums = None
        reading = len(feature_rows) + len(pool_rows) > 0
        q_stream = np.array([q for q, _ in queries], dtype=np.int64)
        results: list[np.ndarray | None] = [None] * len(queries)
        tensors: list | None = [None] * len(queries) if self._training else None
        # Earlier waves' context ranges, per token: (n, max_ranges) lo/hi in kv coordinates.
        n_ranges = max(len(slot.ctx_ranges) for slot in group)
        ranges = np.zeros((len(group), max(n_ranges, 1), 2), dtype=np.int64)
        for s, slot in enumerate(group):
            for j, (lo, hi) in enumerate(slot.ctx_ranges):
                ranges[s, j] = (lo, hi)
        order = np.argsort(pair_rows, kind="stable")
        pair_rows, pair_cols = pair_rows[order], pair_cols[order]
        for a in range(0, n, self.budget):
            b = min(n, a + self.budget)
            width = base + b
            cols = np.arange(width)
            visible = np.zeros((b - a, width), dtype=bool)
            visible[:, : self.head_len] = True
            tok_ranges = ranges[owner[a:b]]
            for j in range(n_ranges):
                lo, hi = tok_ranges[:, j, 0:1], tok_ranges[:, j, 1:2]
                visible |= (cols >= lo) & (cols < hi)
            visible |= (cols >= base + chain_lo[a:b, None]) & (cols < base + chain_hi[a:b, None])
            lo_p, hi_p = np.searchsorted(pair_rows, [a, b])
            visible[pair_rows[lo_p:hi_p] - a, base + pair_cols[lo_p:hi_p]] = True
            in_chunk = np.nonzero((q_stream >= a) & (q_stream < b))[0]
            keep = q_stream[in_chunk] - a
            width_ids = max((len(queries[i][1]) for i in in_chunk), default=1)
            gather = np.full((len(in_chunk), width_ids), -1, dtype=np.int64)
            for r, i in enumerate(in_chunk):
                gather[r, : len(queries[i][1])] = queries[i][1]
            if len(keep) == 0:
                keep, gather = np.array([0]), np.full((1, 1), -1, dtype=np.int64)
            if self.between_passes is not None and not self._training:
                self.between_passes()
            if self._training:
                lp_tensor = backend.forward_train(cache, ids[a:b], pos[a:b], visible, keep, gather)
                lp = backend.to_numpy(lp_tensor)
            elif reading:
                here = np.nonzero((feature_rows >= a) & (feature_rows < b))[0]
                pooled_here = np.nonzero((pool_rows >= a) & (pool_rows < b))[0]
                lp, got = backend.forward_features(cache, ids[a:b], pos[a:b], visible, keep, gather,
                                                   np.concatenate([feature_rows[here], pool_rows[pooled_here]]) - a,
                                                   layers)
                if features is None and len(feature_rows):
                    features = np.zeros((len(feature_rows), len(layers), got.shape[-1]))
                if pool_sums is None and len(pool_rows):
                    pool_sums = np.zeros((len(group), len(layers), got.shape[-1]))
                if len(here):
                    features[here] = got[: len(here)]
                if len(pooled_here):  # a slot's chain is contiguous in the stream: one segment per slot
                    owners = pool_owner[pooled_here]
                    starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
                    pool_sums[owners[starts]] += np.add.reduceat(got[len(here):], starts, axis=0)
            else:
                lp = backend.forward(cache, ids[a:b], pos[a:b], visible, keep, gather)
            self.record_passes += 1
            self.tokens_fed += b - a
            for r, i in enumerate(in_chunk):
                results[i] = lp[r, : len(queries[i][1])]
                if tensors is not None:
                    tensors[i] = lp_tensor[r, : len(queries[i][1])]
        return results, tensors, features, pool_sums  # type: ignore[return-value]

    def _trace(self, slot: _Slot, forest: FieldForest, probs: np.ndarray, mass: float) -> dict:
        field_ = (slot.compiled or self.compiled).schema.fields[forest.field_index]
        tail = (slot.compiled or self.compiled).prompt.tail_text
        context = slot.prompt_text[: len(slot.prompt_text) - len(tail)] + slot.context_text
        return {"record": slot.record.id, "field": field_.name, "scoring": self.compiled.scoring,
                "context": context,
                "lines": [{"label": field_.labels[label], "text": line} for label, line in forest.lines],
                "probs": {label: float(p) for label, p in zip(field_.labels, probs)}, "mass": mass}
