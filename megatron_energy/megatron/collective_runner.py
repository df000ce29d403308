"""Run the collective actions of the plan an energy session is running, on the job's DDP model chunks.

:class:`CollectiveRunner` is a ``ScheduleListener`` placed after the session, and a
``runtime.parts.PlanFollower`` of the session's state: the state tells it which plan point runs
(``runtime.parts.RunningPoint``) whenever a plan is adopted, reverted (fallback, safety net), re-armed or
moved to another point (a straggler's pace). At the next step's start it builds, swaps or removes this
rank's :class:`~megatron_energy.megatron.collective_launch.CollectiveLauncher` (none for a plan whose
collective actions change nothing Megatron does: :func:`changes_megatron`); communicators for the budgets of
*every* point of the plan are created with the first launcher, so switching points creates none. A plan the
job cannot honour is reported once and its collective actions are skipped (its clocks still run): every
member of a data-parallel group runs the same pipeline rank's actions on the same job, so the members agree.

On the launcher path the model chunks come from :func:`capture_model`, which wraps megatron-training's
``setup_model_and_optimizer`` to keep the model it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from megatron_energy.errors import EnergyError
from megatron_energy.megatron.collective_launch import CollectiveLauncher
from megatron_energy.megatron.communicators import BudgetCommunicators
from megatron_energy.plan import Action, CollectiveAction, Plan
from megatron_energy.runtime.parts import RunningPoint

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from megatron_energy.megatron.session_factory import DeferredSession

CommunicatorConfig = Mapping[str, Mapping[str, Any]] | None
ModelChunks = Callable[[], Sequence[Any] | None]
"""Returns this rank's ``DistributedDataParallel`` chunks (``None`` until built)."""


class CollectiveRunner:
    """Keeps this rank's collective launcher in step with the plan point the session runs.

    Args:
        model_chunks: Returns this rank's ``DistributedDataParallel`` chunks (``None`` until built).
        communicator_config: The job's ``--nccl-communicator-config-path`` mapping, or ``None``; or a callable
            returning it, called when the first plan starts (Megatron's arguments exist by then).
    """

    def __init__(
        self,
        model_chunks: ModelChunks,
        communicator_config: CommunicatorConfig | Callable[[], CommunicatorConfig] = None,
    ) -> None:
        self._model_chunks = model_chunks
        self._config_source = communicator_config
        self._communicators: BudgetCommunicators | None = None
        self._config: CommunicatorConfig = None
        self._told: RunningPoint | None = None
        self._running: RunningPoint | None = None
        self._refused: list[Plan] = []
        self.launcher: CollectiveLauncher | None = None

    def follow(self, running: RunningPoint | None) -> None:
        """The session runs ``running`` from now on (``None``: no plan); applied at the next step's start."""
        self._told = running

    def _sync(self) -> None:
        running = self._told
        if running == self._running:
            return
        if self.launcher is not None:
            self.launcher.uninstall()
            self.launcher = None
        self._running = running
        if running is None or any(running.plan is plan for plan in self._refused):
            return
        stage = running.stage
        every_point: list[Action] = [a for point in running.plan.points for a in point.ranks[stage].actions]
        if not any(changes_megatron(action) for action in every_point):
            return
        chunks = self._model_chunks()
        if not chunks:
            self._refuse(
                running,
                "the job's model chunks were not captured (the launcher wraps "
                "megatron-training's setup_model_and_optimizer; a script that builds its model "
                "otherwise is not covered)",
            )
            return
        try:
            if self._communicators is None:
                source = self._config_source
                self._config = source() if callable(source) else source
                self._communicators = BudgetCommunicators(self._config)
            self.launcher = CollectiveLauncher(
                chunks,
                running.actions,
                running.passes,
                stage,
                communicators=self._communicators,
                budget_actions=every_point,
                communicator_config=self._config,
            )
        except EnergyError as refused:
            self._refuse(running, str(refused))

    def _refuse(self, running: RunningPoint, reason: str) -> None:
        self._refused.append(running.plan)
        logger.info(
            f"[energy] pipeline rank {running.stage}: the plan's collective actions are not applied (its "
            f"clocks are): {reason}"
        )

    def on_step_begin(self, step: int) -> None:
        """Follow the session's plan point, then pass the event on."""
        self._sync()
        if self.launcher is not None:
            self.launcher.on_step_begin(step)

    def on_step_end(self, step: int) -> None:
        """Pass the event on."""
        if self.launcher is not None:
            self.launcher.on_step_end(step)

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Pass the event on."""
        if self.launcher is not None:
            self.launcher.on_instruction_begin(kind, microbatch, chunk)

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Pass the event on."""
        if self.launcher is not None:
            self.launcher.on_instruction_end(kind, microbatch, chunk)

    def on_p2p_begin(self, op: str) -> None:
        """Pipeline p2p is not retimed."""

    def on_p2p_end(self, op: str) -> None:
        """Pipeline p2p is not retimed."""

    def close(self) -> None:
        """Give the bucket groups their own methods back."""
        if self.launcher is not None:
            self.launcher.uninstall()
            self.launcher = None


