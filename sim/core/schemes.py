"""The paper's schemes as config tables (paper-targets.md section 1, decisions.md names).

`scheme_table(scheme, model, workload, ...)` returns a complete run-config table:
- `TP`: TP=4, one stage, static chunk 2048;
- `PP_2048`, `PP_<c>`: PP=4, static chunk (c any positive integer);
- `DCP_greedy`: PP=4, greedy dynamic chunk, launched at chunk 128 (the artifact's recipe);
- `DCP_pred`: PP=4, predictive (ALP) dynamic chunk, launched at 128;
- `DCP_pred+DS`: DCP_pred plus the delay-scheduling rebalancer.
`PP_static` is not a single config: it is the best `PP_<c>` over `STATIC_CHUNKS`, found by
the goodput search.
"""

from __future__ import annotations

import copy
import re

from sim.core.errors import ConfigError

MODELS = ("qwen2.5-32b", "qwen2.5-14b")
STATIC_CHUNKS = (128, 256, 512, 1024, 2048)
SCHEMES = ("TP", "PP_2048", "PP_<c>", "PP_static", "DCP_greedy", "DCP_pred", "DCP_pred+DS")
GPU = "a100-pcie-40gb"


def profile_dir(model: str, tp: int, gpu: str = GPU) -> str:
    if model not in MODELS:
        raise ConfigError(f"unknown model {model!r}; allowed: {', '.join(MODELS)}")
    return f"profiles/{gpu}/{model}/tp{tp}"


def scheme_table(scheme: str, model: str, workload: dict, *, num_gpus: int = 4, seed: int = 1,
                 slo_scale: float = 1.0, gpu: str = GPU, extra: dict | None = None) -> dict:
    """The run-config table of `scheme` for `model` on `workload` (a [workload] table)."""
    slo = {"ttft_ms": 2000.0 * slo_scale, "tpot_ms": 200.0 * slo_scale}
    if scheme == "TP":
        parallel, chunk, policy = {"pp": 1, "tp": num_gpus}, 2048, {"name": "static"}
    else:
        parallel = {"pp": num_gpus, "tp": 1}
        m = re.fullmatch(r"PP_(\d+)", scheme)
        if m:
            chunk, policy = int(m.group(1)), {"name": "static"}
        elif scheme == "DCP_greedy":
            chunk, policy = 128, {"name": "greedy"}
        elif scheme in ("DCP_pred", "DCP_pred+DS"):
            chunk, policy = 128, {"name": "predictive"}
        else:
            raise ConfigError(f"unknown scheme {scheme!r}; allowed: TP, PP_<c>, DCP_greedy, DCP_pred, DCP_pred+DS")
    table = {
        "seed": seed,
        "parallel": parallel,
        "scheduler": {"chunk_size_tokens": chunk, "chunk_policy": policy},
        "latency": {"kind": "profile", "profile": profile_dir(model, parallel["tp"], gpu)},
        "slo": slo,
        "workload": copy.deepcopy(workload),
    }
    if scheme == "DCP_pred+DS":
        table["scheduler"]["rebalancer"] = {"name": "delay-scheduling"}
    if extra:
        _merge(table, extra)
    return table


def is_static(scheme: str) -> bool:
    return scheme == "TP" or scheme.startswith("PP_")


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)
