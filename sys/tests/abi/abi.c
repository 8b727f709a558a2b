/*
 * Prints the kernel ABI that userdma-sys mirrors, as the uapi headers on the include path define it.
 * Built and run by tests/kernel_abi.rs once per header set; one line per item:
 *
 *   LINUX_VERSION_CODE <n>          first line: the header set's version
 *   NAME <value>                    constants and ioctl numbers
 *   sizeof:STRUCT <n>               struct sizes
 *   offsetof:STRUCT.FIELD <n>       field offsets
 *
 * Items newer than Linux 6.1 (the oldest header set supported) are printed only when the headers
 * have them: by the macro introduced with them where there is one, by LINUX_VERSION_CODE otherwise.
 * Struct sizes are printed only for headers whose struct has every field userdma-sys has.
 */
#include <stddef.h>
#include <stdio.h>

#include <linux/version.h>

#include <asm-generic/hugetlb_encode.h>
#include <linux/magic.h>
#include <asm/unistd.h>
#include <linux/dma-buf.h>
#include <linux/dma-heap.h> /* its fd flags need O_CLOEXEC, O_ACCMODE: */
#include <fcntl.h>
#include <linux/membarrier.h>
#include <linux/udmabuf.h>
#include <linux/memfd.h>
#include <linux/mempolicy.h>
#include <linux/mman.h>
#include <linux/pci_regs.h>
#include <linux/vfio.h>

#if defined(__has_include)
#if __has_include(<linux/iommufd.h>)
#include <linux/iommufd.h>
#define HAVE_IOMMUFD 1
#endif
#else
#error "the compiler lacks __has_include (gcc >= 5 or clang has it)"
#endif

#define VAL(name) printf("%s %lld\n", #name, (long long)(name))
#define SIZEOF(s) printf("sizeof:%s %zu\n", #s, sizeof(struct s))
#define OFFSETOF(s, f) printf("offsetof:%s.%s %zu\n", #s, #f, offsetof(struct s, f))

