"""The built-in games; importing this package registers them."""

from . import hexade, overflow, supplier_sabotage, supply_chains, teeko

__all__ = ["hexade", "overflow", "supplier_sabotage", "supply_chains", "teeko"]
