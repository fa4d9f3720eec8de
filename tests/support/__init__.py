"""What the tests share, and nothing else: no test module imports another test module.

A package, not one module, because it holds several concepts that a test picks from
separately: processes and their liveness (``processes``), loopback ports and a loopback echo
server (``network``), runs on a box made and ended by the tests (``runs``), the tail-logs
follower and the log writer it reads (``logs``), file trees and checkpoint folders
(``trees``), the box agent run locally (``agent``), the replay connector and its recordings
(``replay``, ``replay_cases``) and the dflash plans the contract tests render (``plans``).
Fixtures stay in the conftest.py files; these are plain functions and classes.
"""
