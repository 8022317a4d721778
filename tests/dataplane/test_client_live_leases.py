"""serve.metadata.client_live_leases: the per-client cap on live read leases is the manifest's, not fixed."""

from __future__ import annotations

from belugactl.dataplane.mds.allocator import Allocator
from belugactl.dataplane.mds.index import IndexConfig, KVIndex
from belugactl.dataplane.mds.quotas import DEFAULT_LIVE_LEASES
from belugactl.model.manifest_schema import MetadataServe


def test_the_index_gives_each_client_the_configured_lease_cap() -> None:
    area = 64 << 20
    default = KVIndex(Allocator(2 << 20, area), IndexConfig())
    assert default.quotas.limits.live_leases == DEFAULT_LIVE_LEASES
    raised = KVIndex(Allocator(2 << 20, area), IndexConfig(client_live_leases=1 << 30))
    assert raised.quotas.limits.live_leases == 1 << 30


def test_the_manifest_field_defaults_to_the_server_default_and_is_bounded() -> None:
    import pydantic
    import pytest

    assert MetadataServe().client_live_leases == DEFAULT_LIVE_LEASES
    with pytest.raises(pydantic.ValidationError):
        MetadataServe(client_live_leases=0)
