//! Connecting: the hello, the welcome with the pool's and the rings' descriptors, and their
//! mappings.

#[allow(clippy::wildcard_imports)] // the client's types and helpers
use super::*;

impl Client {
    /// Connects to the owner listening at `path` and takes the pool and rings it makes for
    /// this client.
    ///
    /// # Errors
    /// [`Error::Connect`] when no owner listens there; [`Error::Owner`] when it refuses this
    /// process (its user or group is not allowed, its limits are reached); what mapping the
    /// pool and rings fails with.
    pub fn connect(path: impl AsRef<Path>, options: &Options) -> Result<Client, Error> {
        Client::connect_timeout(path, options, ANSWER)
    }

    /// [`Client::connect`], waiting at most `answer` for each answer of the owner (its
    /// welcome, and every later request's; `connect` waits 30 s): for a program that
    /// would rather say that nothing answers than wait long for a peer that never will.
    ///
    /// # Errors
    /// As [`Client::connect`]; [`Error::Timeout`] when the peer does not answer within
    /// `answer`.
    pub fn connect_timeout(
        path: impl AsRef<Path>,
        options: &Options,
        answer: Duration,
    ) -> Result<Client, Error> {
        let path = path.as_ref();
        let socket = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| io_err("socket", e))?;
        let addr = UnixAddr::new(path).map_err(|e| Error::Connect {
            path: path.to_owned(),
            source: e.into(),
        })?;
        socket::connect(socket.as_raw_fd(), &addr).map_err(|e| Error::Connect {
            path: path.to_owned(),
            source: e.into(),
        })?;
        let name = Name::new(&options.name).map_err(Error::Proto)?;
        let hello = Msg::Hello {
            pool_bytes: options.pool_bytes,
            name,
        };
        if let Err(e) = send(&socket, &hello) {
            // An owner that refused this peer at the door said why before it closed.
            return Err(match recv(&socket, Some(Duration::from_millis(100))) {
                Ok(Msg::Error { code, text, .. }) => Error::Owner { code, text },
                _ => e,
            });
        }
        let (client, pool_bytes, sq, cq, max_streams, max_in_flight) =
            match recv(&socket, Some(answer))? {
                Msg::Welcome {
                    client,
                    pool_bytes,
                    sq_entries,
                    cq_entries,
                    max_streams,
                    max_in_flight,
                } => (
                    client,
                    pool_bytes,
                    sq_entries,
                    cq_entries,
                    max_streams,
                    max_in_flight,
                ),
                Msg::Error { code, text, .. } => return Err(Error::Owner { code, text }),
                other => {
                    return Err(Error::Unexpected {
                        expected: "a welcome",
                        got: format!("{other:?}"),
                    })
                }
            };
        wait_readable(&socket, Some(answer))?;
        let mut items = share::recv(socket.as_fd())?.into_iter();
        let (
            Some(pool_item),
            Some(rings_item),
            Some(Received::Fence(owner_bell)),
            Some(Received::Fence(bell)),
            None,
        ) = (
            items.next(),
            items.next(),
            items.next(),
            items.next(),
            items.next(),
        )
        else {
            return Err(Error::Unexpected {
                expected: "a pool, rings and two doorbells",
                got: "other descriptors".into(),
            });
        };
        let pool_region = pool_item.into_region()?;
        if pool_region.len() as u64 != pool_bytes {
            return Err(Error::Unexpected {
                expected: "a pool of the welcome's length",
                got: format!("{} bytes", pool_region.len()),
            });
        }
        // The client's own view of the pool: a software DMA space, only for the pool's
        // addressing (the owner maps the same pages for the device).
        let space = SoftIommu::new(48)?;
        let pool = Arc::new(Pool::open_shared(
            space.map(Arc::new(pool_region))?,
            Exhaustion::Fail,
        )?);
        let rings_region = rings_item.into_region()?;
        let rings_len = rings_region.len() / 8;
        let rings_words = rings_region.as_ptr().cast::<AtomicU64>();
        let client = Client {
            socket,
            id: client,
            pool,
            rings_region,
            rings_words,
            rings_len,
            owner_bell,
            bell,
            streams: Vec::new(),
            events: VecDeque::new(),
            refused: VecDeque::new(),
            max_streams,
            max_in_flight,
            in_flight: 0,
            gone: None,
            spin: crate::spin::Spin::new(SPIN),
            answer,
        };
        let rings = client.rings()?;
        if rings.sq_entries() != sq || rings.cq_entries() != cq {
            return Err(Error::Unexpected {
                expected: "rings of the welcome's sizes",
                got: format!("{} and {}", rings.sq_entries(), rings.cq_entries()),
            });
        }
        Ok(client)
    }

    /// [`Client::connect`], trying again until an owner answers or `timeout` passes: for a
    /// client started before its owner, or reconnecting after the owner restarted.
    ///
    /// # Errors
    /// The last [`Error::Connect`] when none answered in time; as [`Client::connect`].
    pub fn connect_wait(
        path: impl AsRef<Path>,
        options: &Options,
        timeout: Duration,
    ) -> Result<Client, Error> {
        // A timeout beyond the clock's range waits as long as it takes.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            match Client::connect(path.as_ref(), options) {
                Err(Error::Connect { .. }) if deadline.is_none_or(|d| Instant::now() < d) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }
}
