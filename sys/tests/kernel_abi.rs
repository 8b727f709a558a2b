//! The ABI of `userdma-sys` against the kernel's own uapi headers.
//!
//! `tests/abi/abi.c` includes the uapi headers and prints every constant, ioctl number, struct size
//! and field offset this crate mirrors. This test compiles and runs it once per header set, and
//! compares each printed value with the one the crate has, from the table below:
//!
//! * a value that differs fails;
//! * an item of the table the headers lack fails, unless the headers are older than the kernel
//!   release that introduced it (and the headers having an item the table says is newer also fails,
//!   so the release numbers are checked too);
//! * an item the C program prints that the table lacks fails;
//! * an item that no header set was new enough to check fails: the system headers (Debian's
//!   `linux-libc-dev`, 6.1 on bookworm) lack iommufd and the device cdev ioctls, so run
//!   `scripts/uapi-headers.sh` and set `USERDMA_UAPI_INCLUDE` to the directories it prints
//!   (colon-separated).
//!
//! A missing C compiler or missing system headers fail the test with what to install.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use userdma_sys::{dmabuf, iommufd, membarrier, mman, pci, vfio};

/// `KERNEL_VERSION(a, b, c)` of `<linux/version.h>`.
const fn kv(a: u32, b: u32, c: u32) -> u32 {
    (a << 16) + (b << 8) + c
}

/// The oldest header set supported (Debian bookworm's linux-libc-dev). Items older than this are
/// all marked with it; only the release of newer items matters to the comparison.
const BASELINE: u32 = kv(6, 1, 0);
/// iommufd.
const V6_2: u32 = kv(6, 2, 0);
/// VFIO device cdev + iommufd, hot reset by device id, `pad` in the info structs ("vfio: align
/// capability structures").
const V6_6: u32 = kv(6, 6, 0);
/// `IOMMU_IOAS_MAP_FILE`.
const V6_13: u32 = kv(6, 13, 0);
/// PASID attach/detach of the device cdev.
const V6_15: u32 = kv(6, 15, 0);
/// VF token passed at BIND_IOMMUFD.
const V6_17: u32 = kv(6, 17, 0);

/// Where the kernel defines an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// A uapi header: the item must be printed by every header set from `since` on.
    Uapi,
    /// A kernel-internal header whose values are ABI through a file (sysfs `resource` flags):
    /// compared if some header defines it, not required.
    Internal,
}

#[derive(Debug)]
struct Item {
    value: i128,
    since: u32,
    origin: Origin,
}

#[derive(Default)]
struct Table {
    items: BTreeMap<String, Item>,
}

impl Table {
    fn add<T>(&mut self, name: &str, value: T, since: u32, origin: Origin)
    where
        T: TryInto<i128>,
        T::Error: fmt::Debug,
    {
        let value = value.try_into().expect("every ABI value fits in an i128");
        let old = self.items.insert(
            name.to_owned(),
            Item {
                value,
                since,
                origin,
            },
        );
        assert!(old.is_none(), "{name} is twice in the table");
    }
}

/// `consts!(t, SINCE => module::NAME, ...)`: constants and ioctl numbers, by their kernel names.
macro_rules! consts {
    ($t:ident, $since:expr => $($module:ident :: $name:ident),+ $(,)?) => {
        $( $t.add(stringify!($name), $module::$name, $since, Origin::Uapi); )+
    };
}

