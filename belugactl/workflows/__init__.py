"""Workflows decide: discover, doctor, plan/apply, serve, lab. They read hosts through `belugactl.host`."""
