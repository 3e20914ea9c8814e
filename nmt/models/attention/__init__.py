# Importing the modules registers their attentions (a new one: a module here + configs/attention/NAME.yaml).
from nmt.models.attention import coverage, local, location, multihead, scores  # noqa: F401
from nmt.models.attention.base import Attention, AttentionState
from nmt.models.attention.registry import ATTENTIONS, build_attention, register

__all__ = ["ATTENTIONS", "Attention", "AttentionState", "build_attention", "register"]
