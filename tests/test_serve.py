"""The web demo over real HTTP on loopback (waitress, through the CLI), and its page rendered by headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import REPO, popen_module, run_module

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start_server(trained, *extra: str) -> tuple[subprocess.Popen, str]:
    """``python -m nmt.serve`` on a free loopback port, once ``/healthz`` answers: (the process, its base URL)."""
    run, cache, _ = trained
    port = free_port()
    args = [f"checkpoint={run}/checkpoints/best.pt", f"port={port}", "beam_size=2", "max_chars=200", *extra]
    proc = popen_module("nmt.serve", args, cache)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1)
            return proc, base
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read()) from None
            time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"nmt.serve did not answer /healthz within 60 s:\n{proc.communicate()[0]}")


def stop(proc: subprocess.Popen) -> str:
    """Terminate the server; its console output."""
    proc.terminate()
    return proc.communicate(timeout=30)[0]


@pytest.fixture(scope="module")
def server(trained):
    proc, base = start_server(trained, "http_threads=4")
    yield base
    stop(proc)


def translate(server: str, text: str) -> tuple[int, dict]:
    return post(server + "/api/translate", json.dumps({"text": text}).encode())


def test_json_endpoint(server):
    code, j = post(server + "/api/translate", json.dumps({"text": "I like cats."}).encode())
    assert code == 200 and j["translation"].strip()
    att = j["attention"]
    assert len(att) == len(j["tgt_pieces"]) and all(len(row) == len(j["src_pieces"]) for row in att)
    assert all(abs(sum(row) - 1.0) < 1e-4 for row in att)
    assert post(server + "/api/translate", json.dumps({"text": "x" * 201}).encode())[0] == 413
    assert post(server + "/api/translate", b"not json")[0] == 400
    assert post(server + "/api/translate", json.dumps({"text": ""}).encode()) == (
        200,
        post(server + "/api/translate", json.dumps({"text": "  "}).encode())[1],
    )


def test_cli_serves_with_waitress_and_no_development_server_warning(trained):
    proc, base = start_server(trained, "http_threads=3")
    with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
        assert r.status == 200 and json.loads(r.read()) == {"ok": True}
    assert translate(base, "I like cats.\nHello.")[0] == 200
    assert post(base + "/nowhere", b"{}")[0] == 404
    out = stop(proc)
    assert "development server" not in out.lower(), out
    assert f"on {base}/ with 3 threads (waitress)" in out, out
    # An access log (waitress writes none): a line per request, the health checks left out.
    assert re.search(r"\] - 127\.0\.0\.1 POST /api/translate 200, 2 lines, \d+ ms$", out, re.M), out
    assert re.search(r"\] - 127\.0\.0\.1 POST /nowhere 404, \d+ ms$", out, re.M), out
    assert "/healthz" not in out, out


def test_bad_thread_count_is_one_line_before_loading(trained, tmp_path):
    run, cache, _ = trained
    proc = run_module("nmt.serve", [f"checkpoint={tmp_path}/missing.pt", "http_threads=0"], cache, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "http_threads=0" in proc.stderr and "missing.pt" not in proc.stderr


def test_concurrent_clients_are_all_answered(server):
    texts = [f"I like {w}." for w in ("cats", "dogs", "tea", "music")] * 4
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda t: translate(server, t), texts))
    assert len(answers) == 16
    for code, j in answers:
        assert code == 200 and j["translation"].strip(), j
    by_text = {t: j["translation"] for t, (_, j) in zip(texts, answers)}
    assert all(j["translation"] == by_text[t] for t, (_, j) in zip(texts, answers))  # no crosstalk


@pytest.mark.parametrize(
    "body, says",
    [
        (b"", "the request body is empty"),
        (b"not json", "the request body is not JSON"),
        (b"\xff\xfe\xfd", "the request body is not JSON"),
        (b'["I like cats."]', "the JSON is an array, not an object"),
        (b'"I like cats."', "the JSON is a string, not an object"),
        (b'{"txt": "I like cats."}', 'the JSON object has no "text" field (its keys: "txt")'),
        (b'{"text": 3}', '"text" is a number, not a string'),
        (b'{"text": ["a", "b"]}', '"text" is an array, not a string'),
        (b'{"text": null}', '"text" is null, not a string'),
    ],
)
def test_each_bad_request_says_what_was_wrong(server, body, says):
    code, j = post(server + "/api/translate", body)
    assert code == 400 and says in j["error"], j
    assert '{"text": "..."}' in j["error"]


def test_other_http_errors_answer_json(server):
    code, j = translate(server, "x" * 201)
    assert code == 413 and j["error"] == "text is 201 characters; the limit is 200"
    code, j = post(server + "/api/translate", b'{"text": "' + b"x" * 5000 + b'"}')  # refused unread
    assert code == 413 and "Too Large" in j["error"]
    try:
        urllib.request.urlopen(server + "/api/translate", timeout=10)
        raise AssertionError("GET /api/translate was answered")
    except urllib.error.HTTPError as e:
        error = json.loads(e.read())["error"]
        assert e.code == 405 and error.startswith("405 Method Not Allowed: GET /api/translate: GET is not allowed here")
        assert "POST /api/translate" in error.split("; ")[1]
    code, j = post(server + "/translate", b'{"text": "Hello."}')  # a guessed path: told the real ones
    assert code == 404 and j["error"].startswith("404 Not Found: POST /translate: no such endpoint; this server ")
    assert all(x in j["error"] for x in ("GET /healthz", 'POST /api/translate with {"text": "..."}'))


def test_each_line_is_translated_on_its_own(server):
    code, j = translate(server, "I like cats.\r\n\n  Where   is the station?  \n")
    assert code == 200
    lines = j["lines"]
    assert [x["source"] for x in lines] == ["I like cats.", "", "Where is the station?"]
    assert j["translation"] == "\n".join(x["translation"] for x in lines)
    assert lines[1]["translation"] == "" and lines[1]["attention"] == []
    for x in (lines[0], lines[2]):
        assert x["translation"].strip()
        assert len(x["attention"]) == len(x["tgt_pieces"])
        assert all(len(row) == len(x["src_pieces"]) for row in x["attention"])
        alone = translate(server, x["source"])[1]  # the same as that line sent alone
        assert [alone[k] for k in ("translation", "src_pieces", "tgt_pieces")] == [
            x[k] for k in ("translation", "src_pieces", "tgt_pieces")
        ]
        assert alone["score"] == pytest.approx(x["score"], abs=1e-4)
    assert {k: j[k] for k in ("score", "src_pieces", "tgt_pieces", "attention")} == {
        k: lines[0][k] for k in ("score", "src_pieces", "tgt_pieces", "attention")
    }


def test_page_renders_in_headless_chromium(server, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail(
            "headless Chromium is needed for this test: `bash scripts/install.sh --with-browser` installs "
            "Debian's chromium (or deselect with -k 'not chromium')"
        )
    flags = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path}/profile", "--virtual-time-budget=15000"]
    dom = subprocess.run([*flags, "--dump-dom", server + "/"], capture_output=True, text=True, timeout=120).stdout
    assert 'id="heatmap"' in dom and "<td" in dom
    translated = dom.split('data-testid="translation">', 1)[1].split("<", 1)[0]
    assert translated.strip(), dom[:2000]
    shot = REPO / "test-artifacts" / "serve.png"
    shot.parent.mkdir(exist_ok=True)
    subprocess.run(
        [*flags, "--window-size=1000,800", f"--screenshot={shot}", server + "/"], capture_output=True, timeout=120
    )
    assert shot.is_file() and shot.stat().st_size > 10_000
    assert Path(shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
