"""Provisioning a host: plan the steps that make it match the manifest, apply them, undo them.

    target.py        what the manifest wants of one host (SetupTarget)
    facts.py         what the host has now (a discovery snapshot plus what setup itself tracks)
    steps_*.py       one module per topic: pool (region, devdax, permissions), header, tuning, ddio, mtrr
    planner.py       plan_setup / plan_teardown: facts + target -> Plan
    applier.py       apply a plan under the host lock, re-planning after every step
    systemd.py       the boot-time unit that re-applies what does not survive a reboot
"""
