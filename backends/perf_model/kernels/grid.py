"""Multilinear interpolation of a measured latency over a grid of kernel shapes.

A kernel table times one kernel at grid points (``m`` rows x ``n`` x ``k``, or tokens, or
message sizes). Between points the latency is interpolated linearly on each axis; past the last
point of an axis whose work grows in proportion to it (rows, bytes, context), it is scaled in
proportion from the last point (an axis the caller names as ``held`` keeps the last point's
value instead); below the first point it is held at the first point's value (a kernel of fewer
rows costs no less than the smallest one timed). Grid points the table lacks are skipped and
the other corners' weights renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True, frozen=True)
class Grid:
    axes: tuple[np.ndarray, ...]  # sorted ascending values of each axis
    latency_ms: np.ndarray  # shape (len(axis) for axis in axes); NaN where not measured

    @classmethod
    def from_rows(cls, points: np.ndarray, latency_ms: np.ndarray) -> Grid:
        """``points``: (rows, axes) shape coordinates; duplicates keep their mean."""
        axes = tuple(np.unique(points[:, i]) for i in range(points.shape[1]))
        index = tuple(np.searchsorted(axes[i], points[:, i]) for i in range(len(axes)))
        total = np.zeros([len(a) for a in axes])
        count = np.zeros_like(total)
        np.add.at(total, index, latency_ms)
        np.add.at(count, index, 1)
        with np.errstate(invalid="ignore"):
            return cls(axes, total / np.where(count > 0, count, np.nan))

    def at(self, point: tuple[float, ...], held: tuple[int, ...] = ()) -> float | None:
        """The interpolated latency (ms) at ``point``, or None if no corner around it was
        measured. ``held``: indices of axes whose last point holds past it."""
        brackets = [_bracket(axis, float(x), i not in held)
                    for i, (axis, x) in enumerate(zip(self.axes, point))]
        value, weight = 0.0, 0.0
        for corner in np.ndindex(*(2,) * len(self.axes)):
            w, index = 1.0, []
            for side, (lo, hi, t, _) in zip(corner, brackets):
                w *= t if side else 1.0 - t
                index.append(hi if side else lo)
            if w == 0.0:
                continue
            cell = self.latency_ms[tuple(index)]
            if not np.isnan(cell):
                value, weight = value + w * cell, weight + w
        if weight == 0.0:
            return None
        scale = float(np.prod([b[3] for b in brackets]))
        return float(value / weight * scale)


def _bracket(axis: np.ndarray, x: float, scaled: bool = True) -> tuple[int, int, float, float]:
    """(lower index, upper index, weight of the upper, scale beyond the last point)."""
    last = len(axis) - 1
    if x <= axis[0]:
        return 0, 0, 0.0, 1.0
    if x >= axis[last]:
        return last, last, 0.0, x / float(axis[last]) if scaled else 1.0
    hi = int(np.searchsorted(axis, x))
    lo = hi - 1
    return lo, hi, (x - axis[lo]) / float(axis[hi] - axis[lo]), 1.0
