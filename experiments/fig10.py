"""fig10: As fig9 for Qwen2.5-14B on azure-conv and cnn-reversed."""

from __future__ import annotations

from experiments import goodput_figs
from experiments.common import Context

MODELS = ("qwen2.5-14b",)
WORKLOADS = ("azure-conv", "cnn-reversed")
SCHEMES = ("TP", "PP_2048", "PP_static", "DCP_greedy", "DCP_pred", "DCP_pred+DS")


def compute(ctx: Context):
    return goodput_figs.compute(ctx, "fig10", MODELS, WORKLOADS, SCHEMES)


def plot(ctx: Context) -> None:
    goodput_figs.plot(ctx, "fig10", SCHEMES)
