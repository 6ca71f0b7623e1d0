"""GPUs and interconnects as data (profiles/gpus, profiles/interconnects), and the interconnect's alpha-beta
model inside a node: what a run reads to cost communication where its ranks sit (sim/latency/cluster.py) and
what the profile tool chain builds profiles with (sim/profiling/specs.py, build.py).

- `GpuSpec`: memory, HBM bandwidth, BF16 (FP8, FP4) peak, the kernel-data family it uses and the scaling
  applied when that data comes from a sibling SKU (e.g. A100 80GB data for an A100 40GB PCIe).
- `Interconnect`: how TP all-reduces and PP sends are costed (alpha-beta), and where the numbers come from.
- `comm_model`: an interconnect's alpha-beta values for a GPU family and a TP group size: fixed values of
  the interconnect file (PCIe; all-reduce from a calibration output when it names one), or the alpha-beta
  fits of measured NCCL tables in profiles/kernels/<family>.toml `[comm.<interconnect>]` (NVSwitch /
  NVLink), every bandwidth capped at the link's (`cap_at_link`).

Readers raise `DataError` (one line, file and field named); nothing here times anything.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from sim.core.errors import DataError
from sim.core.tomlio import read_toml

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
GPUS_DIR = PROFILES / "gpus"
INTERCONNECTS_DIR = PROFILES / "interconnects"
KERNELS_DIR = PROFILES / "kernels"


# -- GPUs and interconnects ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuSpec:
    name: str
    display: str
    memory_gib: float           # usable capacity
    m_init_gib: float           # free memory before weights load (SGLang's profile_max_num_token)
    hbm_bw_gbps: float
    bf16_tflops: float
    kernel_data: str            # profiles/kernels/<kernel_data>.toml
    default_interconnect: str
    scaling: dict = field(default_factory=dict)    # s_mem, s_comp, lookup, cpu_ms, status, source / calibration
    source: str = ""
    sm_count: int = 0           # streaming multiprocessors (0: not given)
    fp8_tflops: float = 0.0     # dense FP8 tensor-core peak (0: not given / not supported)
    fp4_tflops: float = 0.0     # dense FP4 tensor-core peak (0: not given / not supported)
    nvlink_gbps: float = 0.0    # per-direction NVLink bandwidth of one GPU (0: not given)

    def peak_tflops(self, dtype: str) -> float:
        """The dense tensor-core peak for GEMMs in `dtype` ("bf16", "fp8", "fp4"); a one-line DataError when the
        GPU's spec does not give it."""
        val = {"bf16": self.bf16_tflops, "fp8": self.fp8_tflops, "fp4": self.fp4_tflops}.get(dtype, 0.0)
        if not val:
            raise DataError(f"profiles/gpus/{self.name}.toml [gpu]: no {dtype}_tflops (dense {dtype.upper()} peak); "
                            f"{self.display} has no {dtype} tensor cores in its spec")
        return val


def _spec_table(folder: Path, name: str, table: str, flag: str, what: str, names) -> tuple[Path, dict, dict]:
    """(path, whole file, its [table]) of the spec `folder/<name>.toml`, or a one-line DataError."""
    path = folder / f"{name}.toml"
    if not path.is_file():
        raise DataError(f"{flag} {name!r}: unknown {what}; allowed: {', '.join(names())}")
    cfg = read_toml(path, DataError)
    sec = cfg.get(table)
    if not isinstance(sec, dict):
        raise DataError(f"{path}: missing table [{table}]")
    return path, cfg, sec


def gpu_names() -> list[str]:
    return sorted(p.stem for p in GPUS_DIR.glob("*.toml"))


def load_gpu(name: str) -> GpuSpec:
    path, cfg, g = _spec_table(GPUS_DIR, name, "gpu", "--gpu", "GPU", gpu_names)
    where = f"{path} [gpu]"
    nums = {}
    for key in ("memory_gib", "m_init_gib", "hbm_bw_gbps", "bf16_tflops"):
        v = g.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise DataError(f"{where}: field {key!r} must be a finite number > 0, got {v!r}")
        nums[key] = float(v)
    for key in ("kernel_data", "default_interconnect", "display"):
        if not isinstance(g.get(key), str):
            raise DataError(f"{where}: field {key!r} must be a string")
    for key in ("fp8_tflops", "fp4_tflops", "nvlink_gbps"):
        v = g.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise DataError(f"{where}: field {key!r} must be a finite number >= 0, got {v!r}")
        nums[key] = float(v)
    sms = g.get("sm_count", 0)
    if isinstance(sms, bool) or not isinstance(sms, int) or sms < 0:
        raise DataError(f"{where}: field 'sm_count' must be a positive integer, got {sms!r}")
    return GpuSpec(name=name, display=g["display"], kernel_data=g["kernel_data"],
                   default_interconnect=g["default_interconnect"], scaling=dict(cfg.get("scaling", {})),
                   source=str(g.get("source", "")), sm_count=sms, **nums)


