"""fig9: Goodput of every scheme on every workload, and P90 TTFT/TPOT/E2E vs rate (Qwen2.5-32B)."""

from __future__ import annotations

from experiments import goodput_figs
from experiments.common import Context

MODELS = ("qwen2.5-32b",)
WORKLOADS = ("azure-conv", "sharegpt", "cnn", "cnn-reversed")
SCHEMES = ("TP", "PP_2048", "PP_static", "DCP_greedy", "DCP_pred", "DCP_pred+DS")


def compute(ctx: Context):
    return goodput_figs.compute(ctx, "fig9", MODELS, WORKLOADS, SCHEMES)


def plot(ctx: Context) -> None:
    goodput_figs.plot(ctx, "fig9", SCHEMES)
