#!/usr/bin/env bash
# Runs userdma's tests against real PCI devices: QEMU guests with the emulated edu device and an
# NVMe controller, behind an emulated Intel IOMMU and without one (tests/guest/README.md). The
# nvme example (examples/nvme/) runs in the guest as a user-space NVMe driver, and the disk image
# it wrote is checked on the host after each boot.
# Installs QEMU and fetches the guest kernel from Debian on the first run; about 3 minutes from a
# warm cache under software emulation. Ends with "guest: N passed, M failed"; non-zero on any failure.
#
#   scripts/guest-test.sh                 # every boot
#   BOOTS=noiommu scripts/guest-test.sh   # one boot; see tests/guest/run.sh for ACCEL, BOOT_TIMEOUT
exec "$(dirname "$0")/../tests/guest/run.sh" "$@"
