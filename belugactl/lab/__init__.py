"""The lab: an emulated multi-host CXL rack on this machine (QEMU guests, a real Debian kernel).

Every guest gets its own CXL host bridge with two root ports and one type-3 device, and all guests'
devices are backed by the same pool file, so they see one shared memory pool. The host's root is
exported read-only over 9p and guests chroot into it, so this checkout's code and virtual
environment run against each guest's real CXL stack. Commands reach a guest through a spool
directory (a writable 9p export) served by a small agent; see `belugactl.lab.guest.agent`.

This package manages processes on the local machine only; it never touches real CXL hardware.
"""
