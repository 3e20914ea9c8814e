"""``python -m nmt.serve checkpoint=PATH [port=8000] [host=127.0.0.1] [http_threads=4]``: a translation web demo.

``GET /`` is a page where a person types English and sees the Spanish and the attention
heatmap; ``GET /healthz`` answers ``{"ok": true}`` once the model is loaded;
``POST /api/translate`` with ``{"text": ...}`` answers JSON. It listens on loopback unless
``host`` says otherwise and limits input length.

The server is waitress (a production WSGI server, pure Python) with ``http_threads`` worker
threads, so a slow translation never stops other clients from connecting, loading the page
or being told what was wrong with their request. The model itself runs one request at a
time (see ``SharedTranslator``).

Each line of the input is translated on its own, all lines of a request as one batch, and
the output has one line per input line: the model was trained on single sentences
(Tatoeba pairs), so a paragraph fed as one sequence goes beyond anything it has seen, and
``nmt.translate`` treats lines the same way. Sentences within one line are not split.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, g, jsonify, request
from omegaconf import DictConfig
from werkzeug.exceptions import HTTPException

from nmt.cli import check_paths, command
from nmt.config import register_configs
from nmt.errors import ConfigError

if TYPE_CHECKING:
    from nmt.translator import Translation, Translator

# Startup: only the launcher and Flask are imported up front, so `--help` and a config mistake answer in about
# a second; the model code (nmt.runtime: torch) comes in when the server loads its checkpoint.

log = logging.getLogger("nmt.serve")
register_configs()

EXPECTED = 'expected a JSON object {"text": "..."}'
JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


class RequestError(ValueError):
    """A request the client must fix; the message says what was wrong (HTTP ``status``)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def json_type(value: Any) -> str:
    """``{"a": 1}`` → ``an object``: the JSON name of a decoded value's type, for error messages."""
    return JSON_TYPES.get(type(value), "a number")


def parse_request(body: bytes, max_chars: int) -> str:
    """The ``text`` of a ``/api/translate`` request body, or a RequestError saying what was wrong.

    Any Content-Type is accepted (``curl -d`` sends form encoding by default): the body is JSON or not.
    """
    if not body.strip():
        raise RequestError(f"the request body is empty; {EXPECTED}")
    try:
        data = json.loads(body)
    except ValueError as e:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8/16/32
        raise RequestError(f"the request body is not JSON ({e}); {EXPECTED}") from None
    if not isinstance(data, dict):
        raise RequestError(f"the JSON is {json_type(data)}, not an object; {EXPECTED}")
    if "text" not in data:
        keys = ", ".join(map(json.dumps, data)) or "none"
        raise RequestError(f'the JSON object has no "text" field (its keys: {keys}); {EXPECTED}')
    text = data["text"]
    if not isinstance(text, str):
        raise RequestError(f'"text" is {json_type(text)}, not a string; {EXPECTED}')
    if len(text) > max_chars:
        raise RequestError(f"text is {len(text)} characters; the limit is {max_chars}", 413)
    return text


def input_lines(text: str) -> list[str]:
    """The lines to translate: one per input line (``\\n``, ``\\r\\n``, ...), spaces collapsed; at least one."""
    return [" ".join(line.split()) for line in text.splitlines()] or [""]


class SharedTranslator:
    """A Translator that the server's worker threads share: one translation at a time.

    A lock rather than a translator per thread: ``Translator.translate`` switches the model's
    train/eval mode (shared state), a copy per thread would multiply the model's memory, and
    torch already spreads one batch over all cores (``threads``), so two batches at once would
    only compete for the same cores. Requests that wait here hold only their worker thread;
    the other threads keep accepting connections and answering ``/``, ``/healthz`` and errors.
    """

    def __init__(self, translator: Translator):
        self.translator = translator
        self.lock = threading.Lock()

    def translate(self, lines: list[str]) -> list[Translation]:
        with self.lock:
            return self.translator.translate(lines, return_attention=True)


def line_json(source: str, t: Translation) -> dict:
    att = t.hypothesis.attention
    return dict(
        source=source,
        translation=t.text,
        score=t.hypothesis.score,
        src_pieces=t.src_pieces,
        tgt_pieces=t.tgt_pieces,
        attention=[] if att is None else att.tolist(),  # [len(tgt_pieces)][len(src_pieces)]
    )


