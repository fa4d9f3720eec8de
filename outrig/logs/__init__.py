"""A run's logs on the workstation: exactly-once following, the pure part (cursors, framing,
segments, line splitting: :mod:`.tail`), and the local mirror they are written to
(:mod:`.mirror`). Both run in the command's own process (``tail-logs``, ``watch``)."""
