"""The streamed reader: malformed lines are reported with file:line, counted, never crash or vanish."""

from __future__ import annotations

import json
import logging

import pytest

from nmt.data.corpus import CorpusSpec, Malformed, check_line, load_pairs, read_tsv, stream_pairs
from nmt.errors import CorpusError

GOOD = "Hello.\tHola.\n"


def write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


def test_malformed_lines_are_reported_and_skipped(tmp_path, caplog):
    data = (
        GOOD.encode()
        + b"one column only\n"
        + b"a\tb\tc\n"
        + b"\tvacio\n"
        + b"empty target\t  \n"
        + b"caf\xe9\tbad latin-1\n"
        + b"\n"
        + "Bye.\tAdiós.\n".encode()
    )
    path = write(tmp_path / "c.tsv", data)
    with caplog.at_level(logging.WARNING, logger="nmt.data.corpus"):
        rows = list(read_tsv(path))
    assert rows == [{"src": "Hello.", "tgt": "Hola."}, {"src": "Bye.", "tgt": "Adiós."}]
    text = caplog.text
    for lineno, what in [
        (2, "found 1"),
        (3, "found 3"),
        (4, "empty source"),
        (5, "empty target"),
        (6, "undecodable"),
        (7, "found 1"),
    ]:
        assert f"{path}:{lineno}: " in text and what in text, (lineno, what)
    assert "skipped 6 malformed lines of 8" in text


def test_a_byte_order_mark_is_not_part_of_the_first_source(tmp_path):
    """A "UTF-8 with BOM" export (Excel, Notepad) gives the same pairs as plain UTF-8."""
    plain = list(read_tsv(write(tmp_path / "plain.tsv", (GOOD + "Bye.\tAdiós.\n").encode())))
    marked = list(read_tsv(write(tmp_path / "bom.tsv", b"\xef\xbb\xbf" + (GOOD + "Bye.\tAdiós.\n").encode())))
    assert marked == plain and marked[0]["src"] == "Hello."


def test_strict_makes_the_first_bad_line_fatal(tmp_path):
    path = write(tmp_path / "c.tsv", (GOOD + "no tab here\n").encode())
    with pytest.raises(CorpusError, match=r"c\.tsv:2: expected 2 tab-separated columns"):
        list(read_tsv(path, strict=True))


def test_the_strict_check_reads_a_file_again_once_it_changed(tmp_path):
    """nmt.train checks a strict corpus before importing torch and the run checks it again; the second check
    skips an unchanged file but never a changed one."""
    from nmt.data import check_corpus

    path = write(tmp_path / "c.tsv", GOOD.encode())
    spec = CorpusSpec(path=path, strict=True)
    check_corpus(spec)
    check_corpus(spec)  # unchanged: passed before
    with open(path, "a", encoding="utf-8") as f:
        f.write("no tab here\n")
    with pytest.raises(CorpusError, match=r"c\.tsv:2: expected 2 tab-separated columns"):
        check_corpus(spec)


def test_line_numbers_follow_newlines_not_unicode_separators(tmp_path, caplog):
    # U+2028 is a line boundary for str.splitlines but not a new line of the file.
    path = write(tmp_path / "c.tsv", ("A\u2028B.\tX.\n" + "bad\n").encode())
    with caplog.at_level(logging.WARNING):
        rows = list(read_tsv(path))
    assert rows == [{"src": "A\u2028B.", "tgt": "X."}]
    assert f"{path}:2:" in caplog.text


def test_crlf_and_missing_final_newline(tmp_path):
    path = write(tmp_path / "c.tsv", b"A.\tB.\r\nC.\tD.")
    assert [(r["src"], r["tgt"]) for r in read_tsv(path)] == [("A.", "B."), ("C.", "D.")]


def test_missing_and_empty_corpus(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        stream_pairs(CorpusSpec(str(tmp_path / "nope.tsv")))
    path = write(tmp_path / "bad.tsv", b"no tabs\nat all\n")
    with pytest.raises(CorpusError, match="no valid source<TAB>target line"):
        list(read_tsv(path))


def test_stream_is_a_datasets_iterable(sample_dir):
    import datasets

    ds = stream_pairs(CorpusSpec(str(sample_dir / "valid.tsv")))
    assert isinstance(ds, datasets.IterableDataset)
    first = next(iter(ds))
    assert set(first) == {"src", "tgt"} and first["src"] and first["tgt"]
    assert len(load_pairs(CorpusSpec(str(sample_dir / "valid.tsv")))) == 200


def test_hub_path_with_a_local_stand_in(tmp_path):
    """The Hub code path (load_dataset(..., streaming=True) on translation rows), on a local folder."""
    d = tmp_path / "opus_standin"
    d.mkdir()
    rows = [
        {"translation": {"en": "Hi.", "es": "Hola."}},
        {"translation": {"en": "", "es": "x"}},
        {"translation": {"en": "Yes.", "es": "Sí."}},
    ]
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = CorpusSpec(path=str(d), hub_path=str(d), hub_name=None, split="train")
    assert [(r["src"], r["tgt"]) for r in stream_pairs(spec)] == [("Hi.", "Hola."), ("Yes.", "Sí.")]


@pytest.mark.parametrize("raw", [b"", b"\t", b"a\t", b"\xff\xfe\tx", b"a\tb\tc"])
def test_check_line_rejects(raw):
    assert isinstance(check_line(raw), Malformed)
