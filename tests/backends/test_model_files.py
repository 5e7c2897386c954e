"""A model file that is broken says so (issue #20 item 5): ``pcd_cli.backends.model_files``
checks GGUF and safetensors headers before anything loads them, and ``pcd label`` /
``pcd inspect-schema`` exit 3 with that message, leaving nothing in the model cache."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from pcd_cli.backends.model_files import check_gguf, check_model_folder, check_safetensors, gguf_data_end
from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path, resolve_model
from pcd_cli.errors import ModelError

from ..helpers import pcd

CASE = Path(__file__).parents[1] / "data" / "cases-round3" / "gguf-html-page-or-truncated-download"
#: The case's HTML page saved under a model's name; tests copy it to a ``.gguf`` name.
HTML_PAGE = CASE / "not-a-model.html"
EMBEDDED_SIZE = 98_362_432
AGAIN = "(an interrupted download? download it again)"
LFS_POINTER = ("version https://git-lfs.github.com/spec/v1\n"
               "oid sha256:4d7c1d4c6b4bd0c3ab1f5f1e2c1a5b0f1b9b1a2e3c4d5e6f708192a3b4c5d6e7\nsize 98362432\n")


def _cut(src: Path, dst: Path, n: int) -> Path:
    with src.open("rb") as fh:
        dst.write_bytes(fh.read(n))
    return dst


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _message(exc_info) -> str:
    return str(exc_info.value)


# --- GGUF ------------------------------------------------------------------------------------

def test_the_embedded_gguf_passes_quickly_and_its_end_is_the_files_size():
    path = embedded_gguf_path()
    started = time.perf_counter()
    check_gguf(path)
    assert time.perf_counter() - started < 1  # header only (~20 ms here), never the tensor data
    assert path.stat().st_size == EMBEDDED_SIZE
    assert gguf_data_end(path) == EMBEDDED_SIZE  # = gguf.GGUFReader's last data_offset + n_bytes (8 s to read)


def test_a_gguf_cut_at_20_mb_is_incomplete_with_both_byte_counts(tmp_path):
    path = _cut(embedded_gguf_path(), tmp_path / "truncated.gguf", 20_000_000)
    with pytest.raises(ModelError) as exc:
        check_gguf(path)
    assert _message(exc) == f"{str(path)!r}: the file is incomplete: 20,000,000 of 98,362,432 bytes {AGAIN}"


@pytest.mark.parametrize("n", [100, 2, 0, 1_785_000])
def test_a_gguf_cut_inside_its_header_is_incomplete(tmp_path, n):
    path = _cut(embedded_gguf_path(), tmp_path / "cut.gguf", n)
    with pytest.raises(ModelError) as exc:
        check_gguf(path)
    assert _message(exc) == f"{str(path)!r}: the file is incomplete: {n:,} bytes, cut inside its header {AGAIN}"


def test_a_gguf_one_byte_short_is_incomplete(tmp_path):
    path = _cut(embedded_gguf_path(), tmp_path / "short.gguf", EMBEDDED_SIZE - 1)
    with pytest.raises(ModelError, match=r"the file is incomplete: 98,362,431 of 98,362,432 bytes"):
        check_gguf(path)


def test_an_html_page_named_gguf_is_not_a_gguf_file_and_says_it_looks_like_html(tmp_path):
    page = tmp_path / "not-a-model.gguf"  # kept as .html in the repository: no model file is tracked by git
    page.write_bytes(HTML_PAGE.read_bytes())
    with pytest.raises(ModelError) as exc:
        check_gguf(page)
    assert _message(exc) == (f"{str(page)!r}: not a GGUF file (it starts with b'<!DOCTYP'; "
                             "a GGUF file starts with b'GGUF'): it looks like an HTML page: download with the "
                             "/resolve/ URL, not /blob/")
    (tmp_path / "x.gguf").write_text("\n  <html><body>Service unavailable</body></html>")
    with pytest.raises(ModelError, match=r"not a GGUF file .*: it looks like an HTML page: download with the "
                                         r"/resolve/ URL, not /blob/$"):
        check_gguf(tmp_path / "x.gguf")


def test_a_git_lfs_pointer_or_other_bytes_named_gguf_is_not_a_gguf_file(tmp_path):
    (tmp_path / "lfs.gguf").write_text(LFS_POINTER)
    with pytest.raises(ModelError, match=r"not a GGUF file \(it starts with b'version '; .*\): it is a git-lfs "
                                         r"pointer file, not the weights: run 'git lfs pull'"):
        check_gguf(tmp_path / "lfs.gguf")
    (tmp_path / "zeros.gguf").write_bytes(bytes(64))
    with pytest.raises(ModelError) as exc:
        check_gguf(tmp_path / "zeros.gguf")
    assert _message(exc).endswith("not a GGUF file (it starts with b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00'; "
                                  "a GGUF file starts with b'GGUF')")


def _tiny_gguf(path: Path, alignment: int | None = None, big_endian: bool = False) -> Path:
    """A small GGUF written by the gguf package: string/int arrays, a custom alignment, F32 and
    F16 tensors, and a Q8_0 tensor given as raw blocks; little- or big-endian."""
    gguf = pytest.importorskip("gguf")
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "déf"] * 50)
    writer.add_array("test.ints", list(range(40)))
    writer.add_string("general.name", "tiny")
    writer.add_tensor("w1", np.arange(30, dtype=np.float32).reshape(5, 6))
    writer.add_tensor("w2", np.ones((3, 7), dtype=np.float16))
    writer.add_tensor("q", np.zeros((2, 34), dtype=np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment, big_endian", [(None, False), (64, False), (None, True)])
def test_a_small_gguf_of_the_gguf_package_is_measured_like_its_reader(tmp_path, alignment, big_endian):
    gguf = pytest.importorskip("gguf")
    path = _tiny_gguf(tmp_path / "tiny.gguf", alignment, big_endian)
    reader = gguf.GGUFReader(path)
    end = max(t.data_offset + t.n_bytes for t in reader.tensors)
    assert gguf_data_end(path) == end
    check_gguf(path)
    _cut(path, tmp_path / "cut.gguf", end - 1)
    with pytest.raises(ModelError, match=rf"incomplete: {end - 1:,} of {end:,} bytes"):
        check_gguf(tmp_path / "cut.gguf")


def test_a_gguf_with_an_unknown_metadata_type_is_damaged(tmp_path):
    key = b"general.name"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 99)
    (tmp_path / "bad.gguf").write_bytes(data + bytes(64))
    with pytest.raises(ModelError, match=r"a damaged GGUF file \(metadata key 'general.name' has unknown "
                                         r"value type 99\)"):
        check_gguf(tmp_path / "bad.gguf")


# --- safetensors -----------------------------------------------------------------------------

def _safetensors(path: Path) -> Path:
    from safetensors.numpy import save_file

    save_file({"a": np.arange(100, dtype=np.float32), "b": np.ones((4, 8), dtype=np.float16)}, str(path),
              metadata={"format": "pt"})
    return path


def test_a_whole_safetensors_file_passes(tmp_path):
    path = _safetensors(tmp_path / "model.safetensors")
    check_safetensors(path)
    (tmp_path / "config.json").write_text("{}")
    check_model_folder(tmp_path)


def test_a_cut_safetensors_file_is_incomplete_with_both_byte_counts(tmp_path):
    full = _safetensors(tmp_path / "full.safetensors")
    size = full.stat().st_size
    cut = _cut(full, tmp_path / "model.safetensors", size - 100)
    with pytest.raises(ModelError) as exc:
        check_safetensors(cut)
    assert _message(exc) == f"{str(cut)!r}: the file is incomplete: {size - 100:,} of {size:,} bytes {AGAIN}"
    (n,) = struct.unpack("<Q", full.read_bytes()[:8])
    cut = _cut(full, tmp_path / "head.safetensors", 40)
    with pytest.raises(ModelError) as exc:
        check_safetensors(cut)
    assert _message(exc) == (f"{str(cut)!r}: the file is incomplete: 40 bytes, cut inside its header "
                             f"of {8 + n:,} bytes {AGAIN}")
    with pytest.raises(ModelError, match=r"the file is incomplete: 5 bytes, cut inside its header"):
        check_safetensors(_cut(full, tmp_path / "tiny.safetensors", 5))


def test_a_safetensors_file_longer_than_its_header_says_is_damaged(tmp_path):
    path = _safetensors(tmp_path / "model.safetensors")
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + b"\0" * 10)
    with pytest.raises(ModelError, match=rf"a damaged safetensors file: {size + 10:,} bytes where its header "
                                         rf"describes {size:,}; download it again"):
        check_safetensors(path)


def test_a_git_lfs_pointer_or_html_page_as_safetensors_says_what_it_is(tmp_path):
    (tmp_path / "model.safetensors").write_text(LFS_POINTER)
    with pytest.raises(ModelError) as exc:
        check_model_folder(tmp_path)
    assert _message(exc) == (f"{str(tmp_path / 'model.safetensors')!r}: not a safetensors file (it starts with "
                             "b'version '; a safetensors file is a header length and a JSON header): it is a "
                             "git-lfs pointer file, not the weights: run 'git lfs pull' in the clone, or download "
                             "the file with the /resolve/ URL")
    (tmp_path / "model.safetensors").write_bytes(HTML_PAGE.read_bytes())
    with pytest.raises(ModelError, match=r"not a safetensors file \(it starts with b'<!DOCTYP'; .*\): it looks "
                                         r"like an HTML page: download with the /resolve/ URL, not /blob/"):
        check_safetensors(tmp_path / "model.safetensors")


def test_a_safetensors_header_that_is_not_json_is_damaged(tmp_path):
    body = b"{not json at all}"
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(body)) + body)
    with pytest.raises(ModelError, match=r"a damaged safetensors file \(its header is not the JSON the format "
                                         r"describes: .*\); download it again"):
        check_safetensors(tmp_path / "model.safetensors")
    body = json.dumps({"a": {"dtype": "F32", "shape": [1]}}).encode()  # no data_offsets
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(body)) + body)
    with pytest.raises(ModelError, match=r"a damaged safetensors file"):
        check_safetensors(tmp_path / "model.safetensors")


def test_resolve_model_checks_a_folders_safetensors(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    _safetensors(folder / "model-00001-of-00002.safetensors")
    assert resolve_model(str(folder)) == ("my-model", str(folder))
    (folder / "model-00002-of-00002.safetensors").write_text(LFS_POINTER)
    with pytest.raises(ModelError, match=r"model-00002-of-00002.safetensors': not a safetensors file"):
        resolve_model(str(folder))


@pytest.mark.parametrize("files, says", [
    ({"adapter_config.json": "{}", "README.md": "x"}, "pass it as --adapter"),
    ({"pcd-tune.json": "{}", "NOTES.md": "x"}, "a pcd tune card (pcd-tune.json) but no model"),
    ({"notes.txt": "x"}, "it holds notes.txt"),
])
def test_a_folder_without_config_json_is_named_for_what_it_is(tmp_path, files, says):
    """Not transformers' "should have a model_type key": the folder is named with what it holds."""
    folder = tmp_path / "models" / "current"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    with pytest.raises(ModelError, match="no config.json, so not a model folder") as info:
        resolve_model(str(folder))
    assert says in str(info.value)


