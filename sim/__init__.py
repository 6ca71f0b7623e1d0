"""PipeSim: a discrete-event simulator of pipeline- and tensor-parallel LLM serving."""
__version__ = "0.1.0"

from sim import native as _native  # noqa: E402

_native.enable()  # the compiled engine modules, when a fresh build exists (sim/native.py)
