"""How many runs the goodput searches of a reproduction take with each search strategy: records
every search of `ppsim reproduce EXP ...` (its label, hint, sweep rates and goodput), then replays
each hinted search (the first seed's tighter SLO scales, the other seeds) on a monotone stand-in
for its outcome (a rate passes if and only if it is at most the goodput that search found) with:

- `climb`: the sweep's rates climbed two at a time from the plain hint (the reference goodput: the
  first seed's, times the SLO-scale ratio), then bisection: the searches before the gallop;
- `gallop X`: steps of X req/s doubling from the plain hint, then bisection;
- `gallop X, pilots`: the same from the hint the run used (pilot-corrected: experiments/common.py).

The replay counts distinct rates run; each strategy finds the same goodput on a monotone outcome
(checked). A real outcome is not monotone at the 0.05 req/s scale, so the real searches differ a
little from their replays; the counts compare strategies, not runs of the code.

Run: `PIPESIM_CACHE=... python benchmarks/search_replay.py [EXP ...] --out DIR` (default EXPs:
fig1 fig9 fig10 fig12 busbw; DIR's point cache makes a second call take seconds).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import experiments.common as common  # noqa: E402
from sim.studies import sweep  # noqa: E402


def record(exps: list[str], out: str) -> list[dict]:
    """Every search of `ppsim reproduce EXP --out OUT`, as it ended."""
    from sim.cli import main as ppsim

    found = []
    real = common.goodput_searches

    def recording(runner, searches, **kw):
        rows = real(runner, searches, **kw)
        for s, row in zip(searches, rows):
            found.append({"exp": exp, "label": dict(s.label), "hint": s.hint_rps, "rates": list(s.rates),
                          "window_s": s.window_s, "max_rate": kw.get("max_rate", 64.0), "tol": kw.get("tol", 0.05),
                          "goodput": row["goodput_rps"], "runs": len(s.results)})
        return rows

    common.goodput_searches = recording
    try:
        for exp in exps:
            if ppsim(["reproduce", exp, "--out", out, "--no-progress"]) != 0:
                raise SystemExit(f"search_replay: ppsim reproduce {exp} failed")
    finally:
        common.goodput_searches = real
    return found


class _Monotone:
    """A runner whose run at a rate passes if and only if the rate is at most `goodput`."""

    def __init__(self, goodput: float) -> None:
        self.goodput, self.rates = goodput, set()

    def has(self, table: dict) -> bool:
        return False

    def run(self, tables: list[dict], desc: str = "") -> list[dict]:
        out = []
        for t in tables:
            rate = t["workload"]["rate_rps"]
            self.rates.add(rate)
            ok = rate <= self.goodput + 1e-9
            out.append({"status": "ok", "num_requests": 10, "num_finished": 10,
                        "p90_ttft_ms": 1000.0 if ok else 3000.0, "p90_tpot_ms": 100.0})
        return out


def replay(rec: dict, hint: float, gallop_rps: float | None) -> int:
    """Distinct rates one strategy runs for the search `rec` from `hint`."""
    runner = _Monotone(rec["goodput"])
    s = sweep.Search({}, {"workload": {}}, rec["rates"], min_window_s=rec["window_s"], full_sweep=False,
                     hint_rps=hint)
    (row,) = sweep.goodput_searches(runner, [s], tol=rec["tol"], max_rate=rec["max_rate"], gallop_rps=gallop_rps)
    if abs(row["goodput_rps"] - rec["goodput"]) > 1e-6:
        raise SystemExit(f"search_replay: {rec['label']} replayed to {row['goodput_rps']}, not {rec['goodput']}")
    return len(runner.rates)


def plain_hints(recs: list[dict]) -> dict[int, tuple[float, str]]:
    """The reference goodput of each hinted search (index into recs) and its phase: the first
    seed's at the same scale ("other seeds"), or, for the first seed, its goodput at the loosest
    scale times the scale ratio ("tighter SLO")."""
    by = {(r["exp"], tuple(sorted(r["label"].items()))): r["goodput"] for r in recs}
    out = {}
    for i, r in enumerate(recs):
        if r["hint"] is None:
            continue
        same = [q for q in recs if q["exp"] == r["exp"] and q["hint"] is None
                and all(q["label"][k] == v for k, v in r["label"].items() if k not in ("seed", "slo_scale"))]
        first_seed = min(q["label"]["seed"] for q in same)
        scale0 = max(q["label"]["slo_scale"] for q in same)
        if r["label"]["seed"] != first_seed:
            out[i] = by[(r["exp"], tuple(sorted({**r["label"], "seed": first_seed}.items())))], "other seeds"
        else:
            ref = by[(r["exp"], tuple(sorted({**r["label"], "slo_scale": scale0}.items())))]
            out[i] = ref * r["label"]["slo_scale"] / scale0, "tighter SLO"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("exps", nargs="*", default=["fig1", "fig9", "fig10", "fig12", "busbw"])
    ap.add_argument("--out", required=True, help="the reproduction's folder (its point cache is reused)")
    ap.add_argument("--steps", default="0.1,0.2,0.4,0.6", help="gallop steps to replay (req/s)")
    args = ap.parse_args()
    import pandas as pd

    recs = record(args.exps, args.out)
    plain = plain_hints(recs)
    steps = [float(x) for x in args.steps.split(",")]
    rows = collections.defaultdict(lambda: collections.Counter())
    for i, (hint, _phase) in plain.items():
        r = recs[i]
        row = rows[r["exp"]]
        row["searches"] += 1
        row["runs (this code)"] += r["runs"]
        row["climb"] += replay(r, hint, None)
        for x in steps:
            row[f"gallop {x:g}"] += replay(r, hint, x)
            row[f"gallop {x:g}, pilots"] += replay(r, r["hint"], x)
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.loc["all"] = df.sum()
    print("distinct rates run by the hinted searches, per strategy (monotone replay):")
    print(df.to_string())
    dist = pd.DataFrame([{"phase": phase, "plain hint": abs(recs[i]["goodput"] - h) / recs[i]["tol"],
                          "hint used": abs(recs[i]["goodput"] - recs[i]["hint"]) / recs[i]["tol"]}
                         for i, (h, phase) in plain.items()])
    print("\nmedian distance from the hint to the goodput, in cells of the grid (0.05 req/s):")
    print(dist.groupby("phase")[["plain hint", "hint used"]].median().to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