static void vfio(void)
{
	VAL(VFIO_API_VERSION);
	VAL(VFIO_TYPE);
	VAL(VFIO_BASE);
	VAL(VFIO_TYPE1_IOMMU);
	VAL(VFIO_TYPE1v2_IOMMU);
	VAL(VFIO_DMA_CC_IOMMU);
	VAL(VFIO_NOIOMMU_IOMMU);
	VAL(VFIO_UNMAP_ALL);

	VAL(VFIO_GROUP_FLAGS_VIABLE);
	VAL(VFIO_GROUP_FLAGS_CONTAINER_SET);
	VAL(VFIO_DEVICE_FLAGS_RESET);
	VAL(VFIO_DEVICE_FLAGS_PCI);
	VAL(VFIO_DEVICE_FLAGS_CAPS);

	VAL(VFIO_REGION_INFO_FLAG_READ);
	VAL(VFIO_REGION_INFO_FLAG_WRITE);
	VAL(VFIO_REGION_INFO_FLAG_MMAP);
	VAL(VFIO_REGION_INFO_FLAG_CAPS);
	VAL(VFIO_REGION_INFO_CAP_SPARSE_MMAP);
	VAL(VFIO_REGION_INFO_CAP_TYPE);
	VAL(VFIO_REGION_INFO_CAP_MSIX_MAPPABLE);

	VAL(VFIO_IRQ_INFO_EVENTFD);
	VAL(VFIO_IRQ_INFO_MASKABLE);
	VAL(VFIO_IRQ_INFO_AUTOMASKED);
	VAL(VFIO_IRQ_INFO_NORESIZE);
	VAL(VFIO_IRQ_SET_DATA_NONE);
	VAL(VFIO_IRQ_SET_DATA_BOOL);
	VAL(VFIO_IRQ_SET_DATA_EVENTFD);
	VAL(VFIO_IRQ_SET_ACTION_MASK);
	VAL(VFIO_IRQ_SET_ACTION_UNMASK);
	VAL(VFIO_IRQ_SET_ACTION_TRIGGER);
	VAL(VFIO_IRQ_SET_DATA_TYPE_MASK);
	VAL(VFIO_IRQ_SET_ACTION_TYPE_MASK);

	VAL(VFIO_PCI_BAR0_REGION_INDEX);
	VAL(VFIO_PCI_BAR1_REGION_INDEX);
	VAL(VFIO_PCI_BAR2_REGION_INDEX);
	VAL(VFIO_PCI_BAR3_REGION_INDEX);
	VAL(VFIO_PCI_BAR4_REGION_INDEX);
	VAL(VFIO_PCI_BAR5_REGION_INDEX);
	VAL(VFIO_PCI_ROM_REGION_INDEX);
	VAL(VFIO_PCI_CONFIG_REGION_INDEX);
	VAL(VFIO_PCI_VGA_REGION_INDEX);
	VAL(VFIO_PCI_NUM_REGIONS);
	VAL(VFIO_PCI_INTX_IRQ_INDEX);
	VAL(VFIO_PCI_MSI_IRQ_INDEX);
	VAL(VFIO_PCI_MSIX_IRQ_INDEX);
	VAL(VFIO_PCI_ERR_IRQ_INDEX);
	VAL(VFIO_PCI_REQ_IRQ_INDEX);
	VAL(VFIO_PCI_NUM_IRQS);

	VAL(VFIO_IOMMU_INFO_PGSIZES);
	VAL(VFIO_IOMMU_INFO_CAPS);
	VAL(VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE);
	VAL(VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL);
	VAL(VFIO_DMA_MAP_FLAG_READ);
	VAL(VFIO_DMA_MAP_FLAG_WRITE);
	VAL(VFIO_DMA_UNMAP_FLAG_ALL);

	/* ioctls */
	VAL(VFIO_GET_API_VERSION);
	VAL(VFIO_CHECK_EXTENSION);
	VAL(VFIO_SET_IOMMU);
	VAL(VFIO_IOMMU_GET_INFO);
	VAL(VFIO_IOMMU_MAP_DMA);
	VAL(VFIO_IOMMU_UNMAP_DMA);
	VAL(VFIO_GROUP_GET_STATUS);
	VAL(VFIO_GROUP_SET_CONTAINER);
	VAL(VFIO_GROUP_UNSET_CONTAINER);
	VAL(VFIO_GROUP_GET_DEVICE_FD);
	VAL(VFIO_DEVICE_GET_INFO);
	VAL(VFIO_DEVICE_GET_REGION_INFO);
	VAL(VFIO_DEVICE_GET_IRQ_INFO);
	VAL(VFIO_DEVICE_SET_IRQS);
	VAL(VFIO_DEVICE_RESET);
	VAL(VFIO_DEVICE_GET_PCI_HOT_RESET_INFO);
	VAL(VFIO_DEVICE_PCI_HOT_RESET);

	/* structs */
	SIZEOF(vfio_info_cap_header);
	OFFSETOF(vfio_info_cap_header, id);
	OFFSETOF(vfio_info_cap_header, version);
	OFFSETOF(vfio_info_cap_header, next);

	SIZEOF(vfio_group_status);
	OFFSETOF(vfio_group_status, argsz);
	OFFSETOF(vfio_group_status, flags);

	OFFSETOF(vfio_device_info, argsz);
	OFFSETOF(vfio_device_info, flags);
	OFFSETOF(vfio_device_info, num_regions);
	OFFSETOF(vfio_device_info, num_irqs);
	OFFSETOF(vfio_device_info, cap_offset);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0) /* "vfio: align capability structures" */
	OFFSETOF(vfio_device_info, pad);
	SIZEOF(vfio_device_info);
