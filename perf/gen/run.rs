//! `sluice-gen run`: the generator process. One EAL, one net_memif port in the server
//! role (the DUT connects as the client), one polling loop on the main lcore.
//!
//! Protocol with the orchestrator, on stdout (lines starting with `@`; everything
//! else is progress for humans):
//!
//! ```text
//! @LISTENING                   port started, memif socket listening
//! @ESTABLISHED <n> <seconds>   the DUT holds n established sessions
//! @READY                       idle; waiting for "measure" on stdin (unless --no-wait)
//! @MEASURED <seconds>          measure window over (read the DUT's counters now)
//! @RESULT {json}               final figures; polling has stopped. The process exits
//!                              when stdin says "quit" or closes (the orchestrator
//!                              stops the DUT first; see `run`)
//! ```
//!
//! Exit status: 0 when everything validated, 3 on validation failures, 4 on any other
//! failure (link never up, establish phase stalled, no command, bad arguments).
use crate::engine::{
    Engine, EngineConfig, FlowOrder, Mode, Out, Phase, Stats, Validate, Workload, FAIL_NAMES,
};
use sluice::dpdk::{tsc, tsc_hz, Burst, Eal, Mempool, Port, PortSettings, BURST_SIZE};
use sluice::flow::rss::{Reta, Toeplitz, DEFAULT_RSS_KEY};
use std::io::BufRead;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

pub struct RunArgs {
    pub socket: String,
    pub file_prefix: String,
    pub lcore: u32,
    pub queues: u16,
    pub memory_mb: u32,
    pub mode: Mode,
    pub workload: Workload,
    pub sessions: u32,
    pub window: usize,
    pub frame_len: usize,
    pub duration_s: f64,
    pub probe_ms: u64,
    pub validate: Validate,
    pub real_servers: u8,
    pub lips: u16,
    pub new_percent: u32,
    pub order: FlowOrder,
    pub vip: u32,
    pub vips: u32,
    pub wait_measure: bool,
    pub link_timeout_s: f64,
    pub stall_timeout_s: f64,
    pub loss_timeout_ms: u64,
    /// `synflood`: the flood service runs the SYN proxy (what the generator expects).
    pub synproxy: bool,
}

pub const EXIT_VALIDATION: i32 = 3;
pub const EXIT_FAILURE: i32 = 4;

const CMD_NONE: u8 = 0;
const CMD_MEASURE: u8 = 1;
const CMD_QUIT: u8 = 2;

/// Everything DPDK the loop uses; dropped in field order: the port, then its queue
/// handles (the last of them closes the device), the pool, the EAL.
struct Dpdk {
    port: Port,
    queues: Vec<(sluice::dpdk::RxQueue, sluice::dpdk::TxQueue)>,
    pool: std::sync::Arc<Mempool>,
    _eal: Eal,
}

