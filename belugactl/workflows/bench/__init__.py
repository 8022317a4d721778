"""The benchmarks behind `belugactl bench`: each runs its subject and its baseline side by side.

rpc_mds   CXL-RPC vs TCP round trips, and the metadata index under churn (bench rpc, bench mds)
kv_copy   the KV block copy engine vs a contiguous copy and a per-piece loop (bench kv)
serving   TTFT of real vLLM: recompute vs pool hit, direct or through the router (bench serve)
soak      writers and readers under restarts, kills and eviction, checked byte for byte (bench soak)
"""
