"""`ppsim plan --concurrency N`: candidates simulated as a closed loop of N clients (sim/studies/concurrency_plan.py).

The hand-calculated case uses the constant latency model: one iteration = 10 ms whatever the batch, so a
request of 10 output tokens takes 10 iterations = 100 ms (its prefill gives the first token)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from sim.cli import main
from sim.core.slo import SLO
from sim.studies.concurrency_plan import hold_clients, plan_rows
from sim.studies.plan import PlanLoad, cost_per_million
from sim.studies.sweep import Runner, sustained
from sim.studies.verdict import rank

CAND = {"interconnect": "x", "replicas": 1, "tp": 1, "pp": 1, "gpus": 1, "router": "single", "engine": "fastpp",
        "profile": "profiles/a100-pcie-40gb/qwen2.5-14b/tp1", "nodes": 1, "gpus_per_node": 8, "network": "-"}
# the constant latency model in place of the profile, and at most 2 requests running at once
CONSTANT = ('latency.kind="constant"', "latency.stage_ms=10.0", "latency.overhead_ms=0.0",
            "scheduler.kv_tokens=100000", "scheduler.max_running_requests=2")


def _at(n: int, slo, constant=CONSTANT) -> dict:
    load = PlanLoad({"kind": "bench", "num_requests": 80, "input_len": 100, "output_len": 10, "concurrency": n},
                    False, None, "", (), {}, 1.0, n)
    return plan_rows(Runner(None, progress=False), [CAND], load, slo, [1], {"x": 2.0}, 0.25, {"fastpp": constant},
                     ("static-2048",))[0]


def test_a_closed_loop_candidate_by_hand():
    slo = sustained(SLO(ttft_ms=60.0, tpot_ms=20.0))
    # 2 clients, 2 running slots: nothing waits; each request 100 ms -> 2 / 0.1 s = 20 req/s, 80 requests in
    # 40 rounds over 4 s; TTFT = one iteration = 10 ms, TPOT 10 ms: margin min(1 - 10/60, 1 - 10/20) = 0.5
    two = _at(2, slo)
    assert two["concurrency"] == 2 and two["achieved_rps"] == pytest.approx(20.0)
    assert two["p90_ttft_ms"] == pytest.approx(10.0) and two["p90_tpot_ms"] == pytest.approx(10.0)
    assert two["meets_slo"] and two["margin"] == pytest.approx(0.5)
    # cost at the achieved rate: 1 GPU at $2/h over 20 x 3600 requests/h = $27.78 per million
    assert two["cost_per_million_at_rate"] == pytest.approx(2.0 / (20 * 3600) * 1e6)
    assert two["cost_per_hour"] == 2.0
    # 4 clients, 2 slots: the server still completes 2 requests per 100 ms (20 req/s), and every request after
    # the first two waits one whole request for its slot: TTFT 100 + 10 = 110 ms > 60 ms (margin 1 - 110/60)
    four = _at(4, slo)
    assert four["achieved_rps"] == pytest.approx(20.0)
    assert four["p50_ttft_ms"] == pytest.approx(110.0) and four["p90_ttft_ms"] == pytest.approx(110.0)
    assert not four["meets_slo"] and four["margin"] == pytest.approx(1 - 110 / 60)
    # the most clients it holds: 2 (4 misses as above; 3 clients on 2 slots: one request in three waits
    # 100 ms, so P90 TTFT = 110 ms misses too), where it serves 20 req/s: $27.78 per million there as well
    assert two["goodput_clients"] == 2 and two["goodput_rps"] == pytest.approx(20.0)
    assert two["cost_per_million_at_goodput"] == pytest.approx(2.0 / (20 * 3600) * 1e6)
    assert math.isnan(four["goodput_clients"]) and math.isnan(four["cost_per_million_at_goodput"])
    ranked = rank(pd.DataFrame([{**two, "deployment": "a"}, {**four, "deployment": "b"}]).drop(columns="_table"),
                  "rate")
    assert list(ranked["rank"].fillna(0)) == [1, 0]


def test_the_most_clients_search_stops_at_its_cap_and_says_so():
    # 2 running slots -> 64: nothing ever waits, every level passes; the search doubles 1, 2, 4, 8, 16 = 16 x 1
    # and stops there (CLIENTS_CAP), each level at 100 ms a request: 16 / 0.1 s = 160 req/s
    wide = CONSTANT[:-1] + ("scheduler.max_running_requests=64",)
    one = _at(1, sustained(SLO(ttft_ms=60.0, tpot_ms=20.0)), wide)
    assert one["achieved_rps"] == pytest.approx(10.0)
    assert one["goodput_clients"] == 16 and one["goodput_rps"] == pytest.approx(160.0)
    assert one["goodput_flag"].startswith("passes at 16 clients (the search's cap")


def test_probe_size_rounds_per_client_and_the_tail():
    p90 = sustained(SLO(ttft_ms=1000.0, tpot_ms=100.0))
    t = {"name": "sharegpt", "num_requests": 10, "max_concurrency": 3}
    # P90 with --quick: ceil(5 / (0.1 x 0.75)) = 67 requests; 8 per client of 16 = 128 wins
    assert "at least 128 requests" in hold_clients(t, 16, p90, quick=True)
    assert t == {"name": "sharegpt", "num_requests": 128, "concurrency": 16}
    t = {"name": "sharegpt", "num_requests": 10}
    hold_clients(t, 2, p90, quick=True)
    assert t["num_requests"] == 67
    p99 = sustained(SLO(ttft_ms=1000.0, ttft_percentile=99.0, tpot_ms=100.0))
    t = {"name": "sharegpt", "num_requests": 10}
    hold_clients(t, 2, p99)  # ceil(20 / (0.01 x 0.75)) = 2667
    assert t["num_requests"] == 2667
    t = {"name": "sharegpt", "num_requests": 10}
    assert "kept as --set asks" in hold_clients(t, 4, p90, asked=True) and t["num_requests"] == 10
    assert hold_clients({"name": "sharegpt", "num_requests": 5000}, 4, p90) == ""


@pytest.mark.parametrize("argv, msg", [
    (["--concurrency", "8", "--rate", "2"], "--concurrency 8 and --rate 2: a plan's load is either"),
    (["--concurrency", "8", "--trace", "x.csv"], "--concurrency 8 with --trace"),
    (["--concurrency", "8", "--workload", "chat-sessions"], "a conversation workload sends its turns"),
    (["--concurrency", "0"], "--concurrency"),
])
def test_concurrency_flag_errors_are_one_line(tmp_path, capsys, argv, msg):
    assert main(["plan", "--model", "qwen2.5-14b", "--gpus", "1", "--no-progress", "--out", str(tmp_path / "p"),
                 *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and msg in err, err


def test_plan_at_concurrency_writes_the_unit_and_the_achieved_rate(tmp_path, capsys, monkeypatch):
    from sim.studies import concurrency_plan

    monkeypatch.setattr(concurrency_plan, "VERIFY_MIN_REQUESTS", 0)  # 10x the probe's 40 requests: 400
    out = tmp_path / "p"
    assert main(["plan", "--model", "qwen2.5-14b", "--gpus", "1", "--quick", "--set", "workload.num_requests=40",
                 "--concurrency", "4", "--policies", "static-2048", "--seeds", "1", "--price-per-gpu-hour", "2.0",
                 "--verify", "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    df = pd.read_csv(out / "plan.csv")
    ok = df[df["status"] == "ok"]
    assert len(ok) == 1 and (ok["concurrency"] == 4).all() and (ok["achieved_rps"] > 0).all()
    r = ok.iloc[0]
    assert r["cost_per_million_at_rate"] == pytest.approx(cost_per_million(2.0, 1, r["achieved_rps"]), rel=1e-5)
    doc = json.loads((out / "plan.json").read_text())
    assert doc["mode"] == "concurrency" and doc["concurrency"] == 4 and doc["load_unit"] == "concurrent clients"
    assert doc["candidates"][0]["achieved_rps"] == pytest.approx(r["achieved_rps"], rel=1e-5)
    txt = (out / "plan.txt").read_text()
    assert "a closed loop of 4 concurrent clients" in txt and "achieved_rps" in txt
    assert "at the candidate's achieved throughput at N clients" in txt
    assert "ranking: among those meeting the SLOs at 4 concurrent clients on every seed" in txt
    # the default SLOs (P90 TTFT 2 s, P90 TPOT 200 ms) hold at 4 clients on one A100 (margin about 0.76)
    assert r["rank"] == 1 and "req/s it serves at 4 concurrent clients" in doc["verdict"]
    m = int(r["goodput_clients"])
    assert m >= 4 and r["goodput_rps"] > 0 and f"at the most clients it holds, {m}" in doc["verdict"]
    assert r["cost_per_million_at_goodput"] == pytest.approx(cost_per_million(2.0, 1, r["goodput_rps"]), rel=1e-5)
    check, most = doc["verification"]
    assert check["check"] == "recommended, at 4 clients" and check["num_requests"] == 400
    assert isinstance(check["holds"], bool) and check["rate_rps"] > 0
    # at the most clients: 10 x its probe's max(40, 8 per client) requests
    assert most["check"] == f"most clients, at {m}" and most["num_requests"] == 10 * max(40, 8 * m)
    assert "verify (the first seed, run at length):" in text


def test_max_gpus_at_concurrency_smoke(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--max-gpus", "2", "--gpus-per-node",
                 "2", "--concurrency", "8", "--slo", "ttft:p90:300", "--slo", "tpot:p90:12", "--quick", "--seeds", "1",
                 "--pp", "1", "--tp", "1", "--policies", "static-2048", "--confirm", "2", "--no-progress", "--out",
                 str(out)]) == 0
    capsys.readouterr()
    df = pd.read_csv(out / "plan.csv")
    ok = df[df["status"] == "ok"]
    assert len(ok) and (ok["concurrency"] == 8).all() and (ok["achieved_rps"] > 0).all()
    for r in ok.itertuples():
        assert r.cost_per_million_at_rate == pytest.approx(cost_per_million(1.0, r.gpus, r.achieved_rps), rel=1e-5)
    best = df[df["rank"] == 1]
    doc = json.loads((out / "plan.json").read_text())
    assert doc["mode"] == "concurrency" and doc["load_unit"] == "concurrent clients"
    assert doc["verdict"].startswith("At 8 concurrent clients with P90 TTFT <= 300 ms")
    assert len(best) and best.iloc[0]["gpus"] == ok[ok["meets_slo"] == True]["gpus"].min()  # noqa: E712
    assert "req/s it serves at 8 concurrent clients" in doc["verdict"]
    # the most clients each confirmed candidate meeting the SLOs holds: at least the 8 it was planned for
    met = ok[ok["meets_slo"] == True]  # noqa: E712
    assert (met["goodput_clients"] >= 8).all() and (met["goodput_rps"] > 0).all()
