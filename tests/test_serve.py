"""The web demo over real HTTP on loopback, and its page rendered by headless Chromium."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import REPO, popen_module

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


@pytest.fixture(scope="module")
def server(trained):
    run, cache, _ = trained
    port = free_port()
    proc = popen_module(
        "nmt.serve", [f"checkpoint={run}/checkpoints/best.pt", f"port={port}", "beam_size=2", "max_chars=200"], cache
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1)
            break
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read()) from None
            time.sleep(0.5)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


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
