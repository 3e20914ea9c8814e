"""The streamed reader: malformed lines are reported with file:line, counted, never crash or vanish."""

from __future__ import annotations

import json
import logging

import pytest

from nmt.data.corpus import CorpusSpec, Malformed, check_layout, check_line, load_pairs, read_tsv, stream_pairs
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
    check_corpus({"train": spec, "valid": spec})
    check_corpus({"train": spec, "valid": spec})  # unchanged: passed before
    with open(path, "a", encoding="utf-8") as f:
        f.write("no tab here\n")
    with pytest.raises(CorpusError, match=r"c\.tsv:2: expected 2 tab-separated columns"):
        check_corpus({"train": spec, "valid": spec})


def test_columns_choose_the_source_and_target_of_lines_with_any_number_of_columns(tmp_path):
    """data.columns=[1,0] trains the other direction from the same files; [0,1] reads the manythings.org/Anki
    exports (a third, attribution column), which the default (exactly two columns) refuses line by line."""
    three = b"Hello.\tHola.\tCC-BY 2.0 (France) Attribution: tatoeba.org #1\n"
    assert check_line(three, (1, 0)) == ("Hola.", "Hello.")
    assert check_line(three, (0, 2))[1].startswith("CC-BY")
    assert check_line(b"Hello.\tHola.\n", (1, 0)) == ("Hola.", "Hello.")
    assert isinstance(check_line(three), Malformed) and check_line(three).columns == 3
    short = check_line(b"Hello.\tHola.\n", (0, 2))
    assert (
        short.detail
        == "expected at least 3 tab-separated columns (source in column 0, target in column 2, from 0), found 2"
    )
    path = write(tmp_path / "c.tsv", three * 3)
    assert load_pairs(CorpusSpec(path, columns=(1, 0))) == [("Hola.", "Hello.")] * 3
    with pytest.raises(CorpusError, match=r"every line has 3 tab-separated columns and data\.columns is unset"):
        list(read_tsv(path))
    with pytest.raises(CorpusError, match=r"e\.g\. columns=\[0,1\]"):  # nmt.evaluate names its own key
        load_pairs(CorpusSpec(path), columns_key="columns")


def test_the_tokenizer_cache_tells_the_directions_apart(tmp_path):
    """data.columns=[1,0] trains the source model on the other column: its cache entry is not the default's,
    which keeps the name it had before the key existed."""
    from nmt.data import corpus_id

    path = write(tmp_path / "c.tsv", GOOD.encode())
    plain, forward, reverse = (corpus_id(CorpusSpec(path, columns=c)) for c in (None, (0, 1), (1, 0)))
    assert len({plain, forward, reverse}) == 3 and plain.endswith(":en-es") and reverse.endswith(":columns1,0")


def test_a_file_laid_out_otherwise_is_found_from_its_first_lines(tmp_path):
    """Checked before torch (nmt.train): when none of the first lines reads and all have the same wrong number
    of columns, one line says how to read the file; a good line among them leaves the bad ones to the pass."""
    three = b"a\tb\tc\n"
    path = write(tmp_path / "c.tsv", three * 50)
    with pytest.raises(CorpusError, match=r"c\.tsv: every line has 3 .* e\.g\. data\.columns=\[0,1\]"):
        check_layout(path, None)
    with pytest.raises(CorpusError, match=r"every line has 3 tab-separated columns, too few for data\.columns=\[0,3\]"):
        check_layout(path, (0, 3))
    check_layout(path, (2, 0))
    check_layout(write(tmp_path / "mixed.tsv", three + GOOD.encode() + three * 30), None)
    with pytest.raises(CorpusError, match="no line has a tab"):
        check_layout(write(tmp_path / "spaces.tsv", b"Hello. Hola.\n" * 5), None)


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
