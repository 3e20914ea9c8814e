"""Tiny-model settings and a subprocess runner shared by the CLI tests."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]

# Small enough to train in seconds on 2 cores, big enough that the loss visibly falls.
TINY = [
    "tokenizer.vocab_size=300",
    "tokenizer.sample_size=3000",
    "encoder.emb_size=32",
    "encoder.hidden_size=32",
    "decoder.emb_size=32",
    "decoder.hidden_size=64",
    "data.max_tokens=600",
    "data.valid_max_sentences=40",
    "data.bucket_size=2000",
    "data.shuffle_buffer=500",
    "trainer.log_every=10",
    "trainer.lr=3e-3",
    "device=cpu",
    "wandb.mode=disabled",
    # Choosing decoding defaults costs ~3 s per tiny run (13 decodes); tests/test_finishing.py turns it on.
    "trainer.tune_decoding=false",
    # Three heatmaps per validation (matplotlib) cost ~1-3 s per tiny run; the `trained` fixture draws them.
    "trainer.plot_attention=0",
]


def compose_cfg(overrides: list[str]):
    """The training config as ``python -m nmt.train OVERRIDES`` composes it (schema registered, as nmt.train does)."""
    from hydra import compose, initialize_config_dir

    from nmt.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose("config", overrides=overrides)


def env(cache: Path) -> dict:
    e = dict(os.environ)
    e.update(
        NMT_CACHE=str(cache),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        WANDB_MODE="disabled",
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),  # 1 under `pytest -n 2` (conftest.py)
        PYTHONUNBUFFERED="1",
    )
    return e


def run_module(
    module: str,
    args: list[str],
    cache: Path,
    stdin: str | None = None,
    timeout: int = 600,
    check: bool = True,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess:
    """``python -m module args`` as a user runs it (from ``cwd``, the repository by default): a new process,
    forked from the tests' warm interpreter (tests/forkserver.py) unless ``NMT_TEST_FORKSERVER=0``."""
    cmd = [sys.executable, "-m", module, *args]
    environ = {**env(cache), "PYTHONPATH": str(REPO)}
    server = _forkserver(environ)
    if server is None:
        proc = subprocess.run(cmd, cwd=cwd, env=environ, input=stdin, capture_output=True, text=True, timeout=timeout)
    else:
        proc = server.run(cmd, module, args, cwd, environ, stdin, timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} exited {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc


# Read by nmt at run time, or not at import time by the libraries the fork server imports: a request may differ
# in these (TORCHINDUCTOR_CACHE_DIR: set in the test process by an in-process torch.compile, read when compiling).
_RUNTIME_ENV = ("NMT_", "PYTEST_", "WANDB_", "PWD", "OLDPWD", "TORCHINDUCTOR_CACHE_DIR")


class _ForkServer:
    """The client of tests/forkserver.py: one server per test process, started at its first request."""

    def __init__(self, environ: dict):
        self.dir = Path(tempfile.mkdtemp(prefix="nmt-forkserver-"))
        self.path = str(self.dir / "socket")
        self.env = {k: v for k, v in environ.items() if not k.startswith(_RUNTIME_ENV)}
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "forkserver.py"), self.path],
            cwd=self.dir,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"tests/forkserver.py did not start (exit {self.proc.wait()})")
        atexit.register(self.close)

    def serves(self, environ: dict) -> bool:
        """Whether a process with this environment may be forked from the server (else a real one is started)."""
        return (
            self.proc.poll() is None
            and {k: v for k, v in environ.items() if not k.startswith(_RUNTIME_ENV)} == self.env
        )

    def run(self, cmd, module, args, cwd, environ, stdin, timeout) -> subprocess.CompletedProcess:
        request = {"module": module, "args": list(args), "cwd": str(cwd), "env": environ}
        with (
            tempfile.TemporaryFile("w+b") as inp,
            tempfile.TemporaryFile("w+b") as out,
            tempfile.TemporaryFile("w+b") as err,
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn,
        ):
            if stdin is not None:
                inp.write(stdin.encode())
                inp.seek(0)
            conn.connect(self.path)
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [inp.fileno(), out.fileno(), err.fileno()])
            replies = conn.makefile("r")
            pid = json.loads(replies.readline())["pid"]
            conn.settimeout(timeout)
            try:
                line = replies.readline()
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(cmd, timeout) from None
            code = json.loads(line)["returncode"]
            out.seek(0)
            err.seek(0)
            # decoded as subprocess.run(text=True) does: UTF-8, universal newlines
            text = [f.read().decode().replace("\r\n", "\n").replace("\r", "\n") for f in (out, err)]
        return subprocess.CompletedProcess(cmd, code, *text)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_SERVER: _ForkServer | None | bool = None  # False: it could not start in this process; real processes only


