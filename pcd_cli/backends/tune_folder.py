"""What a ``pcd tune`` output folder holds, and which of its files pcd may replace.

``pcd tune -o DIR`` writes a model folder (or an adapter) plus its card ``pcd-tune.json`` and,
when the holdout supports one, ``pcd-calibration.json``. The card lists every file pcd wrote
(``files``, paths relative to the folder). A later ``pcd tune -o DIR`` replaces only those
files; a folder that holds anything else (a team's notes, eval reports) is refused, naming the
files, before the model loads (the Hugging Face Trainer's rule for a non-empty ``output_dir``,
without a flag that deletes other people's files). Cards written before the list existed are
read with ``LEGACY_WRITTEN``: the names pcd's writers (transformers, peft, the tokenizer)
produce. ``card_mismatches`` says what a labelling run reads differently from what the card's
tune trained (schema, prompt head, scoring, dtype, label orderings).

Framework-free (the standard library only).
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

from ..errors import InputError

#: The provenance card every ``pcd tune`` output folder holds.
CARD_NAME = "pcd-tune.json"
#: File name of the calibration ``pcd tune`` writes into its output folder.
CALIBRATION_NAME = "pcd-calibration.json"

#: What pcd tune wrote into a folder whose card has no ``files`` list (cards before 0.x): the
#: model or adapter files, the tokenizer files, the card and the calibration (glob patterns,
#: top level only).
LEGACY_WRITTEN = (
    CARD_NAME, CALIBRATION_NAME, "config.json", "generation_config.json", "model.safetensors",
    "model-*-of-*.safetensors", "model.safetensors.index.json", "adapter_config.json", "adapter_model.safetensors",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
    "merges.txt", "tokenizer.model", "added_tokens.json",
)


def folder_files(folder: Path) -> list[str]:
    """Every file under ``folder`` (recursively, links included), as sorted POSIX paths relative to it."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


def read_card(folder: str | Path) -> dict | None:
    """The ``pcd-tune.json`` card of ``folder`` as a dict, or ``None`` (absent or not a JSON object)."""
    try:
        card = json.loads((Path(folder) / CARD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return card if isinstance(card, dict) else None


def written_by_pcd(folder: str | Path, card: dict | None = None) -> tuple[list[str], list[str]]:
    """Split ``folder``'s files into ``(written by pcd tune, not written by pcd tune)``.

    pcd's are the card's ``files`` list (plus the card itself); for a card without the list, the
    top-level files matching ``LEGACY_WRITTEN`` (and peft's ``README.md`` in an adapter folder).
    A folder without a card has no pcd files.
    """
    folder = Path(folder)
    card = read_card(folder) if card is None else card
    files = folder_files(folder)
    if card is None:
        return [], files
    listed = card.get("files")
    if isinstance(listed, list) and all(isinstance(f, str) for f in listed):
        ours = set(listed) | {CARD_NAME}
        return [f for f in files if f in ours], [f for f in files if f not in ours]
    patterns = LEGACY_WRITTEN + (("README.md",) if card.get("kind") == "adapter" else ())
    mine = [f for f in files if "/" not in f and any(fnmatch.fnmatchcase(f, p) for p in patterns)]
    return mine, [f for f in files if f not in mine]


def check_tune_output(output: str | Path) -> None:
    """Refuse ``pcd tune -o OUTPUT`` unless pcd may write there: a new or empty folder, or an
    earlier pcd tune folder holding only the files its card says pcd wrote.

    Raises:
        InputError: ``output`` is a file; a folder without a ``pcd-tune.json`` card that is not
            empty; a pcd tune folder that also holds other files (each named, up to 10).
    """
    path = Path(output).expanduser()
    if not path.exists():
        return
    if not path.is_dir():
        raise InputError(f"-o {str(output)!r} is a file; give a folder (pcd tune writes a model folder)")
    files = folder_files(path)
    if not files:
        return
    if not (path / CARD_NAME).is_file():
        raise InputError(f"-o {str(output)!r} is not empty and is not a pcd tune folder (no {CARD_NAME}); it holds "
                         f"{_some(files)}. Give a new folder: pcd tune writes a whole model folder")
    _, foreign = written_by_pcd(path)
    if foreign:
        raise InputError(f"-o {str(output)!r} is an earlier pcd tune folder that also holds files pcd did not write "
                         f"({_some(foreign)}); pcd replaces only its own files and will not leave a tuned model beside "
                         "other files: move them out, or give another folder")


def _some(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


_CACHE_KEY = re.compile(r"-[0-9a-f]{16}$")
_QUANT = re.compile(r"\.(q\d\w*|iq\d\w*|f16|f32|bf16)$")


def model_name_key(name: str) -> str:
    """A model's name reduced for comparison: the last path component, lower case, without
    ``.gguf``, a GGUF quantisation suffix (``.Q4_1``) or pcd's converted-cache key (``-<16 hex>``).

    ``HuggingFaceTB/SmolLM2-135M-Instruct``, ``/cache/pcd/models/SmolLM2-135M-Instruct.Q4_1-0123456789abcdef``
    and ``smollm2-135m-instruct`` all give ``smollm2-135m-instruct``.
    """
    key = str(name).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()
    key = key.removesuffix(".gguf")
    key = _CACHE_KEY.sub("", key)
    return _QUANT.sub("", key)


def card_mismatches(card: dict, metadata: dict[str, str]) -> list[str]:
    """What differs between a tuned model's card and a labelling run's metadata: schema, prompt
    head (template, examples), scoring mode or label orderings (``--permutations``). Empty
    when the run reads what was trained."""
    checks = [("schema", "schema_sha256", "pcd.schema_sha256"),
              ("prompt head (instructions, catalog, examples)", "prompt_head_sha256", "pcd.prompt_head_sha256"),
              ("scoring mode", "scoring", "pcd.scoring"), ("dtype", "dtype", "pcd.dtype")]
    out = [f"{what}: trained for {card.get(key)!r}, labelling with {metadata.get(meta)!r}"
           for what, key, meta in checks if card.get(key) is not None and card.get(key) != metadata.get(meta)]
    trained = (card.get("hyperparameters") or {}).get("permutations")
    reading = json.loads(metadata.get("pcd.permutations") or '{"k": 1}').get("k", 1)
    if trained is not None and trained != reading:
        out.append(f"label orderings (--permutations): trained for {trained}, labelling with {reading}")
    return out