#endif

	SIZEOF(vfio_region_info);
	OFFSETOF(vfio_region_info, argsz);
	OFFSETOF(vfio_region_info, flags);
	OFFSETOF(vfio_region_info, index);
	OFFSETOF(vfio_region_info, cap_offset);
	OFFSETOF(vfio_region_info, size);
	OFFSETOF(vfio_region_info, offset);

	SIZEOF(vfio_region_sparse_mmap_area);
	OFFSETOF(vfio_region_sparse_mmap_area, offset);
	OFFSETOF(vfio_region_sparse_mmap_area, size);

	SIZEOF(vfio_region_info_cap_sparse_mmap);
	OFFSETOF(vfio_region_info_cap_sparse_mmap, header);
	OFFSETOF(vfio_region_info_cap_sparse_mmap, nr_areas);
	OFFSETOF(vfio_region_info_cap_sparse_mmap, reserved);
	OFFSETOF(vfio_region_info_cap_sparse_mmap, areas);

	SIZEOF(vfio_region_info_cap_type);
	OFFSETOF(vfio_region_info_cap_type, header);
	OFFSETOF(vfio_region_info_cap_type, type);
	OFFSETOF(vfio_region_info_cap_type, subtype);

	SIZEOF(vfio_irq_info);
	OFFSETOF(vfio_irq_info, argsz);
	OFFSETOF(vfio_irq_info, flags);
	OFFSETOF(vfio_irq_info, index);
	OFFSETOF(vfio_irq_info, count);

	SIZEOF(vfio_irq_set);
	OFFSETOF(vfio_irq_set, argsz);
	OFFSETOF(vfio_irq_set, flags);
	OFFSETOF(vfio_irq_set, index);
	OFFSETOF(vfio_irq_set, start);
	OFFSETOF(vfio_irq_set, count);
	OFFSETOF(vfio_irq_set, data);

	SIZEOF(vfio_pci_dependent_device);
	OFFSETOF(vfio_pci_dependent_device, group_id);
	OFFSETOF(vfio_pci_dependent_device, segment);
	OFFSETOF(vfio_pci_dependent_device, bus);
	OFFSETOF(vfio_pci_dependent_device, devfn);

	SIZEOF(vfio_pci_hot_reset_info);
	OFFSETOF(vfio_pci_hot_reset_info, argsz);
	OFFSETOF(vfio_pci_hot_reset_info, flags);
	OFFSETOF(vfio_pci_hot_reset_info, count);
	OFFSETOF(vfio_pci_hot_reset_info, devices);

	SIZEOF(vfio_pci_hot_reset);
	OFFSETOF(vfio_pci_hot_reset, argsz);
	OFFSETOF(vfio_pci_hot_reset, flags);
	OFFSETOF(vfio_pci_hot_reset, count);
	OFFSETOF(vfio_pci_hot_reset, group_fds);

	OFFSETOF(vfio_iommu_type1_info, argsz);
	OFFSETOF(vfio_iommu_type1_info, flags);
	OFFSETOF(vfio_iommu_type1_info, iova_pgsizes);
	OFFSETOF(vfio_iommu_type1_info, cap_offset);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0) /* "vfio: align capability structures" */
	OFFSETOF(vfio_iommu_type1_info, pad);
	SIZEOF(vfio_iommu_type1_info);
#endif

	SIZEOF(vfio_iova_range);
	OFFSETOF(vfio_iova_range, start);
	OFFSETOF(vfio_iova_range, end);

	SIZEOF(vfio_iommu_type1_info_cap_iova_range);
	OFFSETOF(vfio_iommu_type1_info_cap_iova_range, header);
	OFFSETOF(vfio_iommu_type1_info_cap_iova_range, nr_iovas);
	OFFSETOF(vfio_iommu_type1_info_cap_iova_range, reserved);
	OFFSETOF(vfio_iommu_type1_info_cap_iova_range, iova_ranges);

	SIZEOF(vfio_iommu_type1_info_dma_avail);
	OFFSETOF(vfio_iommu_type1_info_dma_avail, header);
	OFFSETOF(vfio_iommu_type1_info_dma_avail, avail);

	SIZEOF(vfio_iommu_type1_dma_map);
	OFFSETOF(vfio_iommu_type1_dma_map, argsz);
	OFFSETOF(vfio_iommu_type1_dma_map, flags);
	OFFSETOF(vfio_iommu_type1_dma_map, vaddr);
	OFFSETOF(vfio_iommu_type1_dma_map, iova);
	OFFSETOF(vfio_iommu_type1_dma_map, size);

	SIZEOF(vfio_iommu_type1_dma_unmap);
	OFFSETOF(vfio_iommu_type1_dma_unmap, argsz);
	OFFSETOF(vfio_iommu_type1_dma_unmap, flags);
	OFFSETOF(vfio_iommu_type1_dma_unmap, iova);
	OFFSETOF(vfio_iommu_type1_dma_unmap, size);
	OFFSETOF(vfio_iommu_type1_dma_unmap, data);
}

