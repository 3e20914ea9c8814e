"""A warm interpreter that starts the tests' ``python -m nmt.X`` processes by fork (tests/helpers.py: run_module).

Every CLI process of the suite used to pay the same ~6 s of imports before its first line on the AVX2 EPYC
(``import torch`` ~2.5 s, ``torch._dynamo`` pulled in by ``torch.optim`` ~2.4 s, ``datasets`` ~1.3 s), about
half of the suite's time (docs/benchmarks.md, "The test suite's time"). This server imports those libraries once,
then forks a new process for each request, which runs the module exactly as ``python -m`` does
(``runpy._run_module_as_main``) with the request's argv, working directory, environment and files for
stdin/stdout/stderr. ``nmt`` itself is never imported here: each process imports it afresh, so module state,
Hydra's globals, logging and the product's own lazy imports start as in a new interpreter.

What differs from a new interpreter: the libraries above are already in ``sys.modules``. Tests about import
order or startup ("refused before torch is imported", the exit collection) therefore start real processes
(helpers.refused_before_torch, their own ``subprocess.run``), and so do tests that signal a process
(helpers.popen_module). The client falls back to a real process whenever the request's environment differs
from this server's in a variable a library may read at import time. ``NMT_TEST_FORKSERVER=0`` turns it off.

Protocol (one request per connection): the client sends a JSON request with three file descriptors
(stdin, stdout, stderr) attached; the server forks a handler, which forks the runner, sends back
``{"pid": N}``, waits for the runner and sends ``{"returncode": R}`` (negative: killed by that signal).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

# The imports a tiny training run pays before its first step (`python -X importtime -m nmt.train ...`).
import datasets  # noqa: F401
import hydra  # noqa: F401
import hydra.core.global_hydra  # noqa: F401
import omegaconf  # noqa: F401
import sacrebleu  # noqa: F401
import sentencepiece  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401  (imported by torch.optim's first step otherwise)
import torch.optim  # noqa: F401
import torch.utils.data  # noqa: F401

assert "nmt" not in sys.modules, "the fork server must not import nmt: each process imports it afresh"


def run_main(request: dict) -> int:
    """In the forked runner: become ``python -m MODULE ARGS`` in CWD with ENV and run it; the exit status."""
    import runpy
    import threading
    import types

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = os.getcwd()  # as `python -m` puts the working directory first
    sys.argv = ["-m", *request["args"]]  # runpy replaces argv[0] with the module's file, as -m does
    sys.modules["__main__"] = types.ModuleType("__main__")  # a fresh namespace, not this server's
    code = 0
    try:
        runpy._run_module_as_main(request["module"], alter_argv=True)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:  # as the interpreter does: print the object, exit 1
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # the interpreter prints the traceback, then ends by SIGINT (returncode -2)
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # The interpreter's shutdown: wait for non-daemon threads, run atexit handlers, flush.
    try:
        threading._shutdown()
    except Exception:
        pass
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code & 0xFF


def handle(conn: socket.socket) -> None:
    """In the forked handler: receive one request, fork its runner, report its pid and exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this process waits for its runner
    data, fds, _, _ = socket.recv_fds(conn, 1 << 22, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 22)
        if not more:
            break
        data += more
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os._exit(run_main(request))
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
    conn.close()


def serve(path: str) -> None:
    parent = os.getppid()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    srv.settimeout(2.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped without waiting for them
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while os.getppid() == parent:  # the pytest worker that started this server is gone: stop
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        if os.fork() == 0:
            srv.close()
            try:
                handle(conn)
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
