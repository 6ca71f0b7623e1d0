"""summary.json's cluster and disaggregation fields (issue 34), from a run's extras.

A run without `[cluster]` gets none of them (its summary is as before). A multi-node run adds:

- `cluster`: the cluster (nodes, GPUs per node, GPU, interconnect, network) and each instance's stages with
  the nodes they sit on (`stage_nodes`), how many stage-to-stage sends cross nodes, whether a TP group
  spans nodes; `gpus`, `nodes_used`; `placement_warnings` (TP groups spanning nodes, costed over the
  network), which `ppsim run` also prints as warnings.

A disaggregated run adds `mode = "disaggregated"` (else `"colocated"`), the pools (`disaggregation`), and:

- `mean_kv_transfer_ms`, `p50_kv_transfer_ms`, `p99_kv_transfer_ms`, `max_kv_transfer_ms`: per request
  whose KV arrived, from the prefill's end (or the decode side's pre-allocation, if later) to the KV's
  arrival at the decode instance: link queueing and the exposed transfer (requests.csv `kv_transfer_ms`);
- `mean_kv_wait_ms`, `p99_kv_wait_ms`: from the prefill's end to the decode side's pre-allocation, for
  requests that waited for room (0 for the others; requests.csv `kv_wait_ms`);
- `num_kv_transfers`, `kv_bytes_total` (the prompts' whole KV, every head and layer);
- `kv_link_utilisation_max`, `kv_link_utilisation_mean`: over the links the transfers used (each GPU's
  NIC or NVLink, out and in), the seconds each spent moving KV bytes over the run's duration (first
  arrival to the end), the busiest one and the mean; `kv_links_used`;
- `bubble_fraction`, `bubble_ms_per_iter`, `total_bubble_s` recomputed over each instance's own stages
  (the iteration table pads a pool of fewer stages with empty ones).
"""

from __future__ import annotations

import math

from sim.core.lazy import lazy

np = lazy("numpy")


def _pct(v, q: float) -> float:
    return float(np.percentile(v, q)) if len(v) else math.nan


def cluster_summary(result) -> dict:
    extras = getattr(result, "extras", {}) or {}
    out: dict = {}
    if "cluster" in extras:
        cl = extras["cluster"]
        out["cluster"] = cl
        out["gpus"] = cl["gpus_used"]
        out["nodes_used"] = cl["nodes_used"]
        out["placement_warnings"] = list(extras.get("cluster_warnings", []))
    dg = extras.get("disaggregation")
    if dg is None:
        if "cluster" in extras:
            out["mode"] = "colocated"
        return out
    out["mode"] = "disaggregated"
    out["disaggregation"] = {k: v for k, v in dg.items() if k != "link_busy_s"}
    cols = extras["request_columns"]
    xfer = np.asarray(cols["kv_transfer_ms"], dtype=float)
    xfer = xfer[~np.isnan(xfer)]
    wait = np.asarray(cols["kv_wait_ms"], dtype=float)
    wait = wait[~np.isnan(wait)]
    out["num_kv_transfers"] = int(len(xfer))
    out["mean_kv_transfer_ms"] = float(xfer.mean()) if len(xfer) else math.nan
    out["p50_kv_transfer_ms"] = _pct(xfer, 50)
    out["p99_kv_transfer_ms"] = _pct(xfer, 99)
    out["max_kv_transfer_ms"] = float(xfer.max()) if len(xfer) else math.nan
    out["mean_kv_wait_ms"] = float(wait.mean()) if len(wait) else math.nan
    out["p99_kv_wait_ms"] = _pct(wait, 99)
    landed = ~np.isnan(np.asarray(cols["kv_ready_s"], dtype=float))
    out["kv_bytes_total"] = int(np.asarray(cols["kv_bytes"])[landed].sum())
    busy = np.array(list(dg["link_busy_s"].values()), dtype=float)
    dur = float(dg["duration_s"])
    util = busy / dur if dur > 0 else np.full(len(busy), math.nan)
    out["kv_links_used"] = int(len(busy))
    out["kv_link_utilisation_max"] = float(util.max()) if len(util) else 0.0
    out["kv_link_utilisation_mean"] = float(util.mean()) if len(util) else 0.0
    out.update(pool_bubbles(result))
    return out


def pool_bubbles(result) -> dict:
    """The bubble figures over each instance's own stages (`instance_stages` in the extras)."""
    it = result.iterations
    stages = (getattr(result, "extras", {}) or {}).get("instance_stages")
    if not stages or "replica" not in it or not len(it["start_s"]):
        return {}
    start, end = np.asarray(it["start_s"]), np.asarray(it["end_s"])
    rep = np.asarray(it["replica"])
    mode = it["mode"]
    busy_rows = np.frombuffer(mode.codes, dtype=np.int8) != 0 if hasattr(mode, "codes") else \
        np.array([m != "idle" for m in mode])
    iter_ms = (end - start) * 1e3
    sb = result.stage_busy
    width = sb.num_stages
    flat = np.frombuffer(sb.flat, dtype=np.float64).reshape(len(iter_ms), width) * 1e3
    n_st = np.asarray(stages)[rep]
    mask = np.arange(width)[None, :] < n_st[:, None]
    busy = (flat * mask).sum(axis=1)
    total = float((iter_ms * n_st).sum())
    idle = (np.maximum(iter_ms[:, None] - flat, 0.0) * mask).sum(axis=1)
    per = idle[busy_rows]
    return {"bubble_fraction": float(1 - busy.sum() / total) if total > 0 else math.nan,
            "bubble_ms_per_iter": float(per.mean()) if len(per) else math.nan,
            "total_bubble_s": float(idle.sum() / 1e3)}
