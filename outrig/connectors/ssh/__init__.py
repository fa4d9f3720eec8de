"""The SSH connection, in the command's own process: the paramiko transport
(:mod:`~outrig.connectors.ssh.transport`), the pipelined login
(:mod:`~outrig.connectors.ssh.pipelined_login`) and the early connect started before the
command's imports (:mod:`~outrig.connectors.ssh.preconnect`)."""
