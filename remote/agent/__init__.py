"""outrig's box agent: the only code outrig runs on a box (docs/agent-protocol.md).

Standard library only, Python >= 3.8, Linux only (/proc). It is never installed: each call
sends this package as one bundle (bundle.py) and runs it once; it reads one JSON request, does
the whole step on the box and writes JSON-line events to stdout, flushed one by one, the last
always a ``result`` event. One module per concept; ``__main__`` holds the one table of ops.
On the workstation the same modules are ``outrig._box.agent.*``.
"""