fn init_dpdk(a: &RunArgs) -> Result<Dpdk, String> {
    let vdev = format!(
        "net_memif0,role=server,socket={},socket-abstract=no",
        a.socket
    );
    let eal_args: Vec<String> = [
        "sluice-gen",
        "-l",
        &a.lcore.to_string(),
        "--no-huge",
        "-m",
        &a.memory_mb.to_string(),
        "--no-shconf",
        "--no-pci",
        "--file-prefix",
        &a.file_prefix,
        "--vdev",
        &vdev,
        "--log-level",
        "lib.eal:notice",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let eal = Eal::init(&eal_args).map_err(|e| format!("EAL: {e} (root needed)"))?;
    let id = eal.port_by_name("net_memif0").map_err(|e| e.to_string())?;
    let descs = 1024u32;
    let wanted = a.window as u32 + a.queues as u32 * (2 * descs + 1024) + 8192;
    let pool = Mempool::new("gen_pool", wanted.next_power_of_two() - 1, 256, 2048)
        .map(std::sync::Arc::new)
        .map_err(|e| e.to_string())?;
    let mut port = Port::new(id).map_err(|e| format!("memif port: {e}"))?;
    port.configure(
        &PortSettings {
            queues: a.queues,
            rx_desc: descs as u16,
            tx_desc: descs as u16,
            ..Default::default()
        },
        &pool,
    )
    .map_err(|e| format!("memif port: {e}"))?;
    port.start().map_err(|e| format!("memif port: {e}"))?;
    let queues = port.take_queues().map_err(|e| e.to_string())?;
    Ok(Dpdk {
        port,
        queues,
        pool,
        _eal: eal,
    })
}

/// Runs the generator; returns the process exit status.
pub fn run(a: RunArgs) -> i32 {
    let mut d = match init_dpdk(&a) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("sluice-gen run: {e}");
            return EXIT_FAILURE;
        }
    };
    println!("@LISTENING");
    let hz = tsc_hz();
    let rss = if a.queues > 1 {
        // The DUT's view of a memif port (no RSS in the device): Sluice's default key
        // and a round-robin table; the generator plays the NIC that applies them.
        Some((
            Toeplitz::new(&DEFAULT_RSS_KEY).expect("40-byte key"),
            Reta::new_round_robin(128, a.queues).expect("queues > 0"),
        ))
    } else {
        None
    };
    let mut engine = Engine::new(EngineConfig {
        mode: a.mode,
        workload: a.workload,
        sessions: a.sessions,
        window: a.window,
        frame_len: a.frame_len,
        validate: a.validate,
        real_servers: a.real_servers,
        lips: a.lips,
        new_percent: a.new_percent,
        order: a.order,
        vip: a.vip,
        vips: a.vips,
        loss_timeout: hz / 1000 * a.loss_timeout_ms,
        rss,
        synproxy: a.synproxy,
    });

    // Link up = the DUT connected to the memif socket.
    let link_deadline = tsc() + (a.link_timeout_s * hz as f64) as u64;
    while !d.port.link().up {
        if tsc() > link_deadline {
            eprintln!(
                "sluice-gen run: the DUT did not connect to {} within {} s",
                a.socket, a.link_timeout_s
            );
            return EXIT_FAILURE;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    println!("gen: link up");

    let cmd = Arc::new(AtomicU8::new(CMD_NONE));
    if a.wait_measure {
        let cmd = cmd.clone();
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                match line.as_deref().map(str::trim) {
                    Ok("measure") => cmd.store(CMD_MEASURE, Ordering::Relaxed),
                    Ok("quit") | Err(_) => break,
                    Ok(_) => {}
                }
            }
            cmd.store(CMD_QUIT, Ordering::Relaxed);
        });
    }

    let outcome = drive(&a, &mut d, &mut engine, &cmd, hz);
    let ok = outcome.error.is_none() && engine.failures.total() == 0;
    println!("@RESULT {}", result_json(&a, &engine, &outcome, hz, ok));
    if a.wait_measure {
        // Stop polling, then wait until the orchestrator has stopped the DUT (it closes
        // our stdin): memif tears its shared memory down when the peer disconnects, from
        // DPDK's interrupt thread, which is unsafe while this lcore is still polling.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while cmd.load(Ordering::Relaxed) != CMD_QUIT && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    if let Err(e) = d.port.stop() {
        eprintln!("sluice-gen run: {e}");
    }
    if engine.failures.total() > 0 {
        EXIT_VALIDATION
    } else if ok {
        0
    } else {
        EXIT_FAILURE
    }
}

#[derive(Default)]
struct Outcome {
    error: Option<String>,
    establish_s: f64,
    measure_s: f64,
    at_start: Stats,
    at_end: Stats,
    /// The loop's cycles in iterations that received packets, and all its cycles,
    /// over the measure window.
    busy_cycles: u64,
    total_cycles: u64,
    /// SYN flood: SYN-ACKs received in each 100 ms of the window (the session table
    /// filling up shows as the count falling).
    flood_per_100ms: Vec<u64>,
}

/// The SYN flood's time series: one count per this many milliseconds of the window.
const FLOOD_SLOT_MS: u64 = 100;

/// Where the run is, as the loop sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    Warmup,
    Establish,
    Probe,
    Settle,
    Ready,
    Measure,
    Drain,
}