/* Hot reset by device cdev id (Linux 6.6). */
static void vfio_devid(void)
{
#ifdef VFIO_PCI_DEVID_OWNED
	VAL(VFIO_PCI_DEVID_OWNED);
	VAL(VFIO_PCI_DEVID_NOT_OWNED);
	OFFSETOF(vfio_pci_dependent_device, devid);
#endif
#ifdef VFIO_PCI_HOT_RESET_FLAG_DEV_ID
	VAL(VFIO_PCI_HOT_RESET_FLAG_DEV_ID);
	VAL(VFIO_PCI_HOT_RESET_FLAG_DEV_ID_OWNED);
#endif
}

/* Device cdev + iommufd (Linux 6.6), PASID attach (6.15), VF token on bind (6.17). */
static void vfio_cdev(void)
{
#ifdef VFIO_DEVICE_BIND_IOMMUFD
	VAL(VFIO_DEVICE_BIND_IOMMUFD);
	VAL(VFIO_DEVICE_ATTACH_IOMMUFD_PT);
	VAL(VFIO_DEVICE_DETACH_IOMMUFD_PT);

	OFFSETOF(vfio_device_bind_iommufd, argsz);
	OFFSETOF(vfio_device_bind_iommufd, flags);
	OFFSETOF(vfio_device_bind_iommufd, iommufd);
	OFFSETOF(vfio_device_bind_iommufd, out_devid);

	OFFSETOF(vfio_device_attach_iommufd_pt, argsz);
	OFFSETOF(vfio_device_attach_iommufd_pt, flags);
	OFFSETOF(vfio_device_attach_iommufd_pt, pt_id);

	OFFSETOF(vfio_device_detach_iommufd_pt, argsz);
	OFFSETOF(vfio_device_detach_iommufd_pt, flags);
#endif
#ifdef VFIO_DEVICE_BIND_FLAG_TOKEN
	VAL(VFIO_DEVICE_BIND_FLAG_TOKEN);
	OFFSETOF(vfio_device_bind_iommufd, token_uuid_ptr);
	SIZEOF(vfio_device_bind_iommufd);
#endif
#ifdef VFIO_DEVICE_ATTACH_PASID
	VAL(VFIO_DEVICE_ATTACH_PASID);
	OFFSETOF(vfio_device_attach_iommufd_pt, pasid);
	SIZEOF(vfio_device_attach_iommufd_pt);
#endif
#ifdef VFIO_DEVICE_DETACH_PASID
	VAL(VFIO_DEVICE_DETACH_PASID);
	OFFSETOF(vfio_device_detach_iommufd_pt, pasid);
	SIZEOF(vfio_device_detach_iommufd_pt);
#endif
}