# --- conversion and cache --------------------------------------------------------------------

def _cache_entries(cache: Path) -> list[str]:
    models = cache / "pcd" / "models"
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


def test_a_bad_gguf_is_refused_before_anything_is_written_to_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = _cut(embedded_gguf_path(), tmp_path / "truncated.gguf", 20_000_000)
    with pytest.raises(ModelError, match="the file is incomplete: 20,000,000 of 98,362,432 bytes"):
        resolve_model(str(path))
    assert not (tmp_path / "cache").exists()  # not even the content-key index


@pytest.mark.parametrize("failure", [RuntimeError("cannot reshape array"), KeyboardInterrupt()])
def test_a_conversion_that_fails_leaves_no_half_entry(tmp_path, monkeypatch, failure):
    import transformers

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "copy.gguf"
    path.write_bytes(embedded_gguf_path().read_bytes())

    def fail(*_args, **_kwargs):
        assert [p for p in _cache_entries(tmp_path / "cache") if p.startswith(".convert-")]  # the temporary folder
        raise failure

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fail)
    with pytest.raises(ModelError if isinstance(failure, Exception) else KeyboardInterrupt):
        converted_gguf_dir(path)
    assert _cache_entries(tmp_path / "cache") == [".keys"]  # the content-key index only: no model folder


