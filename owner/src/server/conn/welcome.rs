//! The welcome: a client's pool and rings made, mapped for the device and sent with their
//! descriptors; a stream declared against its model and the owner's limits.

#[allow(clippy::wildcard_imports)] // the connection module's types, limits and helpers
use super::*;

impl Owner {
    /// Makes the client's pool and rings and sends them.
    pub(super) fn welcome(
        &mut self,
        slot: usize,
        pool_bytes: u64,
        name: &str,
    ) -> Result<(), Refusal> {
        let limits = self.config.limits;
        let bytes = pool_bytes
            .clamp(MIN_POOL, limits.pool_bytes)
            .next_multiple_of(2 << 20);
        let bytes = usize::try_from(bytes).map_err(|_| {
            refusal(
                Code::InvalidArgument,
                true,
                "a pool larger than this machine's address space".into(),
            )
        })?;
        let sys = |what: &str, e: &dyn std::fmt::Display| {
            refusal(
                Code::Exhausted,
                true,
                format!("the owner could not make {what}: {e}"),
            )
        };
        let region = Region::builder(bytes)
            .page_size(PageSize::Base)
            .memfd()
            .build()
            .map_err(|e| sys("the client's pool", &e))?;
        let region = Arc::new(region);
        let mapping = self
            .device
            .map_host(Arc::clone(&region))
            .map_err(|e| sys("a DMA mapping of the client's pool", &e))?;
        // Page-sized chunks and classes: the pool's buffers need only page alignment in IOVA,
        // which the client's own view of the pool (another DMA space) shares with the
        // device's whatever else either space holds. Buffers above a page come from the buddy
        // allocator in whole pages.
        let pool_config = pool::Config::default().chunk_size(4096).max_class(4096);
        let pool =
            Pool::create_shared(mapping, pool_config).map_err(|e| sys("the client's pool", &e))?;
        let entries = limits.in_flight.next_power_of_two();
        let rings_len = chan::region_len(entries, entries).next_multiple_of(4096);
        let rings_region = Arc::new(
            Region::builder(rings_len)
                .page_size(PageSize::Base)
                .memfd()
                .build()
                .map_err(|e| sys("the client's rings", &e))?,
        );
        let words = rings_region.as_ptr().cast::<AtomicU64>();
        let len = rings_len / 8;
        {
            // SAFETY: as in `Ready::rings`: the region is fresh, page-aligned, `len` words.
            let w = unsafe { std::slice::from_raw_parts(words.as_ptr(), len) };
            Rings::init(w, entries, entries).map_err(|e| sys("the client's rings", &e))?;
        }
        let owner_bell = Fence::new().map_err(|e| sys("a doorbell", &e))?;
        let client_bell = Fence::new().map_err(|e| sys("a doorbell", &e))?;
        let conn = self.conns[slot].as_mut().expect("a live slot");
        let welcome = Msg::Welcome {
            client: conn.id,
            pool_bytes: bytes as u64,
            sq_entries: entries,
            cq_entries: entries,
            max_streams: limits.streams,
            max_in_flight: limits.in_flight,
        };
        if !conn.send(&welcome) {
            return Err(refusal(
                Code::System,
                true,
                "the welcome could not be sent".into(),
            ));
        }
        share::send(
            conn.socket_borrow(),
            &[
                Item::Region(&region),
                Item::Region(&rings_region),
                Item::Fence(&owner_bell),
                Item::Fence(&client_bell),
            ],
        )
        .map_err(|e| sys("the welcome's descriptors", &e))?;
        conn.name = name.to_owned();
        conn.ready = Some(Ready {
            pool: Arc::new(pool),
            shared: Shared {
                _region: rings_region,
                words,
                len,
                sq: entries,
                cq: entries,
            },
            sq_head: 0,
            cq_tail: 0,
            owner_bell,
            client_bell,
            in_flight: 0,
            frames: 0,
            next_stream: 0,
            streams: 0,
        });
        #[cfg(feature = "tracing")]
        tracing::info!(
            client = conn.id,
            pid = conn.pid,
            uid = conn.uid,
            name = %conn.name,
            pool_bytes = bytes,
            "client connected"
        );
        Ok(())
    }