/// The polling loop: RX from every queue, handle each frame in place, TX; start
/// tokens the engine asks for; move through the phases. No allocation and no
/// per-packet FFI call in here.
fn drive(a: &RunArgs, d: &mut Dpdk, e: &mut Engine, cmd: &AtomicU8, hz: u64) -> Outcome {
    let mut out = Outcome::default();
    let nq = d.queues.len();
    let mut rx = Burst::new();
    let mut spare = Burst::new();
    let mut txs: Vec<Burst> = (0..nq).map(|_| Burst::new()).collect();
    let ms = hz / 1000;
    let start = tsc();
    let mut step = Step::Warmup;
    let mut step_at = start;
    let mut next_hk = start;
    let mut next_expire = start;
    let mut next_arp = start;
    let mut next_progress = start + 1000 * ms;
    let mut last_established = 0u64;
    let mut last_progress_at = start;
    let frame_len = a.frame_len as u16;
    let swap = a.mode.is_swap();
    let (mut busy, mut prev, mut prev_got) = (0u64, start, false);
    let (mut busy_at_start, mut cycles_at_start) = (0u64, start);
    let flood = a.workload == Workload::SynFlood;
    // Allocated here so the loop never allocates: one slot per 100 ms, and spare.
    out.flood_per_100ms =
        Vec::with_capacity((a.duration_s * 1000.0 / FLOOD_SLOT_MS as f64) as usize + 8);
    let (mut next_slot, mut slot_base) = (u64::MAX, 0u64);
    loop {
        let now = tsc();
        if prev_got {
            busy += now - prev;
        }
        prev = now;
        prev_got = false;
        for q in 0..nq {
            if d.queues[q].0.rx(&mut rx) == 0 {
                continue;
            }
            prev_got = true;
            for i in 0..rx.len() {
                // The proxy's SYN-ACK can be shorter than the frame it becomes next.
                if flood && rx.packet_len(i) < frame_len as u32 {
                    rx.set_packet_len(i, frame_len);
                }
                if let Out::Tx(t) = e.handle(rx.packet_mut(i), now) {
                    let t = t as usize % nq;
                    if txs[t].is_full() {
                        flush(&mut d.queues[t].1, &mut txs[t], e);
                    }
                    if !rx.move_to(i, &mut txs[t]) {
                        e.stats.tx_dropped += 1;
                    }
                }
            }
            rx.compact_moved();
            rx.free_all();
        }
        // New tokens, in bursts.
        let mut want = e.deficit();
        while want > 0 {
            let n = want.min(BURST_SIZE);
            if !spare.alloc_from(&d.pool, n) {
                break;
            }
            let mut started = 0;
            for i in 0..spare.len() {
                spare.set_packet_len(i, frame_len);
                let f = spare.packet_mut(i);
                f.fill(0);
                if let Some(Out::Tx(t)) = e.launch(f, now) {
                    started += 1;
                    let t = t as usize % nq;
                    if txs[t].is_full() {
                        flush(&mut d.queues[t].1, &mut txs[t], e);
                    }
                    if !spare.move_to(i, &mut txs[t]) {
                        e.stats.tx_dropped += 1;
                    }
                }
            }
            spare.compact_moved();
            spare.free_all();
            if started == 0 {
                break;
            }
            want = e.deficit();
        }
        for (t, burst) in txs.iter_mut().enumerate() {
            if !burst.is_empty() {
                flush(&mut d.queues[t].1, burst, e);
            }
        }

        if now < next_hk {
            continue;
        }
        next_hk = now + ms / 10;
        if now >= next_slot {
            let n = e.stats.flood_syn_acks;
            if out.flood_per_100ms.len() < out.flood_per_100ms.capacity() {
                out.flood_per_100ms.push(n - slot_base);
            }
            slot_base = n;
            next_slot += FLOOD_SLOT_MS * ms;
        }
        if now >= next_expire {
            e.expire(now);
            next_expire = now + 10 * ms;
        }
        // ARP announcements from the real servers while the DUT learns them.
        if !swap && matches!(step, Step::Warmup | Step::Establish) && now >= next_arp {
            next_arp = now + if step == Step::Warmup { 100 } else { 1000 } * ms;
            announce(d, e, a.real_servers);
        }
        let since = |t: u64| (now - t) as f64 / hz as f64;
        match step {
            Step::Warmup => {
                if since(step_at) >= 0.3 {
                    step_at = now;
                    if swap {
                        step = Step::Probe;
                        e.set_phase(Phase::Probe);
                    } else {
                        step = Step::Establish;
                        e.set_phase(Phase::Establish);
                        last_progress_at = now;
                        println!("gen: establishing {} sessions", a.sessions);
                    }
                }
            }
            Step::Establish => {
                let est = e.stats.established;
                if est != last_established {
                    last_established = est;
                    last_progress_at = now;
                }
                if now >= next_progress {
                    next_progress = now + 1000 * ms;
                    println!(
                        "gen: established {est}/{} ({:.1} s, lost tokens {})",
                        a.sessions,
                        since(step_at),
                        e.stats.lost
                    );
                }
                if e.failures.total() > 0 {
                    out.error = Some("validation failures while establishing sessions".into());
                    break;
                }
                if e.establish_done() {
                    out.establish_s = since(step_at);
                    println!("@ESTABLISHED {} {:.3}", est, out.establish_s);
                    step = Step::Probe;
                    step_at = now;
                    e.set_phase(Phase::Probe);
                } else if since(last_progress_at) > a.stall_timeout_s {
                    out.error = Some(format!(
                        "establish phase stalled at {est}/{} sessions for {} s",
                        a.sessions, a.stall_timeout_s
                    ));
                    break;
                }
            }
            Step::Probe => {
                if since(step_at) * 1000.0 >= a.probe_ms as f64 {
                    step = Step::Settle;
                    step_at = now;
                    e.set_phase(Phase::Idle);
                }
            }
            Step::Settle => {
                // Lost tokens expire after the loss timeout, so this ends.
                if e.active() == 0 {
                    println!("@READY");
                    step = Step::Ready;
                    step_at = now;
                } else if since(step_at) > 10.0 {
                    out.error = Some("tokens still in flight 10 s after the probe".into());
                    break;
                }
            }
            Step::Ready => {
                let c = cmd.load(Ordering::Relaxed);
                if c == CMD_QUIT {
                    out.error = Some("told to quit (or stdin closed) before measuring".into());
                    break;
                }
                if !a.wait_measure || c == CMD_MEASURE {
                    out.at_start = e.stats;
                    busy_at_start = busy;
                    cycles_at_start = now;
                    step = Step::Measure;
                    step_at = now;
                    if flood {
                        next_slot = now + FLOOD_SLOT_MS * ms;
                        slot_base = e.stats.flood_syn_acks;
                    }
                    e.set_phase(Phase::Measure);
                    println!("gen: measuring for {} s", a.duration_s);
                } else if since(step_at) > 600.0 {
                    out.error = Some("no measure command within 600 s".into());
                    break;
                }
            }
            Step::Measure => {
                if e.failures.total() > 0 && a.validate == Validate::Full {
                    // Full validation stops at the first wrong packet.
                    out.error = Some("validation failures".into());
                }
                if since(step_at) >= a.duration_s || out.error.is_some() {
                    out.measure_s = since(step_at);
                    out.at_end = e.stats;
                    out.busy_cycles = busy - busy_at_start;
                    out.total_cycles = now - cycles_at_start;
                    next_slot = u64::MAX;
                    e.set_phase(Phase::Drain);
                    println!("@MEASURED {:.6}", out.measure_s);
                    step = Step::Drain;
                    step_at = now;
                }
            }
            Step::Drain => {
                if e.active() == 0 || since(step_at) > 0.5 {
                    break;
                }
            }
        }
    }
    // Whatever is still queued for transmission is freed with the bursts.
    out
}

