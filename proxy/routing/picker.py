"""Picker: turn weighted scores into a ranked list under a load bound.

Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): no backend
takes a new request while its load would exceed ``ceil((1 + epsilon) * mean)``, where the
mean counts the request being placed. The best-scoring backend that is under the bound wins;
those over it keep their order but go last, so retries can still reach them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class BoundedLoadPicker:
    """``epsilon=None`` disables the bound: plain highest score."""

    epsilon: float | None = 0.25

    def rank(
        self, totals: Sequence[float], loads: Sequence[float], tiebreak: Sequence[int]
    ) -> tuple[list[int], bool]:
        """Candidate indexes, best first, and whether the bound overruled the top score."""
        order = sorted(range(len(totals)), key=lambda i: (-totals[i], -tiebreak[i]))
        if self.epsilon is None or len(order) < 2:
            return order, False
        cap = math.ceil((1.0 + self.epsilon) * (sum(loads) + 1.0) / len(loads))
        under = [i for i in order if loads[i] + 1.0 <= cap]
        if not under or under[0] == order[0]:
            return order, False
        over = [i for i in order if loads[i] + 1.0 > cap]
        return under + over, True
