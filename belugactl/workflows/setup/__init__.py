"""Provisioning a host: plan the steps that make it match the manifest, apply them, undo them.

    target.py        what the manifest wants of one host (SetupTarget, HeaderSpec)
    facts.py         what the host has now (SetupFacts: a discovery snapshot plus what topics read)
    observe.py       read a host into SetupFacts (discovery, then each topic's own reads)
    pool_lookup.py   the pool's memdevs, region, namespace and dax device among the facts
    topic.py         what a topic is (SetupTopic: plan, teardown, apply hooks) and Planned
    topics/          one module per topic, found by the registry in topics/__init__.py (topic_ids())
    force.py         the one place that decides what --force allows
    planner.py       plan_setup / plan_teardown: the topics in order (teardown in reverse)
    execute.py       executors of the built-in action types
    applier.py       apply a plan under the host lock, re-planning after every step
    systemd.py       the boot-time unit that re-applies what does not survive a reboot

Imports point one way: target, facts -> pool_lookup, topic, force -> topics/* -> observe, planner
-> applier. tests/setup/test_setup_topics.py fails if a cycle comes back.
"""
