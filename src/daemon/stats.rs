//! What the management core reports: answers to control requests (status, xstats,
//! zeroing) and the periodic testpmd-style printout.
use super::PortEntry;
use crate::config::Config;
use crate::control::protocol::Request;
use crate::control::report::{LcoreStatus, PortStatus, StatusReport, XstatsReport};
use crate::dataplane::capture::Capture;
use crate::dataplane::counters::{Event, WorkerCounters};
use crate::emulator::EmulatorStats;
use crate::model::DropReason;
use crate::wire::ethernet::MacAddr;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One port's (rx packets, rx bytes, tx packets, tx bytes) at a point in time.
type PortReading = (u64, u64, u64, u64);

/// Previous readings, for rates "since last show".
pub struct StatsView {
    started: Instant,
    management_lcore: u32,
    worker_lcores: Vec<u32>,
    last: Option<(Instant, Vec<PortReading>)>,
    last_cycles: Vec<(u64, u64)>,
    /// Publish -> all workers adopted latencies (the management loop measures them).
    pub adoption: super::adoption::Adoption,
    /// The capture's per-worker copy rings, for their copied and dropped counts.
    pub capture: Option<Arc<Capture>>,
    /// Where the printed statistics go.
    stdout: Printout,
}

impl StatsView {
    pub fn new(cfg: &Config, started: Instant) -> Self {
        StatsView {
            started,
            management_lcore: cfg.lcores.management,
            worker_lcores: cfg.lcores.workers.clone(),
            last: None,
            last_cycles: vec![(0, 0); cfg.lcores.workers.len()],
            adoption: Default::default(),
            capture: None,
            stdout: Printout::default(),
        }
    }

