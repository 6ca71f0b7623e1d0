"""Cross-check of the two A100 Mixtral-8x7B MoE sources (issue 44): AIConfigurator's A100 MoE rows and the Frontier
simulator's MIT-licensed table (NetX-lab/Frontier, data/profiling/compute/a100/mixtral_8x7b_moe/moe.csv).

Usage: python profiles/crosscheck_moe_a100.py FRONTIER_MOE_CSV > profiles/crosscheck_moe_a100.md

Frontier's rows time the MoE layer's parts (moe_gating, moe_shuffling, moe_grouped_gemm) per token count and
TP degree (experts sharded by TP, ep 1); AIConfigurator's A100 rows (SGLang 0.5.10, sglang_fused_moe_triton,
bfloat16, balanced routing; its vLLM 0.14 table has no Mixtral rows) time the fused kernel. Both are set against
the roofline floor of the experts the tokens touch (A100 SXM: 312 TFLOP/s dense BF16, 2039 GB/s).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from sim.latency.roofline import expected_experts  # noqa: E402
from sim.profiling.aic import package_root, package_version  # noqa: E402
from sim.latency.hardware import load_gpu  # noqa: E402
from sim.profiling.specs import load_model  # noqa: E402

TOKENS = (1, 16, 64, 256, 1024, 4096)


def main(path: str) -> None:
    fr = pd.read_csv(path)
    aic = pd.read_parquet(package_root() / "systems/data/a100_sxm/moe/sglang/0.5.10/moe_perf.parquet")
    aic = aic[(aic.kernel_source == "sglang_fused_moe_triton") & (aic.moe_dtype == "bfloat16")
              & (aic.hidden_size == 4096) & (aic.inter_size == 14336) & (aic.topk == 2) & (aic.num_experts == 8)
              & (aic.moe_ep_size == 1) & (aic.distribution == "balanced")]
    m, gpu = load_model("mixtral-8x7b"), load_gpu("a100-sxm-80gb")
    print(f"# A100 Mixtral-8x7B routed experts: Frontier vs AIConfigurator ({package_version()})\n")
    print("ms per layer; Frontier = moe_gating + moe_shuffling + moe_grouped_gemm (median); AIC = fused kernel "
          "(median); floor = max(touched experts' weights / HBM, their FLOPs / peak).\n")
    print("| TP | tokens | Frontier ms | AIC ms | AIC / Frontier | Frontier / floor | AIC / floor |")
    print("|---|---|---|---|---|---|---|")
    for tp in (1, 2, 4, 8):
        f = fr[fr.num_tensor_parallel_workers == tp]
        a = aic[aic.moe_tp_size == tp]
        for t in TOKENS:
            fr_t = f[f.num_tokens == t]
            a_t = a[a.num_tokens == t]
            if fr_t.empty or a_t.empty:
                continue
            fv = float((fr_t["time_stats.moe_gating.median"] + fr_t["time_stats.moe_shuffling.median"]
                        + fr_t["time_stats.moe_grouped_gemm.median"]).median())
            av = float(a_t.latency.median())
            touched = expected_experts(8, 2, t)
            floor = max(touched * m.expert_params / tp * 2 / (gpu.hbm_bw_gbps * 1e9),
                        2 * t * 2 * m.expert_params / tp / (gpu.bf16_tflops * 1e12)) * 1e3
            print(f"| {tp} | {t} | {fv:.4g} | {av:.4g} | {av / fv:.2f} | {fv / floor:.2f} | {av / floor:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
