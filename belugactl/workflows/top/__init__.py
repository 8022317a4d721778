"""`belugactl top`: a live view of the rack from the endpoints Prometheus scrapes.

- `prom_text.py`: Prometheus text exposition, parsed into samples;
- `scrape.py`: which endpoints (the same list `export prometheus` writes) and one round of scrapes;
- `model.py`: two successive rounds -> a `Snapshot` (health, pool use, hit rate, rates, latency);
- `view_state.py`: the keys (sort, filter, quit) as a state machine;
- `view.py`: a snapshot as lines of text for a width (the live screen and `--once`);
- `live.py`: the refresh loop and the terminal's keys.
"""