/* iommufd (Linux 6.2). */
static void iommufd(void)
{
#ifdef HAVE_IOMMUFD
	VAL(IOMMUFD_TYPE);
	VAL(IOMMUFD_CMD_DESTROY);
	VAL(IOMMUFD_CMD_IOAS_ALLOC);
	VAL(IOMMUFD_CMD_IOAS_IOVA_RANGES);
	VAL(IOMMUFD_CMD_IOAS_MAP);
	VAL(IOMMUFD_CMD_IOAS_UNMAP);
	VAL(IOMMUFD_CMD_OPTION);

	VAL(IOMMU_DESTROY);
	VAL(IOMMU_IOAS_ALLOC);
	VAL(IOMMU_IOAS_IOVA_RANGES);
	VAL(IOMMU_IOAS_MAP);
	VAL(IOMMU_IOAS_UNMAP);
	VAL(IOMMU_OPTION);

	VAL(IOMMU_IOAS_MAP_FIXED_IOVA);
	VAL(IOMMU_IOAS_MAP_WRITEABLE);
	VAL(IOMMU_IOAS_MAP_READABLE);
	VAL(IOMMU_OPTION_RLIMIT_MODE);
	VAL(IOMMU_OPTION_HUGE_PAGES);
	VAL(IOMMU_OPTION_OP_SET);
	VAL(IOMMU_OPTION_OP_GET);

	SIZEOF(iommu_destroy);
	OFFSETOF(iommu_destroy, size);
	OFFSETOF(iommu_destroy, id);

	SIZEOF(iommu_ioas_alloc);
	OFFSETOF(iommu_ioas_alloc, size);
	OFFSETOF(iommu_ioas_alloc, flags);
	OFFSETOF(iommu_ioas_alloc, out_ioas_id);

	SIZEOF(iommu_iova_range);
	OFFSETOF(iommu_iova_range, start);
	OFFSETOF(iommu_iova_range, last);

	SIZEOF(iommu_ioas_iova_ranges);
	OFFSETOF(iommu_ioas_iova_ranges, size);
	OFFSETOF(iommu_ioas_iova_ranges, ioas_id);
	OFFSETOF(iommu_ioas_iova_ranges, num_iovas);
	OFFSETOF(iommu_ioas_iova_ranges, __reserved);
	OFFSETOF(iommu_ioas_iova_ranges, allowed_iovas);
	OFFSETOF(iommu_ioas_iova_ranges, out_iova_alignment);

	SIZEOF(iommu_ioas_map);
	OFFSETOF(iommu_ioas_map, size);
	OFFSETOF(iommu_ioas_map, flags);
	OFFSETOF(iommu_ioas_map, ioas_id);
	OFFSETOF(iommu_ioas_map, __reserved);
	OFFSETOF(iommu_ioas_map, user_va);
	OFFSETOF(iommu_ioas_map, length);
	OFFSETOF(iommu_ioas_map, iova);

	SIZEOF(iommu_ioas_unmap);
	OFFSETOF(iommu_ioas_unmap, size);
	OFFSETOF(iommu_ioas_unmap, ioas_id);
	OFFSETOF(iommu_ioas_unmap, iova);
	OFFSETOF(iommu_ioas_unmap, length);

	SIZEOF(iommu_option);
	OFFSETOF(iommu_option, size);
	OFFSETOF(iommu_option, option_id);
	OFFSETOF(iommu_option, op);
	OFFSETOF(iommu_option, __reserved);
	OFFSETOF(iommu_option, object_id);
	OFFSETOF(iommu_option, val64);
#endif
#ifdef IOMMU_IOAS_MAP_FILE /* Linux 6.13 */
	VAL(IOMMUFD_CMD_IOAS_MAP_FILE);
	VAL(IOMMU_IOAS_MAP_FILE);
	SIZEOF(iommu_ioas_map_file);
	OFFSETOF(iommu_ioas_map_file, size);
	OFFSETOF(iommu_ioas_map_file, flags);
	OFFSETOF(iommu_ioas_map_file, ioas_id);
	OFFSETOF(iommu_ioas_map_file, fd);
	OFFSETOF(iommu_ioas_map_file, start);
	OFFSETOF(iommu_ioas_map_file, length);
	OFFSETOF(iommu_ioas_map_file, iova);
#endif
}

