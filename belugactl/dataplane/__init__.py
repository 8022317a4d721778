"""The data plane: pool mapping, the native coherence helper, CXL-RPC, the KV metadata server.

Import the submodules you need (`belugactl.dataplane.client`, `.pool`, `.native`); this package
init stays empty so that importing one piece does not drag in the others.
"""
