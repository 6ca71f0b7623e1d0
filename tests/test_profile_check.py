"""Latency that obeys physics (issue 31): the roofline floor, extrapolation beyond the measured grid,
`ppsim profile check`, and the validation of profile values and overrides."""

from __future__ import annotations

import json
import math
import shutil
import tomllib

import numpy as np
import pytest

from conftest import REPO, load_shipped
from sim.cli import main as ppsim
from sim.cli.profile import shipped_profile_dirs
from sim.core.errors import ConfigError, DataError
from sim.latency.analysis import OVERRIDE_RANGES, load_model, with_overrides
from sim.latency.base import BatchStats
from sim.latency.physics import GROWTH_BOUND, MFU_BOUND, check_profile
from sim.latency.profiled import Profile, ProfiledLatencyModel
from sim.latency.hardware import load_gpu, load_interconnect
from sim.profiling.specs import model_names

P32 = REPO / "profiles" / "a100-pcie-40gb" / "qwen2.5-32b"
L8 = REPO / "profiles" / "built" / "a100-sxm-80gb" / "llama-3.1-8b" / "tp1"
SHIPPED = shipped_profile_dirs()


_shipped = load_shipped  # each shipped profile loaded once for the loops below (read-only use)
_REPORTS: dict = {}  # (profile folder, max_tokens) -> its check: the bounds test's, then the CLI's


def _check(prof, max_tokens=None):
    """check_profile, once per shipped profile: `profile check --all` below repeats the bounds test's checks."""
    key = (str(prof.path), max_tokens)
    if key not in _REPORTS:
        _REPORTS[key] = check_profile(prof, max_tokens=max_tokens)
    return _REPORTS[key]


def test_every_profile_is_found():
    hand = [d for d in SHIPPED if "built" not in d.parts and "aic" not in d.parts and "moe" not in d.parts]
    assert len(hand) == 12 and len(SHIPPED) - len(hand) == len(list((REPO / "profiles" / "built").rglob("meta.toml"))) \
        + len(list((REPO / "profiles" / "aic").rglob("meta.toml"))) \
        + len(list((REPO / "profiles" / "moe").rglob("meta.toml")))


# -- the issue's "done when": every shipped profile, every token count up to the context length --------------

def test_no_shipped_profile_exceeds_a_physical_bound_up_to_its_context_length():
    bad = []
    for d in SHIPPED:
        prof = _shipped(d)
        assert prof.context_length, f"{d}: [model] context_length_tokens missing"
        report = _check(prof)
        assert report.max_tokens == prof.context_length
        assert report.prefill[-1]["tokens"] == prof.context_length
        mx = report.maxima()
        assert max(v for k, v in mx.items() if k.endswith("_mfu")) <= MFU_BOUND, d
        assert max(v for k, v in mx.items() if k.endswith(("_bw", "_link"))) <= 1.0 + 1e-9, d
        bad += [p.line(f"{d}: ") for p in report.problems]
    assert not bad, "\n".join(bad[:20])


