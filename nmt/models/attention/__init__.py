from nmt.models.attention import scores  # noqa: F401  (registers the classic scores)
from nmt.models.attention.base import Attention, AttentionState
from nmt.models.attention.registry import ATTENTIONS, build_attention, register

__all__ = ["ATTENTIONS", "Attention", "AttentionState", "build_attention", "register"]
