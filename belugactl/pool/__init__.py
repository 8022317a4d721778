"""The shared pool: what is on it and the one way to map it.

    geometry.py   PoolGeometry: pool size, RPC rings, journal, shared KV area; every offset bounds-checked
    header.py     the on-media header at offset 0 (codec, claim and epoch words); it carries the geometry
    mapping.py    PoolMapping: the one mapping class (verified whole pool, or setup's/doctor's raw window)
    lock.py       flock-based locks on the pool: the claim word's CAS, one metadata server per pool
    file_pool.py  a pool in a plain file (development, CI, benchmarks)

Layering: above model/ (the manifest and the layout derived from it) and host/ (a Host's root);
below workflows/ and the data plane's services (metadata server, clients, the vLLM connector).
From dataplane/ it uses only the two leaf modules every pool user shares: the native helper
(flushes, atomics) and the typed pool errors (PoolMismatch, PoolMissing).

Import the submodules; this init stays empty so that importing the pool stays light.
"""