# --- the CLI ---------------------------------------------------------------------------------

@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # relative names keep the messages short (no line folding)
    for name in ("input.jsonl", "schema.yaml"):
        (tmp_path / name).write_bytes((CASE / name).read_bytes())
    return tmp_path


def _pcd(command: str, model: str):
    args = (["label", "input.jsonl", "-s", "schema.yaml", "--id-field", "id", "-o", "out.parquet", "--quiet"]
            if command == "label" else ["inspect-schema", "schema.yaml"])
    return pcd(*args, "--model", model, code=None)


@pytest.mark.parametrize("command", ["label", "inspect-schema"])
def test_the_cli_exits_3_on_a_gguf_cut_inside_its_header(workdir, command):
    _cut(embedded_gguf_path(), workdir / "cut.gguf", 100)
    result = _pcd(command, "cut.gguf")
    assert result.exit_code == 3, result.output
    assert (f"error: 'cut.gguf': the file is incomplete: 100 bytes, cut inside its header {AGAIN}"
            in _one_line(result.output))
    assert "Traceback" not in result.output
    assert not (workdir / "cache").exists() and not (workdir / "out.parquet").exists()


@pytest.mark.parametrize("command", ["label", "inspect-schema"])
def test_the_cli_exits_3_on_a_model_folder_with_a_cut_or_pointer_safetensors(workdir, command):
    folder = workdir / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    full = _safetensors(workdir / "full.safetensors")
    size = full.stat().st_size
    _cut(full, folder / "model.safetensors", size - 8)
    result = _pcd(command, "m")
    assert result.exit_code == 3, result.output
    assert (f"error: 'm/model.safetensors': the file is incomplete: {size - 8:,} of {size:,} bytes {AGAIN}"
            in _one_line(result.output))
    (folder / "model.safetensors").write_text(LFS_POINTER)
    result = _pcd(command, "m")
    assert result.exit_code == 3, result.output
    assert ("error: 'm/model.safetensors': not a safetensors file (it starts with b'version '; a safetensors file "
            "is a header length and a JSON header): it is a git-lfs pointer file" in _one_line(result.output))
    assert "Traceback" not in result.output
    assert not (workdir / "cache").exists()