@dataclass(frozen=True)
class Interconnect:
    name: str
    description: str
    kind: str                   # "fixed" (alpha-beta values here) or "measured" (fits in profiles/kernels)
    values: dict                # kind = fixed: p2p_alpha_us, p2p_bw_gbps, allreduce_alpha_us, allreduce_busbw_gbps
    families: tuple[str, ...]   # kernel-data families it exists for (empty: any)
    fallback_family: dict       # family -> family whose measurements stand in for a missing op
    source: str = ""
    calibration: str = ""
    link_bw_gbps: dict = field(default_factory=dict)   # kernel family -> per-direction GB/s between two GPUs
    link_source: str = ""

    def link_bw(self, family: str, where: str = "") -> float:
        """The per-direction bandwidth (GB/s) of the fastest link between two GPUs of `family`: the
        communication floor."""
        if family not in self.link_bw_gbps:
            raise DataError(f"profiles/interconnects/{self.name}.toml [link]: no bw_gbps for {family} GPUs{where}; "
                            f"present: {', '.join(sorted(self.link_bw_gbps)) or 'none'}")
        return float(self.link_bw_gbps[family])


def interconnect_names() -> list[str]:
    return sorted(p.stem for p in INTERCONNECTS_DIR.glob("*.toml"))


def load_interconnect(name: str) -> Interconnect:
    path, cfg, ic = _spec_table(INTERCONNECTS_DIR, name, "interconnect", "--interconnect", "interconnect",
                                interconnect_names)
    kind = ic.get("kind")
    if kind not in ("fixed", "measured"):
        raise DataError(f"{path} [interconnect]: field 'kind' must be 'fixed' or 'measured', got {kind!r}")
    link = cfg.get("link", {})
    bws = link.get("bw_gbps", {}) if isinstance(link, dict) else None
    if not isinstance(bws, dict) or not bws:
        raise DataError(f"{path} [link]: field 'bw_gbps' must be a table of kernel family = GB/s per direction")
    for fam, v in bws.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise DataError(f"{path} [link]: field 'bw_gbps.{fam}' must be a finite number > 0, got {v!r}")
    return Interconnect(name=name, description=str(ic.get("description", "")), kind=kind,
                        values=dict(cfg.get("alpha_beta", {})), families=tuple(ic.get("families", ())),
                        fallback_family=dict(ic.get("fallback_family", {})), source=str(ic.get("source", "")),
                        calibration=str(ic.get("calibration", "")), link_bw_gbps=dict(bws),
                        link_source=str(link.get("source", "")))


# -- the interconnect's alpha-beta model inside a node -------------------------------------------------

def fits_file(name: str) -> dict:
    """[[fit]] entries (param -> entry) and [lookup] of a calibration output in profiles/."""
    path = PROFILES / name
    if not path.is_file():
        return {"fit": {}, "lookup": {}}
    raw = tomllib.loads(path.read_text())
    return {"fit": {f["param"]: f for f in raw.get("fit", [])}, "lookup": raw.get("lookup", {})}


def cap_at_link(vals: dict, how: str, records: list[dict], link_gbps: float, ic: Interconnect,
                family: str) -> tuple[dict, str, list[dict]]:
    """Bandwidths no faster than the link (a fit or a borrowed value above it is not physical, e.g. an
    all-reduce fit of another GPU family): capped at `link_gbps` and said so in the derivation."""
    capped = []
    for key in ("p2p_bw_gbps", "allreduce_busbw_gbps"):
        if vals[key] > link_gbps:
            capped.append(f"{key} {vals[key]:g} GB/s capped at the link's {link_gbps:g} GB/s per direction "
                          f"(profiles/interconnects/{ic.name}.toml [link], {family})")
            vals[key] = link_gbps
            records = [dict(r, value=link_gbps, status=f"{r.get('status', '')}; capped at the link bandwidth")
                       if r.get("param") == key else r for r in records]
    return vals, how + ("; " + "; ".join(capped) if capped else ""), records


