"""The simulator's twin of the runtime: calibration presets measured on the runtime's machine (docs/twin.md).

`dualpath.twin` sits at the top of the layering beside `cli`: it imports both drivers, neither imports it.
"""

from dualpath.twin.calibrate import calibrate, fit_measurements
from dualpath.twin.calibration import (
    Calibration,
    CalibrationError,
    CalibrationOverheads,
    load_calibration,
    write_calibration,
)
from dualpath.twin.calibration_fit import FitQuality

__all__ = [
    "Calibration",
    "CalibrationError",
    "CalibrationOverheads",
    "FitQuality",
    "calibrate",
    "fit_measurements",
    "load_calibration",
    "write_calibration",
]
