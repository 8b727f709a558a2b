/* Drives QEMU's edu device (1234:11e8) through VFIO from C: its registers through the BAR
 * calls, its DMA engine with buffers from a pool and a mapping of the library's. A round
 * trip host -> edu -> another host buffer, each transfer ending with an MSI on the device's
 * interrupt fd, then one more edu -> host transfer into a mapping, ended by polling edu's
 * command register; every byte checked, and the bytes after each destination checked
 * untouched.
 *
 *   cc -std=c11 edu_dma.c $(pkg-config --cflags --libs userdma)
 *   userdma bind 0000:00:03.0 --driver vfio-pci && ./a.out 0000:00:03.0 [--allow-noiommu]
 *
 * Prints one line, "edu-dma: BDF ok: ...", and exits 0; on a failed call it prints the
 * library's message and exits 1; 2 for bad arguments; 3 when bytes came back wrong.
 *
 * edu (QEMU docs/specs/edu.rst): BAR 0 holds its registers; its DMA engine copies between
 * host memory (by the address the device uses: an IOVA behind an IOMMU) and a 4 KiB buffer
 * at 0x40000 in its own address space, one transfer at a time, and its DMA mask is 28 bits.
 * QEMU 7.2 checks a transfer's end off by one (and aborts on a transfer that reaches the
 * buffer's last byte), so transfers stay within its first 4095 bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <userdma.h>

/* edu's registers (offsets in BAR 0). */
enum {
	EDU_ID = 0x00,
	EDU_LIVENESS = 0x04,
	EDU_IRQ_STATUS = 0x24,
	EDU_IRQ_ACK = 0x64,
	EDU_DMA_SRC = 0x80,
	EDU_DMA_DST = 0x88,
	EDU_DMA_COUNT = 0x90,
	EDU_DMA_CMD = 0x98,
};
enum {
	DMA_START = 1,   /* set while a transfer runs */
	DMA_TO_RAM = 2,  /* direction: edu's buffer to host memory */
	DMA_IRQ = 4,     /* raise the interrupt (status bit IRQ_DMA) when done */
	IRQ_DMA = 0x100,
};
static const uint64_t EDU_BUFFER = 0x40000;
static const uint64_t BAR0_LEN = 1 << 20;
enum { DMA_MASK_BITS = 28, LEN = 4000, GUARD = 256, CANARY = 0xc3 };
/* A transfer ends about 100 ms after it starts; the margin covers software emulation. */
enum { TIMEOUT_MS = 10000 };

enum { EXIT_CALL = 1, EXIT_USAGE = 2, EXIT_DATA = 3 };

#define TRY(call)                                                                          \
	do {                                                                                   \
		enum udma_status s_ = (call);                                                      \
		if (s_ != UDMA_OK) {                                                               \
			fprintf(stderr, "edu-dma: %s failed: %s: %s\n", #call, udma_status_name(s_),   \
				udma_last_error());                                                        \
			exit(EXIT_CALL);                                                               \
		}                                                                                  \
	} while (0)

