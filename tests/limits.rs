//! Sizes a caller passes are checked against what can be had before anything is allocated for
//! them: an absurd one is an error naming the limit, never an aborted process or a panic.
#![cfg(not(loom))]

use std::sync::Arc;

use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Config, Error as PoolError, Pool};

#[test]
fn more_buffers_than_a_pool_holds_are_refused_before_anything_is_reserved() {
    let region = Region::builder(4 << 20)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .expect("region");
    let mapping = SoftIommu::new(48)
        .expect("space")
        .map(Arc::new(region))
        .expect("mapping");
    let pool = Pool::new(mapping, Config::default().chunk_size(64 << 10)).expect("pool");
    let mut out = Vec::new();
    for count in [1 << 20, usize::MAX / 2, usize::MAX] {
        let error = pool
            .alloc_bulk(4096, count, &mut out)
            .expect_err("too many");
        assert!(matches!(error, PoolError::Exhausted { .. }), "{error:?}");
        assert!(out.is_empty() && out.capacity() < 1 << 20);
    }
    pool.alloc_bulk(4096, 8, &mut out).expect("eight");
}
