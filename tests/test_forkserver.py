"""The tests' fork server (tests/forkserver.py) runs a module as ``python -m`` does in a new process.

run_module starts most of the suite's CLI processes from it; these tests hold its processes equal to real
ones on everything a CLI can see, except the one documented difference: the server's libraries are imported.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from helpers import run_module

PROBE = textwrap.dedent(
    """
    import atexit, json, os, sys
    atexit.register(lambda: print("atexit ran", file=sys.stderr))
    mode = sys.argv[1]
    if mode == "report":
        print(json.dumps({
            "argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
            "name": __name__,
            "cwd": os.getcwd(),
            "path0": sys.path[0],
            "env": os.environ.get("NMT_PROBE"),
            "stdin": sys.stdin.read(),
            "nmt": "nmt" in sys.modules,
            "torch": "torch" in sys.modules,
            "main": sorted(k for k in vars(sys.modules["__main__"]) if not k.startswith("__")),
        }))
        print("a line\\r\\nand a carriage return\\rend", file=sys.stderr)
        sys.exit(3)
    if mode == "message":
        sys.exit("a message instead of a code")
    if mode == "raise":
        raise ValueError("uncaught")
    if mode == "interrupt":
        raise KeyboardInterrupt
    """
)


@pytest.fixture()
def probe_dir(tmp_path):
    (tmp_path / "nmt_probe_mod.py").write_text(PROBE)
    return tmp_path


def both(monkeypatch, probe_dir, mode: str, stdin: str | None = None):
    """The probe run once as a real process and once from the fork server (stderr without the traceback's
    file paths, which differ only in the runner's frames)."""
    got = {}
    for server in ("0", "1"):
        monkeypatch.setenv("NMT_TEST_FORKSERVER", server)
        monkeypatch.setenv("NMT_PROBE", "value")
        proc = run_module("nmt_probe_mod", [mode], probe_dir / "cache", stdin=stdin, check=False, cwd=probe_dir)
        got[server] = proc
    return got["0"], got["1"]


def test_a_forked_process_sees_what_a_new_one_sees(monkeypatch, probe_dir):
    real, forked = both(monkeypatch, probe_dir, "report", stdin="typed\nlines\n")
    assert real.returncode == forked.returncode == 3
    a, b = json.loads(real.stdout), json.loads(forked.stdout)
    # the one difference, by design: the server's libraries are already imported (nmt never is)
    assert (a.pop("torch"), b.pop("torch")) == (False, True)
    assert a == b
    assert a["argv"] == ["nmt_probe_mod.py", "report"] and a["name"] == "__main__" and a["env"] == "value"
    assert a["cwd"] == a["path0"] == str(probe_dir) and a["stdin"] == "typed\nlines\n" and not a["nmt"]
    assert real.stderr == forked.stderr == "a line\nand a carriage return\nend\natexit ran\n"


@pytest.mark.parametrize("mode,code,says", [("message", 1, "a message instead of a code"), ("raise", 1, "ValueError")])
def test_exits_and_errors_end_a_forked_process_as_they_end_a_new_one(monkeypatch, probe_dir, mode, code, says):
    real, forked = both(monkeypatch, probe_dir, mode)
    assert real.returncode == forked.returncode == code
    for proc in (real, forked):
        assert says in proc.stderr and proc.stderr.rstrip().endswith("atexit ran"), proc.stderr


def test_an_uncaught_interrupt_ends_a_forked_process_by_sigint_as_it_ends_a_new_one(monkeypatch, probe_dir):
    real, forked = both(monkeypatch, probe_dir, "interrupt")
    assert real.returncode == forked.returncode == -2
    assert "KeyboardInterrupt" in real.stderr and "KeyboardInterrupt" in forked.stderr


def test_a_process_whose_environment_a_library_may_read_at_import_is_started_for_real(monkeypatch, probe_dir):
    monkeypatch.setenv("NMT_TEST_FORKSERVER", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1" if os.environ.get("MKL_NUM_THREADS") != "1" else "2")
    proc = run_module("nmt_probe_mod", ["report"], probe_dir / "cache", check=False, cwd=probe_dir)
    assert json.loads(proc.stdout)["torch"] is False  # a new interpreter: nothing imported


def test_a_server_that_cannot_start_leaves_real_processes(monkeypatch, probe_dir, tmp_path):
    """A Unix socket path has a length limit (108 bytes on Linux): under a long TMPDIR the server cannot bind,
    and the tests go on with real processes instead of failing."""
    import helpers

    long_tmp = tmp_path / ("x" * 60) / ("y" * 60)
    long_tmp.mkdir(parents=True)
    monkeypatch.setattr(helpers, "_SERVER", None)  # this test process's server is put back afterwards
    monkeypatch.setattr(helpers.tempfile, "tempdir", str(long_tmp))
    monkeypatch.setenv("NMT_TEST_FORKSERVER", "1")
    with pytest.warns(UserWarning, match="every CLI test starts a real process"):
        proc = run_module("nmt_probe_mod", ["report"], probe_dir / "cache", check=False, cwd=probe_dir)
    assert proc.returncode == 3 and json.loads(proc.stdout)["torch"] is False
    assert helpers._SERVER is False