    /// Admits a stream of the client in `slot`: its pipeline built on free queues.
    pub(super) fn admit(
        &mut self,
        slot: usize,
        priority: u8,
        period_ns: u64,
        max_wait_ns: u64,
        name: &str,
        model: &str,
    ) -> Result<Msg, Refusal> {
        let conn = self.conns[slot].as_ref().expect("a live slot");
        let id = conn.id;
        let ready = conn.ready.as_ref().expect("greeted");
        if ready.streams >= self.config.limits.streams {
            return Err(refusal(
                Code::Exhausted,
                false,
                format!(
                    "this client has its limit of {} streams: close one first",
                    self.config.limits.streams
                ),
            ));
        }
        if self.streams.len() >= userdma_infer::sched::MAX_STREAMS {
            return Err(refusal(
                Code::Exhausted,
                false,
                "the owner schedules its most streams (64): try again when one closes".into(),
            ));
        }
        if name.is_empty() {
            return Err(refusal(
                Code::InvalidArgument,
                false,
                "a stream needs a name".into(),
            ));
        }
        if self
            .streams
            .iter()
            .any(|s| s.client == id && s.name == name && !s.closing)
        {
            return Err(refusal(
                Code::InvalidArgument,
                false,
                format!("this client already has a stream named {name:?}"),
            ));
        }
        let Some(entry) = self.config.models.iter().find(|e| e.name == model) else {
            let names: Vec<&str> = self.config.models.iter().map(|e| e.name.as_str()).collect();
            return Err(refusal(
                Code::NotFound,
                false,
                format!("no model {model:?} here: this owner has {names:?}"),
            ));
        };
        let mut config = entry.pipeline;
        let split = config.split;
        let want = if split { 3 } else { 1 };
        let Some(base) = free_run(&self.queues_used, want) else {
            return Err(refusal(
                Code::Exhausted,
                false,
                format!(
                    "the device has no {want} free queues for another stream ({} in use): \
                     close a stream, or start the owner with more queues",
                    self.queues_used.iter().filter(|&&u| u).count()
                ),
            ));
        };
        config.queue = base as u16;
        config.context = base as u32;
        config.results = Results::Copy;
        let pipeline = Pipeline::on(Arc::clone(&self.device), entry.model.clone(), config)
            .map_err(|e| {
                refusal(
                    e.code(),
                    false,
                    format!("the device cannot take another stream: {e}"),
                )
            })?;
        for q in &mut self.queues_used[base..base + want] {
            *q = true;
        }
        let ready = self.conns[slot]
            .as_mut()
            .and_then(Conn::ready_mut)
            .expect("greeted");
        let number = ready.next_stream;
        ready.next_stream += 1;
        ready.streams += 1;
        let input_bytes = entry.model.input().bytes;
        let result_bytes = entry.model.result().bytes;
        let cap = self.config.limits.in_flight as usize;
        self.streams.push(OStream {
            client: id,
            slot,
            number,
            name: name.to_owned(),
            priority,
            max_wait: (max_wait_ns > 0).then_some(max_wait_ns),
            period_ns,
            context: base as u32,
            queues: (base as u16, want as u16),
            pipeline,
            pool: Arc::clone(&ready.pool),
            waiting: std::collections::VecDeque::with_capacity(cap),
            on_device: std::collections::VecDeque::with_capacity(self.config.in_flight.max(4)),
            latency: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .expect("valid bounds"),
            frames: 0,
            failed: 0,
            lost: 0,
            max_head_wait: 0,
            last_dispatch: 0,
            frame_ns: 0,
            stated: 0,
            closing: false,
            reply_closed: false,
        });
        self.reschedule();
        Ok(Msg::Declared {
            stream: number,
            input_bytes,
            result_bytes,
        })
    }
}
