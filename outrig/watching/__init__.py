"""An unattended run followed by ``outrig watch``: the pure judge of whether a box is alive
(``health.py``), the watch's wording (``lines.py``) and the ``on_event`` hook that tells a
person (``notify.py``). The loop itself is ``outrig/ops/watch.py``; hangs are ``outrig/hang/``."""