    pub fn answer(
        &mut self,
        req: Request,
        ports: &[PortEntry],
        counters: &[Arc<WorkerCounters>],
        emulator: Option<&EmulatorStats>,
    ) -> Result<serde_json::Value, String> {
        match req {
            Request::Status => {
                let report = self.status(ports, counters, emulator);
                serde_json::to_value(report).map_err(|e| e.to_string())
            }
            Request::Xstats { port } => {
                let entry = ports
                    .iter()
                    .find(|p| p.port.id() == port)
                    .ok_or_else(|| format!("no port {port} (ports: {})", port_list(ports)))?;
                let stats = entry.port.xstats().map_err(|e| e.to_string())?;
                serde_json::to_value(XstatsReport {
                    port,
                    name: entry.name.clone(),
                    stats,
                })
                .map_err(|e| e.to_string())
            }
            Request::ZeroCounters => {
                for p in ports {
                    p.port.reset_stats().map_err(|e| e.to_string())?;
                }
                // The workers zero their own counters at their next poll; wait for
                // them (microseconds) so the reply means it is done.
                counters.iter().for_each(|c| c.request_zero());
                let deadline = Instant::now() + Duration::from_millis(500);
                while counters.iter().any(|c| c.zero_pending()) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_micros(100));
                }
                self.last = None;
                self.last_cycles.iter_mut().for_each(|c| *c = (0, 0));
                Ok(serde_json::json!({"zeroed": true}))
            }
            other => Err(format!(
                "{} is handled by the service registry",
                other.command_name()
            )),
        }
    }

    pub fn status(
        &self,
        ports: &[PortEntry],
        counters: &[Arc<WorkerCounters>],
        _emulator: Option<&EmulatorStats>,
    ) -> StatusReport {
        let mut drops: BTreeMap<String, u64> = BTreeMap::new();
        let mut events: BTreeMap<String, u64> = BTreeMap::new();
        for r in DropReason::ALL {
            drops.insert(r.name().into(), 0);
        }
        for e in Event::ALL {
            events.insert(e.name().into(), 0);
        }
        let mut neighbours = 0;
        let mut lcores = vec![LcoreStatus {
            lcore: self.management_lcore,
            role: "management".into(),
            worker: None,
            ..Default::default()
        }];
        for (w, c) in counters.iter().enumerate() {
            let ring = self.capture.as_ref().and_then(|cap| cap.rings.get(w));
            for (r, v) in DropReason::ALL.iter().zip(c.drops_snapshot()) {
                *drops.get_mut(r.name()).unwrap() += v;
            }
            for (e, v) in Event::ALL.iter().zip(c.events_snapshot()) {
                *events.get_mut(e.name()).unwrap() += v;
            }
            // Workers share what they learn, so tables converge; the largest is the
            // best count of distinct neighbours without merging tables across cores.
            neighbours = neighbours.max(c.neighbour_entries.load(Relaxed));
            lcores.push(LcoreStatus {
                lcore: self.worker_lcores[w],
                role: "worker".into(),
                worker: Some(w as u16),
                busy_percent: busy_percent(
                    c.busy_cycles.load(Relaxed),
                    c.total_cycles.load(Relaxed),
                ),
                rx_packets: c.rx_packets.load(Relaxed),
                tx_packets: c.tx_packets.load(Relaxed),
                polls: c.polls.load(Relaxed),
                sessions: c.sessions.load(Relaxed),
                sessions_created: c.sessions_created.load(Relaxed),
                redirected_out: c.events[Event::RedirectedOut as usize].load(Relaxed),
                redirected_in: c.events[Event::RedirectedIn as usize].load(Relaxed),
                neighbours: c.neighbour_entries.load(Relaxed),
                busy_cycles: c.busy_cycles.load(Relaxed),
                total_cycles: c.total_cycles.load(Relaxed),
                session_table_bytes: c.session_table_bytes.load(Relaxed),
                snapshot_generation: c.snapshot_generation.load(Relaxed),
                capture_copied: ring.map_or(0, |r| r.copied.load(Relaxed)),
                capture_dropped: ring.map_or(0, |r| r.dropped.load(Relaxed)),
            });
        }
        StatusReport {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            ports: ports.iter().map(port_status).collect(),
            lcores,
            drops,
            events,
            neighbours,
            sessions: counters.iter().map(|c| c.sessions.load(Relaxed)).sum(),
            sessions_created: counters
                .iter()
                .map(|c| c.sessions_created.load(Relaxed))
                .sum(),
            sessions_expired: counters
                .iter()
                .map(|c| c.sessions_expired.load(Relaxed))
                .sum(),
            snapshot_adoption: self.adoption.report(),
            // The service table's and the template census's business: the
            // management loop fills them in.
            real_server_ids: Default::default(),
            persistence_templates: None,
            management: None,
        }
    }

    /// Prints a testpmd-style block: per-port counters and rates since the last print,
    /// per-worker busy share, non-zero drops, and the emulator's view.
    pub fn print(
        &mut self,
        ports: &[PortEntry],
        counters: &[Arc<WorkerCounters>],
        emulator: Option<&EmulatorStats>,
    ) {
        if !self.stdout.open {
            return;
        }
        let now = Instant::now();
        // One reading per port, so the totals and the rates below agree.
        let stats: Vec<_> = ports
            .iter()
            .map(|p| p.port.stats().unwrap_or_default())
            .collect();
        let readings: Vec<PortReading> = stats
            .iter()
            .map(|s| (s.rx_packets, s.rx_bytes, s.tx_packets, s.tx_bytes))
            .collect();
        let mut out = String::new();
        for (i, (p, s)) in ports.iter().zip(&stats).enumerate() {
            out += &format!(
                "\n  ######################## NIC statistics for port {:<2} ({}) ########################\n",
                p.port.id(),
                p.name
            );
            out += &format!(
                "  RX-packets: {:<12} RX-missed: {:<12} RX-bytes:  {}\n",
                s.rx_packets, s.rx_missed, s.rx_bytes
            );
            out += &format!(
                "  RX-errors:  {}\n  RX-nombuf:  {:<12}\n",
                s.rx_errors, s.rx_nombuf
            );
            out += &format!(
                "  TX-packets: {:<12} TX-errors: {:<12} TX-bytes:  {}\n",
                s.tx_packets, s.tx_errors, s.tx_bytes
            );
            if let Some((then, prev)) = &self.last {
                let secs = now.duration_since(*then).as_secs_f64().max(1e-3);
                let (prx, prb, ptx, ptb) = prev.get(i).copied().unwrap_or_default();
                let (rx, rb, tx, tb) = readings[i];
                out += "\n  Throughput (since last show)\n";
                out += &format!(
                    "  Rx-pps: {:>12.0}          Rx-bps: {:>12.0}\n  Tx-pps: {:>12.0}          Tx-bps: {:>12.0}\n",
                    (rx - prx) as f64 / secs,
                    (rb - prb) as f64 * 8.0 / secs,
                    (tx - ptx) as f64 / secs,
                    (tb - ptb) as f64 * 8.0 / secs
                );
            }
            out +=
                "  ############################################################################\n";
        }
        for (w, c) in counters.iter().enumerate() {
            let (busy, total) = (c.busy_cycles.load(Relaxed), c.total_cycles.load(Relaxed));
            let (pb, pt) = self.last_cycles[w];
            self.last_cycles[w] = (busy, total);
            out += &format!(
                "  worker {w} (lcore {}): busy {:5.1}% now, {:5.1}% overall; rx {} tx {}; sessions {} (created {}); redirected out {} in {}\n",
                self.worker_lcores[w],
                busy_percent(busy.saturating_sub(pb), total.saturating_sub(pt)),
                busy_percent(busy, total),
                c.rx_packets.load(Relaxed),
                c.tx_packets.load(Relaxed),
                c.sessions.load(Relaxed),
                c.sessions_created.load(Relaxed),
                c.events[Event::RedirectedOut as usize].load(Relaxed),
                c.events[Event::RedirectedIn as usize].load(Relaxed),
            );
        }
        let report = self.status(ports, counters, emulator);
        let dropped: Vec<String> = report
            .drops
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let replied: Vec<String> = report
            .events
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out += &format!("  events: {}\n", replied.join(" "));
        out += &format!(
            "  drops:  {}\n",
            if dropped.is_empty() {
                "none".into()
            } else {
                dropped.join(" ")
            }
        );
        if let Some(em) = emulator {
            out += &format!("  peers:  {}\n", em.summary());
        }
        self.write_out(&out);
        self.last = Some((now, readings));
    }

    /// Writes `text` and a newline to stdout, unless an earlier write failed.
    pub fn write_out(&mut self, text: &str) {
        self.stdout.write(&mut std::io::stdout().lock(), text);
    }
}

