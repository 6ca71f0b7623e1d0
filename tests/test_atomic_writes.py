"""Writes that cannot destroy (issue 32): profile build / import-vidur and the length-fit tool.

Each output is complete or absent: a profile folder is written into a staging sibling and swapped
in whole after success, a single file is renamed into place once complete (sim/core/fsio.py). An
existing output is replaced only with --force, and a refused or failed write leaves it byte for
byte as it was. A writer is made to fail after its first file to interrupt a write mid-way.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from sim.core import fsio
from sim.profiling.build import build_profile
from sim.latency.hardware import load_gpu, load_interconnect
from sim.profiling.specs import load_model
from sim.profiling.vidur_import import import_vidur
from sim.workloads import fit_lengths
from tests.fuzzing import invoke
from tests.test_latency_cli import model_toml, tiny_mlp

REPO = Path(__file__).resolve().parents[1]
BUILD = ["profile", "build", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--tp", "1"]


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("ppsim: warning:")]
    assert len(lines) == 1, err
    return lines[0]


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def leftovers(folder: Path) -> list[str]:
    """Hidden staging / temporary siblings (.NAME.partial-PID, .NAME.tmp-PID, .NAME.old-PID)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def fail_after_first_file(monkeypatch, exc: type[BaseException]) -> list[Path]:
    """Make fsio.write_text write one file, then raise `exc` (a full disk, a Ctrl-C)."""
    real, written = fsio.write_text, []

    def flaky(path, text):
        if written:
            raise exc("interrupted by the test")
        real(path, text)
        written.append(Path(path))

    monkeypatch.setattr(fsio, "write_text", flaky)
    return written


def build(out: Path, tp: int = 1):
    return build_profile(load_model("llama-3.1-8b"), load_gpu("h100-sxm-80gb"), load_interconnect("nvswitch"), tp, out)


def vidur_import(tmp_path: Path, out: Path):
    src = tmp_path / "vidur"
    src.mkdir(exist_ok=True)
    tiny_mlp(src)
    return import_vidur(src, model_toml(tmp_path), out)


WRITERS = {"build": lambda tmp_path, out: build(out), "import-vidur": vidur_import}


# ---------------------------------------------------------------- (a) interrupted mid-way

@pytest.mark.parametrize("exc", [OSError, KeyboardInterrupt])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_interrupted_profile_write_leaves_no_folder(tmp_path, monkeypatch, writer, exc):
    out = tmp_path / "profiles" / "tp1"
    written = fail_after_first_file(monkeypatch, exc)
    with pytest.raises(exc, match="interrupted by the test"):
        WRITERS[writer](tmp_path, out)
    assert len(written) == 1  # the write did start
    assert not out.exists()
    assert leftovers(out.parent) == []


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_interrupted_profile_write_leaves_the_old_profile_as_it_was(tmp_path, monkeypatch, writer):
    out = tmp_path / "p"
    WRITERS[writer](tmp_path, out)
    (out / "comm.csv").write_text("op,num_workers,bytes,ms\n")  # a file the new profile would not have
    before = files_of(out)
    written = fail_after_first_file(monkeypatch, OSError)
    with pytest.raises(OSError):
        WRITERS[writer](tmp_path, out)
    assert len(written) == 1
    assert files_of(out) == before
    assert leftovers(tmp_path) == []


def test_a_replaced_profile_keeps_no_file_of_the_old_one(tmp_path):
    out = tmp_path / "p"
    vidur_import(tmp_path, out)
    (out / "comm.csv").write_text("op,num_workers,bytes,ms\n")  # stale: the new import has no network CSVs
    vidur_import(tmp_path, out)
    assert sorted(files_of(out)) == ["attention.csv", "layer_nonattn.csv", "meta.toml"]
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------- (b) no replacing without --force

def test_profile_build_refuses_an_existing_profile_without_force(tmp_path):
    out = tmp_path / "p"
    assert invoke([*BUILD, "--out", str(out)])[0] == 0
    before = files_of(out)
    code, _, err = invoke([*BUILD[:-1], "2", "--out", str(out)])
    assert code == 2 and "--force" in one_line(err)
    assert files_of(out) == before
    assert invoke([*BUILD[:-1], "2", "--out", str(out), "--force"])[0] == 0
    assert files_of(out) != before and "tp = 2" in (out / "meta.toml").read_text()
    assert leftovers(tmp_path) == []


def test_import_vidur_refuses_an_existing_profile_without_force_and_replaces_it_with(tmp_path):
    src = tmp_path / "vidur"
    src.mkdir()
    tiny_mlp(src)
    argv = ["profile", "import-vidur", str(src), "--model", str(model_toml(tmp_path)), "--out", str(tmp_path / "o")]
    assert invoke(argv)[0] == 0
    before = files_of(tmp_path / "o")
    code, _, err = invoke(argv)
    assert code == 2 and "--force" in one_line(err)
    assert files_of(tmp_path / "o") == before
    # an imported profile's source is "imported (ppsim profile import-vidur)": --force may replace it
    assert invoke([*argv, "--force"])[0] == 0


def test_force_never_replaces_a_profile_folder_holding_other_files(tmp_path):
    out = tmp_path / "p"
    assert invoke([*BUILD, "--out", str(out)])[0] == 0
    (out / "notes.txt").write_text("mine\n")
    before = files_of(out)
    code, _, err = invoke([*BUILD, "--out", str(out), "--force"])
    assert code == 2 and "notes.txt" in one_line(err)
    assert files_of(out) == before