def changes_megatron(action: Action) -> bool:
    """Whether applying ``action`` changes what Megatron does with its collectives.

    A gradient reduction or parameter gather is always applied (its bucket group is checked against the
    plan); a collective Megatron launches itself (pipeline p2p, TP) only when the plan gives it a budget or
    overlaps it with GEMMs: at NCCL's budget and Megatron's own launch, its action only writes out what runs.
    """
    if not isinstance(action, CollectiveAction):
        return False
    return action.collective.group == "dp" or action.max_ctas is not None or action.at.phase is not None


class CapturedModel:
    """The model megatron-training's ``setup_model_and_optimizer`` returned (launcher path)."""

    def __init__(self) -> None:
        self.chunks: list[Any] | None = None

    def __call__(self) -> list[Any] | None:
        """This rank's DDP model chunks, ``None`` before the model is built."""
        return self.chunks


def capture_model() -> tuple[CapturedModel, Callable[[], None]]:
    """Wrap ``megatron.training.training.setup_model_and_optimizer`` to keep the model it returns.

    Returns:
        The captured model (callable for :class:`CollectiveRunner`) and a function that restores Megatron's.
    """
    from megatron.training import training

    original = training.setup_model_and_optimizer
    captured = CapturedModel()

    def setup_model_and_optimizer(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        captured.chunks = list(result[0])
        return result

    training.setup_model_and_optimizer = setup_model_and_optimizer

    def restore() -> None:
        training.setup_model_and_optimizer = original

    return captured, restore


def megatron_communicator_config() -> CommunicatorConfig:
    """The communicator config Megatron read (``--nccl-communicator-config-path``), or ``None``."""
    from megatron.training.global_vars import get_args

    from megatron_energy.runtime.running.communicator_budgets import read_communicator_config

    path = getattr(get_args(), "nccl_communicator_config_path", None)
    return None if path is None else read_communicator_config(path)


def chunks_from_config(model_config: Any) -> list[Any] | None:
    """The DDP model chunks behind ``config.no_sync_func``; ``None`` when it is not set.

    Megatron's ``train()`` sets it to the chunks' bound ``no_sync`` methods under ``--overlap-grad-reduce``
    (patched path: the model itself is not handed to the hooks).
    """
    funcs = getattr(model_config, "no_sync_func", None)
    if funcs is None:
        return None
    owners = [getattr(func, "__self__", None) for func in (funcs if isinstance(funcs, list) else [funcs])]
    return None if any(owner is None for owner in owners) else owners


def follow_session(session: DeferredSession, model_chunks: ModelChunks) -> CollectiveRunner:
    """A :class:`CollectiveRunner` the energy session tells which plan point runs; place it after the session.

    Args:
        session: The energy session's listener; it follows the session's state from the session's start.
        model_chunks: Returns this rank's DDP chunks (the session also reads the measured bucket layout from
            them).

    Returns:
        The runner, which applies the running point's collective actions to ``model_chunks``.
    """
    session.model_chunks = model_chunks
    runner = CollectiveRunner(model_chunks, megatron_communicator_config)
    session.plan_followers.append(runner)
    return runner
