"""Install test optimisers as a pip package would: an entry-point declaration in a folder on the path.

The optimisers' source is in ``tests/optimiser_plugin``; a ``.dist-info`` folder under ``site`` declares them
in the ``megatron_energy.optimisers`` entry-point group. Both folders go on the ranks' ``sys.path`` (where
``PYTHONPATH`` would put them); a planner process gets the same path.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

PLUGIN_SOURCE = Path(__file__).resolve().parent / "optimiser_plugin"


def install_plugin(site: Path, entry_points: Mapping[str, str]) -> None:
    """Declare ``entry_points`` (mode name -> ``module:factory``) in an installed-distribution folder."""
    dist_info = site / "toy_optimisers-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-optimisers\nVersion: 0.1\n")
    declared = "".join(f"{name} = {factory}\n" for name, factory in entry_points.items())
    (dist_info / "entry_points.txt").write_text(f"[megatron_energy.optimisers]\n{declared}")