def test_non_attention_time_at_2n_is_at_least_1_6x_that_at_n_for_every_shipped_profile():
    for d in SHIPPED:
        prof = _shipped(d)
        m = ProfiledLatencyModel(prof, 1, variance=False)
        ns = sorted({4096, 4097, 4500, 5000, 6000, 6144, 7000, 8191, 8192, 12288, 16384, 24576,
                     prof.context_length // 2})
        for n in ns:
            if 2 * n > prof.context_length:
                continue
            layer = m.layer_nonattn_s(2 * n, True) / m.layer_nonattn_s(n, True)
            stage = (m.stage_time(BatchStats.prefill(2 * n), 0).linear_s / m.stage_time(BatchStats.prefill(n), 0).linear_s)
            assert layer >= GROWTH_BOUND and stage >= GROWTH_BOUND, (d, n, layer, stage)


def test_profile_check_cli_over_every_shipped_profile_exits_0(capsys, monkeypatch,
                                                            shipped_profiles_loaded_once):
    # the command's own walk, loading and printing, over the checks the bounds test made (the same function
    # of the same profiles: `_check`); run alone, it makes them
    import sim.latency.physics

    monkeypatch.setattr(sim.latency.physics, "check_profile", _check)
    assert ppsim(["profile", "check", "--all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(f"{len(SHIPPED)} profiles checked up to their context length; 0 with problems")
    assert sum(line.startswith("ok ") for line in out) == len(SHIPPED)


def test_profile_check_one_profile_prints_the_table(capsys):
    assert ppsim(["profile", "check", str(P32 / "tp1")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok ") and "MFU" in out and "32768" in out and "decode" in out
    assert ppsim(["profile", "check", str(L8), "--json", "--max-tokens", "8192"]) == 0
    rep = json.loads(capsys.readouterr().out)[0]
    assert rep["ok"] and rep["max_tokens"] == 8192 and rep["prefill"][-1]["tokens"] == 8192


# -- a planted over-fast table fails ---------------------------------------------------------------------------

def _copy(tmp_path, src=L8):
    d = tmp_path / "prof"
    shutil.copytree(src, d)
    return d


def test_planted_over_fast_layer_table_fails(tmp_path, capsys):
    d = _copy(tmp_path)
    csv = d / "layer_nonattn.csv"
    lines = csv.read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        n, lin, tot = line.split(",")
        f = 0.3 if int(n) >= 2048 else 1.0     # 2048+ tokens at 3.3x the measured speed: above the peak
        out.append(f"{n},{float(lin) * f:.5g},{float(tot) * f:.5g}")
    csv.write_text("\n".join(out) + "\n")
    rep = check_profile(Profile.load(d))
    kinds = {(p.kind, p.part, p.what) for p in rep.problems}
    assert ("data", "linear", "dense BF16 peak") in kinds           # table points faster than the A100 allows
    assert ("violation", "linear", "dense BF16 peak") in kinds      # the run (at the floor) above 90% of peak
    assert ppsim(["profile", "check", str(d)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"{d}: data: linear at layer_nonattn.csv num_tokens=2048") for line in lines)
    assert any("violation: linear at prefill 4096 tokens: 100.0% of the dense BF16 peak (bound 90%)" in line
               for line in lines)


def test_planted_over_fast_decode_attention_and_lm_head_fail(tmp_path):
    d = _copy(tmp_path)
    att = (d / "attention.csv").read_text().splitlines()
    parts = att[2].split(",")
    parts[-1] = f"{float(parts[-1]) * 0.5:.5g}"       # KV reads at 1.5x the HBM bandwidth
    att[2] = ",".join(parts)
    (d / "attention.csv").write_text("\n".join(att) + "\n")
    meta = (d / "meta.toml").read_text()
    lm = tomllib.loads(meta)["overhead"]["lm_head_ms"]
    (d / "meta.toml").write_text(meta.replace(f"lm_head_ms = {lm}", f"lm_head_ms = {lm / 3}"))
    rep = check_profile(Profile.load(d))
    kinds = {(p.kind, p.part, p.what) for p in rep.problems}
    assert ("data", "attention", "HBM bandwidth") in kinds and ("data", "lm_head", "HBM bandwidth") in kinds
    # the run itself never reads faster than the HBM allows: the floor holds it at 100%
    assert max(r["attention_bw"] for r in rep.decode) == pytest.approx(1.0)
    assert max(r["lm_head_bw"] for r in rep.decode) == pytest.approx(1.0)


def test_a_profile_without_roofline_needs_a_gpu(tmp_path, capsys):
    d = tmp_path / "tiny"
    shutil.copytree(REPO / "tests" / "data" / "tiny-profile", d)
    assert ppsim(["profile", "check", str(d)]) == 2
    err = capsys.readouterr().err
    assert "no [roofline] section" in err and err.count("\n") == 1
    assert ppsim(["profile", "check", str(d), "--gpu", "a100-sxm-80gb", "--max-tokens", "4096"]) in (0, 1)
    assert "a100-sxm-80gb" in capsys.readouterr().out


# -- the floor and the extrapolation ---------------------------------------------------------------------------

def _without_roofline(prof: Profile) -> Profile:
    meta = {k: v for k, v in prof.meta.items() if k != "roofline"}
    return Profile(prof.path, meta, prof.grid, prof.layer_ms, prof.attention, prof.comm, layer_raw=prof.layer_raw)


@pytest.mark.parametrize("tp,pp", [(1, 4), (2, 2), (4, 1)])
@pytest.mark.parametrize("model", ["qwen2.5-32b", "qwen2.5-14b"])
def test_the_floor_keeps_the_calibrated_tables_bit_for_bit_inside_the_grid(model, tp, pp):
    """Inside the measured grid the calibrated A100 PCIe tables are physical: the floor changes no value
    of the linear table, and no stage time of prefills up to 4096 tokens or decode batches up to 100
    requests (the LM head's compute term binds only above ~120 sequences per micro-batch)."""
    prof = Profile.load(REPO / "profiles" / "a100-pcie-40gb" / model / f"tp{tp}")
    a = ProfiledLatencyModel(prof, pp, variance=False)
    b = ProfiledLatencyModel(_without_roofline(prof), pp, variance=False)
    assert a.floors is not None and b.floors is None
    assert a._scaled_ms == b._scaled_ms
    batches = [BatchStats.prefill(t, p) for t in (1, 64, 129, 512, 2048, 4096) for p in (0, 1500)]
    batches += [BatchStats.decode(n, c) for n in (1, 17, 64, 100) for c in (300, 1400, 4000)]
    batches += [BatchStats(512, 1, 512 * 512, 512 * 900, 60, 60 * 1300)]
    for st in batches:
        assert a.stage_times(st) == b.stage_times(st), st
        for s in range(pp):
            assert a.stage_time(st, s) == b.stage_time(st, s)


def test_issue_examples_prefill_keeps_growing_past_the_grid():
    m = load_model(L8, 1)
    lin = [m.stage_time(BatchStats.prefill(t), 0).linear_s for t in (4096, 8192, 16384)]
    assert lin[1] / lin[0] > 1.9 and lin[2] / lin[1] > 1.9      # was 272.5 ms at all three
    fl = m.floors
    for t in (8192, 16384, 131072):           # below 90% of the A100's peak at every size
        flops = 2 * t * m.shape.layer_params * m.shape.num_layers
        assert flops / m.stage_time(BatchStats.prefill(t), 0).linear_s / fl.bounds.peak_flops <= MFU_BOUND
    q = load_model(P32 / "tp1", 4)
    vals = [q.layer_nonattn_s(t, True) for t in (4096, 8192, 10**6)]   # was flat 326 ms from 4096 to 1e6
    assert vals[1] > 1.9 * vals[0] and vals[2] > 200 * vals[0]


def test_extrapolation_rate_is_fitted_on_the_top_never_negative_never_below_the_floor(tmp_path):
    d = _copy(tmp_path)
    csv = d / "layer_nonattn.csv"
    lines = csv.read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:   # the top half of the grid falls (as the issue's Qwen2.5-32B table did at its end)
        n, lin, tot = line.split(",")
        f = 1.0 if int(n) < 2048 else 2048 / int(n)
        out.append(f"{n},{float(lin) * f:.5g},{float(tot) * f:.5g}")
    csv.write_text("\n".join(out) + "\n")
    m = load_model(d, 1)
    assert m.extrapolation_rate_s() == 0.0
    last = m.layer_nonattn_s(4096, True)
    for t in (4097, 6000, 8192, 65536):
        v = m.layer_nonattn_s(t, True)
        assert v >= last and v >= m.floors.linear_s(t) * (1 - 1e-12)
        last = v
    assert m.layer_nonattn_s(65536, True) == pytest.approx(m.floors.linear_s(65536))
    # a physical table grows at its own top rate: least squares over 2048..4096 tokens
    m2 = load_model(L8, 1)
    g, y = m2.profile.grid, m2.profile.layer_raw
    top = g >= 2048
    slope = np.polyfit(g[top].astype(float), y[top], 1)[0] / 1e3
    assert m2.extrapolation_rate_s() == pytest.approx(slope, rel=1e-9)
    assert m2.layer_nonattn_s(5000, True) == pytest.approx(m2.layer_nonattn_s(4096, True) + slope * 904, rel=1e-12)


def test_attention_floors_prefill_after_a_long_prefix_and_decode():
    m = load_model(P32 / "tp1", 1)
    fl = m.floors
    st = BatchStats.prefill(1, 30000)           # one token after 30k: a KV read, not the fitted c*p FLOP rate
    assert m.attention_s(st) == pytest.approx(fl.kv_token_s * 30001)
    st = BatchStats.decode(64, 32000)           # the calibrated 8-KV-head fit x s_mem reads at 103% of 1555 GB/s
    assert m.attention_s(st) == pytest.approx(fl.kv_token_s * 64 * 32000)
    big = BatchStats.prefill(32768)
    pairs = 32768 * 32769 / 2
    assert fl.pair_flops * pairs / m.attention_s(big) / fl.bounds.peak_flops < MFU_BOUND


def test_lm_head_is_compute_bound_for_many_sequences_and_both_paths_agree():
    for path, pp in ((P32 / "tp1", 4), (P32 / "tp4", 1), (L8, 2)):
        m = load_model(path, pp)
        n_star = m.lm_head_s / m.lm_seq_s
        assert 100 < n_star < 400
        assert m.lm_head_time_s(int(n_star) - 1) == m.lm_head_s
        assert m.lm_head_time_s(1000) == pytest.approx(1000 * m.lm_seq_s)
        mfu = m.floors.lm_flops_per_seq * 1000 / m.lm_head_time_s(1000) / m.floors.bounds.peak_flops
        assert mfu == pytest.approx(m.lm_mfu) and mfu <= MFU_BOUND
        for st in (BatchStats.decode(int(n_star) + 50, 900), BatchStats(300, 2, 300 * 150, 0, 400, 400 * 700)):
            last = m.stage_time(st, pp - 1)
            assert m.stage_times(st) == tuple(m.stage_time(st, s).total_s for s in range(pp)) or m.tp > 1
            assert last.linear_s > m.stage_time(BatchStats.decode(1, 900), pp - 1).linear_s


def test_comm_floor_and_built_bandwidths_never_exceed_the_link():
    for d in SHIPPED:
        meta = _shipped(d).meta
        link = meta["roofline"]["link_bw_gbps"]
        assert meta["comm"]["p2p_bw_gbps"] <= link and meta["comm"]["allreduce_busbw_gbps"] <= link, d
    a40 = Profile.load(REPO / "profiles" / "built" / "a40-48gb" / "llama-3.1-8b" / "tp2").meta
    assert a40["comm"]["allreduce_busbw_gbps"] == 56.25 and "capped at the link" in a40["derivation"]["comm"]
    m = load_model(REPO / "profiles" / "a100-pcie-40gb" / "qwen2.5-32b" / "tp4", 1)
    assert m.allreduce_s(4096) >= 1.5 * 4096 * 5120 * 2 / 32e9


def test_roofline_sections_agree_with_the_gpu_and_interconnect_specs():
    for d in SHIPPED:
        meta = _shipped(d).meta
        rl = meta["roofline"]
        gpu, base = load_gpu(rl["gpu_spec"]), load_gpu(rl["base_gpu_spec"])
        ic = load_interconnect(rl["interconnect"])
        assert (rl["bf16_tflops"], rl["hbm_bw_gbps"]) == (gpu.bf16_tflops, gpu.hbm_bw_gbps), d
        assert (rl["base_bf16_tflops"], rl["base_hbm_bw_gbps"]) == (base.bf16_tflops, base.hbm_bw_gbps), d
        if meta["profile"].get("kernel_data") == "aic":   # measured on the GPU itself; NVLink of its spec
            assert base == gpu and rl["link_bw_gbps"] == gpu.nvlink_gbps, d
            assert rl["peak_tflops"] == gpu.peak_tflops(meta["profile"]["weight_dtype"]), d
            continue
        assert rl["link_bw_gbps"] == ic.link_bw(gpu.kernel_data), d
        assert base.kernel_data == gpu.kernel_data


def test_every_model_has_a_cited_context_length():
    for name in model_names():
        text = (REPO / "profiles" / "models" / f"{name}.toml").read_text()
        m = tomllib.loads(text)["model"]
        assert m["context_length_tokens"] in (16384, 32768, 40960, 131072)   # 40960: Qwen3-30B-A3B
        line = next(x for x in text.splitlines() if x.startswith("context_length_tokens"))
        assert "max_position_embeddings" in line and "config.json" in line + m["source"]
    assert tomllib.loads((REPO / "profiles/models/llama-3.1-8b.toml").read_text())["model"][
        "context_length_tokens"] == 131072


# -- values validated on load ----------------------------------------------------------------------------------

@pytest.mark.parametrize("section,key,value,message", [
    ("scaling", "s_mem", "nan", "[scaling]: key 's_mem' must be a finite number"),
    ("scaling", "s_comp", "1e300", "[scaling]: key 's_comp' must be a finite number in [0.1, 10]"),
    ("overhead", "cpu_ms", "inf", "[overhead]: key 'cpu_ms' must be a finite number"),
    ("overhead", "lm_head_ms", "-1.0", "[overhead]: key 'lm_head_ms' must be a finite number in [0, 1e+06]"),
    ("ground_truth", "jitter_cv", "nan", "[ground_truth]: key 'jitter_cv' must be a finite number"),
    ("ground_truth", "slow_prob", "1.5", "[ground_truth]: key 'slow_prob' must be a finite number in [0, 1]"),
    ("model", "num_layers", "0", "[model]: key 'num_layers' must be an integer in [1, 1000]"),
    ("model", "head_dim", "12.5", "[model]: key 'head_dim' must be an integer in [1, 1000000]"),
    ("comm", "allreduce_busbw_gbps", "500.0", "[comm]: key 'allreduce_busbw_gbps' must be in (0, 32]"),
    ("roofline", "hbm_bw_gbps", "nan", "[roofline]: key 'hbm_bw_gbps' must be a finite number"),
    ("memory", "m_init_gib", "0.0", "[memory]: key 'm_init_gib' must be a finite number in (0, 1e+06]"),
    ("fit_errors", "made_up", "nan", "[fit_errors]: key 'made_up' must be a finite number"),
])
def test_meta_values_are_finite_and_in_range(tmp_path, section, key, value, message):
    d = _copy(tmp_path, P32 / "tp4")
    text = (d / "meta.toml").read_text()
    lines, done, sec = [], False, None
    for line in text.splitlines():
        if line.startswith("["):
            if sec == section and not done:
                lines.append(f"{key} = {value}")
                done = True
            sec = line.split("]")[0].strip("[")
        if sec == section and line.split("=")[0].strip() == key:
            line, done = f"{key} = {value}", True
        lines.append(line)
    if not done:
        lines += [f"[{section}]", f"{key} = {value}"]
    (d / "meta.toml").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as exc:
        Profile.load(d)
    msg = str(exc.value)
    assert msg.startswith(str(d / "meta.toml")) and message in msg and "\n" not in msg


@pytest.mark.parametrize("file,edit,message", [
    ("attention.csv", lambda t: t.replace("decode,", "decode,inf,", 1).replace(",,,,", ",,,", 1),
     "column 'a_ms' must hold non-negative numbers"),
    ("layer_nonattn.csv", lambda t: "\n".join(line if i != 1 else ",".join(["1", "nan"] + line.split(",")[2:])
                                              for i, line in enumerate(t.splitlines())) + "\n",
     "column 'qkv_proj' must hold non-negative numbers (finite, ms)"),
])
def test_table_values_are_finite(tmp_path, file, edit, message):
    d = _copy(tmp_path, P32 / "tp1")
    p = d / file
    p.write_text(edit(p.read_text()))
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Profile.load(d)


# -- overrides validated where they are applied ----------------------------------------------------------------

@pytest.mark.parametrize("key,value", [("s_mem", math.nan), ("s_comp", 1e300), ("s_mem", 0.5), ("jitter_cv", -0.1),
                                       ("cpu_ms", math.inf), ("slow_prob", 0.5), ("p2p_alpha_us", 5000.0),
                                       ("allreduce_busbw_gbps", 100.0), ("allreduce_busbw_gbps", 0.0),
                                       ("decode_wave_fraction", 2.0), ("mode", "nearest"), ("cpu_ms", True)])
def test_bad_overrides_are_one_line_errors_naming_the_key(key, value):
    prof = Profile.load(P32 / "tp4")
    with pytest.raises(ConfigError) as exc:
        with_overrides(prof, **{key: value})
    msg = str(exc.value)
    assert f"[latency.overrides] {key} must be" in msg and "\n" not in msg
    if key == "allreduce_busbw_gbps":
        assert "(0, 32]" in msg and "link" in msg


def test_overrides_inside_their_ranges_still_work():
    prof = Profile.load(P32 / "tp4")
    for key, (lo, hi) in OVERRIDE_RANGES.items():
        hi = min(hi, 32.0)
        with_overrides(prof, **{key: hi})
        if lo > 0 or key not in ("p2p_bw_gbps", "allreduce_busbw_gbps"):
            with_overrides(prof, **{key: lo})


def test_nan_override_in_a_run_is_one_line_exit_2(capsys):
    cfg = str(REPO / "experiments" / "configs" / "default.toml")
    for bad in ("{s_mem=nan}", "{s_comp=1e300}"):
        assert ppsim(["run", cfg, "--set", f"latency.overrides={bad}", "--set", "workload.num_requests=5",
                      "--out", "/tmp/never-written-pipesim"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ppsim: error: ") and err.count("\n") == 1 and "[latency.overrides]" in err


def test_imported_profiles_get_roofline_from_a_named_gpu_spec(tmp_path):
    import pandas as pd

    from sim.profiling.profile_io import read_model_config, write_profile

    cfg_path = tmp_path / "m.toml"
    cfg_path.write_text("tp = 1\n[model]\nnum_layers = 4\nhidden_size = 1024\nnum_q_heads = 8\nnum_kv_heads = 8\n"
                        "head_dim = 128\nvocab_size = 32000\nintermediate_size = 4096\ncontext_length_tokens = 8192\n"
                        "[profile]\ngpu_spec = \"a100-sxm-80gb\"\n")
    cfg = read_model_config(cfg_path)
    grid = [1, 64, 128, 512, 1024]
    layer = pd.DataFrame({"layer_nonattn_ms": [0.02 + 2 * 12.6e6 * t / 200e12 * 1e3 for t in grid]},
                         index=pd.Index(grid, name="num_tokens"))
    pre = {"a_ms": 0.01, "b_c": 1e-5, "b_c2": 1e-8, "b_cp": 1e-8}
    prof = write_profile(tmp_path / "out", cfg=cfg, layer=layer, prefill=pre, decode={"a_ms": 0.01, "b_ctx": 1e-6},
                         comm=None, gpu="A100", base_hardware="test", sources=[], derivation={})
    assert prof.meta["roofline"]["gpu_spec"] == "a100-sxm-80gb" and prof.meta["roofline"]["link_bw_gbps"] == 300.0
    assert prof.measured()["tokens"] == (1.0, 1024.0) and prof.context_length == 8192
    rep = check_profile(prof)
    assert rep.max_tokens == 8192 and rep.prefill[-1]["tokens"] == 8192


def test_slowness_flags_a_layer_row_over_3x_its_roofline_and_a_tp_degree_that_is_not_faster(tmp_path):
    """Issue 42: flags (not problems) for rows 3x slower than the roofline of the GPU they were measured on, and
    for a TP degree whose layer table is not faster than half as many GPUs' at a compute-bound token count."""
    from sim.latency.physics import SLOW_BOUND, TP_FROM_TOKENS, tp_scaling_flags

    src = REPO / "profiles" / "built" / "h100-sxm-80gb" / "llama-3.1-8b"
    for tp in (1, 2):
        shutil.copytree(src / f"tp{tp}", tmp_path / "m" / f"tp{tp}")
    assert tp_scaling_flags([tmp_path / "m" / "tp1", tmp_path / "m" / "tp2"]) == []
    # Plant a slow row: the tp2 layer time at 2048 tokens made 10x (slower than tp1 and > 3x its roofline).
    csv = tmp_path / "m" / "tp2" / "layer_nonattn.csv"
    lines = csv.read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("2048,"))
    cells = lines[i].split(",")
    cells[1:] = [f"{float(c) * 10:.6g}" for c in cells[1:]]
    lines[i] = ",".join(cells)
    csv.write_text("\n".join(lines) + "\n")
    prof = Profile.load(tmp_path / "m" / "tp2")
    rep = check_profile(prof)
    assert any("num_tokens=2048" in s for s in rep.slow)   # (its running maximum also fails the growth check)
    fl = prof.bounds()
    floor = max(2 * prof.shape().layer_params / 2 * 2048 / fl.peak_flops,
                prof.shape().layer_params / 2 * 2 / fl.hbm_bw)
    t = float(prof.layer_raw[list(prof.grid).index(2048)]) / 1e3
    assert t > SLOW_BOUND * floor
    flags = tp_scaling_flags([tmp_path / "m" / "tp1", tmp_path / "m" / "tp2"])
    assert len(flags) == 1 and "tp2 is not faster than tp1" in flags[0] and f"first 2048" in flags[0]
    assert TP_FROM_TOKENS <= 2048
