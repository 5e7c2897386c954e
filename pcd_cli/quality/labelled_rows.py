"""Gold rows a job has already labelled, kept so that a later fit decodes only the new ones
(``pcd serve --label-studio``'s retrain: ``pcd_cli.fitting.calibrate_on_gold(store=...)``).

A row is what ``pcd calibrate`` reads of a labelled gold row: its output columns (``Labeler.label_frame``
with ``all_probs``: the raw ``<f>__probs`` and the rest, the id column aside) and, with a linear
readout being fitted, its readout features (``{decision name: {layer: (hidden,) float64}}`` at
each decision point, ``Decoder.feature_layers``). Rows are keyed by two things, the two a row's
values are a function of (docs/labelling.md, "Nightly runs"):

* the model input key, ``__input_sha256`` (``pcd_cli.quality.data.input_keys``): the text the
  model reads;
* the job's fingerprint (``fingerprint``): ``Labeler.job_parts()`` (weights, tokenizer, adapter,
  backend, dtype, device, libraries, schema, prompt, examples, every option that changes a value;
  ``pcd_cli.job_fingerprint``), the layers read and the output columns. A store written under
  another fingerprint is never read: another model, prompt or option labels every row again.

The file is one ``.npz`` (numpy, read with ``allow_pickle=False``), written whole or not at all
(``io.files.write_atomic``):

* ``meta``: JSON text ``{"format_version": 1, "fingerprint", "columns", "decisions": [[name,
  layer], ...]}``;
* ``keys``: the rows' input keys, ``(n,)`` text;
* ``rows``: the rows' output columns (without the id column) as Parquet bytes, ``(bytes,)`` uint8,
  the Arrow types ``label_frame`` writes (floats are stored exactly);
* ``x<j>`` and ``has<j>``: the features of ``decisions[j]``, float64 ``(n, hidden)``, and which
  rows have them, bool ``(n,)``.

It is bounded: each fit rewrites it with the rows of its own gold only (a row that left the gold
leaves the store), so it never holds more rows than the gold the last fit read. A file that
cannot be read (another format, truncated) is ignored with a warning: the rows are labelled again.
"""

from __future__ import annotations

import io
import json
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("pcd")

#: The file's ``meta.format_version``; another version is not read (its rows are labelled again).
FORMAT_VERSION = 1


def fingerprint(job_parts: dict, feature_layers, columns) -> str:
    """The store's key for a job: SHA-256 (hex) of the job's fingerprint parts
    (``Labeler.job_parts()``), the layers whose hidden states are read (``()`` without a
    readout) and the output column names, in order."""
    from ..job_fingerprint import sha256_of

    return sha256_of([job_parts, [int(layer) for layer in (feature_layers or ())], [str(c) for c in columns]])


@dataclass
class StoredRows:
    """Rows read back from a store (``LabelledRows.read``).

    Attributes:
        keys: input key -> row index.
        table: the rows' output columns (a ``pyarrow.Table``, without the id column), in store order.
        features: per row, ``{decision name: {layer: (hidden,) float64}}``, or ``None`` where
            the store holds none.
    """

    keys: dict[str, int]
    table: object
    features: list[dict | None]


class LabelledRows:
    """The store at ``path`` (an ``.npz`` file; module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self, key: str) -> StoredRows | None:
        """The rows stored under fingerprint ``key``; ``None`` when there is no file, it holds
        another fingerprint or format, or cannot be read (then with a warning naming it)."""
        if not self.path.is_file():
            return None
        try:
            with np.load(self.path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if meta.get("format_version") != FORMAT_VERSION or meta.get("fingerprint") != key:
                    return None
                keys = [str(k) for k in data["keys"]]
                import pyarrow.parquet as pq

                table = pq.read_table(io.BytesIO(data["rows"].tobytes()))
                decisions = [(str(name), int(layer)) for name, layer in meta["decisions"]]
                matrices = [(data[f"x{j}"], data[f"has{j}"]) for j in range(len(decisions))]
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            log.warning("labelled gold rows %s unreadable (%s: %s); they are labelled again", self.path,
                        type(exc).__name__, exc)
            return None
        if table.num_rows != len(keys) or list(table.column_names) != meta.get("columns"):
            log.warning("labelled gold rows %s inconsistent (rows or columns); they are labelled again", self.path)
            return None
        features: list[dict | None] = [None] * len(keys)
        for (name, layer), (x, has) in zip(decisions, matrices):
            for i in np.flatnonzero(has):
                row = features[i] if features[i] is not None else {}
                row.setdefault(name, {})[layer] = x[i]
                features[i] = row
        return StoredRows({k: i for i, k in enumerate(keys)}, table, features)

    def write(self, key: str, keys: list[str], table, features: list[dict | None] | None) -> None:
        """Replace the store by ``keys``' rows under fingerprint ``key``, whole or not at all.

        Args:
            keys: each row's input key (distinct). table: a ``pyarrow.Table`` of the rows'
                output columns without the id column, one row per key.
            features: per row ``{decision name: {layer: (hidden,) array}}`` or ``None``;
                ``None`` for no features at all.

        Raises:
            ValueError: ``keys`` and ``table`` or ``features`` disagree in length, or a
                decision's features differ in width between rows.
            MachineError: the file cannot be written (``io.files.write_atomic``).
        """
        import pyarrow.parquet as pq

        from ..io.files import write_atomic

        n = len(keys)
        if table.num_rows != n or (features is not None and len(features) != n) or len(set(keys)) != n:
            raise ValueError(f"labelled rows: {n} keys (distinct), {table.num_rows} rows, "
                             f"{'no' if features is None else len(features)} feature rows")
        decisions = sorted({(name, int(layer)) for row in features or () if row for name, read in row.items()
                            for layer in (read or {})})
        arrays = {}
        for j, (name, layer) in enumerate(decisions):
            width = {np.asarray(row[name][layer]).shape for row in features
                     if row and row.get(name) and layer in row[name]}
            if len(width) != 1:
                raise ValueError(f"labelled rows: decision {name!r} layer {layer} has features of widths {sorted(width)}")
            x = np.zeros((n, *width.pop()), dtype=np.float64)
            has = np.zeros(n, dtype=bool)
            for i, row in enumerate(features):
                if row and row.get(name) and layer in row[name]:
                    x[i], has[i] = row[name][layer], True
            arrays[f"x{j}"], arrays[f"has{j}"] = x, has
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        meta = {"format_version": FORMAT_VERSION, "fingerprint": key, "columns": list(table.column_names),
                "decisions": [[name, layer] for name, layer in decisions]}
        out = io.BytesIO()
        np.savez(out, meta=np.array(json.dumps(meta)), keys=np.array(keys, dtype=str),
                 rows=np.frombuffer(buffer.getvalue(), dtype=np.uint8), **arrays)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, out.getvalue())
