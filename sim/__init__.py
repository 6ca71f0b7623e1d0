"""PipeSim: a discrete-event simulator of pipeline- and tensor-parallel LLM serving."""
__version__ = "0.1.0"