def test_the_embedded_model_is_checked_before_its_cache_entry_is_looked_up(tmp_path, monkeypatch):
    from pcd_cli.backends import torch_backend

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    seen = []
    monkeypatch.setattr(torch_backend, "check_gguf", lambda p: seen.append(p) or check_gguf(p))
    target = torch_backend.converted_gguf_target(embedded_gguf_path())
    assert seen == [embedded_gguf_path()]
    assert target.parent == tmp_path / "cache" / "pcd" / "models"


# -- the case gguf-html-page-or-truncated-download as it runs, tests/data/cases-round3/ (issue #20;
# formerly tests/test_cases_round3.py)
@pytest.mark.parametrize("command", ["label", "inspect-schema"])
@pytest.mark.parametrize("model, message", [
    ("not-a-model.gguf", "'not-a-model.gguf': not a GGUF file (it starts with b'<!DOCTYP'; a GGUF file starts with "
                         "b'GGUF'): it looks like an HTML page: download with the /resolve/ URL, not /blob/"),
    ("truncated.gguf", "'truncated.gguf': the file is incomplete: 20,000,000 of 98,362,432 bytes "
                       "(an interrupted download? download it again)"),
])
def test_a_gguf_that_is_a_web_page_or_a_cut_download_exits_3_naming_the_cause(tmp_path, monkeypatch, command,
                                                                               model, message):
    from pcd_cli.backends.torch_backend import embedded_gguf_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # relative names, as the case runs them
    for name in ("input.jsonl", "schema.yaml"):
        (tmp_path / name).write_bytes((CASE / name).read_bytes())
    # the page is kept as .html in the repository (no model file is tracked by git) and named as the case names it
    (tmp_path / "not-a-model.gguf").write_bytes((CASE / "not-a-model.html").read_bytes())
    with embedded_gguf_path().open("rb") as fh:
        (tmp_path / "truncated.gguf").write_bytes(fh.read(20_000_000))
    args = (["label", "input.jsonl", "-s", "schema.yaml", "--id-field", "id", "-o", "out.parquet", "--quiet"]
            if command == "label" else ["inspect-schema", "schema.yaml"])
    result = pcd(*args, "--model", model, code=None)
    assert result.exit_code == 3, result.output
    assert f"error: {message}" in " ".join(result.output.split())
    assert "Traceback" not in result.output and "reshape" not in result.output
    assert not (tmp_path / "cache").exists()  # no half-converted entry, not even a content key
    assert not (tmp_path / "out.parquet").exists()
