"""The harness of the fuzz suite (tests/test_fuzz.py): run `ppsim` in this process on a hostile
input and hold the result to the contract every command keeps.

The contract (issue 32): exit 0 with a valid result, or a one-line error on stderr and exit 2
(exit 1 only for a run that failed on allocation, with its complete outputs); never a hang (a
per-case timer), a traceback or an internal error, a write outside `--out`, or a change to a file
that existed before.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import signal
from pathlib import Path

from sim.cli import main

CASE_TIMEOUT_S = 60.0


class Hang(BaseException):  # (not an Exception: no `except Exception` may swallow it)
    pass


def _alarm(_sig, _frame):
    raise Hang()


def invoke(argv: list[str], timeout_s: float = CASE_TIMEOUT_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `ppsim argv`, run here under a timer."""
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except Hang:
        raise AssertionError(f"ppsim {' '.join(argv)}: no answer within {timeout_s:g} s (a hang)") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue()


def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Path -> SHA-256 of every file under `root` (except under `skip`)."""
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not (skip is not None and (p == skip or skip in p.parents)):
            files[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return files


def check(argv: list[str], code: int, out: str, err: str, *, run_dir: Path | None = None,
          names: tuple[str, ...] = ()) -> str:
    """Hold one result to the contract; returns "ok" or "refused" (for the statistics)."""
    label = f"ppsim {' '.join(argv)}"
    assert "Traceback" not in err and "Traceback" not in out, f"{label}: a traceback:\n{err}"
    assert "internal error" not in err, f"{label}: {err.strip()}"
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if not ln.startswith("ppsim: warning:")]
    if code == 2:
        assert len(errors) == 1 and errors[0].startswith("ppsim"), f"{label}: not one line:\n{err}"
        if names:
            assert any(n in errors[0] for n in names), f"{label}: the error names none of {names}: {errors[0]}"
        if run_dir is not None:
            assert not run_dir.exists() or not any(run_dir.iterdir()) or (run_dir / ".pipesim").is_file(), label
        return "refused"
    assert code in (0, 1), f"{label}: exit {code}: {err}"
    assert not errors or all("%" in e or "it/s" in e or "run/s" in e for e in errors), f"{label}: exit {code}:\n{err}"
    if run_dir is not None:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["num_requests"] >= 0
        assert code == 0 or summary["status"] != "ok", f"{label}: exit 1 for an ok run"
        for key in ("p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"):
            v = summary.get(key)
            assert v is None or (isinstance(v, (int, float)) and (math.isnan(v) or 0 <= v < 1e15)), (label, key, v)
    return "ok"


def toml_value(value) -> str:
    """`value` as the right-hand side of `--set KEY=VALUE` (TOML)."""
    import tomli_w

    return tomli_w.dumps({"v": value})[4:].strip()