static void fail(int code, const char *what)
{
	fprintf(stderr, "edu-dma: %s\n", what);
	exit(code);
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
	struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

/* Polls the command register until no transfer runs. */
static void wait_idle(udma_device *dev, const char *when)
{
	uint64_t start = now_ms();
	for (;;) {
		uint64_t cmd = 0;
		TRY(udma_device_read64(dev, 0, EDU_DMA_CMD, &cmd));
		if (cmd == UINT64_MAX)
			fail(EXIT_CALL, "the DMA command register reads all-ones: the device is gone");
		if ((cmd & DMA_START) == 0)
			return;
		if (now_ms() - start > TIMEOUT_MS) {
			fprintf(stderr, "edu-dma: the DMA engine is still busy %s after %d ms\n", when,
				TIMEOUT_MS);
			exit(EXIT_CALL);
		}
		sleep_ms(1);
	}
}

/* Starts a transfer of `len` bytes between edu's buffer and `addr` (a device address). */
static void start(udma_device *dev, int to_ram, uint64_t addr, uint64_t len, int irq)
{
	if (len < 1 || len > 4095 || ((addr + len - 1) >> DMA_MASK_BITS) != 0)
		fail(EXIT_USAGE, "a transfer is 1 to 4095 bytes below edu's 28-bit DMA mask");
	wait_idle(dev, "before a transfer");
	uint64_t src = to_ram ? EDU_BUFFER : addr;
	uint64_t dst = to_ram ? addr : EDU_BUFFER;
	uint64_t cmd = DMA_START | (to_ram ? DMA_TO_RAM : 0) | (irq ? DMA_IRQ : 0);
	TRY(udma_device_write64(dev, 0, EDU_DMA_SRC, src));
	TRY(udma_device_write64(dev, 0, EDU_DMA_DST, dst));
	TRY(udma_device_write64(dev, 0, EDU_DMA_COUNT, len));
	/* The bytes the device reads were stored before the write that starts it. */
	atomic_thread_fence(memory_order_release);
	TRY(udma_device_write64(dev, 0, EDU_DMA_CMD, cmd));
}

/* Waits for the interrupt that ends a transfer started with DMA_IRQ, and acknowledges it. */
static void wait_irq(udma_device *dev, int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int n = poll(&p, 1, TIMEOUT_MS);
	if (n != 1) {
		uint32_t status = 0;
		TRY(udma_device_read32(dev, 0, EDU_IRQ_STATUS, &status));
		fprintf(stderr, "edu-dma: no interrupt within %d ms (edu interrupt status %#" PRIx32 ")\n",
			TIMEOUT_MS, status);
		exit(EXIT_CALL);
	}
	uint64_t count = 0;
	if (read(fd, &count, sizeof count) != (ssize_t)sizeof count || count == 0)
		fail(EXIT_CALL, "reading the interrupt eventfd failed");
	/* The bytes the device wrote are read after the interrupt that says they are there. */
	atomic_thread_fence(memory_order_acquire);
	uint32_t status = 0;
	TRY(udma_device_read32(dev, 0, EDU_IRQ_STATUS, &status));
	if ((status & IRQ_DMA) == 0) {
		fprintf(stderr, "edu-dma: interrupt status %#" PRIx32 " lacks the DMA bit %#x\n", status,
			IRQ_DMA);
		exit(EXIT_CALL);
	}
	TRY(udma_device_write32(dev, 0, EDU_IRQ_ACK, status));
}

/* The first difference between `want` and `got`, or -1. */
static long differs(const unsigned char *want, const unsigned char *got, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (want[i] != got[i])
			return (long)i;
	return -1;
}

static void check_bytes(const char *what, const unsigned char *want, const unsigned char *got)
{
	long at = differs(want, got, LEN);
	if (at >= 0) {
		fprintf(stderr, "edu-dma: %s: byte %ld is %#x, want %#x\n", what, at, got[at],
			want[at]);
		exit(EXIT_DATA);
	}
	for (size_t i = LEN; i < LEN + GUARD; i++)
		if (got[i] != CANARY) {
			fprintf(stderr, "edu-dma: %s: the device wrote byte %zu, past the transfer\n",
				what, i);
			exit(EXIT_DATA);
		}
}

int main(int argc, char **argv)
{
	if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "--allow-noiommu") != 0)) {
		fprintf(stderr, "usage: %s BDF [--allow-noiommu]\n", argv[0]);
		return EXIT_USAGE;
	}
	const char *bdf = argv[1];
	if (udma_version() >> 16 != UDMA_VERSION_MAJOR)
		fail(EXIT_CALL, "the library's major version is not the header's");

	udma_pci_options po = {.size = sizeof po, .backend = UDMA_PCI_VFIO,
			       .dma_mask_bits = DMA_MASK_BITS, .irq_kind = UDMA_IRQ_MSI,
			       .irq_count = 1, .flags = argc == 3 ? UDMA_PCI_ALLOW_NOIOMMU : 0};
	udma_device *dev;
	TRY(udma_device_open_pci(bdf, &po, &dev));

	/* The registers: edu's ID, and its liveness register, which reads back the complement. */
	udma_bar_info bar = {.size = sizeof bar};
	TRY(udma_device_get_bar(dev, 0, &bar));
	if (bar.len < BAR0_LEN)
		fail(EXIT_CALL, "BAR 0 is smaller than edu's 1 MiB");
	uint32_t id = 0, live = 0;
	TRY(udma_device_read32(dev, 0, EDU_ID, &id));
	if ((id & 0xff) != 0xed)
		fail(EXIT_CALL, "the ID register's low byte is not 0xed: is this edu?");
	TRY(udma_device_write32(dev, 0, EDU_LIVENESS, 0x12345678u));
	TRY(udma_device_read32(dev, 0, EDU_LIVENESS, &live));
	if (live != ~0x12345678u)
		fail(EXIT_CALL, "the liveness register does not read back the complement");

	/* Nothing pending from before: each interrupt counted below is a transfer's. */
	int fd;
	TRY(udma_device_interrupt_fd(dev, 0, &fd));
	uint32_t pending = 0;
	TRY(udma_device_read32(dev, 0, EDU_IRQ_STATUS, &pending));
	if (pending != 0)
		TRY(udma_device_write32(dev, 0, EDU_IRQ_ACK, pending));
	struct pollfd quiet = {.fd = fd, .events = POLLIN};
	if (poll(&quiet, 1, 0) == 1) {
		uint64_t stale;
		if (read(fd, &stale, sizeof stale) != (ssize_t)sizeof stale)
			fail(EXIT_CALL, "draining the interrupt eventfd failed");
	}

	/* Host memory in the device's DMA space: a pool's buffers and a mapping of our own. */
	udma_pool_options pool_o = {.size = sizeof pool_o, .bytes = 2 << 20,
				    .page_size = UDMA_PAGE_2M};
	udma_pool *pool;
	TRY(udma_pool_create(dev, &pool_o, &pool));
	/* Both of one size: one size class of the pool (a 2 MiB pool has room for one slab). */
	udma_buffer *src, *dst;
	TRY(udma_pool_alloc(pool, LEN + GUARD, &src));
	TRY(udma_pool_alloc(pool, LEN + GUARD, &dst));
	udma_buffer_info si = {.size = sizeof si}, di = {.size = sizeof di};
	TRY(udma_buffer_get_info(src, &si));
	TRY(udma_buffer_get_info(dst, &di));
	udma_mapping *map;
	TRY(udma_memory_map(dev, 2 << 20, UDMA_PAGE_2M, &map));
	udma_mapping_info mi = {.size = sizeof mi};
	TRY(udma_mapping_get_info(map, &mi));
	uint64_t map_iova = 0, contiguous = 0;
	TRY(udma_mapping_iova(map, 4096, &map_iova, &contiguous));
	if (contiguous < LEN + GUARD)
		fail(EXIT_CALL, "the mapping is not contiguous for the device at offset 4096");

	unsigned char *want = si.host, *back = di.host, *mapped = (unsigned char *)mi.host + 4096;
	uint32_t state = 0x9e3779b9u;
	for (size_t i = 0; i < LEN; i++) {
		state ^= state << 13;
		state ^= state >> 17;
		state ^= state << 5;
		want[i] = (unsigned char)(state >> 8);
	}
	memset(back, CANARY, LEN + GUARD);
	memset(mapped, CANARY, LEN + GUARD);

	/* Host -> edu and edu -> another host buffer, each ended by the MSI. */
	start(dev, 0, si.iova, LEN, 1);
	wait_irq(dev, fd);
	start(dev, 1, di.iova, LEN, 1);
	wait_irq(dev, fd);
	check_bytes("host -> edu -> pool buffer", want, back);
	/* edu -> the mapping, ended by polling the command register. */
	start(dev, 1, map_iova, LEN, 0);
	wait_idle(dev, "for the transfer into the mapping");
	atomic_thread_fence(memory_order_acquire);
	check_bytes("edu -> mapping", want, mapped);

	TRY(udma_pool_free(pool, src));
	TRY(udma_pool_free(pool, dst));
	TRY(udma_pool_destroy(pool));
	TRY(udma_mapping_destroy(map));
	close(fd);
	TRY(udma_device_close(dev));
	printf("edu-dma: %s ok: %d bytes host %#" PRIx64 " -> edu -> host %#" PRIx64
	       " (2 interrupts), edu -> mapping %#" PRIx64 " (polled); ID %#010" PRIx32 "\n",
	       bdf, LEN, si.iova, di.iova, map_iova, id);
	return EXIT_SUCCESS;
}