/* dma-buf (sync and sync_file export: Linux 6.0), udmabuf (4.20), dma-heap (5.6). */
static void dmabuf(void)
{
	VAL(DMA_BUF_MAGIC);
	VAL(UDMABUF_FLAGS_CLOEXEC);
	VAL(UDMABUF_CREATE);
	VAL(UDMABUF_CREATE_LIST);
	SIZEOF(udmabuf_create);
	OFFSETOF(udmabuf_create, memfd);
	OFFSETOF(udmabuf_create, flags);
	OFFSETOF(udmabuf_create, offset);
	OFFSETOF(udmabuf_create, size);
	SIZEOF(udmabuf_create_item);
	OFFSETOF(udmabuf_create_item, memfd);
	OFFSETOF(udmabuf_create_item, __pad);
	OFFSETOF(udmabuf_create_item, offset);
	OFFSETOF(udmabuf_create_item, size);
	SIZEOF(udmabuf_create_list);
	OFFSETOF(udmabuf_create_list, flags);
	OFFSETOF(udmabuf_create_list, count);
	OFFSETOF(udmabuf_create_list, list);

	VAL(DMA_BUF_SYNC_READ);
	VAL(DMA_BUF_SYNC_WRITE);
	VAL(DMA_BUF_SYNC_RW);
	VAL(DMA_BUF_SYNC_START);
	VAL(DMA_BUF_SYNC_END);
	VAL(DMA_BUF_SYNC_VALID_FLAGS_MASK);
	VAL(DMA_BUF_BASE);
	VAL(DMA_BUF_IOCTL_SYNC);
	VAL(DMA_BUF_NAME_LEN);
	VAL(DMA_BUF_SET_NAME_B);
	VAL(DMA_BUF_IOCTL_EXPORT_SYNC_FILE);
	SIZEOF(dma_buf_sync);
	OFFSETOF(dma_buf_sync, flags);
	SIZEOF(dma_buf_export_sync_file);
	OFFSETOF(dma_buf_export_sync_file, flags);
	OFFSETOF(dma_buf_export_sync_file, fd);

	VAL(DMA_HEAP_VALID_FD_FLAGS);
	VAL(DMA_HEAP_VALID_HEAP_FLAGS);
	VAL(DMA_HEAP_IOC_MAGIC);
	VAL(DMA_HEAP_IOCTL_ALLOC);
	SIZEOF(dma_heap_allocation_data);
	OFFSETOF(dma_heap_allocation_data, len);
	OFFSETOF(dma_heap_allocation_data, fd);
	OFFSETOF(dma_heap_allocation_data, fd_flags);
	OFFSETOF(dma_heap_allocation_data, heap_flags);
}

static void pci(void)
{
	VAL(PCI_CFG_SPACE_SIZE);
	VAL(PCI_CFG_SPACE_EXP_SIZE);
	VAL(PCI_STD_HEADER_SIZEOF);
	VAL(PCI_STD_NUM_BARS);
	VAL(PCI_VENDOR_ID);
	VAL(PCI_DEVICE_ID);
	VAL(PCI_COMMAND);
	VAL(PCI_COMMAND_IO);
	VAL(PCI_COMMAND_MEMORY);
	VAL(PCI_COMMAND_MASTER);
	VAL(PCI_COMMAND_INTX_DISABLE);
	VAL(PCI_STATUS);
	VAL(PCI_STATUS_INTERRUPT);
	VAL(PCI_STATUS_CAP_LIST);
	VAL(PCI_CLASS_REVISION);
	VAL(PCI_REVISION_ID);
	VAL(PCI_CLASS_PROG);
	VAL(PCI_HEADER_TYPE);
	VAL(PCI_HEADER_TYPE_MASK);
	VAL(PCI_HEADER_TYPE_NORMAL);
	VAL(PCI_BASE_ADDRESS_0);
	VAL(PCI_BASE_ADDRESS_SPACE_IO);
	VAL(PCI_BASE_ADDRESS_MEM_TYPE_MASK);
	VAL(PCI_BASE_ADDRESS_MEM_TYPE_64);
	VAL(PCI_BASE_ADDRESS_MEM_PREFETCH);
	VAL(PCI_SUBSYSTEM_VENDOR_ID);
	VAL(PCI_SUBSYSTEM_ID);
	VAL(PCI_CAPABILITY_LIST);
	VAL(PCI_INTERRUPT_PIN);

	VAL(PCI_CAP_LIST_ID);
	VAL(PCI_CAP_LIST_NEXT);
	VAL(PCI_CAP_ID_PM);
	VAL(PCI_CAP_ID_MSI);
	VAL(PCI_CAP_ID_VNDR);
	VAL(PCI_CAP_ID_EXP);
	VAL(PCI_CAP_ID_MSIX);

	VAL(PCI_MSI_FLAGS);
	VAL(PCI_MSI_FLAGS_ENABLE);
	VAL(PCI_MSI_FLAGS_QMASK);
	VAL(PCI_MSI_FLAGS_QSIZE);
	VAL(PCI_MSI_FLAGS_64BIT);
	VAL(PCI_MSI_FLAGS_MASKBIT);

	VAL(PCI_MSIX_FLAGS);
	VAL(PCI_MSIX_FLAGS_QSIZE);
	VAL(PCI_MSIX_FLAGS_MASKALL);
	VAL(PCI_MSIX_FLAGS_ENABLE);
	VAL(PCI_MSIX_TABLE);
	VAL(PCI_MSIX_TABLE_BIR);
	VAL(PCI_MSIX_TABLE_OFFSET);
	VAL(PCI_MSIX_PBA);
	VAL(PCI_MSIX_ENTRY_SIZE);
	VAL(PCI_CAP_MSIX_SIZEOF);

	VAL(PCI_EXP_FLAGS);
	VAL(PCI_EXP_FLAGS_VERS);
	VAL(PCI_EXP_FLAGS_TYPE);
	VAL(PCI_EXP_DEVCAP);
	VAL(PCI_EXP_DEVCAP_FLR);
	VAL(PCI_EXP_DEVCTL);
	VAL(PCI_EXP_DEVCTL_PAYLOAD);
	VAL(PCI_EXP_DEVCTL_READRQ);
	VAL(PCI_EXP_LNKCAP);
	VAL(PCI_EXP_LNKCAP_SLS);
	VAL(PCI_EXP_LNKCAP_MLW);
	VAL(PCI_EXP_LNKSTA);
	VAL(PCI_EXP_LNKSTA_CLS);
	VAL(PCI_EXP_LNKSTA_NLW);

	/* Kernel-internal (include/linux/ioport.h); ABI of the sysfs `resource` file. No uapi header
	 * defines them today; compared only if one ever does. */
#ifdef IORESOURCE_IO
	VAL(IORESOURCE_IO);
#endif
#ifdef IORESOURCE_MEM
	VAL(IORESOURCE_MEM);
#endif
#ifdef IORESOURCE_PREFETCH
	VAL(IORESOURCE_PREFETCH);
#endif
#ifdef IORESOURCE_READONLY
	VAL(IORESOURCE_READONLY);
#endif
#ifdef IORESOURCE_MEM_64
	VAL(IORESOURCE_MEM_64);
#endif
#ifdef IORESOURCE_DISABLED
	VAL(IORESOURCE_DISABLED);
#endif
#ifdef IORESOURCE_UNSET
	VAL(IORESOURCE_UNSET);
#endif
}

