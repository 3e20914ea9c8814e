"""Tests for nmt.data.fetch: parsing, cleaning, splitting, copying, download (no network)."""

from __future__ import annotations

import io
import subprocess
import sys
import unicodedata
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from nmt.data import fetch
from nmt.data.fetch import (
    SPLITS,
    clean_pairs,
    corpus_ready,
    default_source,
    fetch_spa_eng,
    normalize_text,
    read_anki_zip,
    split_pairs,
)
from nmt.errors import CorpusError

NBSP = "\u00a0"
DECOMPOSED_CAFE = "cafe\u0301"  # "café" in NFD
COMPOSED_CAFE = unicodedata.normalize("NFC", DECOMPOSED_CAFE)


def _raw_lines() -> list[str]:
    lines = [
        "Go.\tVe.",
        "Go.\tVete.",  # one English sentence, several translations
        "Go.\tVaya.",
        "go.\tVáyase.",  # same sentence case-folded: must share the split
        "Go.\tVe.",  # exact duplicate
        f"Hi.{NBSP}\tHola.",  # no-break space: normalises to the duplicate-free "Hi."
        "Hi.\tHola.",  # duplicate of the previous line after normalisation
        f"I like {DECOMPOSED_CAFE}.\tMe gusta el {DECOMPOSED_CAFE}.",  # non-NFC
        "Run!\t¡Corre!\tCC-BY 2.0 (France) Attribution: tatoeba.org #906328",  # 3 columns
        "Zero\u200bwidth  spaces.\tEspacios\u2009raros.",
        "   \tVacío.",  # empty English side
        "only one column",
    ]
    lines += [f"Sentence number {i}.\tFrase número {i}." for i in range(60)]
    lines += [f"Sentence number {i}.\tOración número {i}." for i in range(0, 60, 7)]
    return lines


def _zip_bytes(lines: list[str], member: str = "spa-eng/spa.txt") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("spa-eng/_about.txt", "about")
        archive.writestr(member, "\r\n".join(lines) + "\r\n")
    return buffer.getvalue()


@pytest.fixture
def zip_bytes() -> bytes:
    return _zip_bytes(_raw_lines())


def _key(english: str) -> str:
    return " ".join(english.casefold().split())


def _read_tsv(path: Path) -> list[tuple[str, str]]:
    text = path.read_bytes().decode("utf-8")
    assert text.endswith("\n") and "\r" not in text
    return [tuple(line.split("\t")) for line in text.split("\n")[:-1]]


def test_normalize_text() -> None:
    assert normalize_text(f"  a{NBSP}b\u200b\u2009c\t d  ") == "a b c d"
    assert normalize_text(DECOMPOSED_CAFE) == COMPOSED_CAFE
    assert normalize_text("\ufeffHi.") == "Hi."


def test_read_anki_zip_keeps_two_columns(zip_bytes: bytes, tmp_path: Path) -> None:
    pairs = read_anki_zip(zip_bytes)
    assert ("Run!", "¡Corre!") in pairs
    assert all(len(pair) == 2 for pair in pairs)
    assert len(pairs) == len(_raw_lines()) - 1  # the one-column line is skipped
    path = tmp_path / "spa-eng.zip"
    path.write_bytes(zip_bytes)
    assert read_anki_zip(path) == pairs


def test_read_anki_zip_without_spa_txt() -> None:
    with pytest.raises(ValueError, match="spa.txt"):
        read_anki_zip(_zip_bytes(["a\tb"], member="spa-eng/other.txt"))


def test_clean_pairs_normalises_and_drops(zip_bytes: bytes) -> None:
    pairs = clean_pairs(read_anki_zip(zip_bytes))
    assert len(pairs) == len(set(pairs))
    assert ("Hi.", "Hola.") in pairs
    assert (f"I like {COMPOSED_CAFE}.", f"Me gusta el {COMPOSED_CAFE}.") in pairs
    assert ("Zerowidth spaces.", "Espacios raros.") in pairs
    assert all(en and es for en, es in pairs)
    assert not any(en.startswith(" ") or "Vacío." == es for en, es in pairs)
    assert pairs.count(("Go.", "Ve.")) == 1
    for en, es in pairs:
        assert normalize_text(en) == en and normalize_text(es) == es


def test_split_is_deterministic_and_disjoint(zip_bytes: bytes) -> None:
    pairs = clean_pairs(read_anki_zip(zip_bytes))
    first = split_pairs(pairs, valid_size=10, test_size=10, seed=7)
    assert first == split_pairs(list(pairs), valid_size=10, test_size=10, seed=7)
    assert set(first) == set(SPLITS)

    # every kept pair exactly once overall
    together = [pair for split in SPLITS for pair in first[split]]
    assert sorted(together) == sorted(pairs)

    # no English sentence (case-folded) in two splits
    owners: dict[str, set[str]] = {}
    for split in SPLITS:
        for en, _ in first[split]:
            owners.setdefault(_key(en), set()).add(split)
    assert all(len(splits) == 1 for splits in owners.values())
    assert owners[_key("Go.")] == owners[_key("go.")]

    # whole groups until the size is reached, the rest is train
    assert 10 <= len(first["valid"]) < 10 + 4
    assert 10 <= len(first["test"]) < 10 + 4
    assert len(first["train"]) == len(pairs) - len(first["valid"]) - len(first["test"])

    other = split_pairs(pairs, valid_size=10, test_size=10, seed=8)
    assert other != first


