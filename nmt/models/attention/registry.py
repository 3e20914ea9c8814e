"""Name → attention class. A new attention is one registered class plus one YAML file."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from nmt.errors import ConfigError

ATTENTIONS: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        if name in ATTENTIONS:
            raise ConfigError(f"attention {name!r} registered twice")
        ATTENTIONS[name] = cls
        return cls

    return wrap


def scores_alone(cls: type) -> bool:
    """Whether ``cls`` can be the score inside local attention's window (``attention.score`` of local_m /
    local_p): it scores every target position at once (``parallel``), is not local itself, and defines
    ``score``, one [B, T, S] score per position. ``multihead`` does not: it has a softmax per head."""
    own = [b for b in cls.__mro__ if b.__name__ != "Attention"]
    return (
        bool(getattr(cls, "parallel", False))
        and not any(b.__name__ == "LocalAttention" for b in cls.__mro__)
        and any("score" in vars(b) for b in own)
    )


def build_attention(name: str, query_size: int, key_size: int, dim: int = 0, **options):
    """The registered class for ``name``; ``dim`` 0 means the query (decoder) size.

    ``options`` (window, score, heads, max_positions, ...) go to the classes whose
    constructor takes them (``accepted_options``); the others ignore them.
    """
    if name not in ATTENTIONS:
        raise ConfigError(f"attention.name={name!r} is unknown; choose one of {sorted(ATTENTIONS)}")
    cls = ATTENTIONS[name]
    return cls(query_size, key_size, dim or query_size, **accepted_options(cls, options))


def accepted_options(cls: type, options: dict) -> dict:
    """The ``options`` that ``cls``'s constructor takes: all of them when it takes ``**options`` (local
    attention, which hands its inner score the ones that score takes)."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(options)
    return {k: v for k, v in options.items() if k in params}