def _forkserver(environ: dict) -> _ForkServer | None:
    """The warm interpreter for ``run_module``, or None: turned off, unable to start (a socket path over the
    system's limit under a long TMPDIR, say: the tests then start real processes, slower), or a request it
    cannot serve faithfully."""
    global _SERVER
    if os.environ.get("NMT_TEST_FORKSERVER", "1") == "0" or _SERVER is False:
        return None
    if _SERVER is None:
        try:
            _SERVER = _ForkServer(environ)
        except (OSError, RuntimeError) as e:
            warnings.warn(f"tests/forkserver.py: {e}; every CLI test starts a real process", stacklevel=2)
            _SERVER = False
            return None
    return _SERVER if _SERVER.serves(environ) else None


def tiny_sweep(
    folder: Path, overrides: list[str], data_dir: Path, cache: Path, steps: int = 20, output: list | None = None
) -> list[Path]:
    """``python -m nmt.train -m OVERRIDES`` with the tiny model on ``data_dir`` for ``steps`` steps into
    the sweep folder ``folder`` (a second call adds jobs to it); returns every job folder found there.
    ``output``: the finished process is appended to it (its stderr holds the sweep's last lines)."""
    args = ["-m", *overrides, f"data.dir={data_dir}", *TINY, f"trainer.max_steps={steps}", f"hydra.sweep.dir={folder}"]
    proc = run_module("nmt.train", args, cache)
    if output is not None:
        output.append(proc)
    return sorted(p.parent.parent for p in folder.rglob(".hydra/config.yaml"))


def popen_module(module: str, args: list[str], cache: Path, new_session: bool = False) -> subprocess.Popen:
    """Start a CLI in the background; new_session: in its own process group, to signal it as a terminal does."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env(cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=new_session,
    )


def tokenizer_cfg(cache_dir: Path, **overrides) -> SimpleNamespace:
    """A tokenizer config section for build_tokenizer, small by default."""
    base = dict(
        model_type="unigram",
        vocab_size=200,
        joint=True,
        sample_size=1000,
        character_coverage=1.0,
        cache_dir=str(cache_dir),
    )
    base.update(overrides)
    return SimpleNamespace(**base)


def source_file(sample_dir: Path, folder: Path, n: int) -> tuple[list[str], Path]:
    """The first ``n`` source sentences of the sample test.tsv, and a file of them (one per line) in ``folder``."""
    lines = [ln.split("\t")[0] for ln in (sample_dir / "test.tsv").read_text(encoding="utf-8").splitlines()[:n]]
    src = folder / "src.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines, src


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def refused_before_torch(module: str, argv: list[str], tmp_path: Path) -> str:
    """Run ``python -m module argv`` in-process under runpy: it must exit 2 with one error line, torch never
    imported; returns that line."""
    code = (
        f"import sys, runpy; sys.argv = {[module, *argv]!r}\n"
        f"try:\n    runpy.run_module({module!r}, run_name='__main__')\n"
        "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)"
    )
    e = {**env(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "2 False", proc.stdout + proc.stderr[-2000:]
    (line,) = error_lines(proc)
    return line