/// `layout!(t, module::struct @ SINCE [, size @ SINCE] { field [= "c name"] [@ SINCE], ... }
/// [nested { a.b [= "c name"] [@ SINCE], ... }])`: the struct's size and each field's offset.
///
/// A field's release defaults to the struct's; the size's release defaults to the newest field's
/// (VFIO and iommufd structs grow by appending fields). The top-level list must name every field of
/// the Rust struct (a destructuring pattern checks it at compile time); `nested` adds members of
/// anonymous unions.
macro_rules! layout {
    (
        $t:ident, $module:ident :: $ty:ident @ $since:ident $(, size @ $ssince:ident)?
        { $( $field:ident $(= $cname:literal)? $(@ $fsince:ident)? ),+ $(,)? }
        $(nested { $( $($path:ident).+ $(= $pname:literal)? $(@ $psince:ident)? ),+ $(,)? })?
    ) => {{
        // Fails to compile if the list above misses a field of the Rust struct.
        fn _every_field_listed(value: &$module::$ty) {
            let $module::$ty { $($field: _),+ } = value;
        }
        // `_` because a given `size @` release leaves it unused.
        let _newest: u32 = [$since $(, layout!(@or $since $(, $fsince)?))+]
            .into_iter()
            .max()
            .unwrap_or($since);
        $(
            let since: u32 = layout!(@or $since $(, $fsince)?);
            let name = format!(
                "offsetof:{}.{}",
                stringify!($ty),
                layout!(@or stringify!($field) $(, $cname)?)
            );
            $t.add(&name, offset_of!($module::$ty, $field), since, Origin::Uapi);
        )+
        $($(
            let since: u32 = layout!(@or $since $(, $psince)?);
            let name = format!(
                "offsetof:{}.{}",
                stringify!($ty),
                layout!(@or stringify!($($path).+) $(, $pname)?)
            );
            $t.add(&name, offset_of!($module::$ty, $($path).+), since, Origin::Uapi);
        )+)?
        let size_since: u32 = layout!(@or _newest $(, $ssince)?);
        $t.add(
            concat!("sizeof:", stringify!($ty)),
            size_of::<$module::$ty>(),
            size_since,
            Origin::Uapi,
        );
    }};
    (@or $default:expr) => { $default };
    (@or $default:expr, $given:expr) => { $given };
}

