"""outrig: drive rented GPU boxes from a workstation over SSH.

The package is the library; ``tasks.py`` is only a thin Invoke skin over it.
Data flows one way: YAML → typed Host/Job → Plan (pure) → one agent call → events.
"""

from __future__ import annotations

__version__ = "0.1.0"
