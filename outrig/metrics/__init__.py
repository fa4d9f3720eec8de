"""A run's metric series, on the workstation: the trainer's metric lines parsed into points
(:mod:`.series`), kept in the run's local store (:mod:`.store`), drawn in the terminal
(:mod:`.termplot`, ``outrig plot``) and as one self-contained HTML page (:mod:`.report`,
``outrig report``, with the chart library in ``report_assets/``)."""