fn rust_table() -> Table {
    let mut t = Table::default();

    // ---- vfio ----
    consts!(t, BASELINE =>
        vfio::VFIO_API_VERSION, vfio::VFIO_TYPE, vfio::VFIO_BASE, vfio::VFIO_TYPE1_IOMMU,
        vfio::VFIO_TYPE1v2_IOMMU, vfio::VFIO_DMA_CC_IOMMU, vfio::VFIO_NOIOMMU_IOMMU,
        vfio::VFIO_UNMAP_ALL,
        vfio::VFIO_GROUP_FLAGS_VIABLE, vfio::VFIO_GROUP_FLAGS_CONTAINER_SET,
        vfio::VFIO_DEVICE_FLAGS_RESET, vfio::VFIO_DEVICE_FLAGS_PCI, vfio::VFIO_DEVICE_FLAGS_CAPS,
        vfio::VFIO_REGION_INFO_FLAG_READ, vfio::VFIO_REGION_INFO_FLAG_WRITE,
        vfio::VFIO_REGION_INFO_FLAG_MMAP, vfio::VFIO_REGION_INFO_FLAG_CAPS,
        vfio::VFIO_REGION_INFO_CAP_SPARSE_MMAP, vfio::VFIO_REGION_INFO_CAP_TYPE,
        vfio::VFIO_REGION_INFO_CAP_MSIX_MAPPABLE,
        vfio::VFIO_IRQ_INFO_EVENTFD, vfio::VFIO_IRQ_INFO_MASKABLE, vfio::VFIO_IRQ_INFO_AUTOMASKED,
        vfio::VFIO_IRQ_INFO_NORESIZE, vfio::VFIO_IRQ_SET_DATA_NONE, vfio::VFIO_IRQ_SET_DATA_BOOL,
        vfio::VFIO_IRQ_SET_DATA_EVENTFD, vfio::VFIO_IRQ_SET_ACTION_MASK,
        vfio::VFIO_IRQ_SET_ACTION_UNMASK, vfio::VFIO_IRQ_SET_ACTION_TRIGGER,
        vfio::VFIO_IRQ_SET_DATA_TYPE_MASK, vfio::VFIO_IRQ_SET_ACTION_TYPE_MASK,
        vfio::VFIO_PCI_BAR0_REGION_INDEX, vfio::VFIO_PCI_BAR1_REGION_INDEX,
        vfio::VFIO_PCI_BAR2_REGION_INDEX, vfio::VFIO_PCI_BAR3_REGION_INDEX,
        vfio::VFIO_PCI_BAR4_REGION_INDEX, vfio::VFIO_PCI_BAR5_REGION_INDEX,
        vfio::VFIO_PCI_ROM_REGION_INDEX, vfio::VFIO_PCI_CONFIG_REGION_INDEX,
        vfio::VFIO_PCI_VGA_REGION_INDEX, vfio::VFIO_PCI_NUM_REGIONS,
        vfio::VFIO_PCI_INTX_IRQ_INDEX, vfio::VFIO_PCI_MSI_IRQ_INDEX, vfio::VFIO_PCI_MSIX_IRQ_INDEX,
        vfio::VFIO_PCI_ERR_IRQ_INDEX, vfio::VFIO_PCI_REQ_IRQ_INDEX, vfio::VFIO_PCI_NUM_IRQS,
        vfio::VFIO_IOMMU_INFO_PGSIZES, vfio::VFIO_IOMMU_INFO_CAPS,
        vfio::VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, vfio::VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL,
        vfio::VFIO_DMA_MAP_FLAG_READ, vfio::VFIO_DMA_MAP_FLAG_WRITE, vfio::VFIO_DMA_UNMAP_FLAG_ALL,
        // ioctls
        vfio::VFIO_GET_API_VERSION, vfio::VFIO_CHECK_EXTENSION, vfio::VFIO_SET_IOMMU,
        vfio::VFIO_IOMMU_GET_INFO, vfio::VFIO_IOMMU_MAP_DMA, vfio::VFIO_IOMMU_UNMAP_DMA,
        vfio::VFIO_GROUP_GET_STATUS, vfio::VFIO_GROUP_SET_CONTAINER,
        vfio::VFIO_GROUP_UNSET_CONTAINER, vfio::VFIO_GROUP_GET_DEVICE_FD,
        vfio::VFIO_DEVICE_GET_INFO, vfio::VFIO_DEVICE_GET_REGION_INFO,
        vfio::VFIO_DEVICE_GET_IRQ_INFO, vfio::VFIO_DEVICE_SET_IRQS, vfio::VFIO_DEVICE_RESET,
        vfio::VFIO_DEVICE_GET_PCI_HOT_RESET_INFO, vfio::VFIO_DEVICE_PCI_HOT_RESET,
    );
    consts!(t, V6_6 =>
        vfio::VFIO_PCI_DEVID_OWNED, vfio::VFIO_PCI_DEVID_NOT_OWNED,
        vfio::VFIO_PCI_HOT_RESET_FLAG_DEV_ID, vfio::VFIO_PCI_HOT_RESET_FLAG_DEV_ID_OWNED,
        vfio::VFIO_DEVICE_BIND_IOMMUFD, vfio::VFIO_DEVICE_ATTACH_IOMMUFD_PT,
        vfio::VFIO_DEVICE_DETACH_IOMMUFD_PT,
    );
    consts!(t, V6_15 => vfio::VFIO_DEVICE_ATTACH_PASID, vfio::VFIO_DEVICE_DETACH_PASID);
    consts!(t, V6_17 => vfio::VFIO_DEVICE_BIND_FLAG_TOKEN);

    layout!(t, vfio::vfio_info_cap_header @ BASELINE { id, version, next });
    layout!(t, vfio::vfio_group_status @ BASELINE { argsz, flags });
    layout!(t, vfio::vfio_device_info @ BASELINE {
        argsz, flags, num_regions, num_irqs, cap_offset, pad @ V6_6,
    });
    layout!(t, vfio::vfio_region_info @ BASELINE {
        argsz, flags, index, cap_offset, size, offset,
    });
    layout!(t, vfio::vfio_region_sparse_mmap_area @ BASELINE { offset, size });
    layout!(t, vfio::vfio_region_info_cap_sparse_mmap @ BASELINE {
        header, nr_areas, reserved, areas,
    });
    layout!(t, vfio::vfio_region_info_cap_type @ BASELINE { header, type_ = "type", subtype });
    layout!(t, vfio::vfio_irq_info @ BASELINE { argsz, flags, index, count });
    layout!(t, vfio::vfio_irq_set @ BASELINE { argsz, flags, index, start, count, data });
    // The anonymous union { group_id; devid; } is at the offset C gives for group_id.
    layout!(t, vfio::vfio_pci_dependent_device @ BASELINE, size @ BASELINE {
        __bindgen_anon_1 = "group_id", segment, bus, devfn,
    } nested {
        __bindgen_anon_1.devid = "devid" @ V6_6,
    });
    layout!(t, vfio::vfio_pci_hot_reset_info @ BASELINE { argsz, flags, count, devices });
    layout!(t, vfio::vfio_pci_hot_reset @ BASELINE { argsz, flags, count, group_fds });
    layout!(t, vfio::vfio_iommu_type1_info @ BASELINE {
        argsz, flags, iova_pgsizes, cap_offset, pad @ V6_6,
    });
    layout!(t, vfio::vfio_iova_range @ BASELINE { start, end });
    layout!(t, vfio::vfio_iommu_type1_info_cap_iova_range @ BASELINE {
        header, nr_iovas, reserved, iova_ranges,
    });
    layout!(t, vfio::vfio_iommu_type1_info_dma_avail @ BASELINE { header, avail });
    layout!(t, vfio::vfio_iommu_type1_dma_map @ BASELINE { argsz, flags, vaddr, iova, size });
    layout!(t, vfio::vfio_iommu_type1_dma_unmap @ BASELINE { argsz, flags, iova, size, data });
    layout!(t, vfio::vfio_device_bind_iommufd @ V6_6 {
        argsz, flags, iommufd, out_devid, token_uuid_ptr @ V6_17,
    });
    layout!(t, vfio::vfio_device_attach_iommufd_pt @ V6_6 { argsz, flags, pt_id, pasid @ V6_15 });
    layout!(t, vfio::vfio_device_detach_iommufd_pt @ V6_6 { argsz, flags, pasid @ V6_15 });

    // ---- iommufd ----
    consts!(t, V6_2 =>
        iommufd::IOMMUFD_TYPE, iommufd::IOMMUFD_CMD_DESTROY, iommufd::IOMMUFD_CMD_IOAS_ALLOC,
        iommufd::IOMMUFD_CMD_IOAS_IOVA_RANGES, iommufd::IOMMUFD_CMD_IOAS_MAP,
        iommufd::IOMMUFD_CMD_IOAS_UNMAP, iommufd::IOMMUFD_CMD_OPTION,
        iommufd::IOMMU_DESTROY, iommufd::IOMMU_IOAS_ALLOC, iommufd::IOMMU_IOAS_IOVA_RANGES,
        iommufd::IOMMU_IOAS_MAP, iommufd::IOMMU_IOAS_UNMAP, iommufd::IOMMU_OPTION,
        iommufd::IOMMU_IOAS_MAP_FIXED_IOVA, iommufd::IOMMU_IOAS_MAP_WRITEABLE,
        iommufd::IOMMU_IOAS_MAP_READABLE, iommufd::IOMMU_OPTION_RLIMIT_MODE,
        iommufd::IOMMU_OPTION_HUGE_PAGES, iommufd::IOMMU_OPTION_OP_SET,
        iommufd::IOMMU_OPTION_OP_GET,
    );
    layout!(t, iommufd::iommu_destroy @ V6_2 { size, id });
    layout!(t, iommufd::iommu_ioas_alloc @ V6_2 { size, flags, out_ioas_id });
    layout!(t, iommufd::iommu_iova_range @ V6_2 { start, last });
    layout!(t, iommufd::iommu_ioas_iova_ranges @ V6_2 {
        size, ioas_id, num_iovas, __reserved, allowed_iovas, out_iova_alignment,
    });
    layout!(t, iommufd::iommu_ioas_map @ V6_2 {
        size, flags, ioas_id, __reserved, user_va, length, iova,
    });
    consts!(t, V6_13 => iommufd::IOMMUFD_CMD_IOAS_MAP_FILE, iommufd::IOMMU_IOAS_MAP_FILE);
    layout!(t, iommufd::iommu_ioas_map_file @ V6_13 {
        size, flags, ioas_id, fd, start, length, iova,
    });
    layout!(t, iommufd::iommu_ioas_unmap @ V6_2 { size, ioas_id, iova, length });

    // ---- dma-buf, udmabuf, dma-heap ----
    consts!(t, BASELINE =>
        dmabuf::DMA_BUF_MAGIC, dmabuf::UDMABUF_FLAGS_CLOEXEC, dmabuf::UDMABUF_CREATE, dmabuf::UDMABUF_CREATE_LIST,
        dmabuf::DMA_BUF_SYNC_READ, dmabuf::DMA_BUF_SYNC_WRITE, dmabuf::DMA_BUF_SYNC_RW,
        dmabuf::DMA_BUF_SYNC_START, dmabuf::DMA_BUF_SYNC_END,
        dmabuf::DMA_BUF_SYNC_VALID_FLAGS_MASK, dmabuf::DMA_BUF_BASE, dmabuf::DMA_BUF_IOCTL_SYNC,
        dmabuf::DMA_BUF_NAME_LEN, dmabuf::DMA_BUF_IOCTL_EXPORT_SYNC_FILE,
        dmabuf::DMA_HEAP_VALID_FD_FLAGS, dmabuf::DMA_HEAP_VALID_HEAP_FLAGS,
        dmabuf::DMA_HEAP_IOC_MAGIC, dmabuf::DMA_HEAP_IOCTL_ALLOC,
    );
    t.add(
        "DMA_BUF_SET_NAME_B",
        dmabuf::DMA_BUF_SET_NAME,
        BASELINE,
        Origin::Uapi,
    );
    layout!(t, dmabuf::udmabuf_create @ BASELINE { memfd, flags, offset, size });
    layout!(t, dmabuf::udmabuf_create_item @ BASELINE { memfd, __pad, offset, size });
    layout!(t, dmabuf::udmabuf_create_list @ BASELINE { flags, count, list });
    layout!(t, dmabuf::dma_buf_sync @ BASELINE { flags });
    layout!(t, dmabuf::dma_buf_export_sync_file @ BASELINE { flags, fd });
    layout!(t, dmabuf::dma_heap_allocation_data @ BASELINE { len, fd, fd_flags, heap_flags });
    layout!(t, iommufd::iommu_option @ V6_2 {
        size, option_id, op, __reserved, object_id, val64,
    });

    // ---- pci ----
    consts!(t, BASELINE =>
        pci::PCI_CFG_SPACE_SIZE, pci::PCI_CFG_SPACE_EXP_SIZE, pci::PCI_STD_HEADER_SIZEOF,
        pci::PCI_STD_NUM_BARS, pci::PCI_VENDOR_ID, pci::PCI_DEVICE_ID, pci::PCI_COMMAND,
        pci::PCI_COMMAND_IO, pci::PCI_COMMAND_MEMORY, pci::PCI_COMMAND_MASTER,
        pci::PCI_COMMAND_INTX_DISABLE, pci::PCI_STATUS, pci::PCI_STATUS_INTERRUPT,
        pci::PCI_STATUS_CAP_LIST, pci::PCI_CLASS_REVISION, pci::PCI_REVISION_ID,
        pci::PCI_CLASS_PROG, pci::PCI_HEADER_TYPE,
        pci::PCI_HEADER_TYPE_MASK, pci::PCI_HEADER_TYPE_NORMAL, pci::PCI_BASE_ADDRESS_0,
        pci::PCI_BASE_ADDRESS_SPACE_IO, pci::PCI_BASE_ADDRESS_MEM_TYPE_MASK,
        pci::PCI_BASE_ADDRESS_MEM_TYPE_64, pci::PCI_BASE_ADDRESS_MEM_PREFETCH,
        pci::PCI_SUBSYSTEM_VENDOR_ID, pci::PCI_SUBSYSTEM_ID, pci::PCI_CAPABILITY_LIST,
        pci::PCI_INTERRUPT_PIN,
        pci::PCI_CAP_LIST_ID, pci::PCI_CAP_LIST_NEXT, pci::PCI_CAP_ID_PM, pci::PCI_CAP_ID_MSI,
        pci::PCI_CAP_ID_VNDR, pci::PCI_CAP_ID_EXP, pci::PCI_CAP_ID_MSIX,
        pci::PCI_MSI_FLAGS, pci::PCI_MSI_FLAGS_ENABLE, pci::PCI_MSI_FLAGS_QMASK,
        pci::PCI_MSI_FLAGS_QSIZE, pci::PCI_MSI_FLAGS_64BIT, pci::PCI_MSI_FLAGS_MASKBIT,
        pci::PCI_MSIX_FLAGS, pci::PCI_MSIX_FLAGS_QSIZE, pci::PCI_MSIX_FLAGS_MASKALL,
        pci::PCI_MSIX_FLAGS_ENABLE, pci::PCI_MSIX_TABLE, pci::PCI_MSIX_TABLE_BIR,
        pci::PCI_MSIX_TABLE_OFFSET, pci::PCI_MSIX_PBA, pci::PCI_MSIX_ENTRY_SIZE,
        pci::PCI_CAP_MSIX_SIZEOF,
        pci::PCI_EXP_FLAGS, pci::PCI_EXP_FLAGS_VERS, pci::PCI_EXP_FLAGS_TYPE,
        pci::PCI_EXP_DEVCAP, pci::PCI_EXP_DEVCAP_FLR, pci::PCI_EXP_DEVCTL,
        pci::PCI_EXP_DEVCTL_PAYLOAD, pci::PCI_EXP_DEVCTL_READRQ,
        pci::PCI_EXP_LNKCAP, pci::PCI_EXP_LNKCAP_SLS, pci::PCI_EXP_LNKCAP_MLW,
        pci::PCI_EXP_LNKSTA, pci::PCI_EXP_LNKSTA_CLS, pci::PCI_EXP_LNKSTA_NLW,
    );
    // include/linux/ioport.h is not uapi: these are compared only if a header ever defines them.
    for (name, value) in [
        ("IORESOURCE_IO", pci::IORESOURCE_IO),
        ("IORESOURCE_MEM", pci::IORESOURCE_MEM),
        ("IORESOURCE_PREFETCH", pci::IORESOURCE_PREFETCH),
        ("IORESOURCE_READONLY", pci::IORESOURCE_READONLY),
        ("IORESOURCE_MEM_64", pci::IORESOURCE_MEM_64),
        ("IORESOURCE_DISABLED", pci::IORESOURCE_DISABLED),
        ("IORESOURCE_UNSET", pci::IORESOURCE_UNSET),
    ] {
        t.add(name, value, BASELINE, Origin::Internal);
    }

    // ---- mman ----
    consts!(t, BASELINE =>
        mman::MAP_HUGETLB, mman::MAP_POPULATE, mman::MAP_LOCKED, mman::MADV_DONTFORK,
        mman::MADV_POPULATE_READ, mman::MADV_POPULATE_WRITE, mman::MAP_HUGE_SHIFT,
        mman::MAP_HUGE_MASK, mman::MAP_HUGE_2MB, mman::MAP_HUGE_1GB,
        mman::MFD_CLOEXEC, mman::MFD_ALLOW_SEALING, mman::MFD_HUGETLB, mman::MFD_HUGE_SHIFT,
        mman::MFD_HUGE_MASK, mman::MFD_HUGE_2MB, mman::MFD_HUGE_1GB, mman::HUGETLBFS_MAGIC,
        mman::MPOL_DEFAULT, mman::MPOL_PREFERRED, mman::MPOL_BIND, mman::MPOL_INTERLEAVE,
        mman::MPOL_LOCAL, mman::MPOL_PREFERRED_MANY, mman::MPOL_MF_STRICT, mman::MPOL_MF_MOVE,
        mman::MPOL_MF_MOVE_ALL,
    );

    // ---- membarrier ----
    consts!(t, BASELINE =>
        membarrier::MEMBARRIER_CMD_QUERY, membarrier::MEMBARRIER_CMD_GLOBAL,
        membarrier::MEMBARRIER_CMD_PRIVATE_EXPEDITED,
        membarrier::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
    );
    // libc names the system call number SYS_membarrier; the kernel's header __NR_membarrier.
    t.add(
        "__NR_membarrier",
        membarrier::SYS_membarrier,
        BASELINE,
        Origin::Uapi,
    );

    t
}