/// Printed statistics, to stdout until a write fails. Statistics are for whoever
/// watches: once they are gone (`sluice ... | head`, a closed terminal, a log reader
/// that died) the printing stops, with a warning on stderr, and the appliance goes on
/// forwarding: a stats reader must not be able to take the data plane down, nor
/// unwind the management core with workers still running.
struct Printout {
    open: bool,
}

impl Default for Printout {
    fn default() -> Self {
        Printout { open: true }
    }
}

impl Printout {
    fn write(&mut self, out: &mut impl std::io::Write, text: &str) {
        if !self.open {
            return;
        }
        if let Err(e) = writeln!(out, "{text}").and_then(|_| out.flush()) {
            self.open = false;
            log::warn!("writing statistics to stdout: {e}: statistics are no longer printed");
        }
    }
}

fn busy_percent(busy: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        (busy as f64 * 1000.0 / total as f64).round() / 10.0
    }
}

fn port_status(p: &PortEntry) -> PortStatus {
    let s = p.port.stats().unwrap_or_default();
    let link = p.port.link();
    PortStatus {
        id: p.port.id(),
        name: p.name.clone(),
        driver: p.port.driver_name(),
        mac: MacAddr(p.mac).to_string(),
        addresses: p.addresses.clone(),
        link_up: link.up,
        speed_mbps: link.speed_mbps,
        rx_packets: s.rx_packets,
        rx_bytes: s.rx_bytes,
        tx_packets: s.tx_packets,
        tx_bytes: s.tx_bytes,
        rx_missed: s.rx_missed,
        rx_errors: s.rx_errors,
        tx_errors: s.tx_errors,
        rx_nombuf: s.rx_nombuf,
        ownership: p.ownership.name().to_string(),
        ownership_detail: p.ownership.to_string(),
        exception: p.exception.as_ref().map(|k| k.report()),
    }
}

fn port_list(ports: &[PortEntry]) -> String {
    ports
        .iter()
        .map(|p| format!("{} = {}", p.port.id(), p.name))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{self, Write};

    /// Accepts `room` writes, then fails each as a pipe with no reader does.
    struct Pipe {
        room: usize,
        written: String,
        attempts: usize,
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.attempts += 1;
            if self.room == 0 {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            self.room -= 1;
            self.written += std::str::from_utf8(buf).unwrap();
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_stdout_stops_the_printing_without_a_panic() {
        let mut pipe = Pipe {
            room: 2,
            written: String::new(),
            attempts: 0,
        };
        let mut out = Printout::default();
        out.write(&mut pipe, "first");
        assert_eq!(pipe.written, "first\n");
        out.write(&mut pipe, "second");
        assert!(!out.open, "a broken pipe closes the printout");
        let attempts = pipe.attempts;
        out.write(&mut pipe, "third");
        assert_eq!(pipe.attempts, attempts, "nothing is written once it failed");
    }
}
