"""Trace download: file:// URL of the shared upstream copy, hash check, cache lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.errors import ConfigError, DataError
from sim.workloads import build_workload
from sim.workloads.fetch import DOWNLOADS, cache_dir, fetch, sha256_of

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CONV = SHARED / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"
CODE = SHARED / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_code.csv"
needs_shared = pytest.mark.skipif(not CONV.is_file(), reason="../shared/data (the Azure 2023 trace copy) is absent")


def test_cache_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("PIPESIM_CACHE", raising=False)
    assert cache_dir() == Path.home() / ".cache" / "pipesim"
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


def test_download_table():
    assert set(DOWNLOADS) == {"azure-conv-2023", "azure-code-2023"}
    for d in DOWNLOADS.values():
        assert d.url == f"https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/{d.file_name}"


@needs_shared
def test_expected_hashes_match_the_upstream_copies():
    assert sha256_of(CONV) == DOWNLOADS["azure-conv-2023"].sha256
    assert sha256_of(CODE) == DOWNLOADS["azure-code-2023"].sha256


@needs_shared
def test_fetch_from_file_url_then_workload_finds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path / "cache"))
    path = fetch("azure-conv-2023", url=CONV.as_uri())
    assert path == tmp_path / "cache" / "AzureLLMInferenceTrace_conv.csv"
    assert path.read_bytes() == CONV.read_bytes()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no leftover .part
    # Cached with the right hash: no download at all (this URL would fail).
    assert fetch("azure-conv-2023", url="file:///nonexistent/x.csv") == path
    assert len(build_workload({"name": "azure-conv"}, seed=0)) == 400


@needs_shared
def test_wrong_hash_is_rejected_and_nothing_is_cached(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as exc:
        fetch("azure-conv-2023", url=CODE.as_uri(), cache=cache)  # the other trace: wrong bytes
    msg = str(exc.value)
    assert "\n" not in msg and "SHA-256 mismatch" in msg and DOWNLOADS["azure-conv-2023"].sha256 in msg
    assert not any(cache.iterdir())


def test_corrupt_cached_file_is_replaced_or_rejected(tmp_path):
    cache = tmp_path
    (cache / "AzureLLMInferenceTrace_conv.csv").write_text("not the trace\n")
    bogus = tmp_path / "bogus.csv"
    bogus.write_text("also not the trace\n")
    with pytest.raises(DataError, match="SHA-256 mismatch"):
        fetch("azure-conv-2023", url=bogus.as_uri(), cache=cache)


def test_unreachable_url_and_unknown_id(tmp_path):
    with pytest.raises(DataError) as exc:
        fetch("azure-code-2023", url=(tmp_path / "missing.csv").as_uri(), cache=tmp_path / "c")
    assert "\n" not in str(exc.value) and "cannot download" in str(exc.value)
    with pytest.raises(ConfigError, match="allowed: azure-code-2023, azure-conv-2023"):
        fetch("azure-2024", cache=tmp_path)
