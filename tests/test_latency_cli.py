"""`ppsim profile ...`: show, plot, import-vidur (shared Vidur data and tiny CSVs), collect."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cli import main as ppsim
from sim.core.errors import DataError
from sim.latency.profiled import Profile, ProfiledLatencyModel

REPO = Path(__file__).resolve().parents[1]
P32 = "profiles/a100-pcie-40gb/qwen2.5-32b/tp1"
VIDUR = REPO.parent / "shared" / "data" / "vidur-profiles"
INTERNLM = VIDUR / "compute" / "a100" / "internlm" / "internlm-20b"
HAS_TORCH = importlib.util.find_spec("torch") is not None

MODEL_TOML = """\
tp = {tp}
[profile]
model = "{name}"
[model]
num_layers = {layers}
hidden_size = {hidden}
num_q_heads = {q}
num_kv_heads = {kv}
head_dim = {d}
vocab_size = 1000
intermediate_size = {ffn}
"""


def model_toml(tmp_path, tp=1, name="tiny", layers=4, hidden=64, q=4, kv=2, d=16, ffn=128) -> Path:
    p = tmp_path / f"{name}-tp{tp}.toml"
    p.write_text(MODEL_TOML.format(tp=tp, name=name, layers=layers, hidden=hidden, q=q, kv=kv, d=d, ffn=ffn))
    return p


# -- show -------------------------------------------------------------------------------------------------------

def test_show_json_keys(capsys):
    assert ppsim(["profile", "show", P32, "--pp", "4", "--tokens", "96,128,129,160,256,2048", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["tokens"] for r in rows] == [96, 128, 129, 160, 256, 2048]
    for r in rows:
        assert list(r) == ["tokens", "linear_ms", "attention_ms", "comm_ms", "overhead_ms", "total_ms"]
        parts = r["linear_ms"] + r["attention_ms"] + r["comm_ms"] + r["overhead_ms"]
        assert r["total_ms"] == pytest.approx(parts, abs=1e-3)
    totals = [r["total_ms"] for r in rows]
    assert totals == sorted(totals)


def test_show_decode_and_text(capsys):
    assert ppsim(["profile", "show", P32, "--pp", "4", "--tokens", "96,128,160", "--decode", "--context", "1000"]) == 0
    out = capsys.readouterr().out
    assert "decode at context 1000" in out and "stage 1" in out


def test_show_total_is_iteration_time_of_the_stage(capsys):
    ppsim(["profile", "show", P32, "--pp", "4", "--tokens", "512", "--json", "--stage", "2"])
    row = json.loads(capsys.readouterr().out)[0]
    m = ProfiledLatencyModel(Profile.load(REPO / P32), 4)
    from sim.latency.base import BatchStats

    st = BatchStats.prefill(512)  # one request: the host time includes its per-request CPU cost
    assert row["total_ms"] == pytest.approx((m.stage_times(st)[2] + m.overhead_s(st)) * 1e3, abs=1e-3)


@pytest.mark.parametrize("argv,msg", [
    (["profile", "show", "no/such/dir"], "not a profile directory"),
    (["profile", "show", P32, "--tokens", "1,x"], "--tokens"),
    (["profile", "show", P32, "--tokens", "0"], "--tokens"),
    (["profile", "show", P32, "--pp", "4", "--stage", "7"], "--stage"),
])
def test_show_errors_are_one_line(argv, msg, capsys):
    assert ppsim(argv) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and err.startswith("ppsim: error:")


def test_help_has_examples(capsys):
    for sub in ("show", "plot", "import-vidur", "collect"):
        assert ppsim(["profile", sub, "--help"]) == 0
        assert "examples:" in capsys.readouterr().out


def test_plot_writes_pngs(tmp_path, capsys):
    assert ppsim(["profile", "plot", "profiles/a100-pcie-40gb/qwen2.5-32b/tp4", "--out", str(tmp_path),
                  "--pp", "1", "--max-tokens", "600"]) == 0
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(pngs) == 3 and all(p.startswith("a100-pcie-40gb-qwen2.5-32b-tp4") for p in pngs)
    assert all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


# -- import-vidur: tiny hand-made CSVs --------------------------------------------------------------------------

OPS = ["emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
       "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]


def tiny_mlp(path: Path, tps=(1, 2), tokens=(1, 8, 16, 64, 128, 256)) -> None:
    rows = []
    for tp in tps:
        for n in tokens:
            r = {"num_tokens": n, "num_tensor_parallel_workers": tp, "n_embd": 64, "n_expanded_embd": 128}
            for i, op in enumerate(OPS):
                r[f"time_stats.{op}.median"] = (0.01 + 0.001 * i) * (1 + n / 64) / tp
            rows.append(r)
    rows.append(dict(rows[2]))          # a duplicated token count: the median is taken
    pd.DataFrame(rows).to_csv(path / "mlp.csv", index=False)


def tiny_attention(path: Path) -> None:
    rows = []
    for c in (16, 32, 64, 128):
        for p in (0, 64, 256):
            rows.append({"is_prefill": True, "batch_size": 1, "prefill_chunk_size": c, "kv_cache_size": p,
                         "num_tensor_parallel_workers": 1,
                         "time_stats.attn_prefill.median": 0.01 + 1e-5 * c + 2e-8 * c * c + 3e-8 * c * p,
                         "time_stats.attn_decode.median": np.nan})
    for b in (1, 4, 16):
        for ctx in (64, 512, 2048):
            rows.append({"is_prefill": False, "batch_size": b, "prefill_chunk_size": 0, "kv_cache_size": ctx,
                         "num_tensor_parallel_workers": 1, "time_stats.attn_prefill.median": np.nan,
                         "time_stats.attn_decode.median": 0.02 + 1e-6 * b * ctx})
    pd.DataFrame(rows).to_csv(path / "attention.csv", index=False)


def tiny_network(path: Path) -> None:
    sizes = [2048 * 4 ** k for k in range(6)]
    ar = [{"time_stats.all_reduce.median": 0.02 + s / 5e6, "num_workers": n, "size": s, "devices_per_node": n,
           "rank": 0} for n in (2, 4) for s in sizes]
    sr = [{"time_stats.send_recv.median": 0.01 + s / 1e7, "num_workers": 2, "size": s, "devices_per_node": dpn,
           "rank": 0} for dpn in (1, 2) for s in sizes]
    pd.DataFrame(ar).to_csv(path / "all_reduce.csv", index=False)
    pd.DataFrame(sr).to_csv(path / "send_recv.csv", index=False)


def test_import_vidur_tiny(tmp_path, capsys):
    src = tmp_path / "vidur"
    src.mkdir()
    tiny_mlp(src)
    tiny_attention(src)
    tiny_network(src)
    out = tmp_path / "out"
    assert ppsim(["profile", "import-vidur", str(src), "--model", str(model_toml(tmp_path)), "--out", str(out)]) == 0
    assert "attention prefill: 12 points" in capsys.readouterr().out
    prof = Profile.load(out)
    assert prof.meta["comm"]["model"] == "table"
    lay = pd.read_csv(out / "layer_nonattn.csv")
    assert list(lay["num_tokens"]) == [1, 8, 16, 64, 128, 256]
    # per-layer sums: qkv + o + up + down + act + rope + 2 norms + add = all ops but emb
    n = 64
    want = sum((0.01 + 0.001 * i) * (1 + n / 64) for i, op in enumerate(OPS) if op != "emb")
    assert lay.set_index("num_tokens").loc[n, "layer_nonattn_ms"] == pytest.approx(want, rel=1e-5)
    # the exact attention model is recovered
    pre, dec = prof.attention["prefill"], prof.attention["decode"]
    assert pre["b_c2"] == pytest.approx(2e-8, rel=1e-3) and pre["b_cp"] == pytest.approx(3e-8, rel=1e-3)
    assert dec["b_ctx"] == pytest.approx(1e-6, rel=1e-3) and dec["a_ms"] == pytest.approx(0.02, rel=1e-3)
    # send_recv kept only on one node; the model runs
    comm = pd.read_csv(out / "comm.csv")
    assert set(comm["op"]) == {"all_reduce", "send_recv"} and len(comm[comm["op"] == "send_recv"]) == 6
    m = ProfiledLatencyModel(prof, 2)
    assert m.p2p_s(1) * 1e3 == pytest.approx(0.01 + 2048 / 1e7, rel=1e-6)


def test_import_vidur_tp2_uses_all_reduce_rows(tmp_path):
    src = tmp_path / "v"
    src.mkdir()
    tiny_mlp(src)
    tiny_network(src)
    prof, report = __import__("sim.profiling.vidur_import", fromlist=["x"]).import_vidur(
        src, model_toml(tmp_path, tp=2), tmp_path / "o")
    assert any("roofline" in line for line in report)       # no attention.csv: assumed, and said so
    assert "attention_assumed" in prof.meta["derivation"]
    m = ProfiledLatencyModel(prof, 1)
    assert m.allreduce_s(1) * 1e3 == pytest.approx(0.02 + 2048 / 5e6, rel=1e-6)   # 64 x 2 B = 128 B -> floor


@pytest.mark.parametrize("breakage,msg", [
    ("drop_column", "mlp.csv: missing column 'time_stats.mlp_up_proj.median'"),
    ("no_tp", "column 'num_tensor_parallel_workers' has no rows for tp = 4"),
    ("other_model", "column 'n_embd' is 64 but the model's hidden_size is 128"),
])
def test_import_vidur_errors(tmp_path, breakage, msg, capsys):
    src = tmp_path / "v"
    src.mkdir()
    tiny_mlp(src)
    cfg = model_toml(tmp_path)
    if breakage == "drop_column":
        df = pd.read_csv(src / "mlp.csv").drop(columns=["time_stats.mlp_up_proj.median"])
        df.to_csv(src / "mlp.csv", index=False)
    elif breakage == "no_tp":
        cfg = model_toml(tmp_path, tp=4, q=4, kv=4)
    else:
        cfg = model_toml(tmp_path, hidden=128)
    assert ppsim(["profile", "import-vidur", str(src), "--model", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err


def test_model_config_errors(tmp_path):
    from sim.profiling.profile_io import read_model_config

    p = tmp_path / "m.toml"
    p.write_text("tp = 1\n[model]\nnum_layers = 2\n")
    with pytest.raises(DataError, match="key 'hidden_size' must be an integer"):
        read_model_config(p)
    p.write_text("[model]\nnum_layers = 2\n")
    with pytest.raises(DataError, match="key 'tp'"):
        read_model_config(p)


# -- import-vidur: the shared Vidur data --------------------------------------------------------------------------

@pytest.mark.skipif(not (INTERNLM / "mlp.csv").is_file(), reason=f"Vidur data not found at {INTERNLM}")
def test_import_vidur_internlm_shared_data(tmp_path):
    from sim.profiling.vidur_import import import_vidur

    cfg = model_toml(tmp_path, tp=1, name="internlm-20b", layers=60, hidden=5120, q=40, kv=40, d=128, ffn=13824)
    prof, _ = import_vidur(INTERNLM, cfg, tmp_path / "ilm", network=VIDUR / "network" / "a100_dgx")
    lay = pd.read_csv(tmp_path / "ilm" / "layer_nonattn.csv").set_index("num_tokens")
    assert len(lay) == 259 and lay.index[0] == 1 and lay.index[-1] == 4096
    # section 4.2: InternLM-20B TP1 QKV + O + up + down per layer
    for n, ms in {1: 0.404, 256: 0.728, 2048: 5.520, 4096: 10.642}.items():
        assert lay.loc[n, "linear_ms"] == pytest.approx(ms, abs=0.002), n
    assert prof.meta["comm"]["model"] == "table"
    m = ProfiledLatencyModel(prof, 4)
    assert m.stage_times(__import__("sim.latency.base", fromlist=["x"]).BatchStats.prefill(2048))[1] > 0


# -- collect ------------------------------------------------------------------------------------------------------

def test_collect_without_torch_says_how_to_install(tmp_path, monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    assert ppsim(["profile", "collect", "--model", str(model_toml(tmp_path)), "--out", str(tmp_path / "o"),
                  "--device", "cpu", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install .[profile]" in err and "\n" not in err


@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch not installed (optional extra 'profile'): collect is not run")
def test_collect_cpu_tiny(tmp_path):
    from sim.profiling.collect import collect

    prof = collect(model_toml(tmp_path), tmp_path / "c", device="cpu", quick=True, log=lambda *_: None)
    meta = prof.meta
    assert meta["provenance"]["device"] == "cpu" and meta["provenance"]["torch_version"]
    assert list(prof.grid) == [1, 8, 16, 32, 64, 128]
    m = ProfiledLatencyModel(prof, 2)
    from sim.latency.base import BatchStats

    assert all(t > 0 for t in m.stage_times(BatchStats.prefill(64)))
    assert prof.meta["comm"]["model"] == "alpha-beta"
