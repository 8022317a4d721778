"""The model layer: the rack manifest, the pool layout derived from it, and the on-media header.

Pure data and rules; nothing here touches a machine. Importing this package stays light: the
submodules pull in pydantic and PyYAML, so import them where they are used:

    from belugactl.model.manifest import load_manifest, Manifest
    from belugactl.model.layout import resolve_layout, PoolLayout
    from belugactl.model.header import PoolHeader
"""