/// `major.minor.patch` of a `LINUX_VERSION_CODE`.
fn version(code: u32) -> String {
    format!("{}.{}.{}", code >> 16, (code >> 8) & 0xff, code & 0xff)
}

/// One set of uapi headers: `None` is the compiler's default (the system's `/usr/include`).
struct HeaderSet {
    label: String,
    include: Option<PathBuf>,
}

/// What one header set said: its version and every `NAME VALUE` line.
struct CItems {
    version: u32,
    values: BTreeMap<String, i128>,
}

fn compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_owned())
}

/// Compiles `abi.c` against one header set and runs it.
fn run_c(set: &HeaderSet, index: usize) -> Result<CItems, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abi/abi.c");
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel_abi");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let binary = out_dir.join(format!("abi-{index}"));

    let cc = compiler();
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&binary);
    if let Some(dir) = &set.include {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg(&source);
    let output = cmd.output().map_err(|e| {
        format!(
            "cannot run the C compiler `{cc}` ({e}): install one (apt-get install gcc) or set CC"
        )
    })?;
    if !output.status.success() {
        return Err(format!(
            "{cc} failed to compile tests/abi/abi.c against {}:\n{}",
            set.label,
            String::from_utf8_lossy(&output.stderr)
        ));
    }

    let output = Command::new(&binary)
        .output()
        .map_err(|e| format!("running {}: {e}", binary.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} exited with {}",
            binary.display(),
            output.status
        ));
    }
    let stdout =
        String::from_utf8(output.stdout).map_err(|e| format!("abi output is not UTF-8: {e}"))?;

    let mut values = BTreeMap::new();
    for line in stdout.lines() {
        let (name, value) = line
            .split_once(' ')
            .ok_or_else(|| format!("malformed abi output line {line:?}"))?;
        let value: i128 = value
            .parse()
            .map_err(|e| format!("malformed value in abi output line {line:?}: {e}"))?;
        if values.insert(name.to_owned(), value).is_some() {
            return Err(format!("abi.c prints {name} twice"));
        }
    }
    let code = values
        .remove("LINUX_VERSION_CODE")
        .ok_or("abi output lacks LINUX_VERSION_CODE")?;
    let version = u32::try_from(code).map_err(|_| format!("bad LINUX_VERSION_CODE {code}"))?;
    Ok(CItems { version, values })
}