fn flush(tx: &mut sluice::dpdk::TxQueue, burst: &mut Burst, e: &mut Engine) {
    let sent = tx.tx(burst);
    e.stats.tx += sent as u64;
}

/// One ARP request from each real server for the DUT's address.
fn announce(d: &mut Dpdk, e: &mut Engine, real_servers: u8) {
    let mut b = Burst::new();
    let n = (real_servers as usize).min(BURST_SIZE);
    if !b.alloc_from(&d.pool, n) {
        return;
    }
    for k in 0..n {
        b.set_packet_len(k, 60);
        let len = Engine::write_arp_announce(b.packet_mut(k), k as u8);
        b.set_packet_len(k, len as u16);
    }
    let sent = d.queues[0].1.tx(&mut b);
    e.stats.tx += sent as u64;
}

fn result_json(a: &RunArgs, e: &Engine, o: &Outcome, hz: u64, ok: bool) -> String {
    let ns = |cycles: Option<u64>| cycles.map(|c| (c as f64 * 1e9 / hz as f64).round() as u64);
    let (s0, s1) = (&o.at_start, &o.at_end);
    let secs = o.measure_s.max(1e-9);
    let d = |f: fn(&Stats) -> u64| f(s1).saturating_sub(f(s0));
    let mut fails = serde_json::Map::new();
    let mut dumps = serde_json::Map::new();
    for (k, name) in FAIL_NAMES.iter().enumerate() {
        let n = e.failures.counts[k];
        if n > 0 {
            fails.insert((*name).into(), n.into());
            dumps.insert((*name).into(), e.failures.dump(k).into());
        }
    }
    let passes = match a.mode {
        Mode::Nat | Mode::FullNat => 2,
        _ => 1,
    };
    serde_json::json!({
        "ok": ok,
        "error": o.error,
        "mode": a.mode.name(),
        "workload": a.workload.name(),
        "sessions": a.sessions,
        "window": a.window,
        "frame_len": a.frame_len,
        "queues": a.queues,
        "vips": a.vips,
        "lips": a.lips,
        "validate": if a.validate == Validate::Full { "full" } else { "sample" },
        "tsc_hz": hz,
        "established": e.stats.established,
        "establish_s": o.establish_s,
        "measure_s": o.measure_s,
        "tx_packets": d(|s| s.tx),
        "rx_packets": d(|s| s.rx),
        "mpps_rx": d(|s| s.rx) as f64 / secs / 1e6,
        "mpps_tx": d(|s| s.tx) as f64 / secs / 1e6,
        "requests": d(|s| s.requests),
        "connections": d(|s| s.connections),
        "requests_per_s": d(|s| s.requests) as f64 / secs,
        "connections_per_s": d(|s| s.connections) as f64 / secs,
        "lost": d(|s| s.lost),
        "stale": d(|s| s.stale),
        "tx_dropped": d(|s| s.tx_dropped),
        "synproxy": a.synproxy,
        "flood_syns": d(|s| s.flood_syns),
        "flood_syn_acks": d(|s| s.flood_syn_acks),
        "flood_syn_acks_per_s": d(|s| s.flood_syn_acks) as f64 / secs,
        "flood_syns_at_rs": d(|s| s.flood_syns_at_rs),
        "flood_syn_acks_per_100ms": o.flood_per_100ms,
        "dut_passes_per_round_trip": passes,
        "gen_busy_percent": 100.0 * o.busy_cycles as f64 / o.total_cycles.max(1) as f64,
        "latency_p50_ns": ns(e.hist_measure.quantile(0.5)),
        "latency_p99_ns": ns(e.hist_measure.quantile(0.99)),
        "latency_samples": e.hist_measure.count(),
        "probe_p50_ns": ns(e.hist_probe.quantile(0.5)),
        "probe_p99_ns": ns(e.hist_probe.quantile(0.99)),
        "probe_samples": e.hist_probe.count(),
        "total": {
            "tx_packets": e.stats.tx,
            "rx_packets": e.stats.rx,
            "requests": e.stats.requests,
            "connections": e.stats.connections,
            "lost": e.stats.lost,
            "stale": e.stats.stale,
            "tx_dropped": e.stats.tx_dropped,
            "checksummed": e.stats.checksummed,
            "arp_answered": e.stats.arp_answered,
            "arp_other": e.stats.arp_other,
            "rx_client": e.stats.rx_client,
            "rx_rs": e.stats.rx_rs,
        },
        "validation_failures": fails,
        "failure_dumps": dumps,
    })
    .to_string()
}
