//! PCI addresses, sysfs discovery, IOMMU groups and driver binding.