def test_a_profile_that_does_not_load_never_replaces_the_old_one(tmp_path):
    src = tmp_path / "vidur"
    src.mkdir()
    tiny_mlp(src)
    out = tmp_path / "o"
    assert invoke(["profile", "import-vidur", str(src), "--model", str(model_toml(tmp_path)), "--out", str(out)])[0] == 0
    before = files_of(out)
    bad = model_toml(tmp_path)
    bad.write_text(bad.read_text() + "[memory]\ngpu_mem_gib = -1\n")  # written, but refused by Profile.load
    code, _, err = invoke(["profile", "import-vidur", str(src), "--model", str(bad), "--out", str(out), "--force"])
    assert code == 2 and one_line(err).startswith(f"ppsim: error: {out}")  # names --out, not the staging folder
    assert files_of(out) == before
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------- (c) the length-fit tool

@pytest.fixture
def length_data(tmp_path, monkeypatch):
    """Two tiny length files in place of the shared data sets."""
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        rows = "\n".join(f"{p},{o}" for p, o in rng.integers(1, 500, size=(200, 2)))
        (data / f"{name}.csv").write_text("prompt,output\n" + rows + "\n")
    monkeypatch.setattr(fit_lengths, "SOURCES", {"a": "a.csv", "b": "b.csv"})
    return data


def test_fit_lengths_refuses_an_existing_file_without_force(tmp_path, length_data, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "lengths_b.csv").write_text("mine\n")
    assert fit_lengths.main(["--data", str(length_data), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--force" in err and "lengths_b.csv" in err
    assert files_of(out) == {"lengths_b.csv": b"mine\n"}  # untouched, and nothing else written
    assert fit_lengths.main(["--data", str(length_data), "--out", str(out), "--force"]) == 0
    assert sorted(files_of(out)) == ["lengths_a.csv", "lengths_b.csv"]
    assert (out / "lengths_b.csv").read_text().startswith("u,prompt,output,")


def test_fit_lengths_interrupted_leaves_complete_files_or_the_old_ones(tmp_path, length_data, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "lengths_b.csv").write_text("mine\n")
    written = fail_after_first_file(monkeypatch, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        fit_lengths.main(["--data", str(length_data), "--out", str(out), "--force"])
    assert written == [out / "lengths_a.csv"]
    assert (out / "lengths_a.csv").read_text().count("\n") == len(fit_lengths.GRID) + 1  # complete
    assert (out / "lengths_b.csv").read_text() == "mine\n"
    assert leftovers(out) == []


def test_fit_lengths_missing_data_is_one_line(tmp_path, capsys):
    assert fit_lengths.main(["--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not found" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# ---------------------------------------------------------------- no direct writes left in sim/

# Files allowed to write directly, and why (every other module goes through sim/core/fsio.py).
DIRECT_WRITERS = {
    "sim/core/fsio.py": "the atomic helpers themselves",
    "sim/outputs/csvout.py": "writes only the temporary sibling write_csv gives it (fsio.atomic_path)",
    "sim/outputs/tables.py": "writes only the temporary sibling write_parquet gives it (fsio.atomic_path)",
    "sim/engine/records.py": "appends to its own temporary spool folder, never an output",
    "sim/studies/sweep.py": "appends whole lines to the sweep cache; a line cut by a kill is ignored",
    "sim/workloads/fetch.py": "downloads to .NAME.part and renames after the hash check",
    "sim/native_build.py": "the compiled build folder; used only once its manifest (atomic) is written",
    "sim/native.py": "the manifest: a temporary sibling renamed into place (layer 0 may not import fsio)",
}
WRITE = re.compile(r"""open\([^)]*["'][wax]b?["']|\.to_csv\(|\.savefig\(|(?<!fsio)\.write_(text|bytes)\(|np\.save"""
                   r"""|savez|json\.dump\(|tomli_w\.dump\(|pq\.write_table\(|shutil\.copy""")


def test_no_direct_writes_outside_fsio():
    found = []
    for path in sorted((REPO / "sim").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in DIRECT_WRITERS:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if WRITE.search(code) and not code.lstrip().startswith(('"', "'")):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert found == [], "write through sim/core/fsio.py (atomic), or list the file in DIRECT_WRITERS:\n" + \
        "\n".join(found)


# ---------------------------------------------------------------- the profile cache, filled by several workers

def test_commit_if_absent_keeps_the_first_complete_folder(tmp_path):
    out = tmp_path / "tp2"
    first = fsio.StagedFolder(out)
    (first.path / "meta.toml").write_text("first")
    first.commit_if_absent("meta.toml")
    second = fsio.StagedFolder(out)  # (another worker that built the same profile meanwhile)
    (second.path / "meta.toml").write_text("second")
    assert second.commit_if_absent("meta.toml") == out
    assert (out / "meta.toml").read_text() == "first" and not second.path.exists()
    # an incomplete folder (no meta.toml) is replaced
    (out / "meta.toml").unlink()
    (out / "layer_nonattn.csv").write_text("cut")
    third = fsio.StagedFolder(out)
    (third.path / "meta.toml").write_text("third")
    third.commit_if_absent("meta.toml")
    assert sorted(p.name for p in out.iterdir()) == ["meta.toml"] and (out / "meta.toml").read_text() == "third"


def _resolve_in_worker(_):
    from sim.latency.profiled import Profile
    from sim.profiling.library import resolve_profile

    path = resolve_profile("qwen2.5-7b", "a40-48gb", 2, "pcie-p2p-disabled")  # not shipped: built into the cache
    Profile.load(path)
    return str(path)


def test_workers_building_one_cached_profile_at_once_all_get_it(tmp_path, monkeypatch):
    import multiprocessing as mp

    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path))
    with mp.get_context("spawn").Pool(4) as pool:
        paths = set(pool.map(_resolve_in_worker, range(8)))
    assert len(paths) == 1
    folder = Path(paths.pop())
    assert folder.is_relative_to(tmp_path)
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tp2"]  # no staging folder left behind
