"""One module per connector (how the agent on a box is reached); the table that picks one
for a host is :data:`outrig.transport.CONNECTORS`."""
