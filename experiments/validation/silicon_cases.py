#!/usr/bin/env python3
"""The validation cases taken from AIConfigurator's silicon measurements (issue 43: current engines).

    python experiments/validation/silicon_cases.py            # the H and J case blocks, as cases.toml has them
    python experiments/validation/silicon_cases.py --all-rows # every selectable row (the R4 ones too), ids S1...

aiconfigurator-core (PyPI, Apache-2.0; the `aic` extra) ships `aiconfigurator_core/systems/silicon_sample.csv`:
end-to-end measurements of TRT-LLM, vLLM and SGLang serving closed loops of fixed-length requests
(ISL/OSL, `silicon_concurrency` clients), each row with its TTFT and TPOT. This script turns the dense-model
vLLM/SGLang rows PipeSim has profiles for into `[[case]]` blocks, verbatim: H = SGLang 0.5.6.post2,
Llama-3.1-8B-Instruct FP8 on H200, TP1 (every such row; client not published: fixed lengths assumed);
J = vLLM, Llama-3.1-70B FP8, ISL/OSL 1024/1024, TP4 on H100, H200 and B200 (every such row). The J rows name
no source or version; they are InferenceMAX's Llama-3.3-70B runs (vLLM 0.10.2), identified by their date and
grid (see `case`), and replay InferenceMAX's server flags and benchmark client (its random dataset with
--random-range-ratio 0.8). The rest is listed as refused in cases.toml with the reason. Nothing is fitted to
these rows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import SILICON_SAMPLE, silicon_rows  # noqa: E402

# the GPU as the report names it and its profile folder (profiles/aic/<gpu>/)
GPU = {"h100_sxm": ("H100-80GB SXM", "h100-sxm-80gb"), "h200_sxm": ("H200-141GB SXM", "h200-sxm"),
       "b200_sxm": ("B200 SXM", "b200-sxm")}
SRCLINE = ("aiconfigurator-core 0.12.0 (PyPI wheel, Apache-2.0) aiconfigurator_core/systems/silicon_sample.csv, "
           "row id {id}; silicon_data_source: {sds}")


def q(s: str) -> str:
    """A TOML basic string."""
    return '"' + s.replace('\\', '\\\\').replace('"', '\\"') + '"'


def case(cid: str, r: dict, kind: str) -> str:
    """One [[case]] block for a silicon row (kind: "sglang" or "vllm")."""
    g, gdir = GPU[r["system"]]
    isl, osl, c, tp = int(r["isl"]), int(r["osl"]), int(r["batch_size"]), int(r["tp_size"])
    n = 10 * c
    if kind == "sglang":
        model = "Llama-3.1-8B-Instruct (FP8, fp8_block GEMMs)"
        prof = f"profiles/aic/{gdir}/vllm/llama-3.1-8b-fp8-kvfp8/tp{tp}"
        real_engine = ("SGLang 0.5.6.post2 (version as the row states), weights FP8 (fp8_block); other server flags not "
                       "published in the sample (defaults assumed: overlap scheduler, radix cache, CUDA graphs on)")
        server = f"sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct (FP8 block quantization) --tp {tp} (exact command not published)"
        sim = ("sglang", "SGLang 0.5 defaults (overlap on, radix cache on, CUDA graphs); the model's 131072-token context",
               '{ engine_version = "0.5", context_length_tokens = 131072 }')
        title = f"SGLang 0.5.6.post2, Llama-3.1-8B FP8, {tp}x {g.split()[0]}, {isl}/{osl} tokens, {c} concurrent clients"
        differs = ["weights fp8_block (SGLang's block-wise FP8 GEMMs); the profile is AIConfigurator's vLLM FP8 (Cutlass per-tensor scaled) GEMM data with an FP8 KV cache: the real KV dtype is not stated",
                   "SGLang 0.5.6.post2 on PipeSim's SGLang 0.5.23 scheduler",
                   "number of requests not published: 10 x concurrency assumed (what AIConfigurator's own closed-loop replays of these rows use)",
                   "client and frontend not published (AIConfigurator's collection); the server's frontend time is not modelled",
                   "prompts of random tokens assumed (no prefix sharing)",
                   "the sample's statistic (mean or median) is not named: compared as the mean"]
        ds = "SGLang 0.5.6.post2 on the 0.5.23 scheduler; fp8_block vs the profile's FP8; request count assumed"
        ver_inf = False
    else:
        # The vLLM Llama-3.1-70B rows are InferenceMAX's Llama-3.3-70B runs, identified (the row does not name
        # them) by what matches: SemiAnalysisAI/InferenceX removed its 70B benchmarks on 2025-10-29 (commit
        # 2582bce "remove llama 70b (#149)"), the rows' measurement date; its .github/workflows/70b-tmpl.yml at the
        # parent commit runs nvidia/Llama-3.3-70B-Instruct-FP8 on vllm/vllm-openai:v0.10.2 at TP 2/4/8 on H100 and
        # 1/2/4/8 on H200 and B200 (FP4 too on B200), concurrency 4-64, ISL/OSL 1k/1k, 1k/8k, 8k/1k: the rows'
        # grid exactly. Its server and client commands are benchmarks/70b_fp8_{h100,h200,b200}_*.sh.
        model = "Llama-3.3-70B-Instruct FP8 (nvidia/Llama-3.3-70B-Instruct-FP8; Llama-3.1-70B's shapes)"
        prof = f"profiles/aic/{gdir}/vllm/llama-3.1-70b-fp8-kvfp8/tp{tp}"
        # --max-model-len: 10240 in 70b_fp8_h100_*.sh; ISL + OSL + 20 (1k/1k) or + 200 in 70b_fp8_h200_slurm.sh
        ctx = {"h100_sxm": 10240, "h200_sxm": isl + osl + 20 if (isl, osl) == (1024, 1024) else isl + osl + 200,
               "b200_sxm": isl + osl}[r["system"]]  # 70b_fp8_b200_docker.sh: the workflow's max-model-len, 2048 / 9216
        seqs = 512 if r["system"] == "b200_sxm" else c
        real_engine = ("vLLM 0.10.2 (vllm/vllm-openai:v0.10.2, InferenceMAX's 70B runs: the row states no version; "
                       "identified from SemiAnalysisAI/InferenceX .github/workflows/70b-tmpl.yml @ 2582bce^), "
                       f"--kv-cache-dtype fp8 --async-scheduling --no-enable-prefix-caching --max-num-batched-tokens "
                       f"8192 --max-num-seqs {seqs} --gpu-memory-utilization 0.9 --max-model-len {ctx}"
                       + (" (FULL_DECODE_ONLY CUDA graphs, fusion passes)" if r["system"] == "b200_sxm" else ""))
        server = (f"vllm serve nvidia/Llama-3.3-70B-Instruct-FP8 --config config.yaml --tensor-parallel-size {tp} ... "
                  f"(benchmarks/70b_fp8_{r['system'].split('_')[0]}_*.sh @ 2582bce^)")
        sim = ("vllm-v1", "vLLM V1 0.10 (read from 0.10.1.1; 0.10.2 ran) with the run's flags: async scheduling "
               "(overlap: the host's next-step work under the GPU step), prefix caching off, 8192-token budget, "
               "max_num_seqs",
               f'{{ engine_version = "0.10", context_length_tokens = {ctx}, overlap = true, prefix_cache = false, '
               f'chunk_size_tokens = 8192, max_running_requests = {seqs} }}')
        title = f"vLLM 0.10.2 (InferenceMAX), Llama-3.3-70B FP8, {tp}x {g.split()[0]}, {isl}/{osl} tokens, {c} concurrent clients"
        differs = ["the row names no source or version: InferenceMAX's runs identified by date and grid (vLLM 0.10.2 image)",
                   "the profile is AIConfigurator's vLLM FP8 GEMM data with an FP8 KV cache (the run's --kv-cache-dtype fp8)",
                   "the client's lengths are drawn from PipeSim's seed, not the client's --seed",
                   "the sample's statistic is compared as the mean (the client's mean_ttft_ms / mean_tpot_ms)"]
        ds = "InferenceMAX's run identified (vLLM 0.10.2 on the 0.10.1.1 scheduler)"
        ver_inf = False
    if kind == "sglang":
        client = (f"closed loop of {c} clients (silicon_concurrency={c}), fixed {isl} input / {osl} output tokens "
                  f"(ISL/OSL of the row); tool not published")
        workload = ['source = "fixed"']
    else:
        # kimbochen/bench_serving benchmark_serving.py (cloned by the scripts): sample_random_requests draws
        # input_lens uniform on the integers [int(ISL r), ISL] (numpy's randint) and output_lens alike (SGLang's definition), and
        # `benchmark` runs --max-concurrency clients over --num-prompts requests sent at once (--request-rate inf)
        client = (f"InferenceMAX's: python3 bench_serving/benchmark_serving.py (github.com/kimbochen/bench_serving) "
                  f"--backend vllm --dataset-name random --random-input-len {isl} --random-output-len {osl} "
                  f"--random-range-ratio 0.8 --num-prompts {n} --max-concurrency {c} --request-rate inf --ignore-eos "
                  f"(70b-tmpl.yml random-range-ratio 0.8, full-sweep-tmpl.yml; --num-prompts CONC x 10): inputs and "
                  f"outputs uniform on [{int(isl * 0.8)}, {isl}] and [{int(osl * 0.8)}, {osl}]")
        workload = ['source = "random"', "range_ratio = 0.8", 'range_ratio_definition = "sglang"']
    L = ["", "[[case]]", f"id = {q(cid)}", f"title = {q(title)}",
         f"source = {q(SRCLINE.format(id=r['id'], sds=r['silicon_data_source']))}",
         f"silicon_row = {q(r['id'])}",
         f"current_engine = true",
         f"ran_version = {q('SGLang 0.5.6.post2' if kind == 'sglang' else 'vLLM 0.10.2')}",
         f"real_engine = {q(real_engine)}"]
    if ver_inf: L.append("version_inferred = true")
    L += [f"server = {q(server)}",
          f"client = {q(client)}",
          f"gpu = {q(f'{tp}x {g}')}", f"model = {q(model)}", f"tp = {tp}",
          f"differs_short = {q(ds)}", "differs = [" + ", ".join(q(d) for d in differs) + "]",
          "[case.sim]", f"engine = {q(sim[0])}", f"engine_note = {q(sim[1])}", f"profile = {q(prof)}", f"scheduler = {sim[2]}",
          "[case.workload]", *workload, f"num_requests = {n}", f"input = {isl}", f"output = {osl}", 'rate = "inf"',
          f"concurrency = {c}",
          "[case.real]", "# silicon_ttft_ms, silicon_tpot_ms of the row, verbatim",
          f"mean_ttft_ms = {r['silicon_ttft_ms']}", f"mean_tpot_ms = {r['silicon_tpot_ms']}"]
    return "\n".join(L)

def blocks(all_rows: bool = False) -> str:
    rows = list(silicon_rows().values())
    sg = [r for r in rows if r["backend"] == "sglang" and r["model_path"] == "meta-llama/Llama-3.1-8B-Instruct"
          and (all_rows or r["tp_size"] == "1")]
    sg.sort(key=lambda r: (int(r["isl"]), int(r["osl"])))
    vl = [r for r in rows if r["backend"] == "vllm" and r["model_path"] == "meta-llama/Llama-3.1-70B"
          and r["precision"] == "fp8" and r["mode"] == "agg"
          and (all_rows or (r["isl"] == "1024" and r["osl"] == "1024" and r["tp_size"] == "4"))]
    order = {"h100_sxm": 0, "h200_sxm": 1, "b200_sxm": 2}
    vl.sort(key=lambda r: (order[r["system"]], int(r["isl"]), int(r["osl"]), int(r["tp_size"]), int(r["batch_size"])))
    if all_rows:
        return "\n".join(case(f"S{i}", r, "sglang" if r["backend"] == "sglang" else "vllm")
                         for i, r in enumerate(sg + vl, 1))
    return "\n".join([case(f"H{i}", r, "sglang") for i, r in enumerate(sg, 1)]
                     + [case(f"J{i}", r, "vllm") for i, r in enumerate(vl, 1)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all-rows", action="store_true", help="every selectable row (SGLang TP1-8, vLLM FP8 all shapes)")
    args = ap.parse_args(argv)
    if silicon_rows() is None:
        raise SystemExit(f"aiconfigurator-core is not installed: no {SILICON_SAMPLE} (pip install -e '.[aic]')")
    print(blocks(args.all_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