/// The outcome of comparing one header set.
#[derive(Default)]
struct Report {
    compared: BTreeSet<String>,
    errors: Vec<String>,
}

fn compare(set: &HeaderSet, table: &Table, c: &CItems, report: &mut Report) -> String {
    let hv = c.version;
    let mut compared = 0usize;
    let mut newer = Vec::new();
    let mut internal = 0usize;

    for (name, item) in &table.items {
        match (c.values.get(name), item.origin) {
            (Some(&value), _) => {
                if item.origin == Origin::Uapi && item.since > hv {
                    report.errors.push(format!(
                        "{}: {name} is in these {} headers, but the table says it appeared in {}: \
                         fix its release in tests/kernel_abi.rs",
                        set.label,
                        version(hv),
                        version(item.since)
                    ));
                }
                if value != item.value {
                    report.errors.push(format!(
                        "{}: {name} is {value} ({value:#x}) in the kernel headers but {} ({:#x}) in \
                         userdma-sys",
                        set.label, item.value, item.value
                    ));
                }
                compared += 1;
                report.compared.insert(name.clone());
            }
            (None, Origin::Internal) => internal += 1,
            (None, Origin::Uapi) if item.since > hv => newer.push(name.as_str()),
            (None, Origin::Uapi) => report.errors.push(format!(
                "{}: {name} (Linux {} per the table) is missing from these {} headers: \
                 abi.c does not print it, or the table has the wrong release",
                set.label,
                version(item.since),
                version(hv)
            )),
        }
    }
    for name in c.values.keys() {
        if !table.items.contains_key(name) {
            report.errors.push(format!(
                "{}: abi.c prints {name}, which the table in tests/kernel_abi.rs lacks",
                set.label
            ));
        }
    }

    let mut line = format!(
        "kernel ABI: {} (Linux {}): compared {compared} items",
        set.label,
        version(hv)
    );
    if !newer.is_empty() {
        let _ = write!(line, ", {} newer than these headers", newer.len());
    }
    if internal > 0 {
        let _ = write!(line, ", {internal} kernel-internal not in any uapi header");
    }
    line
}

