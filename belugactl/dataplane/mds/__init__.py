"""The KV metadata server: allocator, index, request dispatch, server loop, admin HTTP."""
