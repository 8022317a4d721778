"""The model layer: the rack manifest and the pool layout derived from it.

Pure data and rules; nothing here touches a machine. Importing this package stays light: the
submodules pull in pydantic and PyYAML, so import them where they are used:

    from belugactl.model.manifest import load_manifest, Manifest
    from belugactl.model.layout import resolve_layout, PoolLayout

The on-media header the layout is written into lives with the pool (belugactl/pool/header.py).
"""
