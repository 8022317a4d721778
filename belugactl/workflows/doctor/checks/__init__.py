"""The built-in checks, one module per topic. Importing this package registers them all.

The report orders them by `registry.TOPIC_ORDER`, so the import order here does not matter.
"""

from belugactl.workflows.doctor.checks import (  # noqa: F401 - imported for their registrations
    caching,
    cxl,
    dax,
    discovery,
    etcd,
    health,
    kernel_facts,
    memory,
    metadata,
    numa,
    pci,
    perf,
    pool_header,
    tools,
    topology,
)
