/* The C API's interop calls on a machine with or without udmabuf: fences (create, signal,
 * wait, time out, refuse what is not one), descriptors passed between two ends of a socket
 * (a mapping's memory and a fence, every malformed request refused), a pipeline frame's
 * fence, access modes of the caller's memory, and dma-buf export, import and lookup: what
 * works where the kernel has udmabuf and the error that names it where not. Built and run
 * as capi_test.c is (scripts/capi-test.sh). The kernel's dma-buf side (vivid capturing into
 * an export, the system heap) is the guest suite's. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static int closed(int fd)
{
	return fcntl(fd, F_GETFD) < 0 && errno == EBADF;
}

static void test_fences(void)
{
	int fd = -1;
	OK(udma_fence_create(&fd));
	CHECK(fd >= 0);
	FAILS(udma_fence_wait(fd, 0), UDMA_ERR_TIMEOUT, "not signalled");
	FAILS(udma_fence_wait(fd, 5000000), UDMA_ERR_TIMEOUT, "not signalled");
	OK(udma_fence_signal(fd));
	OK(udma_fence_signal(fd));
	OK(udma_fence_wait(fd, 0));
	OK(udma_fence_wait(fd, UINT64_MAX));
	CHECK(!closed(fd)); /* the caller's descriptor stays the caller's */
	close(fd);

	int p[2];
	CHECK(pipe2(p, O_CLOEXEC) == 0);
	FAILS(udma_fence_signal(p[0]), UDMA_ERR_INVALID_ARGUMENT, "another driver's");
	FAILS(udma_fence_wait(p[0], 0), UDMA_ERR_TIMEOUT, "not signalled");
	CHECK(write(p[1], "x", 1) == 1);
	OK(udma_fence_wait(p[0], SECOND)); /* any readable descriptor is a signalled fence */
	close(p[0]);
	close(p[1]);

	FAILS(udma_fence_signal(-1), UDMA_ERR_INVALID_ARGUMENT, "not a file descriptor");
	FAILS(udma_fence_wait(1000000, 0), UDMA_ERR_INVALID_ARGUMENT, "not an open file descriptor");
	FAILS(udma_fence_create(NULL), UDMA_ERR_INVALID_ARGUMENT, "fd is NULL");
}

