/* The C side of bench-support's `dpdk` module; see dpdk.c. */
#ifndef USERDMA_BENCH_DPDK_H
#define USERDMA_BENCH_DPDK_H

#include <stdint.h>

struct rte_mempool;
struct udb_pair;

enum { UDB_PIPELINE = 0, UDB_HANDOFF = 1 };

int udb_eal_init(int huge);
int udb_errno(void);
const char *udb_strerror(int error);
const char *udb_version(void);
unsigned udb_lcore(void);

struct rte_mempool *udb_mempool_create(const char *name, unsigned count, unsigned size,
				       unsigned cache, int no_spread);
unsigned udb_mempool_stride(const struct rte_mempool *mp);
void udb_mempool_free(struct rte_mempool *mp);
const char *udb_mempool_ops(const struct rte_mempool *mp);
/* placement 0..3: the loop's code 0, 16, 32 or 48 bytes into a 64-byte line; 0 on a bad
 * argument or an empty pool */
uint64_t udb_mempool_get_put(struct rte_mempool *mp, uint64_t iters, unsigned bulk,
			     unsigned placement);

struct udb_pair *udb_pair_start(int kind, unsigned burst, unsigned esize, struct rte_mempool *mp);
uint64_t udb_pair_run(struct udb_pair *p, uint64_t objects);
uint64_t udb_pair_stop(struct udb_pair *p);

#endif