def create_app(translator: Translator, max_chars: int) -> Flask:
    app = Flask(__name__)
    # A body longer than any valid request (12 bytes per character: a JSON surrogate-pair escape)
    # is refused with 413 before it is read.
    app.config["MAX_CONTENT_LENGTH"] = 12 * max_chars + 1024
    shared = SharedTranslator(translator)
    page = resources.files("nmt.web").joinpath("index.html").read_text().replace("__MAX_CHARS__", str(max_chars))

    @app.before_request
    def started() -> None:
        g.started = time.perf_counter()

    @app.after_request
    def access_log(response: Response) -> Response:
        """One line per request (waitress writes none), health checks left out: the client, the request, the
        status, the lines translated and the milliseconds taken, e.g.
        ``127.0.0.1 POST /api/translate 200, 2 lines, 84 ms``."""
        if request.path != "/healthz":
            ms = 1000 * (time.perf_counter() - g.get("started", time.perf_counter()))
            lines = f", {g.lines} line{'s' * (g.lines != 1)}" if "lines" in g else ""
            status = response.status_code
            log.info("%s %s %s %d%s, %.0f ms", request.remote_addr, request.method, request.path, status, lines, ms)
        return response

    @app.get("/")
    def index() -> Response:
        return Response(page, mimetype="text/html")

    @app.get("/healthz")
    def health() -> Response:
        return jsonify(ok=True)

    @app.post("/api/translate")
    def api() -> tuple[Response, int]:
        try:
            text = parse_request(request.get_data(cache=False), max_chars)
        except RequestError as e:
            return jsonify(error=str(e)), e.status
        lines = input_lines(text)
        g.lines = len(lines)  # for the access log
        per_line = [line_json(src, t) for src, t in zip(lines, shared.translate(lines))]
        # The first line's fields at the top level too, so single-line clients read them directly.
        joined = "\n".join(x["translation"] for x in per_line)
        return jsonify(per_line[0] | dict(translation=joined, lines=per_line)), 200

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> tuple[Response, int]:
        """404, 405, 413 (body too large), 500 ...: JSON with the reason, like the API's own errors; a 404 or 405
        names the endpoints there are (a client guessing ``POST /translate`` learns the path)."""
        if e.code in (404, 405):
            why = "no such endpoint" if e.code == 404 else f"{request.method} is not allowed here"
            return jsonify(error=f"{e.code} {e.name}: {request.method} {request.path}: {why}; {ENDPOINTS}"), e.code
        return jsonify(error=f"{e.code} {e.name}: {e.description}"), e.code or 500

    return app


ENDPOINTS = 'this server answers GET / (the demo page), GET /healthz and POST /api/translate with {"text": "..."}'


def make_server(app: Callable[[dict, Any], Any], host: str, port: int, threads: int):
    """A waitress server for the WSGI ``app`` (the Flask app, or a ``LateApp`` that gets it once the model has
    loaded), bound to host:port (port 0: a free one, see ``.effective_port``); ``.run()`` serves.

    Built with ``create_server`` rather than ``waitress.serve`` so the log line can give the port
    actually bound, and ``close()`` stops it (tests run it in a thread).
    """
    from waitress import create_server

    try:
        return create_server(app, host=host, port=port, threads=threads, ident="nmt")
    except OSError as e:  # the port is taken, or the host is not an address of this machine
        raise ConfigError(f"cannot listen on host={host} port={port}: {e.strerror or e}") from None
    except ValueError as e:  # waitress: a host name that does not resolve ("Invalid host/port specified.")
        raise ConfigError(f"cannot listen on host={host} port={port}: {e} (not an address of this machine?)") from None


class LateApp:
    """The WSGI application a server is bound with before its model is loaded: ``app`` is set once it is, and
    requests are served (``server.run()``) only after that, so nothing ever reaches it unset."""

    app: Any = None

    def __call__(self, environ: dict, start_response: Any) -> Any:
        return self.app(environ, start_response)


@command("serve")
def main(cfg: DictConfig) -> None:
    check_paths([cfg.checkpoint, *cfg.ensemble])
    # Bound before the model loads: a taken port or a host that is not this machine's answers in a second.
    late = LateApp()
    server = make_server(late, cfg.host, cfg.port, cfg.http_threads)
    try:
        from nmt.runtime import load_translator

        late.app = create_app(load_translator(cfg), cfg.max_chars)
        log.info(
            "serving %s on http://%s:%s/ with %d threads (waitress)",
            cfg.checkpoint,
            cfg.host,
            server.effective_port,
            cfg.http_threads,
        )
        server.run()
    except KeyboardInterrupt:
        log.info("stopped")
    finally:
        server.close()


if __name__ == "__main__":
    main()
