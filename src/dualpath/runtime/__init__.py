"""The real serving runtime: one scheduler process and one OS process per node (DESIGN §4 "runtime").

Decisions come only from the sans-I/O core (`dualpath.policy`, `dualpath.engine`); this package drives that
core with wall-clock time and real byte movement: emulated SNIC/CNIC rate limiters, a FileStore directory as
the shared "3FS" mount, a PyTorch model doing layerwise prefill, ZeroMQ for the control plane.
"""
