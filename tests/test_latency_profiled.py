"""ProfiledLatencyModel: comm tables, monotonicity, micro-benchmark shape and one-line data errors."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

from sim.core.errors import DataError
from sim.latency.analysis import bubble_ms, load_model, micro_benchmarks, prefill_ms, split_ms
from sim.latency.base import BatchStats
from sim.latency.profiled import CommCurve, Profile, ProfiledLatencyModel

REPO = Path(__file__).resolve().parents[1]
P32 = REPO / "profiles" / "a100-pcie-40gb" / "qwen2.5-32b"
NVS = REPO / "profiles" / "a100-sxm-80gb-nvswitch" / "qwen2.5-32b"
TINY = REPO / "tests" / "data" / "tiny-profile"


# -- comm table ------------------------------------------------------------------------------------------------

def test_comm_curve_log_log_interpolation_and_ends():
    c = CommCurve(np.array([1000, 10000, 100000]), np.array([0.01, 0.1, 1.0]))
    assert c(1000) == pytest.approx(0.01)
    assert c(10000) == pytest.approx(0.1)
    # log-log: halfway in log(bytes) between 1e3 and 1e4 is sqrt(1e7) bytes -> sqrt(0.01 * 0.1) ms
    assert c(10 ** 3.5) == pytest.approx((0.01 * 0.1) ** 0.5)
    assert c(1) == pytest.approx(0.01)                      # below the table: latency floor
    assert c(200000) == pytest.approx(1.0 + 0.9 / 90000 * 100000)   # above: linear in bytes from the last two


def test_comm_curve_running_max_and_duplicates():
    c = CommCurve(np.array([100, 200, 200, 400]), np.array([0.06, 0.02, 0.04, 0.08]))
    xs = np.geomspace(50, 1000, 200)
    ys = [c(x) for x in xs]
    assert np.all(np.diff(ys) >= -1e-12)                    # bimodal small messages never make bigger cheaper
    assert c(200) == pytest.approx(0.06)                    # median(0.02, 0.04) = 0.03 -> running max 0.06


def test_table_comm_used_by_nvswitch_profiles():
    prof = Profile.load(NVS / "tp4")
    assert prof.meta["comm"]["model"] == "table"
    m = ProfiledLatencyModel(prof, 1)
    comm = prof.comm
    rows = comm[(comm["op"] == "all_reduce") & (comm["num_workers"] == 4)]
    table = rows.groupby("bytes")["ms"].median().cummax()
    on_grid = [b for b in table.index if b % 10240 == 0]
    assert on_grid
    for b in on_grid[:5]:
        assert m.allreduce_s(b // 10240) * 1e3 == pytest.approx(table.loc[b], rel=1e-9)
    # TP 4 all-reduce at 2048 tokens from the table, two per layer, 64 layers
    st = m.stage_time(BatchStats.prefill(2048), 0)
    assert st.comm_s == pytest.approx(128 * m.allreduce_s(2048) + m.logits_gather_s(1))  # one sequence sampled
    m4 = ProfiledLatencyModel(Profile.load(NVS / "tp1"), 4)
    assert m4.p2p_s(1024) * 1e3 == pytest.approx(m4._p2p_curve(20480 * 1024))


def test_comm_table_missing_worker_count_is_one_line(tmp_path):
    d = tmp_path / "p"
    shutil.copytree(NVS / "tp4", d)
    text = (d / "comm.csv").read_text().splitlines()
    (d / "comm.csv").write_text("\n".join([text[0]] + [r for r in text[1:] if not r.startswith("all_reduce,4,")]) + "\n")
    with pytest.raises(DataError, match=r"comm\.csv: column 'num_workers' has no 'all_reduce' rows for 4"):
        ProfiledLatencyModel(Profile.load(d), 1)


def test_comm_table_bad_column(tmp_path):
    d = tmp_path / "p"
    shutil.copytree(NVS / "tp1", d)
    (d / "comm.csv").write_text((d / "comm.csv").read_text().replace("op,num_workers,bytes,ms", "op,num_workers,bytes,us"))
    with pytest.raises(DataError, match=r"comm\.csv: missing column 'ms'") as exc:
        Profile.load(d)
    assert "\n" not in str(exc.value)


# -- data errors ---------------------------------------------------------------------------------------------

def _copy_tiny(tmp_path) -> Path:
    d = tmp_path / "tiny"
    shutil.copytree(TINY, d)
    return d


def test_missing_column_names_file_and_column(tmp_path):
    d = _copy_tiny(tmp_path)
    csv = d / "layer_nonattn.csv"
    csv.write_text(csv.read_text().replace("layer_nonattn_ms", "total"))
    with pytest.raises(DataError, match=r"layer_nonattn\.csv: missing column 'layer_nonattn_ms'") as exc:
        Profile.load(d)
    assert "\n" not in str(exc.value)


def test_wrong_time_unit(tmp_path):
    d = _copy_tiny(tmp_path)
    meta = d / "meta.toml"
    meta.write_text(meta.read_text().replace('time = "ms"', 'time = "us"'))
    with pytest.raises(DataError, match=r"meta\.toml: \[profile\] units\.time must be 'ms'"):
        Profile.load(d)


def test_wrong_unit_column_in_attention(tmp_path):
    d = _copy_tiny(tmp_path)
    csv = d / "attention.csv"
    csv.write_text(csv.read_text().replace("a_ms", "a_us"))
    with pytest.raises(DataError, match=r"attention\.csv: missing column 'a_ms'"):
        Profile.load(d)


def test_unsorted_grid(tmp_path):
    d = _copy_tiny(tmp_path)
    csv = d / "layer_nonattn.csv"
    lines = csv.read_text().splitlines()
    lines[1], lines[2] = lines[2], lines[1]
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"layer_nonattn\.csv: column 'num_tokens' must be strictly increasing"):
        Profile.load(d)


def test_non_numeric_times(tmp_path):
    d = _copy_tiny(tmp_path)
    csv = d / "layer_nonattn.csv"
    lines = csv.read_text().splitlines()
    head = lines[0].split(",")
    i = head.index("layer_nonattn_ms")
    row = lines[1].split(",")
    row[i] = "abc"
    lines[1] = ",".join(row)
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"column 'layer_nonattn_ms' must hold positive numbers"):
        Profile.load(d)


def test_builder_meta_keys_accepted():
    meta = tomllib.loads((P32 / "tp1" / "meta.toml").read_text())
    assert "derivation" in meta and "intermediate_size" in meta["model"]
    prof = Profile.load(P32 / "tp1")
    assert prof.shape().intermediate_size == 27648


def test_models_on_one_profile_share_its_token_parts_and_agree_with_fresh_ones():
    """The token-count parts of the stage times are cached on the profile, per stage count
    (a sweep's worker runs hundreds of points on one profile): a model built on a warm cache
    gives the same floats as one on a fresh copy of the profile; another stage split or
    overridden meta (`with_overrides`: a new profile) gets its own."""
    prof = Profile.load(P32 / "tp1")
    batches = [BatchStats.prefill(t) for t in (1, 130, 700, 2048)] + [BatchStats.decode(n, 900) for n in (3, 64)]
    a = ProfiledLatencyModel(prof, 4, variance=False)
    first = [a.stage_times(st) for st in batches]
    assert len(prof.token_parts[4]) == len({st.num_tokens for st in batches})
    b = ProfiledLatencyModel(prof, 4, variance=False)
    assert [b.stage_times(st) for st in batches] == first
    fresh = ProfiledLatencyModel(Profile.load(P32 / "tp1"), 4, variance=False)
    assert [fresh.stage_times(st) for st in batches] == first
    two = ProfiledLatencyModel(prof, 2, variance=False)
    assert [len(two.stage_times(st)) for st in batches] == [2] * len(batches) and set(prof.token_parts) == {2, 4}
    slow = load_model(prof, 4, p2p_alpha_us=30.0)      # the top of its documented range (25 in the profile)
    assert slow.profile.token_parts is not prof.token_parts
    assert slow.stage_times(batches[0])[0] > first[0][0]


# -- monotonicity ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["grid", "bucket128"])
@pytest.mark.parametrize("tp,pp", [(1, 4), (4, 1)])
def test_more_tokens_never_cost_less(mode, tp, pp):
    m = load_model(P32 / f"tp{tp}", pp, mode=mode)
    for s in range(pp):
        pre = [sum(m.stage_time(BatchStats.prefill(t), s).__getattribute__(f) for f in
                   ("linear_s", "attention_s", "comm_s", "overhead_s")) for t in range(1, 4700, 3)]
        assert np.all(np.diff(pre) >= -1e-12), (mode, s)
        dec = [m.stage_time(BatchStats.decode(n, 1400), s).total_s for n in range(1, 700)]
        assert np.all(np.diff(dec) >= -1e-12), (mode, s)


def test_scaled_layer_is_monotone_across_the_scaling_ramp():
    m = load_model(P32 / "tp1", 4, mode="grid", s_mem=1.35, s_comp=1.0)
    ys = [m.layer_nonattn_s(t, scaled=True) for t in range(1, 5000)]
    assert np.all(np.diff(ys) >= 0)


# -- calibrated profile: micro-benchmark shape (paper-targets section 3) -----------------------------------------

def test_micro_benchmarks_of_the_calibrated_profile():
    m = ProfiledLatencyModel(Profile.load(P32 / "tp1"), 4)
    r = micro_benchmarks(m, context=1400)
    # 129 tokens cost about the same as 256 (within 15%)
    assert abs(prefill_ms(m, 129) / prefill_ms(m, 256) - 1) < 0.15
    assert abs(r["prefill_129_over_256"] - 1) < 0.15
    # 160 decode requests clearly cost more than 128 (paper: +31%)
    assert r["decode_160_over_128"] > 1.2
    # 96 -> 128: the paper says about +5%. The honest model gives about +9% at context 1400 (decode
    # attention grows linearly with the requests; the linear layers are flat within the 128 bucket);
    # assert what it gives, and that the step is much smaller than the next one.
    assert 1.0 < r["decode_128_over_96"] < 1.12
    assert r["decode_160_over_128"] - 1 > 2.5 * (r["decode_128_over_96"] - 1)


def test_bubble_definition():
    m = ProfiledLatencyModel(Profile.load(P32 / "tp1"), 4)
    b = bubble_ms(m)
    ta = [t * 1e3 for t in m.stage_times(BatchStats.prefill(2048))]
    tb = [t * 1e3 for t in m.stage_times(BatchStats.prefill(128))]
    assert b["bubble_ms"] == pytest.approx(sum(ta[s + 1] - tb[s] for s in range(3)))
    assert 350 < b["bubble_ms"] < 700


def test_split_total_is_iteration_cost():
    m = ProfiledLatencyModel(Profile.load(P32 / "tp1"), 4)
    stats = BatchStats.prefill(512)
    sp = split_ms(m, stats)
    st = m.stage_time(stats, 1)
    host = m.cpu_s + m.cpu_per_req_s * 1 + m.broadcast_s  # one request in the micro-batch
    assert sp["total_ms"] == pytest.approx((st.total_s + host) * 1e3)
    assert sp["overhead_ms"] == pytest.approx((st.overhead_s + host) * 1e3)
