"""A stand-in GPU box on this machine, for tests and ``inv demo``.

outrig's promise is that it works against a real OpenSSH server over a slow link, on boxes
whose GPUs are held by processes that misbehave. This package provides those conditions
locally without a GPU or a network: a real ``sshd`` on 127.0.0.1 with throwaway keys
(:mod:`outrig.sandbox.box`), a fake ``nvidia-smi`` whose answers come from files that GPU-using
stand-ins write (:mod:`outrig.sandbox.nvidia_smi`), and a TCP proxy that injects latency and
cuts connections (:mod:`outrig.sandbox.proxy`).
"""
