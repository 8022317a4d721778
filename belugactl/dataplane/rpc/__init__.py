"""CXL-RPC: the wire format, the slot rings in the pool, and the TCP transport."""
