"""fig1: P90 TTFT and P90 TPOT vs request rate, TP vs PP_2048 (Qwen2.5-32B, azure-conv, rates 1..10)."""

from __future__ import annotations

from experiments import goodput_figs
from experiments.common import Context

MODELS = ("qwen2.5-32b",)
WORKLOADS = ("azure-conv",)
SCHEMES = ("TP", "PP_2048")


def compute(ctx: Context):
    return goodput_figs.compute(ctx, "fig1", MODELS, WORKLOADS, SCHEMES)


def plot(ctx: Context) -> None:
    goodput_figs.plot(ctx, "fig1", SCHEMES)
