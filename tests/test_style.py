"""Project rules that a grep can check: no global RNG outside sim/core/rng.py, no simpy in policies."""

from __future__ import annotations

import re

from conftest import REPO

CODE = [p for d in ("sim", "experiments", "profiles", "benchmarks") for p in (REPO / d).rglob("*.py")]


def test_no_global_random_state():
    bad = []
    for p in CODE:
        if p.name == "rng.py":
            continue
        text = p.read_text()
        if re.search(r"^\s*import random\b|np\.random\.(seed|rand|randn|randint|choice|exponential|normal|uniform)\(", text, re.M):
            bad.append(str(p.relative_to(REPO)))
    assert bad == []


def test_policies_never_touch_the_clock():
    for p in (REPO / "sim" / "policies").glob("*.py"):
        assert not re.search(r"^\s*(import simpy|from simpy)", p.read_text(), re.M), p.name


def test_modules_open_with_a_docstring():
    missing = [str(p.relative_to(REPO)) for p in (REPO / "sim").rglob("*.py")
               if p.stat().st_size and not p.read_text().lstrip().startswith(('"""', '#'))]
    assert missing == []
