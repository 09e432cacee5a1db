"""DualPath: agentic LLM serving on PD-disaggregated clusters with two KV read paths."""

# First, before any subpackage loads a compiled module: DUALPATH_PURE_PYTHON=1 or an edited .py runs
# the source, not a stale .so of the optional native build (native.py).
from dualpath import native  # noqa: F401
