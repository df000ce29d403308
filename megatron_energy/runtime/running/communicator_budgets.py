"""SM (CTA) budgets of a plan's collectives as NCCL communicator settings, in megatron-core's own format.

NCCL decides how many CTAs (thread blocks, one per SM) a collective's kernels use from the communicator's
``minCTAs``/``maxCTAs``, fixed when the communicator is created. megatron-core creates its communicators in
``parallel_state.initialize_model_parallel`` with the entries of the YAML given to
``--nccl-communicator-config-path``, keyed by process-group name (``dp_cp``, ``tp``, ``pp``, ...), through
``parallel_state.get_nccl_options`` onto ``torch.distributed.ProcessGroupNCCL.Options().config``. This
module turns the budgets a plan names into entries of that mapping: the file Megatron reads at start-up for
a fixed budget per group, and the settings of the extra per-budget communicators that
``megatron.communicators`` creates for budgets that vary within an iteration.

A budget is **exact** by default: ``min_ctas = max_ctas = budget``, so a collective runs on the SMs the plan
modelled (NCCL may otherwise pick fewer channels for a small message); ``exact=False`` sets only the cap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_energy.atomic import write_atomically
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.collective_names import CollectiveName, GroupName
from megatron_energy.plan import Action, CollectiveAction, Plan

MEGATRON_GROUPS: dict[GroupName, str] = {"dp": "dp_cp", "tp": "tp", "pp": "pp", "ep": "ep"}
"""Group of a plan's collective name (``pipeline.collectives.PROCESS_GROUPS``) -> megatron-core's config key.

