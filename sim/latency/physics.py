"""`ppsim profile check`: does a profile obey the hardware's physics at every size up to the context length?

Two kinds of findings (profiles/FORMAT.md, "Physical bounds"):

- **Violations of the run-time model** (what a run uses: the scaled tables, their extrapolation and the
  roofline floor, on the target GPU of `[roofline]`): per part (linear layers, attention, LM head,
  communication), the achieved TFLOP/s and MFU of prefill at every power-of-two token count up to the
  model's context length (one prompt, and chunks after long prefixes), the HBM bandwidth utilisation of
  decode (batches x contexts up to the context length) and the link utilisation of communication. A part
  above 90% of the dense BF16 peak (`MFU_BOUND`: sustained GEMMs reach 70-80% of peak, the best kernels
  about 85%; above 90% a table is not a measurement), above 100% of the HBM bandwidth or above 100% of
  the link's bandwidth is a violation. So is non-attention time that grows less than 1.6x from n to 2n
  tokens for n >= 4096 (`GROWTH_BOUND`, issue 31: past the measured grid the work is compute bound and
  linear in tokens).
- **Data errors**: a table point, fit or constant faster than the roofline of the GPU it was measured on
  (`[roofline] base_*`, unscaled): the layer table at each grid point, the attention fits over their
  measured ranges (`[measured]`), the LM head constant, the measured collectives.

**Slowness flags** (`slow`, printed, not problems: a slow kernel is possible, an impossibly fast one is not):
a layer-table point more than `SLOW_BOUND` (3x) slower than its roofline on the GPU it was measured on
(untuned or mis-measured rows), and, over sibling profiles of one model (`tp_scaling_flags`, `--all`), a
TP degree whose layer table is not faster than the next smaller one's at a compute-bound token count
(>= `TP_FROM_TOKENS`).

`notes` lists the parts where the run-time floor binds (a scaled value faster than the target GPU
allows, e.g. a calibrated sibling-SKU factor): not an error, the run uses the floor there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.core.errors import DataError
from sim.latency.base import BatchStats
from sim.latency.profiled import Profile, ProfiledLatencyModel
from sim.latency.roofline import Bounds, Floors

MFU_BOUND = 0.90        # share of the dense BF16 peak no part may exceed (issue 31)
BW_BOUND = 1.00         # share of the HBM bandwidth no part may exceed
LINK_BOUND = 1.00       # share of the link's per-direction bandwidth no collective may exceed
GROWTH_BOUND = 1.6      # non-attention time at 2n over n, n >= GROWTH_FROM tokens (issue 31)
GROWTH_FROM = 4096
AT_FLOOR = 0.999        # a part within 0.1% of a bound runs at the floor (a note, not an error)
DECODE_BATCHES = (1, 8, 32, 128, 256, 512, 1024)
CHUNKS = (1, 64, 512, 2048, 8192)
SLOW_BOUND = 3.0        # a layer-table point slower than 3x its roofline is flagged (issue 42)
TP_FROM_TOKENS = 512    # from here GEMMs are compute bound: twice the GPUs must be faster (issue 42)


@dataclass
class Problem:
    kind: str            # "violation" (the run-time model) or "data" (a table point below its GPU's floor)
    part: str            # linear, attention, lm_head, comm
    where: str           # e.g. "prefill 8192 tokens"
    value: float         # the utilisation (share of the bound's peak)
    bound: float
    what: str            # "dense BF16 peak", "HBM bandwidth", "link bandwidth", "growth 2n/n"

    def line(self, prefix: str = "") -> str:
        if self.what.startswith("growth"):
            return (f"{prefix}{self.kind}: {self.part} at {self.where}: non-attention time grows {self.value:.2f}x "
                    f"from n to 2n tokens (at least {self.bound:g}x)")
        return (f"{prefix}{self.kind}: {self.part} at {self.where}: {self.value:.1%} of the {self.what} "
                f"(bound {self.bound:.0%})")


@dataclass
class Report:
    profile: str
    bounds: Bounds
    base: Bounds
    max_tokens: int
    context_note: str
    prefill: list[dict] = field(default_factory=list)
    chunks: list[dict] = field(default_factory=list)
    decode: list[dict] = field(default_factory=list)
    growth: list[dict] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)     # slowness flags (not problems)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def maxima(self) -> dict[str, float]:
        """The largest utilisation of each part and kind over every row."""
        out: dict[str, float] = {}
        for row in self.prefill + self.chunks + self.decode:
            for k, v in row.items():
                if k.endswith(("_mfu", "_bw", "_link")) and isinstance(v, float):
                    out[k] = max(out.get(k, 0.0), v)
        return out

    def as_dict(self) -> dict:
        return {"profile": self.profile, "gpu": self.bounds.describe(), "base_gpu": self.base.describe(),
                "max_tokens": self.max_tokens, "context": self.context_note, "ok": self.ok,
                "problems": [p.line() for p in self.problems], "notes": self.notes, "slow": self.slow, "maxima": self.maxima(),
                "prefill": self.prefill, "chunks": self.chunks, "decode": self.decode, "growth": self.growth}


def _powers(lo: int, hi: int) -> list[int]:
    out, t = [], lo
    while t < hi:
        out.append(t)
        t *= 2
    return out + [hi]


def _util(work: float, seconds: float, rate: float) -> float:
    return work / seconds / rate if seconds > 0 and rate > 0 else 0.0


def with_roofline(profile: Profile, roofline: dict) -> Profile:
    """A copy of `profile` whose `[roofline]` is `roofline` (for a profile without one: `--gpu`)."""
    import copy

    meta = copy.deepcopy(profile.meta)
    meta["roofline"] = dict(roofline)
    return Profile(profile.path, meta, profile.grid, profile.layer_ms, profile.attention, profile.comm,
                   layer_raw=profile.layer_raw)


class Checker:
    def __init__(self, profile: Profile, max_tokens: int | None = None) -> None:
        self.profile = profile
        bounds = profile.bounds()
        if bounds is None:
            raise DataError(f"{profile.path / 'meta.toml'}: no [roofline] section (the GPU's dense BF16 peak and HBM "
                            "bandwidth); rebuild the profile or give --gpu NAME (profiles/gpus/)")
        self.bounds = bounds
        self.base = profile.bounds(base=True) or bounds
        shape = profile.shape()
        self.shape, self.tp = shape, profile.tp
        pp = 2 if shape.num_layers >= 2 else 1      # a middle split, so that the PP send is costed too
        self.model = ProfiledLatencyModel(profile, pp, variance=False)
        self.fl = Floors.for_shape(bounds, shape, self.tp)
        self.base_fl = Floors.for_shape(self.base, shape, self.tp)
        ctx = profile.context_length
        ranges = profile.measured()
        if max_tokens:
            self.max_tokens, self.context_note = int(max_tokens), f"checked up to {int(max_tokens)} tokens (--max-tokens)"
        elif ctx:
            self.max_tokens, self.context_note = ctx, f"the model's context length, {ctx} tokens"
        else:
            self.max_tokens = int(max(hi for _, hi in ranges.values()))
            self.context_note = (f"context length not recorded ([model] context_length_tokens): checked up to the "
                                 f"measured ranges' end, {self.max_tokens} tokens")
        self.ranges = ranges

    # -- the run-time model --------------------------------------------------------------------------------
    def _comm(self, tokens: int, num_seqs: int) -> float:
        """The largest link utilisation of the communication of a batch of `tokens` tokens."""
        link, m, sh = self.bounds.link_bw, self.model, self.shape
        if not link:
            return 0.0
        size = tokens * sh.hidden_size * sh.act_bytes
        out = _util(m.act_bytes * tokens, m.p2p_s(tokens), link) if m.num_stages > 1 else 0.0
        if self.tp > 1:
            out = max(out, _util(2 * (self.tp - 1) / self.tp * size, m.allreduce_s(tokens), link))
            gathered = num_seqs * sh.vocab_size * sh.act_bytes
            out = max(out, _util((self.tp - 1) / self.tp * gathered, m.logits_gather_s(num_seqs), link))
        return out

    def _linear(self, tokens: int) -> dict:
        t = self.model.layer_nonattn_s(tokens, scaled=True)
        return {"linear_ms": t * 1e3,
                "linear_tflops": _util(self.fl.linear_flops_per_token * tokens, t, 1e12),
                "linear_mfu": _util(self.fl.linear_flops_per_token * tokens, t, self.bounds.peak_flops),
                "linear_bw": _util(self.fl.weight_bytes(tokens), t, self.bounds.hbm_bw)}

    def _lm_head(self, num_seqs: int) -> dict:
        t = self.model.lm_head_time_s(num_seqs)
        return {"lm_head_ms": t * 1e3,
                "lm_head_mfu": _util(self.fl.lm_flops_per_seq * num_seqs, t, self.bounds.peak_flops),
                "lm_head_bw": _util(self.fl.lm_bytes, t, self.bounds.hbm_bw)}

    def _prefill_attention(self, chunk: int, prefix: int) -> dict:
        st = BatchStats.prefill(chunk, prefix)
        t = self.model.attention_s(st)
        pairs = Floors.prefill_pairs(chunk, st.sum_c2, st.sum_cp)
        return {"attention_ms": t * 1e3,
                "attention_tflops": _util(self.fl.pair_flops * pairs, t, 1e12),
                "attention_mfu": _util(self.fl.pair_flops * pairs, t, self.bounds.peak_flops),
                "attention_bw": _util(self.fl.kv_token_bytes * (chunk + prefix), t, self.bounds.hbm_bw)}

    def rows(self, report: Report) -> None:
        top = self.max_tokens
        for T in _powers(1, top):
            row = {"tokens": T, **self._linear(T), **self._prefill_attention(T, 0), **self._lm_head(1),
                   "comm_link": self._comm(T, 1)}
            report.prefill.append(row)
        for c in CHUNKS:
            for p in sorted({0, 1024, 8192, top // 2, top - c}):
                if c + p > top or p < 0 or c > top:
                    continue
                report.chunks.append({"chunk": c, "prefix": p, **self._prefill_attention(c, p)})
        for ctx in sorted({1024, 8192, top}):
            if ctx > top:
                continue
            for b in DECODE_BATCHES:
                st = BatchStats.decode(b, ctx)
                t = self.model.attention_s(st)
                report.decode.append({"batch": b, "context": ctx, **self._linear(b),
                                      "attention_ms": t * 1e3,
                                      "attention_bw": _util(self.fl.kv_token_bytes * b * ctx, t, self.bounds.hbm_bw),
                                      **self._lm_head(b), "comm_link": self._comm(b, b)})
        n = GROWTH_FROM
        while 2 * n <= max(top, 2 * GROWTH_FROM):
            for m in (n, n + n // 2):
                a, b = (self.model.layer_nonattn_s(x, scaled=True) for x in (m, 2 * m))
                report.growth.append({"tokens": m, "ratio": b / a})
            n *= 2

    def violations(self, report: Report) -> None:
        names = {"mfu": ("dense BF16 peak", MFU_BOUND), "bw": ("HBM bandwidth", BW_BOUND),
                 "link": ("link bandwidth", LINK_BOUND)}
        at_floor: dict[str, str] = {}
        for kind, rows in (("prefill", report.prefill), ("chunk", report.chunks), ("decode", report.decode)):
            for row in rows:
                if kind == "prefill":
                    where = f"prefill {row['tokens']} tokens"
                elif kind == "chunk":
                    where = f"prefill chunk {row['chunk']} after {row['prefix']} tokens"
                else:
                    where = f"decode {row['batch']} x {row['context']} tokens"
                for key, val in row.items():
                    suffix = key.rsplit("_", 1)[-1]
                    if suffix not in names or not isinstance(val, float):
                        continue
                    part = key[: -len(suffix) - 1].replace("comm", "communication")
                    what, bound = names[suffix]
                    if val > bound * (1 + 1e-9):
                        report.problems.append(Problem("violation", part, where, val, bound, what))
                    elif suffix != "mfu" and val >= AT_FLOOR * bound:
                        at_floor.setdefault(f"{part} ({what})", where)
        for part, where in at_floor.items():
            report.notes.append(f"{part} runs at the roofline floor (first at {where}): the profile's scaled value "
                                f"is faster than {self.bounds.gpu_spec} allows; the run uses the floor")
        for g in report.growth:
            if g["ratio"] < GROWTH_BOUND:
                report.problems.append(Problem("violation", "linear", f"{g['tokens']} -> {2 * g['tokens']} tokens",
                                               g["ratio"], GROWTH_BOUND, "growth 2n/n"))

    # -- the data, against the GPU it was measured on ---------------------------------------------------------
    def data_errors(self, report: Report) -> None:
        prof, fl, base = self.profile, self.base_fl, self.base
        name = base.gpu_spec or "base GPU"
        for g, ms in zip(prof.grid.tolist(), prof.layer_raw.tolist()):
            t = ms / 1e3
            floor = max(fl.linear_flops_per_token * g / base.peak_flops, fl.weight_bytes(g) / base.hbm_bw)
            if t > SLOW_BOUND * floor:
                report.slow.append(f"slow: layer_nonattn.csv num_tokens={g}: {ms:.4g} ms, {t / floor:.1f}x its roofline "
                                   f"on {name} (flag at {SLOW_BOUND:g}x)")
            for val, what, rate in ((fl.linear_flops_per_token * g, "dense BF16 peak", base.peak_flops),
                                    (fl.weight_bytes(g), "HBM bandwidth", base.hbm_bw)):
                u = _util(val, t, rate)
                if u > 1 + 1e-9:
                    report.problems.append(Problem("data", "linear", f"layer_nonattn.csv num_tokens={g} ({name})",
                                                   u, 1.0, what))
        pre, dec = prof.attention["prefill"], prof.attention["decode"]
        c_lo, c_hi = self.ranges.get("prefill_chunk", self.ranges["tokens"])
        ctx_hi = self.ranges.get("prefill_context", (0.0, c_hi))[1]
        # `prefill_prefix` (optional): the prefixes the points had (AIConfigurator's context tables: none)
        p_lo, p_hi = self.ranges.get("prefill_prefix", (0.0, ctx_hi))
        chunk = max(1, int(c_lo))
        while chunk <= c_hi:
            for prefix in sorted({0, int(ctx_hi - chunk) // 2, int(ctx_hi - chunk)}):
                if prefix < 0 or not p_lo <= prefix <= p_hi:
                    continue
                t = (pre["a_ms"] + pre["b_c"] * chunk + pre["b_c2"] * chunk * chunk
                     + pre["b_cp"] * chunk * prefix) / 1e3
                pairs = Floors.prefill_pairs(chunk, chunk * chunk, chunk * prefix)
                for val, what, rate in ((fl.pair_flops * pairs, "dense BF16 peak", base.peak_flops),
                                        (fl.kv_token_bytes * (chunk + prefix), "HBM bandwidth", base.hbm_bw)):
                    u = _util(val, t, rate)
                    if u > 1 + 1e-9:
                        report.problems.append(Problem("data", "attention", f"attention.csv prefill chunk {chunk} "
                                                       f"after {prefix} tokens ({name})", u, 1.0, what))
            chunk *= 2
        b_lo, b_hi = self.ranges.get("decode_batch", (1.0, 1.0))
        x_lo, x_hi = self.ranges.get("decode_context", self.ranges["tokens"])
        for b in sorted({max(1, int(b_lo)), int(b_hi)}):
            for ctx in sorted({max(1, int(x_lo)), int(x_hi)}):
                t = (dec["a_ms"] + dec["b_ctx"] * b * ctx) / 1e3
                u = _util(fl.kv_token_bytes * b * ctx, t, base.hbm_bw)
                if u > 1 + 1e-9:
                    report.problems.append(Problem("data", "attention", f"attention.csv decode {b} x {ctx} tokens "
                                                   f"({name})", u, 1.0, "HBM bandwidth"))
        lm_ms = float(prof.meta["overhead"].get("lm_head_ms", 0.0))
        if lm_ms > 0:
            u = _util(fl.lm_bytes * self.tp, lm_ms / 1e3, base.hbm_bw)
            if u > 1 + 1e-9:
                report.problems.append(Problem("data", "lm_head", f"meta.toml [overhead] lm_head_ms ({name})", u, 1.0,
                                               "HBM bandwidth"))
        if prof.comm is not None and base.link_bw:
            for r in prof.comm.itertuples():
                n = int(r.num_workers)
                f = 2 * (n - 1) / n if r.op == "all_reduce" else 1.0
                u = _util(f * r.bytes, r.ms / 1e3, base.link_bw)
                if u > 1 + 1e-9:
                    report.problems.append(Problem("data", "communication", f"comm.csv {r.op} {n} GPUs {r.bytes} bytes",
                                                   u, 1.0, "link bandwidth"))

    def run(self) -> Report:
        report = Report(str(self.profile.path), self.bounds, self.base, self.max_tokens, self.context_note)
        self.rows(report)
        self.violations(report)
        self.data_errors(report)
        return report


def check_profile(profile: Profile, max_tokens: int | None = None) -> Report:
    """The physics check of one profile (module docstring)."""
    return Checker(profile, max_tokens=max_tokens).run()


def fmt_table(report: Report) -> list[str]:
    """The report's rows as text tables (per layer; utilisations in %)."""
    pct = lambda v: f"{100 * v:6.1f}"  # noqa: E731
    out = [f"prefill, one prompt (per layer; MFU and HBM in % of {report.bounds.describe()}):",
           f"{'tokens':>8} {'linear ms':>10} {'TFLOP/s':>8} {'MFU':>6} {'attn ms':>9} {'TFLOP/s':>8} {'MFU':>6} "
           f"{'LMhead HBM':>10} {'link':>6}"]
    for r in report.prefill:
        out.append(f"{r['tokens']:>8} {r['linear_ms']:>10.4g} {r['linear_tflops']:>8.1f} {pct(r['linear_mfu'])} "
                   f"{r['attention_ms']:>9.4g} {r['attention_tflops']:>8.1f} {pct(r['attention_mfu'])} "
                   f"{pct(r['lm_head_bw']):>10} {pct(r['comm_link'])}")
    out.append("prefill chunk after a prefix (attention per layer):")
    out.append(f"{'chunk':>8} {'prefix':>8} {'attn ms':>9} {'TFLOP/s':>8} {'MFU':>6} {'HBM':>6}")
    for r in report.chunks:
        out.append(f"{r['chunk']:>8} {r['prefix']:>8} {r['attention_ms']:>9.4g} {r['attention_tflops']:>8.1f} "
                   f"{pct(r['attention_mfu'])} {pct(r['attention_bw'])}")
    out.append("decode (per layer; HBM bandwidth utilisation in %):")
    out.append(f"{'batch':>8} {'context':>8} {'linear HBM':>10} {'attn HBM':>9} {'LMhead HBM':>10} {'LMhead MFU':>10} "
               f"{'link':>6}")
    for r in report.decode:
        out.append(f"{r['batch']:>8} {r['context']:>8} {pct(r['linear_bw']):>10} {pct(r['attention_bw']):>9} "
                   f"{pct(r['lm_head_bw']):>10} {pct(r['lm_head_mfu']):>10} {pct(r['comm_link'])}")
    if report.growth:
        worst = min(report.growth, key=lambda g: g["ratio"])
        out.append(f"non-attention growth from n to 2n tokens (n >= {GROWTH_FROM}): smallest {worst['ratio']:.3f}x "
                   f"at n = {worst['tokens']} (bound {GROWTH_BOUND}x)")
    return out