static void mman(void)
{
	VAL(MAP_HUGETLB);
	VAL(MAP_POPULATE);
	VAL(MAP_LOCKED);
	VAL(MADV_DONTFORK);
	VAL(MADV_POPULATE_READ);
	VAL(MADV_POPULATE_WRITE);
	VAL(MAP_HUGE_SHIFT);
	VAL(MAP_HUGE_MASK);
	VAL(MAP_HUGE_2MB);
	VAL(MAP_HUGE_1GB);
	VAL(MFD_CLOEXEC);
	VAL(MFD_ALLOW_SEALING);
	VAL(MFD_HUGETLB);
	VAL(MFD_HUGE_SHIFT);
	VAL(MFD_HUGE_MASK);
	VAL(MFD_HUGE_2MB);
	VAL(MFD_HUGE_1GB);
	VAL(HUGETLBFS_MAGIC);

	VAL(MPOL_DEFAULT);
	VAL(MPOL_PREFERRED);
	VAL(MPOL_BIND);
	VAL(MPOL_INTERLEAVE);
	VAL(MPOL_LOCAL);
	VAL(MPOL_PREFERRED_MANY);
	VAL(MPOL_MF_STRICT);
	VAL(MPOL_MF_MOVE);
	VAL(MPOL_MF_MOVE_ALL);

	VAL(MEMBARRIER_CMD_QUERY);
	VAL(MEMBARRIER_CMD_GLOBAL);
	VAL(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
	VAL(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
	VAL(__NR_membarrier);
}

int main(void)
{
	VAL(LINUX_VERSION_CODE);
	vfio();
	vfio_devid();
	vfio_cdev();
	iommufd();
	dmabuf();
	pci();
	mman();
	return ferror(stdout) ? 1 : 0;
}