DDP reduces gradients over ``intra_dp_cp_group``, which is the ``dp_cp`` communicator with a single
distributed-optimizer instance (``parallel_state.py:967``); with ``--num-distributed-optimizer-instances``
> 1 it is ``intra_dp_cp`` (not covered: see ``megatron.communicators``). The MoE all-to-all runs on the
expert-parallel group, created with the ``ep`` key (``parallel_state.py:1361``)."""

MAX_CTAS_LIMIT = 64
"""Largest CTA budget NCCL accepts (``MAXCHANNELS`` of NCCL 2.17+; Hopper's default cap is 32)."""


class BudgetError(EnergyValueError):
    """A CTA budget or communicator config cannot be used; the message says what to do."""


@dataclass(frozen=True)
class CtaBudget:
    """The CTAs one communicator's collectives may use."""

    group: str
    """megatron-core process-group name (``dp_cp``, ``tp``, ``pp``, ...)."""
    max_ctas: int
    """Most CTAs (SMs) per collective kernel."""
    exact: bool = True
    """Also set ``min_ctas`` to ``max_ctas``, so the collective uses exactly this many."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_ctas <= MAX_CTAS_LIMIT:
            raise BudgetError(
                f"a CTA budget of {self.max_ctas} for the {self.group!r} communicator is outside NCCL's "
                f"1..{MAX_CTAS_LIMIT}: rerun planning with a budget in that range"
            )

    @property
    def label(self) -> str:
        """``dp_cp.ctas8``: the name of the communicator that carries this budget."""
        return f"{self.group}.ctas{self.max_ctas}"

    def entry(self) -> dict[str, int]:
        """The communicator-config entry (``max_ctas``, and ``min_ctas`` when exact)."""
        entry = {"max_ctas": self.max_ctas}
        if self.exact:
            entry["min_ctas"] = self.max_ctas
        return entry


def collective_group(collective: CollectiveName) -> str:
    """The megatron-core process group (its communicator-config key) a plan's collective runs on."""
    return MEGATRON_GROUPS[collective.group]


def plan_budgets(actions: Iterable[Action], exact: bool = True) -> dict[str, tuple[CtaBudget, ...]]:
    """The distinct CTA budgets a rank's actions ask for, per process group (ascending).

    Pass the actions of every point of the plan, so switching points (a straggler's pace) needs no
    communicator that does not exist yet.

    Args:
        actions: One rank's actions (clock actions are ignored, as are collectives without a budget).
        exact: See :attr:`CtaBudget.exact`.

    Returns:
        ``{group: budgets}``, only groups with at least one budget.
    """
    found: dict[str, set[int]] = {}
    for action in actions:
        if isinstance(action, CollectiveAction) and action.max_ctas is not None:
            found.setdefault(collective_group(action.collective), set()).add(action.max_ctas)
    return {
        group: tuple(CtaBudget(group, ctas, exact) for ctas in sorted(values))
        for group, values in sorted(found.items())
    }


def communicator_config(
    budgets: Iterable[CtaBudget], base: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """The mapping megatron-core reads from ``--nccl-communicator-config-path``, with fixed budgets set.

    Args:
        budgets: At most one budget per group: the budget of that group's only communicator.
        base: The job's own communicator config (its other keys, e.g. ``cga_cluster_size``,
            ``is_high_priority_stream``, ``net_name``, are kept).

    Returns:
        ``{group: {key: value}}``.

    Raises:
        BudgetError: Two budgets for one group (that needs per-budget communicators, not one entry).
    """
    config = {group: dict(entry) for group, entry in (base or {}).items()}
    seen: dict[str, int] = {}
    for budget in budgets:
        if budget.group in seen and seen[budget.group] != budget.max_ctas:
            raise BudgetError(
                f"the {budget.group!r} communicator cannot have budgets {seen[budget.group]} and "
                f"{budget.max_ctas} at once: budgets that vary within an iteration need one communicator "
                "per budget (megatron_energy.megatron.communicators.BudgetCommunicators)"
            )
        seen[budget.group] = budget.max_ctas
        entry = config.setdefault(budget.group, {})
        entry.pop("min_ctas", None)
        entry.update(budget.entry())
    return config


FIXED_GROUPS = ("pp", "tp", "ep")
"""Groups whose collectives megatron-core launches itself: their budget is fixed for the run."""


def plan_communicator_config(
    plan: Plan, base: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """The communicator config to start the job with for a plan: the budgets of pp and tp collectives.

    Their communicators are created by megatron-core at start-up and shared by every rank and point of the
    plan, so each group takes one budget for the whole run. Data-parallel budgets are left out: they vary by
    bucket and get communicators of their own at run time (``megatron.communicators``).

    Args:
        plan: The plan (every point and rank is read).
        base: The job's own communicator config, kept where the plan sets nothing.

    Returns:
        The mapping to write with :func:`write_communicator_config` for ``--nccl-communicator-config-path``.

    Raises:
        BudgetError: The plan gives one fixed group two budgets.
    """
    fixed: dict[str, tuple[int, CollectiveName]] = {}
    for point in plan.points:
        for rank in point.ranks:
            for action in rank.actions:
                if not isinstance(action, CollectiveAction) or action.max_ctas is None:
                    continue
                group = collective_group(action.collective)
                if group not in FIXED_GROUPS:
                    continue
                seen = fixed.setdefault(group, (action.max_ctas, action.collective))
                if seen[0] != action.max_ctas:
                    raise BudgetError(
                        f"the plan gives {seen[1]} {seen[0]} CTAs and {action.collective} {action.max_ctas}, "
                        f"but both run on megatron-core's {group!r} communicators, created once with one "
                        "budget: rerun planning with one budget per group"
                    )
    return communicator_config([CtaBudget(group, ctas) for group, (ctas, _) in fixed.items()], base)


def read_communicator_config(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a ``--nccl-communicator-config-path`` file (YAML).

    Raises:
        BudgetError: The file cannot be read or is not a mapping of group names to mappings.
    """
    import yaml

    source = Path(path)
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as error:
        raise BudgetError(
            f"cannot read the communicator config {source}: {error}; fix or remove it"
        ) from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise BudgetError(
            f"the communicator config {source} must map process-group names to settings, e.g. "
            "'dp_cp: {max_ctas: 8}'; fix it"
        )
    return {str(group): dict(entry) for group, entry in data.items()}


def write_communicator_config(path: str | Path, config: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write a communicator config for ``--nccl-communicator-config-path`` (YAML, atomically).

    Returns:
        The path written.
    """
    import yaml

    target = Path(path)
    text = yaml.safe_dump({group: dict(entry) for group, entry in config.items()}, sort_keys=True)
    write_atomically(target, text)
    return target


def check_fixed_budget(
    collective: CollectiveName, max_ctas: int | None, config: Mapping[str, Mapping[str, Any]] | None
) -> None:
    """Refuse a budget for a collective Megatron launches itself unless its communicator was created with it.

    Pipeline p2p and TP collectives run on megatron-core's own communicators, created once at start-up, so
    their budget must be in the communicator config Megatron read (``--nccl-communicator-config-path``).

    Args:
        collective: The plan's collective (``pp.send_recv``, ``tp.all_reduce``, ...).
        max_ctas: The plan's budget; ``None`` needs nothing.
        config: The communicator config the job started with (``None``: none was given).

    Raises:
        BudgetError: The communicator was created without that budget, with the entry to add.
    """
    if max_ctas is None:
        return
    budget = CtaBudget(collective_group(collective), max_ctas)
    entry = (config or {}).get(budget.group, {})
    if entry.get("max_ctas") != max_ctas or entry.get("min_ctas", max_ctas) != max_ctas:
        raise BudgetError(
            f"the plan gives {collective} {max_ctas} CTAs, but megatron-core created the {budget.group!r} "
            f"communicator with {dict(entry) or 'NCCL defaults'}; a budget is fixed when the communicator is "
            f"created: add '{budget.group}: {budget.entry()}' to the file given to "
            "--nccl-communicator-config-path (communicator_budgets.write_communicator_config) and restart"
        )
