"""Expert parallelism of an MoE model (issue 44): which `[parallel] ep` / `attention_dp` layouts exist and which
PipeSim models.

The engines' rules (read from their source):

- vLLM 0.11.0 `--enable-expert-parallel` (`vllm/model_executor/layers/fused_moe/config.py`,
  `FusedMoEParallelConfig.make`): the expert-parallel group is every GPU of the TP x DP grid, ep = tp x dp, and
  the MoE layer's own TP is 1 (each rank holds num_experts / ep whole experts, `layer.py` `determine_expert_map`;
  attention stays TP-sharded). Without data-parallel attention (dp = 1) there is no dispatch: every rank holds
  the step's hidden states after attention's all-reduce, runs its own experts on the tokens routed to them
  (`forward_impl`: `do_naive_dispatch_combine` needs dp_size > 1) and the partial outputs are summed by one
  all-reduce over the TP group (`maybe_all_reduce_tensor_model_parallel` -> `tensor_model_parallel_all_reduce`),
  as after a TP-sharded MoE layer. All-to-all kernels (pplx, DeepEP) are used only with dp > 1
  (`FusedMoEParallelConfig.use_all2all_kernels`).
- SGLang 0.5.3 `--ep-size` (`sglang/srt/distributed/parallel_state.py` `initialize_model_parallel`): moe_ep =
  ep_size, moe_tp = tp / ep_size inside the TP group; with the default `moe_a2a_backend = "none"` the fused MoE
  layer runs its num_experts / ep experts and all-reduces over the TP group
  (`layers/moe/fused_moe_triton/layer.py` `FusedMoE.forward`).

Modelled: ep = 1 (experts sharded by TP, both engines' default) and ep = tp with attention_dp = 1 (vLLM's
`--enable-expert-parallel` at dp 1; SGLang's `--ep-size` = tp): moe_tp = 1, each rank num_experts / ep whole
experts, one all-reduce over the TP group after the layer, the EP group inside one node. Refused with a one-line
error: attention_dp > 1 (data-parallel attention: one scheduler per rank and all-to-all dispatch, not modelled
yet), 1 < ep < tp (SGLang's moe_tp = tp / ep: AIConfigurator's tables have no rows with both moe_tp and ep > 1),
ep > tp (needs attention_dp), an EP group wider than a node's GPUs, ep with [disaggregation], and ep > 1 on
`vllm-v0` (vLLM 0.6.3 predates expert parallelism: `NO_EP_ENGINES`).
"""

from __future__ import annotations

from typing import Any, Mapping

from sim.core.errors import ConfigError


def check_ep_layout(tp: int, ep: int, attention_dp: int, where: str) -> None:
    """A one-line ConfigError naming the field when (tp, ep, attention_dp) is not a modelled layout."""
    if attention_dp != 1:
        raise ConfigError(f"{where}: [parallel] attention_dp = {attention_dp}: data-parallel attention is not "
                          f"modelled yet; allowed: 1")
    if ep not in (1, tp):
        raise ConfigError(f"{where}: [parallel] ep = {ep} with tp = {tp}: allowed: 1 (experts sharded by TP) or "
                          f"{tp} (= tp: experts split whole over the TP group, vLLM --enable-expert-parallel at "
                          f"data-parallel size 1)")


# Engines without expert parallelism: vLLM 0.6.3 (`vllm-v0`) predates `--enable-expert-parallel`, added by vLLM
# PR #14305 (merged 2025-03-06, vLLM 0.8.0; before it only the VLLM_TEST_ENABLE_EP variable of PR #12583, 2025-02).
NO_EP_ENGINES = {"vllm-v0": "vLLM 0.6.3 has no expert parallelism (--enable-expert-parallel came with vLLM 0.8.0, "
                            "PR #14305)"}


def check_ep_engine(ep: int, engine: str, where: str) -> None:
    """ep > 1 on an engine release that has no expert parallelism (`NO_EP_ENGINES`) is a one-line error."""
    if ep > 1 and engine in NO_EP_ENGINES:
        raise ConfigError(f"{where}: [parallel] ep = {ep} with engine {engine}: {NO_EP_ENGINES[engine]}; allowed: 1")


def check_ep_placement(ep: int, cluster: Mapping[str, Any] | None, disaggregated: bool, where: str) -> None:
    """The EP group must sit inside one node, and [disaggregation] pools have no ep."""
    if ep == 1:
        return
    if disaggregated:
        raise ConfigError(f"{where}: [parallel] ep = {ep} does not apply with [disaggregation]; allowed: 1")
    if cluster is not None and ep > int(cluster.get("gpus_per_node", ep)):
        raise ConfigError(f"{where}: [parallel] ep = {ep}: expert parallelism across nodes is not modelled; "
                          f"allowed: at most [cluster] gpus_per_node ({cluster['gpus_per_node']})")


def check_profile_ep(ep: int, profile_meta: Mapping[str, Any], profile: str) -> None:
    """The run's ep against the profile's layout ([moe] ep; a dense profile has none)."""
    moe = profile_meta.get("moe") or {}
    if not moe:
        if ep != 1:
            raise ConfigError(f"config [parallel] ep = {ep} but profile {profile} is not a mixture-of-experts "
                              f"profile; allowed: 1")
        return
    have = int(moe.get("ep", 1))
    if have != ep:
        raise ConfigError(f"config [parallel] ep = {ep} but profile {profile} is for ep = {have} "
                          f"(profiles/moe/<gpu>/vllm/<model>/tp<T>-ep<E>/ hold the EP layouts)")
