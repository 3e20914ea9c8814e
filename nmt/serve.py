"""``python -m nmt.serve checkpoint=PATH [port=8000] [host=127.0.0.1]``: a small translation web demo.

``GET /`` is a page where a person types English and sees the Spanish and the attention
heatmap; ``POST /api/translate`` with ``{"text": ...}`` answers JSON. It listens on
loopback unless ``host`` says otherwise, limits input length, and serves one request at
a time (the model is not shared between threads). Flask's own server: fine for a demo,
put a real WSGI server in front for anything more.
"""

from __future__ import annotations

import logging
import sys
from importlib import resources

from flask import Flask, Response, jsonify, request
from omegaconf import DictConfig

from nmt.cli import command
from nmt.config import register_configs
from nmt.errors import NmtError
from nmt.runtime import load_translator
from nmt.translator import Translator

log = logging.getLogger("nmt.serve")
register_configs()


def create_app(translator: Translator, max_chars: int) -> Flask:
    app = Flask(__name__)
    page = resources.files("nmt.web").joinpath("index.html").read_text().replace("__MAX_CHARS__", str(max_chars))

    @app.get("/")
    def index() -> Response:
        return Response(page, mimetype="text/html")

    @app.get("/healthz")
    def health() -> Response:
        return jsonify(ok=True)

    @app.post("/api/translate")
    def api() -> tuple[Response, int]:
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            return jsonify(error='expected a JSON object {"text": "..."}'), 400
        text = body["text"]
        if len(text) > max_chars:
            return jsonify(error=f"text is {len(text)} characters; the limit is {max_chars}"), 413
        t = translator.translate([" ".join(text.split())], return_attention=True)[0]
        att = t.hypothesis.attention
        return jsonify(
            translation=t.text,
            score=t.hypothesis.score,
            src_pieces=t.src_pieces,
            tgt_pieces=t.tgt_pieces,
            attention=[] if att is None else att.tolist(),
        ), 200

    return app


@command("serve")
def main(cfg: DictConfig) -> None:
    try:
        app = create_app(load_translator(cfg), cfg.max_chars)
    except NmtError as e:
        log.error("%s", e)
        sys.exit(2)
    log.info("serving %s on http://%s:%d/", cfg.checkpoint, cfg.host, cfg.port)
    app.run(host=cfg.host, port=cfg.port, threaded=False)


if __name__ == "__main__":
    main()
