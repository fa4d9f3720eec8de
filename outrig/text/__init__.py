"""Text for a person at a terminal, pure: the layout of plans, status and tables in the
terminal's width (``layout.py``) and that width, read once (``terminal.py``). ``Reporter``
(:mod:`outrig.console`) prints what these lay out."""