static void test_share(void)
{
	udma_device *dev = loopback();
	udma_mapping *m = NULL;
	OK(udma_memory_map(dev, 8192, UDMA_PAGE_BASE, &m));
	udma_mapping_info info = {.size = sizeof info};
	OK(udma_mapping_get_info(m, &info));
	int memfd = -1, fence = -1;
	OK(udma_mapping_fd(m, &memfd));
	OK(udma_fence_create(&fence));

	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
	udma_share_item items[2] = {
		{.kind = UDMA_SHARE_REGION, .fd = memfd, .len = 8192, .page_size = UDMA_PAGE_BASE},
		{.kind = UDMA_SHARE_FENCE, .fd = fence},
	};
	OK(udma_share_send(sv[0], items, 2));
	udma_share_item got[4];
	size_t n = 0;
	OK(udma_share_recv(sv[1], got, 4, &n));
	CHECK(n == 2);
	CHECK(got[0].kind == UDMA_SHARE_REGION && got[0].len == 8192 && got[0].page_size == 0);
	CHECK(got[1].kind == UDMA_SHARE_FENCE && got[1].len == 0);
	/* The other end maps the same memory and waits on the same fence. */
	volatile uint8_t *theirs = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, got[0].fd, 0);
	CHECK(theirs != MAP_FAILED);
	((volatile uint8_t *)info.host)[4097] = 0x3c;
	CHECK(theirs[4097] == 0x3c);
	munmap((void *)theirs, 8192);
	FAILS(udma_fence_wait(got[1].fd, 0), UDMA_ERR_TIMEOUT, "not signalled");
	OK(udma_fence_signal(fence));
	OK(udma_fence_wait(got[1].fd, SECOND));
	close(got[0].fd);
	close(got[1].fd);

	/* Requests the sender refuses before anything is sent. */
	udma_share_item bad = {.kind = 9, .fd = fence};
	FAILS(udma_share_send(sv[0], &bad, 1), UDMA_ERR_INVALID_ARGUMENT, "not a udma_share_kind");
	bad = (udma_share_item){.kind = UDMA_SHARE_REGION, .fd = memfd, .len = 100};
	FAILS(udma_share_send(sv[0], &bad, 1), UDMA_ERR_INVALID_ARGUMENT, "multiple of its page size");
	bad = (udma_share_item){.kind = UDMA_SHARE_FENCE, .fd = -1};
	FAILS(udma_share_send(sv[0], &bad, 1), UDMA_ERR_INVALID_ARGUMENT, "items[0].fd -1");
	FAILS(udma_share_send(sv[0], items, 0), UDMA_ERR_INVALID_ARGUMENT, "count 0");
	FAILS(udma_share_send(sv[0], items, UDMA_SHARE_MAX_ITEMS + 1), UDMA_ERR_INVALID_ARGUMENT, "count 17");
	FAILS(udma_share_send(sv[0], NULL, 1), UDMA_ERR_INVALID_ARGUMENT, "items is NULL");
	/* A dma-buf item whose descriptor is not one: refused as the receiver would refuse it. */
	bad = (udma_share_item){.kind = UDMA_SHARE_DMABUF, .fd = fence, .len = UINT64_MAX};
	FAILS(udma_share_send(sv[0], &bad, 1), UDMA_ERR_INVALID_ARGUMENT, "dma-buf");

	/* No room at all: refused before the socket is read, so the message waits. */
	udma_share_item one = {.kind = UDMA_SHARE_FENCE, .fd = fence};
	OK(udma_share_send(sv[0], &one, 1));
	FAILS(udma_share_recv(sv[1], got, 0, &n), UDMA_ERR_INVALID_ARGUMENT, "capacity is 0");
	OK(udma_share_recv(sv[1], got, 4, &n));
	CHECK(n == 1 && got[0].kind == UDMA_SHARE_FENCE);
	close(got[0].fd);

	/* More items than room: refused, and the descriptors that came are closed. */
	int p[2];
	CHECK(pipe2(p, O_CLOEXEC) == 0);
	udma_share_item three[3] = {
		{.kind = UDMA_SHARE_FENCE, .fd = p[0]},
		{.kind = UDMA_SHARE_FENCE, .fd = p[0]},
		{.kind = UDMA_SHARE_FENCE, .fd = p[0]},
	};
	OK(udma_share_send(sv[0], three, 3));
	close(p[0]);
	FAILS(udma_share_recv(sv[1], got, 2, &n), UDMA_ERR_INVALID_ARGUMENT, "room for");
	/* Every copy of the read end is gone: the write end sees no reader. */
	signal(SIGPIPE, SIG_IGN);
	CHECK(write(p[1], "x", 1) < 0 && errno == EPIPE);
	close(p[1]);

	/* A malformed message from a peer that does not speak the protocol. */
	CHECK(send(sv[0], "hello", 5, 0) == 5);
	FAILS(udma_share_recv(sv[1], got, 4, &n), UDMA_ERR_INVALID_ARGUMENT, "shorter than its header");
	close(sv[0]);
	FAILS(udma_share_recv(sv[1], got, 4, &n), UDMA_ERR_NOT_FOUND, "closed");
	close(sv[1]);
	close(memfd);
	close(fence);

	/* The caller's own memory has no file to pass. */
	void *mine = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	udma_mapping *um = NULL;
	OK(udma_memory_map_user(dev, mine, 4096, UDMA_PAGE_BASE, &um));
	int none = -1;
	FAILS(udma_mapping_fd(um, &none), UDMA_ERR_INVALID_ARGUMENT, "no file behind it");
	OK(udma_mapping_destroy(um));
	munmap(mine, 4096);
	OK(udma_mapping_destroy(m));
	OK(udma_device_close(dev));
}

static void noop_result(void *user, const udma_frame_output *output)
{
	(void)output;
	(*(int *)user)++;
}

static void test_pipeline_fence(void)
{
	udma_device *dev = loopback();
	udma_model *model = NULL;
	OK(udma_model_create_chain(2, 4096, &model));
	udma_pipeline *p = NULL;
	OK(udma_pipeline_create(dev, model, NULL, &p));
	int f1 = -1, f0 = -1;
	OK(udma_pipeline_fence(p, 1, &f1));
	FAILS(udma_fence_wait(f1, 0), UDMA_ERR_TIMEOUT, "not signalled");
	uint8_t input[16] = {1, 2, 3};
	int results = 0;
	OK(udma_pipeline_submit(p, input, sizeof input, NULL));
	OK(udma_pipeline_submit(p, input, sizeof input, NULL));
	while (results < 2) {
		size_t finished = 0;
		OK(udma_pipeline_wait(p, noop_result, &results, &finished));
	}
	OK(udma_fence_wait(f1, 0));
	OK(udma_pipeline_fence(p, 0, &f0));
	OK(udma_fence_wait(f0, 0)); /* a done frame's fence comes signalled */
	FAILS(udma_pipeline_fence(p, 0, NULL), UDMA_ERR_INVALID_ARGUMENT, "fd is NULL");
	close(f0);
	close(f1);
	OK(udma_pipeline_destroy(p));
	OK(udma_model_destroy(model));
	OK(udma_device_close(dev));
}