def family_meta(family: str) -> dict:
    """The kernel-data family's TOML (profiles/kernels/<family>.toml), whose `[comm.<interconnect>]` tables hold
    the measured NCCL fits (what `sim.profiling.kernels.KernelModel.load` reads as its `meta`)."""
    return read_toml(KERNELS_DIR / f"{family}.toml", DataError, "kernel data missing (profiles/build_kernels.py "
                     "writes it)")


def comm_model(ic: Interconnect, family: str, tp: int, meta: dict | None = None) -> tuple[dict, str, list[dict]]:
    """([comm] alpha-beta values, derivation text, [[fit]] records) of an interconnect for GPUs of a kernel-data
    `family` (`meta`: its TOML when already read) and a TP group of `tp` GPUs, every bandwidth at most the link's
    (`cap_at_link`). Profiles are built with it (sim/profiling/build.py) and multi-node runs cost their
    intra-node links with it (`sim.latency.cluster.intra_node_link`)."""
    vals, how, records = _comm_model(ic, family, family_meta(family) if meta is None else meta, tp)
    return cap_at_link(vals, how, records, ic.link_bw(family), ic, family)


def _comm_model(ic: Interconnect, family: str, meta: dict, tp: int) -> tuple[dict, str, list[dict]]:
    if ic.families and family not in ic.families:
        raise DataError(f"--interconnect {ic.name!r}: no data for {family} GPUs; allowed for this GPU: "
                        f"{', '.join(allowed_interconnects(family))}")
    if ic.kind == "fixed":
        vals = {k: float(ic.values[k]) for k in ("p2p_alpha_us", "p2p_bw_gbps", "allreduce_alpha_us",
                                                  "allreduce_busbw_gbps")}
        records = []
        how = f"{ic.name}: fixed alpha-beta values of profiles/interconnects/{ic.name}.toml ({ic.source})"
        if ic.calibration:
            fit = fits_file(ic.calibration)["fit"]
            for p in ("allreduce_busbw_gbps", "allreduce_alpha_us"):
                if p in fit:
                    vals[p] = float(fit[p]["value"])
                    records.append({**fit[p], "record": f"profiles/{ic.calibration}"})
            how += f"; all-reduce from profiles/{ic.calibration}"
        return vals, how, records
    fam = family
    table = meta.get("comm", {}).get(ic.name)
    notes = []
    if table is None or not any(k.startswith("all_reduce_") for k in table):
        alt = ic.fallback_family.get(fam)
        if alt is None:
            raise DataError(f"--interconnect {ic.name!r}: no measured collectives for {fam} GPUs")
        alt_table = family_meta(alt).get("comm", {}).get(ic.name, {})
        notes.append(f"all-reduce borrowed from the {alt} fit (no {fam} all-reduce measured)")
        merged = dict(alt_table)
        merged.update({k: v for k, v in (table or {}).items() if k == "send_recv"})
        table = merged
    sr = table["send_recv"]
    ns = sorted(int(k.rsplit("_", 1)[1]) for k in table if k.startswith("all_reduce_"))
    n = tp if tp in ns else max(ns)
    if tp > 1 and n != tp:
        notes.append(f"TP{tp} uses the {n}-GPU all-reduce fit (largest group measured): extrapolated")
    ar = table[f"all_reduce_{n}"]
    vals = {"p2p_alpha_us": sr["alpha_us"], "p2p_bw_gbps": sr["bw_gbps"], "allreduce_alpha_us": ar["alpha_us"],
            "allreduce_busbw_gbps": ar["busbw_gbps"]}
    how = (f"{ic.name}: alpha-beta fits of measured NCCL tables ({', '.join(table.get('sources', []))}), "
           f"profiles/kernels/{fam}.toml [comm.{ic.name}]; send_recv 2 GPUs, all-reduce {n} GPUs"
           + ("; " + "; ".join(notes) if notes else ""))
    status = "fitted to measured collectives (alpha-beta)" + (" (" + "; ".join(notes) + ")" if notes else "")
    records = [{"param": p, "value": vals[p], "status": status, "target": "", "achieved": "", "residual": ""}
               for p in ("allreduce_busbw_gbps", "allreduce_alpha_us", "p2p_bw_gbps", "p2p_alpha_us")]
    return vals, how, records


def allowed_interconnects(family: str) -> list[str]:
    """The interconnects that have data for GPUs of a kernel-data `family`."""
    out = []
    for name in interconnect_names():
        ic = load_interconnect(name)
        if not ic.families or family in ic.families:
            out.append(name)
    return out