def tp_scaling_flags(dirs) -> list[str]:
    """Sibling profiles (one model folder, tp<T> sub-folders) whose layer table at twice the TP degree is not
    faster than at the smaller degree at some compute-bound grid point (>= TP_FROM_TOKENS tokens)."""
    from pathlib import Path

    groups: dict = {}
    for d in dirs:
        d = Path(d)
        if d.name.startswith("tp") and d.name[2:].isdigit():
            groups.setdefault(d.parent, {})[int(d.name[2:])] = d
    out = []
    for parent, tps in sorted(groups.items()):
        loaded = {t: Profile.load(p) for t, p in tps.items()}
        for t in sorted(loaded):
            if 2 * t not in loaded:
                continue
            a, b = loaded[t], loaded[2 * t]
            ta = dict(zip(a.grid.tolist(), a.layer_raw.tolist()))
            bad = [g for g, ms in zip(b.grid.tolist(), b.layer_raw.tolist())
                   if g >= TP_FROM_TOKENS and g in ta and ms >= ta[g]]
            if bad:
                out.append(f"slow: {parent}: tp{2 * t} is not faster than tp{t} at {len(bad)} grid points from "
                           f"{TP_FROM_TOKENS} tokens (first {bad[0]})")
    return out


def summary_line(report: Report) -> str:
    mx = report.maxima()
    parts = "; ".join(f"{p} MFU {mx.get(p + '_mfu', 0):.0%} HBM {mx.get(p + '_bw', 0):.0%}"
                      for p in ("linear", "attention", "lm_head"))
    link = f"; link {mx.get('comm_link', 0):.0%}" if report.bounds.link_bw else ""
    status = "ok  " if report.ok else "FAIL"
    return f"{status} {report.profile}: up to {report.max_tokens} tokens; {parts}{link}"

