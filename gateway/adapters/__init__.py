"""Adapters at the edge: concrete implementations of the ports in `gateway.ports`."""
