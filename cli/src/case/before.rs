//! The "before" run: naive frames (heap input, fresh mappings and arena per frame), streams
//! taken round-robin, each frame synchronous.

use std::time::{Duration, Instant};

use userdma_infer::pipeline::{naive::Naive, Model};
use userdma_infer::sched::streams::{ArrivalQueue, FrameSpan};
use userdma_infer::sched::{Policy, Scheduler, StreamId, StreamSpec};
use userdma_loopback::{LoopbackRuntime, Unit};

use super::figures::{device_figures, Run, RunFigures, StreamFigures};
use super::mix::{working_set, Frames, Mix};
use super::CaseArgs;
use crate::pipeline::Error;

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// "before": naive frames, round-robin, synchronous.
pub(super) fn before(
    args: &CaseArgs,
    mix: &Mix,
    model: &Model,
    frames: &Frames,
) -> Result<Run, Error> {
    let n = mix.len();
    let specs: Vec<StreamSpec> = (0..n).map(|i| mix.spec(i, false)).collect();
    let rts = mix.runtimes(model)?;
    let timeout = Duration::from_secs(30);
    let mut naive = Vec::with_capacity(n);
    for (i, s) in specs.iter().enumerate() {
        let rt = &rts[mix.device[i]];
        let ws = working_set(args);
        rt.loopback_device()
            .expect("a loopback runtime")
            .set_working_set(mix.queue[i], ws.private, ws.shared, ws.key)
            .map_err(userdma::Error::Device)?;
        naive.push(Naive::new(
            rt,
            model.clone(),
            mix.queue[i],
            s.context,
            timeout,
        )?);
    }
    let mut scheduler =
        Scheduler::new(Policy::RoundRobin, specs.clone()).map_err(Error::Schedule)?;
    let mut queues: Vec<ArrivalQueue> =
        (0..n).map(|i| ArrivalQueue::new(mix.arrivals(i))).collect();
    let mut oldest = vec![None; n];
    let mut latency: Vec<_> = (0..n).map(|_| histogram()).collect();
    let mut done = vec![0u64; n];
    let mut longest = vec![0u64; n];
    let (mut head_longest, mut last_dispatch) = (vec![0u64; n], vec![0u64; n]);
    let mut wrong = 0u64;
    // The context each device ran last: a frame in another one is a switch on that device.
    let mut last: Vec<Option<u32>> = vec![None; mix.on_device.len()];
    let mut switches = 0u64;
    let mut timeline = Vec::with_capacity(mix.timeline_capacity(args.seconds));
    let end = args.seconds * 1_000_000_000;
    let (allocs0, maps0) = (
        crate::pipeline::allocations(),
        rts.iter()
            .map(|rt| rt.dma_space().stats().maps)
            .sum::<u64>(),
    );
    let start = Instant::now();
    loop {
        let now = nanos(start.elapsed());
        if now >= end {
            break;
        }
        // Frames run synchronously: nothing of any stream is on a device here.
        for (q, o) in queues.iter_mut().zip(&mut oldest) {
            q.arrive(now, false);
            *o = q.oldest();
        }
        let Some(d) = scheduler.decide(now, &oldest) else {
            let next = queues
                .iter()
                .filter_map(ArrivalQueue::next_arrival)
                .min()
                .unwrap_or(now)
                .min(end);
            std::thread::sleep(Duration::from_nanos(next.saturating_sub(now).max(1000)));
            continue;
        };
        let i = d.stream.0;
        let device = mix.device[i];
        let context = specs[i].context;
        switches += u64::from(last[device].is_some_and(|c| c != context));
        last[device] = Some(context);
        let arrival = queues[i].take().unwrap_or(now);
        longest[i] = longest[i].max(now - arrival);
        head_longest[i] = head_longest[i].max(now - arrival.max(last_dispatch[i]));
        last_dispatch[i] = now;
        let frame = done[i];
        let p = Frames::of(i, frame);
        let mut ok = true;
        naive[i].frame(
            frame,
            &mut |_, input: &mut [u8]| input.copy_from_slice(&frames.inputs[p]),
            &mut |_, result, _| {
                ok = result.is_ok_and(|r| r == frames.expected[p].as_slice());
            },
        )?;
        wrong += u64::from(!ok);
        let finished = nanos(start.elapsed());
        let _ = latency[i].record(finished.saturating_sub(arrival).max(1));
        if timeline.len() < timeline.capacity() {
            timeline.push(FrameSpan {
                stream: StreamId(i),
                device,
                frame,
                arrival_ns: arrival,
                dispatch_ns: now,
                done_ns: finished,
                ok,
            });
        }
        done[i] += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    let allocs = crate::pipeline::allocations() - allocs0;
    let maps = rts
        .iter()
        .map(|rt| rt.dma_space().stats().maps)
        .sum::<u64>()
        - maps0;
    // The naive queues are the copy engine's (every step of a frame on one queue).
    let (device_switches, bound, rates) = device_figures(&rts, mix, Unit::Copy, 0, &done)?;
    for q in naive {
        q.shutdown()?;
    }
    let total: u64 = done.iter().sum();
    let figures = RunFigures {
        name: "before",
        policy: Policy::RoundRobin,
        seconds,
        streams: (0..n)
            .map(|i| StreamFigures {
                name: specs[i].name.clone(),
                device: mix.device[i],
                numa_node: mix.node(mix.device[i]),
                priority: specs[i].priority,
                target_fps: mix.streams[i].fps,
                arrived: queues[i].arrived(),
                frames: done[i],
                failed: 0,
                lost: 0,
                dropped: queues[i].dropped(),
                left_waiting: queues[i].len() as u64,
                fps: done[i] as f64 / seconds,
                latency_mean_ms: latency[i].mean() / 1e6,
                latency_p99_ms: latency[i].value_at_quantile(0.99) as f64 / 1e6,
                longest_wait_ms: longest[i] as f64 / 1e6,
                longest_head_wait_ms: head_longest[i] as f64 / 1e6,
                stated_wait_bound_ms: None,
                bound_at_model_ms: None,
                frame_service_ms: None,
                modelled_frame_ms: None,
                max_wait_ms: None,
                sram_hit_rate: rates[i],
            })
            .collect(),
        total_fps: total as f64 / seconds,
        allocations_per_sec: allocs as f64 / seconds,
        dma_maps_per_sec: maps as f64 / seconds,
        switches_per_sec: switches as f64 / seconds,
        device_switches,
        scheduler_switches: switches,
        device_bound_fps: bound,
        wrong,
        trace: None,
    };
    Ok(Run {
        figures,
        latency,
        timeline,
    })
}