fn header_sets() -> Result<Vec<HeaderSet>, String> {
    if !Path::new("/usr/include/linux/version.h").exists()
        || !Path::new("/usr/include/linux/vfio.h").exists()
    {
        return Err(
            "the system's Linux uapi headers are missing (/usr/include/linux/vfio.h): \
                    apt-get install linux-libc-dev"
                .to_owned(),
        );
    }
    let mut sets = vec![HeaderSet {
        label: "system /usr/include".to_owned(),
        include: None,
    }];
    if let Some(dirs) = std::env::var_os("USERDMA_UAPI_INCLUDE") {
        let dirs = dirs
            .into_string()
            .map_err(|_| "USERDMA_UAPI_INCLUDE is not UTF-8".to_owned())?;
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            let path = PathBuf::from(dir);
            if !path.join("linux/vfio.h").is_file() || !path.join("linux/version.h").is_file() {
                return Err(format!(
                    "USERDMA_UAPI_INCLUDE entry {dir} has no linux/vfio.h and linux/version.h: \
                     it must be a uapi include directory, as scripts/uapi-headers.sh prints"
                ));
            }
            sets.push(HeaderSet {
                label: dir.to_owned(),
                include: Some(path),
            });
        }
    }
    Ok(sets)
}

#[test]
fn kernel_abi_matches_uapi_headers() {
    let table = rust_table();
    let sets = header_sets().unwrap_or_else(|e| panic!("{e}"));

    let mut report = Report::default();
    let mut summary = Vec::new();
    let mut newest = 0;
    for (index, set) in sets.iter().enumerate() {
        let c = run_c(set, index).unwrap_or_else(|e| panic!("{e}"));
        if c.version < BASELINE {
            report.errors.push(format!(
                "{}: headers of Linux {} are older than the oldest supported ({})",
                set.label,
                version(c.version),
                version(BASELINE)
            ));
        }
        newest = newest.max(c.version);
        summary.push(compare(set, &table, &c, &mut report));
    }

    // Items no header set was new enough to check, grouped by the release that introduced them.
    let mut unchecked: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for (name, item) in &table.items {
        if item.origin == Origin::Uapi && !report.compared.contains(name) {
            unchecked.entry(item.since).or_default().push(name);
        }
    }
    if !unchecked.is_empty() {
        let mut by_release = String::new();
        for (since, names) in &unchecked {
            let shown: Vec<&str> = names.iter().copied().take(4).collect();
            let more = names.len() - shown.len();
            let _ = write!(
                by_release,
                "\n      Linux {}: {} items ({}{})",
                version(*since),
                names.len(),
                shown.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            );
        }
        report.errors.push(format!(
            "no header set given is new enough to check every item (the newest is Linux {}). \
             Run scripts/uapi-headers.sh and set USERDMA_UAPI_INCLUDE to the directories it prints:\n      \
             USERDMA_UAPI_INCLUDE=\"$(scripts/uapi-headers.sh | tail -n 1)\" cargo test -p userdma-sys\n    \
             Not checked:{by_release}",
            version(newest),
        ));
    }

    // Shown even when the test passes (libtest captures only the print macros).
    let mut stderr = std::io::stderr().lock();
    for line in &summary {
        let _ = writeln!(stderr, "{line}");
    }
    drop(stderr);

    assert!(
        report.errors.is_empty(),
        "userdma-sys disagrees with the kernel uapi headers:\n  - {}",
        report.errors.join("\n  - ")
    );
}
