"""Discrete-event simulator of a PD-disaggregated cluster (DESIGN §4 "sim").

Imports nothing, so `import dualpath.sim.kernel` stays cheap (the package root has already routed a
stale native build to its source: dualpath/native.py).
"""
