"""The course's end of training at d = 1,024, as figures: what the report's claims and the setup study both judge by.

They live below both readers (``report.course`` states its claims with them,
``analysis.setups`` judges each setup by them), so the two never disagree on a
threshold. The course's figures are one head's, its first layer's: every
dynamics claim reads that layer.
"""

from __future__ import annotations

__all__ = ["SCALED", "COURSE_WIDTH", "COURSE_LAYER", "END_SPREAD", "COURSE_END_FROZEN", "END_FROZEN", "SCALED_SPREAD",
           "SCALED_TOLERANCE", "BIG_GAP"]

SCALED = "inv_sqrt_d"  # the course's scale, 1/sqrt(d)
COURSE_WIDTH = 1024  # the width of the course's end-of-training claims
COURSE_LAYER = 0  # the layer every dynamics claim reads
END_SPREAD = 5000.0  # without the scale: "over 5,000"
COURSE_END_FROZEN = 0.999  # the course's figure, "99.9% of rows" (what a plot marks)
END_FROZEN = 0.99  # and what agrees with it: at least 99%
SCALED_SPREAD, SCALED_TOLERANCE = 3.4, 0.30  # with the scale: "settled around 3.4", ±30%
BIG_GAP = (16.5, 18.5)  # "17 to 18 points" and its rounding
