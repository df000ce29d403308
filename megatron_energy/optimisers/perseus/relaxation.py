"""The exact relaxation of the frontier problem: convex hulls and a linear program re-solved from its basis.

Each instruction's (time, energy) options are replaced by their lower convex hull (:func:`lower_convex_hull`);
:class:`HotStartProgram` holds the resulting linear program and re-solves it after a bound change from the
previous basis (HiGHS as bundled with SciPy >= 1.15), or with one ``linprog`` call per solve on older SciPy.
Its first solve may start from a given basis instead of the slack one (:meth:`HotStartProgram.set_basis`).

Any non-negative multipliers ``y`` of the rows ``A x ≤ b`` give a lower bound on the optimum without a solve
(:meth:`HotStartProgram.dual_bound`, Lagrangian relaxation of the rows)::

    min { c·x : A x ≤ b, lo ≤ x ≤ hi }  ≥  −b·y + Σ_j min(r_j·lo_j, r_j·hi_j),   r = c + Aᵀ y

With the optimal multipliers of a solve it is that solve's optimum; for others it is lower, but still valid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from megatron_energy.pipeline.profile import ClockOption

try:  # HiGHS as bundled with SciPy >= 1.15: re-solves from the last basis after a bound change.
    from scipy.optimize._highspy import _core as _highs
except ImportError:  # pragma: no cover - exercised only on older SciPy
    _highs = None


def lower_convex_hull(options: Sequence[ClockOption]) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the lower convex hull of the options' (time, energy) points, time ascending.

    Args:
        options: An instruction's clock options.

    Returns:
        ``(times_s, energies_j)`` of the hull vertices; slopes between them strictly increase.
    """
    best: dict[float, float] = {}
    for option in options:
        best[option.time_s] = min(option.energy_j, best.get(option.time_s, math.inf))
    hull: list[tuple[float, float]] = []
    for point in sorted(best.items()):
        while len(hull) >= 2:
            (t0, e0), (t1, e1) = hull[-2], hull[-1]
            if (t1 - t0) * (point[1] - e0) - (e1 - e0) * (point[0] - t0) > 0:
                break
            hull.pop()
        hull.append(point)
    array = np.array(hull, dtype=float)
    return array[:, 0], array[:, 1]


