"""Discrete-event simulator of a PD-disaggregated cluster (DESIGN §4 "sim").

Imports only the native-build switch (policy/native.py), so `import dualpath.sim.kernel` stays cheap.
"""

# First: DUALPATH_PURE_PYTHON=1 or an edited .py runs the source, not a stale .so (policy/native.py).
import dualpath.policy.native  # noqa: F401
