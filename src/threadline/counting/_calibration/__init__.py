"""Calibration: learning how far the estimate is from what a provider reports.

One idea in five modules: :mod:`._token_calibration` keeps a ratio per model
and tool set and makes the calibrated counters; :mod:`._classes` splits an
estimate by class of token (framing, tool calls, scripts); :mod:`._slopes`
fits an intercept and a slope per class from the reports; :mod:`._bounds`
says which reports and values can be believed, and how far one report moves
a calibration; :mod:`._saved` is what a saved conversation keeps of all that.
The rest of threadline imports from here.
"""

from threadline.counting._calibration._saved import (
    SavedEntry,
    SavedValueError,
    check_saved,
    merged,
)
from threadline.counting._calibration._token_calibration import (
    CalibratedCounter,
    ReportAnchoredCounter,
    TokenCalibration,
    calibrated_estimate,
    calibration_key,
)

__all__ = [
    "CalibratedCounter",
    "ReportAnchoredCounter",
    "SavedEntry",
    "SavedValueError",
    "TokenCalibration",
    "calibrated_estimate",
    "calibration_key",
    "check_saved",
    "merged",
]