class HotStartProgram:
    """``min c·x`` s.t. ``A x ≤ b``, ``lo ≤ x ≤ hi``, re-solved from the last basis after bound changes."""

    def __init__(
        self, cost: np.ndarray, matrix: sp.csc_matrix, rhs: np.ndarray, lower: np.ndarray, upper: np.ndarray
    ):
        self.lower, self.upper = lower.copy(), upper.copy()
        self._problem = (cost, matrix, rhs)
        self._solver = None
        self._upper_marginals = np.zeros(len(cost))
        self._row_marginals = np.zeros(len(rhs))
        self._last: Any = None  # HiGHS' solution of the last solve (its bindings are untyped)
        self._devex_next = False
        if _highs is not None:
            lp = _highs.HighsLp()
            lp.num_col_, lp.num_row_ = matrix.shape[1], matrix.shape[0]
            lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, lower, np.minimum(upper, _highs.kHighsInf)
            lp.row_lower_, lp.row_upper_ = np.full(matrix.shape[0], -_highs.kHighsInf), rhs
            lp.a_matrix_.format_ = _highs.MatrixFormat.kColwise
            lp.a_matrix_.start_, lp.a_matrix_.index_ = matrix.indptr, matrix.indices
            lp.a_matrix_.value_ = matrix.data
            self._solver = _highs._Highs()
            self._solver.setOptionValue("output_flag", False)
            self._solver.passModel(lp)

    def set_upper(self, column: int, upper: float) -> None:
        """Change one column's upper bound (kept for the following solves)."""
        self.upper[column] = upper
        if self._solver is not None:
            self._solver.changeColBounds(column, self.lower[column], min(upper, _highs.kHighsInf))

    def set_basis(self, columns: np.ndarray, rows: np.ndarray) -> None:
        """Start the next solve from this basis (ignored where HiGHS cannot be restarted: older SciPy).

        That solve prices with devex: measured on S=16 M=256 VPP=2 from a longest-path-tree basis
        (:mod:`megatron_energy.optimisers.perseus.starting_basis`), HiGHS' steepest edge took 17–20 s (9,353
        iterations) against 7.8–8.4 s for devex (12,508), and 13.5–14.5 s from the slack basis (29,989).
        Later solves go back to HiGHS' own choice.

        Args:
            columns: Status of every column: 0 nonbasic at the lower bound, 1 basic, 2 nonbasic at the upper.
            rows: Status of every row, numbered alike (2: the row is tight).
        """
        if self._solver is None:
            return
        statuses = (
            _highs.HighsBasisStatus.kLower,
            _highs.HighsBasisStatus.kBasic,
            _highs.HighsBasisStatus.kUpper,
        )
        basis = _highs.HighsBasis()
        basis.col_status = [statuses[status] for status in columns.tolist()]
        basis.row_status = [statuses[status] for status in rows.tolist()]
        basis.valid = True
        if self._solver.setBasis(basis) != _highs.HighsStatus.kOk:
            raise RuntimeError("HiGHS refused the starting basis of the relaxed frontier program")
        self._devex_next = True

    def solve(self) -> tuple[np.ndarray, float]:
        """Solve with the current bounds; returns the solution and the objective value."""
        if self._solver is None:
            cost, matrix, rhs = self._problem
            result = linprog(
                cost, A_ub=matrix, b_ub=rhs, bounds=np.c_[self.lower, self.upper], method="highs"
            )
            if result.status != 0:
                raise RuntimeError(f"the relaxed frontier program failed: {result.message}")
            self._upper_marginals = np.asarray(result.upper.marginals)
            self._row_marginals = np.asarray(result.ineqlin.marginals)
            return result.x, float(result.fun)
        if self._devex_next:
            self._solver.setOptionValue("simplex_dual_edge_weight_strategy", 1)
        self._solver.run()
        if self._devex_next:
            self._solver.setOptionValue("simplex_dual_edge_weight_strategy", -1)
            self._devex_next = False
        status = self._solver.getModelStatus()
        if status != _highs.HighsModelStatus.kOptimal:
            message = self._solver.modelStatusToString(status)
            raise RuntimeError(f"the relaxed frontier program failed: {message}")
        self._last = self._solver.getSolution()
        return np.asarray(self._last.col_value), float(self._solver.getInfo().objective_function_value)

    def upper_bound_dual(self, column: int) -> float:
        """The objective's rate of change with ``column``'s upper bound at the last solve (0 if not binding).

        The optimum is convex in the bound, so this is a subgradient: the line through the last optimum with
        this slope lies below the optimum at every other value of the bound.
        """
        if self._solver is None:
            return min(float(self._upper_marginals[column]), 0.0)
        if self._last is None:
            raise RuntimeError("upper_bound_dual needs a solve first")
        return min(float(self._last.col_dual[column]), 0.0)

    def row_multipliers(self) -> np.ndarray:
        """The rows' optimal multipliers ``y ≥ 0`` at the last solve (see :meth:`dual_bound`)."""
        if self._solver is None:
            return np.maximum(-self._row_marginals, 0.0)
        if self._last is None:
            raise RuntimeError("row_multipliers needs a solve first")
        return np.maximum(-np.asarray(self._last.row_dual), 0.0)

    def dual_bound(self, multipliers: np.ndarray, implied_upper: np.ndarray) -> float:
        """A lower bound on the optimum under the current bounds, from any row multipliers (see the module).

        Args:
            multipliers: ``y ≥ 0``, one per row.
            implied_upper: Upper bounds every feasible ``x`` meets anyway (``inf`` where none is known); they
                keep the bound finite where a column's reduced cost is negative and its own bound infinite.

        Returns:
            ``−b·y + Σ_j min(r_j·lo_j, r_j·hi_j)``; ``-inf`` where a non-zero reduced cost meets an
            infinite bound.
        """
        cost, matrix, rhs = self._problem
        reduced = cost + matrix.T @ multipliers
        at_bound = np.where(reduced < 0, np.minimum(self.upper, implied_upper), self.lower)
        unbounded = np.isinf(at_bound)
        if np.any(unbounded & (reduced != 0)):
            return -math.inf
        return float(-rhs @ multipliers + reduced @ np.where(unbounded, 0.0, at_bound))
