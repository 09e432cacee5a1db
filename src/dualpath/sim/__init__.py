"""Discrete-event simulator of a PD-disaggregated cluster (DESIGN §4 "sim").

Kept free of imports so that `import dualpath.sim.kernel` stays cheap.
"""
