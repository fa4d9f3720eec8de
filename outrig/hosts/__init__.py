"""What a ``--host`` names, below :mod:`outrig.inventory` (which turns it into a ``Host``):
the host file's schema (``file_model.py``), the SSH configuration as OpenSSH reads it
(``ssh_config.py``) and the judge of a box's GPUs (``gpu_health.py``)."""