def test_split_keeps_groups_adjacent_in_valid() -> None:
    pairs = [(f"s{i}", f"t{i}-{j}") for i in range(30) for j in range(3)]
    result = split_pairs(pairs, valid_size=6, test_size=6, seed=1)
    valid = [en for en, _ in result["valid"]]
    assert len(valid) == 6
    assert valid[0] == valid[1] == valid[2] and valid[3] == valid[4] == valid[5]


def test_fetch_downloads_and_splits(zip_bytes: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    requested: list[str] = []

    def fake_urlopen(request: urllib.request.Request, timeout: float) -> io.BytesIO:
        requested.append(request.full_url)
        assert timeout > 0
        return io.BytesIO(zip_bytes)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    dest = tmp_path / "data" / "spa-eng"
    assert not corpus_ready(dest)
    result = fetch_spa_eng(dest, url="http://example.invalid/spa-eng.zip", valid_size=5, test_size=5)
    assert result == dest
    assert requested == ["http://example.invalid/spa-eng.zip"]
    assert corpus_ready(dest)
    assert not list(dest.glob(".*tmp"))

    expected = split_pairs(clean_pairs(read_anki_zip(zip_bytes)), valid_size=5, test_size=5, seed=20261121)
    for split in SPLITS:
        assert _read_tsv(dest / f"{split}.tsv") == expected[split]

    # a second fetch gives byte-identical files
    before = {split: (dest / f"{split}.tsv").read_bytes() for split in SPLITS}
    fetch_spa_eng(dest, url="http://example.invalid/spa-eng.zip", valid_size=5, test_size=5)
    assert before == {split: (dest / f"{split}.tsv").read_bytes() for split in SPLITS}


def test_fetch_without_network_names_url_and_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(request: urllib.request.Request, timeout: float) -> io.BytesIO:
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(CorpusError, match="--from DIR") as info:
        fetch_spa_eng(tmp_path / "out")
    assert fetch.SPA_ENG_URL in str(info.value)
    assert not corpus_ready(tmp_path / "out")


def _make_corpus(directory: Path, with_sample: bool = True) -> None:
    directory.mkdir(parents=True)
    for split in SPLITS:
        (directory / f"{split}.tsv").write_text(f"{split} one\tuno\n{split} two\tdos\n", "utf-8")
    (directory / "README.md").write_text("readme", "utf-8")
    if with_sample:
        (directory / "sample").mkdir()
        for split in SPLITS:
            (directory / "sample" / f"{split}.tsv").write_text(f"{split}\tx\n", "utf-8")


def test_fetch_copies_from_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("must not download when a source is given")

    monkeypatch.setattr(urllib.request, "urlopen", no_download)
    source = tmp_path / "shared"
    _make_corpus(source)
    for path in [*source.glob("*.tsv"), *source.glob("sample/*.tsv")]:
        path.chmod(0o444)  # like the shared corpus
    dest = tmp_path / "dest"
    assert fetch_spa_eng(dest, source=source) == dest
    assert corpus_ready(dest)
    for name in [
        "train.tsv",
        "valid.tsv",
        "test.tsv",
        "README.md",
        *(f"sample/{split}.tsv" for split in SPLITS),
    ]:
        assert (dest / name).read_bytes() == (source / name).read_bytes()
    # the copy is writable, so a later fetch can replace it
    assert fetch_spa_eng(dest, source=source) == dest


def test_fetch_from_incomplete_source_fails(tmp_path: Path) -> None:
    source = tmp_path / "shared"
    _make_corpus(source, with_sample=False)
    (source / "test.tsv").unlink()
    with pytest.raises(CorpusError):
        fetch_spa_eng(tmp_path / "dest", source=source)


def test_corpus_ready(tmp_path: Path) -> None:
    assert not corpus_ready(tmp_path / "missing")
    _make_corpus(tmp_path / "c", with_sample=False)
    assert corpus_ready(tmp_path / "c")
    (tmp_path / "c" / "valid.tsv").write_text("")
    assert not corpus_ready(tmp_path / "c")


def test_default_source_prefers_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = tmp_path / "corpus"
    _make_corpus(corpus, with_sample=False)
    monkeypatch.setenv("NMT_SPA_ENG_SOURCE", str(corpus))
    assert default_source() == corpus.resolve()


def test_default_source_relative_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make_corpus(tmp_path / "shared" / "data" / "spa-eng", with_sample=False)
    (tmp_path / "clone").mkdir()
    monkeypatch.chdir(tmp_path / "clone")
    monkeypatch.setenv("NMT_SPA_ENG_SOURCE", str(tmp_path / "nowhere"))
    assert default_source() == (tmp_path / "shared" / "data" / "spa-eng").resolve()


def test_cli_copies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "shared"
    _make_corpus(source)
    dest = tmp_path / "out"
    assert fetch.main(["--from", str(source), "--dest", str(dest)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert str(source) in out[0] and "train 2" in out[0]
    assert corpus_ready(dest)


def test_fetching_loads_no_torch() -> None:
    """The corpus command starts in a fraction of a second: the shared atomic writer does not pull in torch."""
    code = "import sys, nmt.data.fetch, nmt.data.tokenizer; print('torch' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
