"""Rack-wide operation: run the per-host command on every host of the manifest, in order, one answer."""
