"""Megatron's console handler and ``megatron_energy``'s records: each record on the console once.

megatron-training configures the root logger at import (``logging.basicConfig(handlers=[CustomHandler()])``,
standard output), and its handler drops the records of the modules named in
``megatron.training.log_handler.BLACKLISTED_MODULES`` (``torch.distributed`` by default). The package's
records propagate to the root logger and are printed by ``megatron_energy.log.ConsoleHandler`` already, so
:func:`leave_energy_records_to_their_handler` names ``megatron_energy`` there too: Megatron's console
handler skips them, any other handler on the root logger (a user's file, say) still gets them.
"""

from __future__ import annotations

from megatron_energy.log import ROOT_LOGGER


def leave_energy_records_to_their_handler() -> None:
    """Have Megatron's console handler skip ``megatron_energy``'s records (idempotent).

    A megatron-core without megatron-training has no such handler: nothing to do.
    """
    try:
        from megatron.training import log_handler
    except ImportError:
        return
    if ROOT_LOGGER not in log_handler.BLACKLISTED_MODULES:
        log_handler.BLACKLISTED_MODULES.append(ROOT_LOGGER)
