"""Errors a user can fix. The commands report them as one line (no traceback) and exit 2."""


class NmtError(Exception):
    """Base class: the message names the file/line/key and what was expected."""


class ConfigError(NmtError, ValueError):
    """An unknown config value or an impossible combination of values."""


class CorpusError(NmtError, ValueError):
    """A missing/empty corpus, or a malformed line under data.strict=true."""


class CheckpointError(NmtError, RuntimeError):
    """A checkpoint that cannot be used (missing, truncated, corrupt, foreign, wrong version)."""


def line_list(lines: list[int], most: int = 20) -> str:
    """Line numbers for a message: ``2, 4, 9``, the first ``most`` of them and ``, ...`` after."""
    return ", ".join(map(str, lines[:most])) + (", ..." if len(lines) > most else "")
