"""Is a model file whole? Cheap checks of GGUF and safetensors files before anything loads them.

A model file cut short by an interrupted download, or a web page saved under the model's name,
otherwise fails deep inside the readers ("cannot reshape array of size ... into shape ...",
"invalid magic") with nothing that names the cause. These checks read only the files' headers
(never the tensor data: the embedded 98 MB GGUF is checked in milliseconds on every run) and
raise ``ModelError`` (exit 3) naming the file and what is wrong with it:

- ``check_gguf(path)``: the magic bytes, then the header (metadata and tensor infos) is parsed
  to find where the last tensor's data ends; a file shorter than that is incomplete.
  Format: the GGUF spec, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
- ``check_safetensors(path)`` / ``check_model_folder(folder)``: the 8-byte header length, the
  JSON header, and the end of the last tensor's ``data_offsets`` must be the file's size.
  Format: https://github.com/huggingface/safetensors#format

Framework-free (the standard library only; the ``gguf`` package, when installed, is asked only
about tensor types missing from the table here).
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

from ..errors import ModelError

GGUF_MAGIC = b"GGUF"
#: ``general.alignment`` when the file does not set it (GGUF spec).
GGUF_DEFAULT_ALIGNMENT = 32
#: Bytes of each fixed-size GGUF metadata value type (spec: ``gguf_metadata_value_type``);
#: 8 = string and 9 = array are read separately.
_GGUF_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
#: ``ggml_type`` -> (elements per block, bytes per block), as in ``gguf.GGML_QUANT_SIZES`` (gguf
#: 0.17); the ids are fixed by the format, so these never change. Newer types are looked up in
#: the installed ``gguf`` package (the one transformers reads GGUF files with).
GGML_BLOCK_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
}
#: How many bytes of a file ``looks_like`` reads.
SNIFF_BYTES = 512
_REDOWNLOAD = "(an interrupted download? download it again)"


def looks_like(head: bytes) -> str | None:
    """What a file that is not the model it claims to be looks like, from its first bytes: a
    clause to put in a message ("it looks like an HTML page: ..."), or ``None`` if it is
    nothing recognisable."""
    text = head.lstrip(b"\xef\xbb\xbf").lstrip()
    lower = text[:64].lower()
    if lower.startswith((b"<!doctype", b"<html")) or (text.startswith(b"<") and b"html" in head.lower()):
        return "it looks like an HTML page: download with the /resolve/ URL, not /blob/"
    if text.startswith(b"<"):
        return "it looks like an HTML or XML page (an error page?): download with the /resolve/ URL, not /blob/"
    if head.startswith(b"version https://git-lfs"):
        return ("it is a git-lfs pointer file, not the weights: run 'git lfs pull' in the clone, "
                "or download the file with the /resolve/ URL")
    if text.startswith((b"{", b"[")):
        return "it looks like a JSON text (an error message from the server?)"
    return None


def _describe_start(head: bytes) -> str:
    return f"it starts with {head[:8]!r}" if head else "it is empty"


class _Truncated(Exception):
    """The header runs past the end of the file (internal to ``check_gguf``)."""


class _GGUFHeader:
    """A reader over the mapped bytes of a GGUF header; every read checks the bounds."""

    def __init__(self, data, endian: str):
        self.data, self.pos, self.end = data, 0, len(data)
        self.e = endian

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.end:
            raise _Truncated
        self.pos = start + n
        return start

    def read(self, fmt: str):
        size = struct.calcsize(fmt)
        return struct.unpack_from(self.e + fmt, self.data, self.take(size))[0]

    def string(self, size_fmt: str) -> bytes:
        n = self.read(size_fmt)
        start = self.take(n)
        return bytes(self.data[start:start + n])

    def skip_strings(self, count: int, size_fmt: str) -> None:
        unpack = struct.Struct(self.e + size_fmt).unpack_from
        width, data, end = struct.calcsize(size_fmt), self.data, self.end
        pos = self.pos
        if count * width > end - pos:
            raise _Truncated
        try:
            for _ in range(count):  # the hot loop: a tokenizer's tokens and merges, ~100k strings
                pos += width + unpack(data, pos)[0]
        except struct.error:  # a length read past the end of the file
            raise _Truncated from None
        if pos > end:
            raise _Truncated
        self.pos = pos


def _ggml_block_size(ggml_type: int) -> tuple[int, int] | None:
    """(elements per block, bytes per block) of a ggml tensor type; ``None`` when unknown."""
    if ggml_type in GGML_BLOCK_SIZES:
        return GGML_BLOCK_SIZES[ggml_type]
    try:
        import gguf

        return tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)])
    except Exception:  # noqa: BLE001 - no gguf package, or a type it does not know either
        return None


def gguf_data_end(path: Path) -> int:
    """Where the last tensor's data ends in the GGUF file ``path``, from its header alone.

    The header is: magic ``GGUF``, version (uint32), tensor count and metadata key/value count
    (uint64; uint32 in version 1), the key/value pairs (key string, value type uint32, value),
    then per tensor: name, n_dims (uint32), dims (uint64 each), ggml type (uint32) and offset
    (uint64, from the start of the data section). The data section starts at the end of the
    header rounded up to ``general.alignment`` (default 32). Strings are a length (uint64;
    uint32 in version 1) and that many bytes. Big-endian files are read as such.

    Raises:
        ModelError: not a GGUF file, a header cut short (incomplete), or a damaged header.
    """
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(SNIFF_BYTES)
        if not head.startswith(GGUF_MAGIC):
            if len(head) < len(GGUF_MAGIC) and GGUF_MAGIC.startswith(head):
                raise ModelError(f"{str(path)!r}: the file is incomplete: {size:,} bytes, cut inside its header "
                                 f"{_REDOWNLOAD}")
            hint = looks_like(head)
            raise ModelError(f"{str(path)!r}: not a GGUF file ({_describe_start(head)}; a GGUF file starts "
                             f"with b'GGUF')" + (f": {hint}" if hint else ""))
        if size < 8:
            raise ModelError(f"{str(path)!r}: the file is incomplete: {size:,} bytes, cut inside its header "
                             f"{_REDOWNLOAD}")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                return _gguf_data_end(path, data)
            except _Truncated:
                raise ModelError(f"{str(path)!r}: the file is incomplete: {size:,} bytes, cut inside its header "
                                 f"{_REDOWNLOAD}") from None


def _gguf_data_end(path: Path, data) -> int:
    (version,) = struct.unpack_from("<I", data, 4)
    endian = "<"
    if version & 0xFFFF == 0 and version:  # a big-endian file: its version reads byte-swapped
        endian, version = ">", struct.unpack_from(">I", data, 4)[0]
    if version not in (1, 2, 3):
        raise ModelError(f"{str(path)!r}: GGUF version {version} is not one pcd knows (1 to 3); "
                         "the file is damaged or newer than this pcd")
    reader = _GGUFHeader(data, endian)
    reader.take(8)
    count = "I" if version == 1 else "Q"
    n_tensors, n_kv = reader.read(count), reader.read(count)
    alignment = GGUF_DEFAULT_ALIGNMENT

    def skip_value(kind: int, key: bytes) -> None:
        if kind in _GGUF_SCALAR:
            reader.take(struct.calcsize(_GGUF_SCALAR[kind]))
        elif kind == _GGUF_STRING:
            reader.string(count)
        elif kind == _GGUF_ARRAY:
            item, n = reader.read("I"), reader.read(count)
            if item in _GGUF_SCALAR:
                reader.take(n * struct.calcsize(_GGUF_SCALAR[item]))
            elif item == _GGUF_STRING:
                reader.skip_strings(n, count)
            elif item == _GGUF_ARRAY:
                for _ in range(n):
                    skip_value(item, key)
            else:
                raise ModelError(f"{str(path)!r}: a damaged GGUF file (metadata key {key.decode(errors='replace')!r} "
                                 f"is an array of unknown type {item})")
        else:
            raise ModelError(f"{str(path)!r}: a damaged GGUF file (metadata key {key.decode(errors='replace')!r} "
                             f"has unknown value type {kind})")

    for _ in range(n_kv):
        key = reader.string(count)
        kind = reader.read("I")
        if key == b"general.alignment" and kind in _GGUF_SCALAR and kind not in (6, 7, 12):
            alignment = reader.read(_GGUF_SCALAR[kind])
            if alignment <= 0 or alignment & (alignment - 1):
                raise ModelError(f"{str(path)!r}: a damaged GGUF file (general.alignment is {alignment}, "
                                 "not a power of two)")
        else:
            skip_value(kind, key)
    end = 0
    for _ in range(n_tensors):
        reader.string(count)
        n_dims = reader.read("I")
        if n_dims * struct.calcsize(count) > reader.end - reader.pos:
            raise _Truncated
        elements = 1
        for _ in range(n_dims):
            elements *= reader.read(count)
        ggml_type, offset = reader.read("I"), reader.read("Q")
        block = _ggml_block_size(ggml_type)
        nbytes = (elements + block[0] - 1) // block[0] * block[1] if block else 0
        end = max(end, offset + nbytes)
    start = -(-reader.pos // alignment) * alignment
    return start + end


def check_gguf(path: str | Path) -> None:
    """Refuse a GGUF file that is not one or is cut short, before anything converts it.

    Raises:
        ModelError: "'<path>': not a GGUF file (...)" (with a hint when it looks like an HTML
            page or a git-lfs pointer), "'<path>': the file is incomplete: N of M bytes (...)",
            "... N bytes, cut inside its header (...)", or a damaged header.
    """
    path = Path(path)
    end = gguf_data_end(path)
    size = path.stat().st_size
    if size < end:
        raise ModelError(f"{str(path)!r}: the file is incomplete: {size:,} of {end:,} bytes {_REDOWNLOAD}")


def check_safetensors(path: str | Path) -> None:
    """Refuse a ``.safetensors`` file that is not one, or not whole, before a model loads it.

    The format: an unsigned little-endian 64-bit header length N, N bytes of JSON (starting
    with ``{``) mapping each tensor name to its dtype, shape and ``data_offsets`` [begin, end)
    relative to the end of the header (plus an optional ``__metadata__``), then the data. The
    largest ``end`` plus 8 plus N is the file's size.

    Raises:
        ModelError: "'<path>': not a safetensors file (...)" (saying what it looks like: an
            HTML page, a git-lfs pointer), "'<path>': the file is incomplete: N of M bytes
            (...)", a header cut short or not JSON, or a file longer than its header says.
    """
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(SNIFF_BYTES)
        if head[8:9] != b"{":  # the JSON header starts at byte 8 (the first 8 are its length)
            hint = looks_like(head)
            if hint or len(head) > 8:
                raise ModelError(f"{str(path)!r}: not a safetensors file ({_describe_start(head)}; a safetensors "
                                 "file is a header length and a JSON header)" + (f": {hint}" if hint else ""))
            raise ModelError(f"{str(path)!r}: the file is incomplete: {size:,} bytes, cut inside its header "
                             f"{_REDOWNLOAD}")
        (n,) = struct.unpack_from("<Q", head, 0)
        if 8 + n > size:
            raise ModelError(f"{str(path)!r}: the file is incomplete: {size:,} bytes, cut inside its header "
                             f"of {8 + n:,} bytes {_REDOWNLOAD}")
        fh.seek(8)
        raw = fh.read(n)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ModelError(f"{str(path)!r}: a damaged safetensors file (its header is not the JSON the format "
                         f"describes: {exc}); download it again") from None
    expected = 8 + n + end
    if size < expected:
        raise ModelError(f"{str(path)!r}: the file is incomplete: {size:,} of {expected:,} bytes {_REDOWNLOAD}")
    if size > expected:
        raise ModelError(f"{str(path)!r}: a damaged safetensors file: {size:,} bytes where its header describes "
                         f"{expected:,}; download it again")


def check_model_folder(folder: str | Path) -> None:
    """``check_safetensors`` on each ``*.safetensors`` file of a local ``--model`` folder (name
    order), then its ``config.json`` (else transformers' own message, "should have a model_type
    key", hides the cause).

    Raises:
        ModelError: no ``config.json`` (naming an adapter or a pcd tune card found instead, else
        the files there), or see ``check_safetensors``.
    """
    folder = Path(folder)
    for path in sorted(folder.glob("*.safetensors")):
        if path.is_file():
            check_safetensors(path)
    if not (folder / "config.json").is_file():
        if (folder / "adapter_config.json").is_file():
            hint = "it holds a LoRA adapter (adapter_config.json): pass it as --adapter, with its base as --model"
        elif (folder / "pcd-tune.json").is_file():
            hint = ("it holds a pcd tune card (pcd-tune.json) but no model: the tune that wrote it did not "
                    "finish or its model files were removed; tune again with -o naming it")
        else:
            names = sorted(p.name for p in folder.iterdir())[:6]
            hint = "it holds " + (", ".join(names) if names else "nothing")
        raise ModelError(f"--model {str(folder)!r}: no config.json, so not a model folder; {hint}")
