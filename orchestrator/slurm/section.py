"""The `slurm:` section of an inventory that the Slurm backend was chosen for."""

from __future__ import annotations

from orchestrator.models.inventory import Inventory
from orchestrator.models.slurm import SlurmSection


def section_of(inventory: Inventory) -> SlurmSection:
    """The inventory's `slurm:` section (models/slurm.py), which picked this backend.

    Raises:
        TypeError: the inventory has none: a caller that skipped `for_inventory`.
    """
    section = inventory.backend
    if not isinstance(section, SlurmSection):
        raise TypeError(f"inventory {inventory.path} has no slurm: section")
    return section