static void test_access_modes(void)
{
	udma_device *dev = loopback();
	void *mine = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	udma_mapping *m = NULL;
	OK(udma_memory_map_user_access(dev, mine, 8192, UDMA_PAGE_BASE, UDMA_ACCESS_DEVICE_READS, &m));
	udma_mapping_info info = {.size = sizeof info};
	OK(udma_mapping_get_info(m, &info));
	CHECK(info.len == 8192 && info.iova != 0);
	OK(udma_mapping_destroy(m));
	FAILS(udma_memory_map_user_access(dev, mine, 8192, UDMA_PAGE_BASE, 3, &m),
	      UDMA_ERR_INVALID_ARGUMENT, "access 3 is not a udma_access");
	munmap(mine, 8192);
	OK(udma_device_close(dev));
}

static void test_dmabuf(void)
{
	udma_device *dev = loopback();
	udma_mapping *m = NULL;
	OK(udma_memory_map(dev, 64 << 10, UDMA_PAGE_BASE, &m));
	udma_mapping_info info = {.size = sizeof info};
	OK(udma_mapping_get_info(m, &info));
	int fd = -1;
	FAILS(udma_dmabuf_export_mapping(m, 100, 4096, 0, &fd), UDMA_ERR_INVALID_ARGUMENT, "page");
	FAILS(udma_dmabuf_export_mapping(m, 0, 4096, 4, &fd), UDMA_ERR_INVALID_ARGUMENT, "flags 0x4");
	FAILS(udma_dmabuf_export_mapping(m, 0, 4096, 0, NULL), UDMA_ERR_INVALID_ARGUMENT, "fd is NULL");
	enum udma_status s = udma_dmabuf_export_mapping(m, 8192, 16384, 0, &fd);
	if (access("/dev/udmabuf", F_OK) == 0) {
		/* A kernel with udmabuf: the dma-buf is the range; it finds its way back. */
		CHECK(s == UDMA_OK);
		void *host = NULL;
		uint64_t len = 0;
		OK(udma_dmabuf_origin(fd, &host, &len));
		CHECK(host == (uint8_t *)info.host + 8192 && len == 16384);
		udma_mapping *again = NULL;
		OK(udma_dmabuf_import(dev, fd, UDMA_ACCESS_READ_WRITE, &again));
		udma_mapping_info ai = {.size = sizeof ai};
		OK(udma_mapping_get_info(again, &ai));
		CHECK(ai.host == host && ai.len == 16384);
		OK(udma_mapping_destroy(again));
		close(fd);
	} else {
		CHECK(s == UDMA_ERR_UNSUPPORTED);
		CHECK(strstr(udma_last_error(), "CONFIG_UDMABUF") != NULL);
	}
	/* Anything that is not a dma-buf is refused by every call that takes one. */
	int memfd = -1;
	OK(udma_mapping_fd(m, &memfd));
	udma_mapping *imp = NULL;
	FAILS(udma_dmabuf_import(dev, memfd, 0, &imp), UDMA_ERR_INVALID_ARGUMENT, "not a dma-buf");
	void *host = NULL;
	uint64_t len = 0;
	FAILS(udma_dmabuf_origin(memfd, &host, &len), UDMA_ERR_INVALID_ARGUMENT, "not a dma-buf");
	FAILS(udma_dmabuf_import(dev, -5, 0, &imp), UDMA_ERR_INVALID_ARGUMENT, "-5");
	FAILS(udma_dmabuf_import(dev, memfd, 7, &imp), UDMA_ERR_INVALID_ARGUMENT, "udma_access");
	close(memfd);

	/* Pool buffers: a buffer from a pool export, or the reason it cannot be. */
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_buffer *b = NULL;
	OK(udma_pool_alloc(pool, 8192, &b));
	s = udma_dmabuf_export_buffer(b, 0, &fd);
	if (s == UDMA_OK) {
		udma_buffer_info bi = {.size = sizeof bi};
		OK(udma_buffer_get_info(b, &bi));
		OK(udma_dmabuf_origin(fd, &host, &len));
		CHECK(host == bi.host && len == bi.capacity);
		close(fd);
	} else {
		CHECK(s == UDMA_ERR_UNSUPPORTED || s == UDMA_ERR_REFUSED);
	}
	OK(udma_pool_free(pool, b));
	OK(udma_pool_destroy(pool));
	OK(udma_mapping_destroy(m));
	OK(udma_device_close(dev));
}

int main(void)
{
	static const struct check_test tests[] = {
		{"fences", test_fences},
		{"share", test_share},
		{"pipeline_fence", test_pipeline_fence},
		{"access_modes", test_access_modes},
		{"dmabuf", test_dmabuf},
	};
	return check_run(tests, sizeof tests / sizeof tests[0]);
}
