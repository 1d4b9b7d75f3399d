//! Prometheus metrics: the text exposition format (version 0.0.4) built from the very
//! reports `sluicectl status --json` and `-L -n --json` print, so the two always agree,
//! and a minimal HTTP endpoint (`[control] metrics = "addr:port"`) on its own threads
//! that asks the management loop for them, like the control socket does. The loop
//! gathers the reports ([`MetricsInputs`]); the text is written on the endpoint's
//! thread.
use crate::control::protocol::Request;
use crate::control::render::skew_pct;
use crate::control::report::{
    AdmissionReport, HealthReport, LaddrPoolStatus, PeerReport, ServicesReport, StatusReport,
    SyncReport, VrrpReport,
};
use crate::control::server::{Handler, Reply};
use crate::dpdk::spawn_helper;
use crate::ha::sync::peers::ResyncState;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One metric family: HELP and TYPE once, then its samples.
///
/// Samples are written straight into the scrape's text, labels escaped as they are
/// copied: at 50,000 real servers a scrape is some 650,000 samples, and a string or
/// two allocated for each made the scrape cost the management loop about half a
/// second.
struct Family<'a> {
    out: &'a mut String,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &str, kind: &str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            push_labels(self.out, labels);
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A sample with labels already written out by [`push_labels`] (the same labels
    /// go into many families).
    fn sample_labelled(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        self.out.push_str(name);
        self.out.push_str(labels);
        let _ = writeln!(self.out, " {value}");
    }
}

/// `{k="v",...}`, each value escaped.
fn push_labels(out: &mut String, labels: &[(&str, &str)]) {
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        push_escaped(out, v);
        out.push('"');
    }
    out.push('}');
}

/// A label value, its backslashes, quotes and newlines escaped.
fn push_escaped(out: &mut String, v: &str) {
    if !v.contains(['\\', '"', '\n']) {
        out.push_str(v);
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A service's `service` label value: `TCP 10.0.0.1:80`.
fn service_label(s: &crate::control::report::ServiceStatus) -> String {
    format!(
        "{} {}",
        s.proto.to_uppercase(),
        crate::control::render::endpoint(&s.vip, s.port)
    )
}

/// Everything one scrape shows, gathered by the management loop; the text is written
/// from it wherever the scrape is answered.
pub struct MetricsInputs {
    pub status: StatusReport,
    pub services: ServicesReport,
    pub pools: Vec<LaddrPoolStatus>,
    pub admission: Vec<AdmissionReport>,
    pub health: HealthReport,
    pub vrrp: Option<VrrpReport>,
    pub sync: Option<SyncReport>,
    pub bgp: Option<crate::ha::bgp::ClusterReport>,
}

impl MetricsInputs {
    /// The exposition text.
    pub fn render(&self) -> String {
        let mut text = render(&self.status, &self.services, &self.pools);
        text.push_str(&render_admission(&self.admission));
        text.push_str(&render_ha(
            &self.health,
            self.vrrp.as_ref(),
            self.sync.as_ref(),
        ));
        if let Some(bgp) = &self.bgp {
            text.push_str(&render_bgp(bgp));
        }
        text
    }
}

/// The exposition text for one scrape.
pub fn render(
    status: &StatusReport,
    services: &ServicesReport,
    pools: &[LaddrPoolStatus],
) -> String {
    let mut out = String::new();
    let o = &mut out;
    Family::new(o, "sluice_up", "gauge", "1 while the appliance runs.").sample("sluice_up", &[], 1);
    Family::new(o, "sluice_uptime_seconds", "gauge", "Seconds since start.").sample(
        "sluice_uptime_seconds",
        &[],
        status.uptime_ms as f64 / 1000.0,
    );

    type PortGetter = fn(&crate::control::report::PortStatus) -> u64;
    let port_counters: [(&str, &str, PortGetter); 4] = [
        (
            "sluice_port_rx_packets_total",
            "Packets the port received.",
            |p| p.rx_packets,
        ),
        (
            "sluice_port_tx_packets_total",
            "Packets the port sent.",
            |p| p.tx_packets,
        ),
        (
            "sluice_port_rx_missed_total",
            "Packets the NIC dropped for want of room.",
            |p| p.rx_missed,
        ),
        (
            "sluice_port_rx_nombuf_total",
            "RX failures for want of mbufs.",
            |p| p.rx_nombuf,
        ),
    ];
    for (name, help, get) in port_counters {
        let mut f = Family::new(o, name, "counter", help);
        for p in &status.ports {
            f.sample(name, &[("port", &p.name)], get(p));
        }
    }

    let mut f = Family::new(
        o,
        "sluice_port_ownership",
        "gauge",
        "1 for how the port's packets reach the worker owning their session: single, device (RSS read back), emulated, steered (in software).",
    );
    for p in status.ports.iter().filter(|p| !p.ownership.is_empty()) {
        f.sample(
            "sluice_port_ownership",
            &[("port", &p.name), ("mode", &p.ownership)],
            1,
        );
    }

    // The exception path's kernel side (the workers' side is in the events and
    // drops: exception_punted, exception_injected, exception_rate_limited, ...).
    if status.ports.iter().any(|p| p.exception.is_some()) {
        let mut f = Family::new(
            o,
            "sluice_exception_frames_total",
            "counter",
            "Frames across a port's kernel interface ([ports.exception]): to_kernel, to_kernel_lost (the interface refused them), from_kernel, from_kernel_lost (inject ring full).",
        );
        for p in &status.ports {
            let Some(e) = &p.exception else { continue };
            let c = &e.counts;
            for (direction, n) in [
                ("to_kernel", c.to_kernel),
                ("to_kernel_lost", c.to_kernel_lost),
                ("from_kernel", c.from_kernel),
                ("from_kernel_lost", c.from_kernel_lost),
            ] {
                f.sample(
                    "sluice_exception_frames_total",
                    &[("port", &p.name), ("direction", direction)],
                    n,
                );
            }
        }
    }

    type LcoreGetter = fn(&crate::control::report::LcoreStatus) -> u64;
    let worker_metrics: [(&str, &str, &str, LcoreGetter); 11] = [
        (
            "sluice_worker_rx_packets_total",
            "counter",
            "Packets the worker received.",
            |l| l.rx_packets,
        ),
        (
            "sluice_worker_tx_packets_total",
            "counter",
            "Packets the worker sent.",
            |l| l.tx_packets,
        ),
        (
            "sluice_worker_busy_cycles_total",
            "counter",
            "TSC cycles of polls that received packets.",
            |l| l.busy_cycles,
        ),
        (
            "sluice_worker_cycles_total",
            "counter",
            "TSC cycles of all polls, busy or idle (busy share = rate of busy cycles over rate of these).",
            |l| l.total_cycles,
        ),
        (
            "sluice_worker_capture_copied_total",
            "counter",
            "Frames a packet capture selected and the worker copied to the capture writer.",
            |l| l.capture_copied,
        ),
        (
            "sluice_worker_capture_dropped_total",
            "counter",
            "Frames a packet capture selected but the worker could not copy (its copy ring was full).",
            |l| l.capture_dropped,
        ),
        (
            "sluice_worker_sessions",
            "gauge",
            "Live sessions in the worker's table.",
            |l| l.sessions,
        ),
        (
            "sluice_worker_sessions_created_total",
            "counter",
            "Sessions the worker created.",
            |l| l.sessions_created,
        ),
        (
            "sluice_worker_redirected_out_total",
            "counter",
            "Packets handed to their owner worker's ring.",
            |l| l.redirected_out,
        ),
        (
            "sluice_worker_redirected_in_total",
            "counter",
            "Packets taken from this worker's redirect ring.",
            |l| l.redirected_in,
        ),
        (
            "sluice_worker_snapshot_generation",
            "gauge",
            "Service snapshot generation the worker uses.",
            |l| l.snapshot_generation,
        ),
    ];
    for (name, kind, help, get) in worker_metrics {
        let mut f = Family::new(o, name, kind, help);
        for l in status.lcores.iter().filter(|l| l.worker.is_some()) {
            let worker = l.worker.unwrap_or(0).to_string();
            f.sample(
                name,
                &[("worker", &worker), ("lcore", &l.lcore.to_string())],
                get(l),
            );
        }
    }

    let mut f = Family::new(
        o,
        "sluice_drops_total",
        "counter",
        "Packets dropped, by reason.",
    );
    for (reason, n) in &status.drops {
        f.sample("sluice_drops_total", &[("reason", reason)], n);
    }
    let mut f = Family::new(
        o,
        "sluice_events_total",
        "counter",
        "Data-plane events, by kind.",
    );
    for (event, n) in &status.events {
        f.sample("sluice_events_total", &[("event", event)], n);
    }
    // The SYN proxy's counters also under their own names, for flood dashboards.
    for (event, n) in status
        .events
        .iter()
        .filter(|(e, _)| e.starts_with("synproxy_"))
    {
        let name = format!("sluice_{event}_total");
        Family::new(o, &name, "counter", "SYN proxy: see docs/SYNPROXY.md.").sample(&name, &[], n);
    }
    Family::new(
        o,
        "sluice_sessions",
        "gauge",
        "Live sessions over all workers.",
    )
    .sample("sluice_sessions", &[], status.sessions);
    if let Some(m) = &status.management {
        let families: [(&str, &str, &str, f64); 4] = [
            (
                "sluice_management_turns_total",
                "counter",
                "Turns of the management loop (health checks, VRRP, sync, control), 5 ms apart when on time.",
                m.turns as f64,
            ),
            (
                "sluice_management_turn_longest_seconds",
                "gauge",
                "The longest management turn's work over the last 30 to 60 seconds.",
                m.longest_turn_us as f64 / 1e6,
            ),
            (
                "sluice_control_requests_total",
                "counter",
                "Control requests the management loop answered.",
                m.control_requests as f64,
            ),
            (
                "sluice_control_turns_cut_total",
                "counter",
                "Management turns that spent their control budget and left requests for the next turn.",
                m.control_turns_cut as f64,
            ),
        ];
        for (name, kind, help, value) in families {
            Family::new(o, name, kind, help).sample(name, &[], value);
        }
    }
    if let Some(t) = &status.persistence_templates {
        let tables = [("ipv4", &t.ipv4), ("ipv6", &t.ipv6)];
        let mut f = Family::new(
            o,
            "sluice_persistence_templates",
            "gauge",
            "Live persistence templates by table and standing, as the last whole count found them.",
        );
        for (family, r) in tables {
            for (standing, n) in [
                ("unconfirmed", r.unconfirmed),
                ("unverified", r.unverified),
                ("confirmed", r.confirmed),
            ] {
                f.sample(
                    "sluice_persistence_templates",
                    &[("family", family), ("standing", standing)],
                    n,
                );
            }
        }
        let mut f = Family::new(
            o,
            "sluice_persistence_template_slots",
            "gauge",
            "Slots of each persistence template table.",
        );
        for (family, r) in tables {
            f.sample(
                "sluice_persistence_template_slots",
                &[("family", family)],
                r.slots,
            );
        }
        Family::new(
            o,
            "sluice_persistence_templates_counted_seconds_ago",
            "gauge",
            "How long ago the template count shown was finished.",
        )
        .sample(
            "sluice_persistence_templates_counted_seconds_ago",
            &[],
            t.counted_ms_ago as f64 / 1000.0,
        );
    }
    let a = &status.snapshot_adoption;
    let mut f = Family::new(
        o,
        "sluice_snapshot_adoption_seconds",
        "summary",
        "Service change published -> adopted by every worker (recent quantiles).",
    );
    let name = "sluice_snapshot_adoption_seconds";
    for (q, v) in [("0.5", a.p50_ns), ("0.99", a.p99_ns)] {
        if let Some(ns) = v {
            f.sample(name, &[("quantile", q)], ns as f64 / 1e9);
        }
    }
    f.sample(
        "sluice_snapshot_adoption_seconds_sum",
        &[],
        a.sum_ns as f64 / 1e9,
    );
    f.sample(
        "sluice_snapshot_adoption_seconds_count",
        &[],
        a.publishes - a.late,
    );
    Family::new(
        o,
        "sluice_snapshot_adoption_max_seconds",
        "gauge",
        "Slowest publish -> every worker adopted since start.",
    )
    .sample(
        "sluice_snapshot_adoption_max_seconds",
        &[],
        a.max_ns as f64 / 1e9,
    );
    Family::new(
        o,
        "sluice_snapshot_adoption_late_total",
        "counter",
        "Published changes some worker had not adopted within the wait bound.",
    )
    .sample("sluice_snapshot_adoption_late_total", &[], a.late);

    type RsGetter = fn(&crate::control::report::RealServerStatus) -> u64;
    let rs_metrics: [(&str, &str, &str, RsGetter); 13] = [
        (
            "sluice_rs_connections_total",
            "counter",
            "Sessions created towards the real server.",
            |r| r.connections,
        ),
        (
            "sluice_rs_in_packets_total",
            "counter",
            "Packets client -> real server.",
            |r| r.in_packets,
        ),
        (
            "sluice_rs_out_packets_total",
            "counter",
            "Packets real server -> client (NAT, FullNAT).",
            |r| r.out_packets,
        ),
        (
            "sluice_rs_in_bytes_total",
            "counter",
            "Bytes client -> real server.",
            |r| r.in_bytes,
        ),
        (
            "sluice_rs_out_bytes_total",
            "counter",
            "Bytes real server -> client.",
            |r| r.out_bytes,
        ),
        (
            "sluice_rs_active_connections",
            "gauge",
            "Sessions in ESTABLISHED (ipvsadm ActiveConn).",
            |r| r.active,
        ),
        (
            "sluice_rs_inactive_connections",
            "gauge",
            "Sessions in other states (ipvsadm InActConn).",
            |r| r.inactive,
        ),
        (
            "sluice_rs_weight",
            "gauge",
            "The real server's weight (0: draining).",
            |r| u64::from(r.weight),
        ),
        (
            "sluice_rs_connections_per_second",
            "gauge",
            "New connections per second (2 s window).",
            |r| r.cps,
        ),
        (
            "sluice_rs_in_packets_per_second",
            "gauge",
            "Client -> real server packets per second (2 s window).",
            |r| r.in_pps,
        ),
        (
            "sluice_rs_evicted",
            "gauge",
            "1 while health checking keeps the real server out of scheduling.",
            |r| u64::from(r.evicted),
        ),
        (
            "sluice_rs_evictions_total",
            "counter",
            "Times health checking evicted the real server.",
            |r| r.evictions,
        ),
        (
            "sluice_rs_overloaded",
            "gauge",
            "1 while the upper connection threshold (-x) keeps the real server from new connections.",
            |r| u64::from(r.overloaded),
        ),
    ];
    // Every real server's labels, written once for the thirteen families.
    let mut real_servers = Vec::new();
    for s in &services.services {
        let service = service_label(s);
        // The sorry server's series go on while it is not listed.
        let listed = s.real_servers.iter().any(|r| r.sorry);
        let sorry = s.sorry_server.iter().filter(|_| !listed);
        for r in s.real_servers.iter().chain(sorry) {
            let rs = crate::control::render::endpoint(&r.ip, r.port);
            let mut labels = String::new();
            push_labels(&mut labels, &[("service", &service), ("rs", &rs)]);
            real_servers.push((labels, r));
        }
    }
    for (name, kind, help, get) in rs_metrics {
        let mut f = Family::new(o, name, kind, help);
        for (labels, r) in &real_servers {
            f.sample_labelled(name, labels, get(r));
        }
    }
    let mut f = Family::new(
        o,
        "sluice_service_available",
        "gauge",
        "1 when some real server can take a new connection (weight > 0, not evicted); 0 raises the all-down alert.",
    );
    for s in &services.services {
        let service = service_label(s);
        f.sample(
            "sluice_service_available",
            &[("service", &service)],
            u8::from(s.available),
        );
    }
    let mut f = Family::new(
        o,
        "sluice_service_sorry_in_use",
        "gauge",
        "1 while the service's sorry server takes its new connections (no real server can); services with a sorry server only.",
    );
    for s in services
        .services
        .iter()
        .filter(|s| s.sorry_server.is_some())
    {
        let service = service_label(s);
        f.sample(
            "sluice_service_sorry_in_use",
            &[("service", &service)],
            u8::from(s.sorry_in_use),
        );
    }
    let mut f = Family::new(
        o,
        "sluice_service_connection_skew_ratio",
        "gauge",
        "Largest share of connections a real server holds over the share its scheduler gives it (1 = as scheduled; sluicectl skew).",
    );
    for s in &services.services {
        let service = service_label(s);
        let conns: Vec<u64> = s
            .real_servers
            .iter()
            .map(|r| r.active + r.inactive)
            .collect();
        f.sample(
            "sluice_service_connection_skew_ratio",
            &[("service", &service)],
            skew_pct(&conns, &crate::control::render::skew_weights(s)) as f64 / 100.0,
        );
    }

    let pool_metrics: [(&str, &str, &str); 5] = [
        (
            "sluice_laddr_ports_used",
            "gauge",
            "FullNAT local ports in use, per worker and local address.",
        ),
        (
            "sluice_laddr_ports_free",
            "gauge",
            "FullNAT local ports of the worker's share not in use.",
        ),
        (
            "sluice_laddr_misses_total",
            "counter",
            "Allocations that found no suitable free port.",
        ),
        (
            "sluice_laddr_early_reuses_total",
            "counter",
            "Local ports reused towards the same real server within its TIME-WAIT.",
        ),
        (
            "sluice_laddr_unprotected_reuses_total",
            "counter",
            "Early local-port reuses without TCP timestamps to rewrite.",
        ),
    ];
    for (i, (name, kind, help)) in pool_metrics.into_iter().enumerate() {
        let mut f = Family::new(o, name, kind, help);
        // Per local address, not per service: the services that share an address
        // share its ports, so a per-service series would count them once each.
        for p in pools {
            let value = match i {
                0 => u64::from(p.used),
                1 => u64::from(p.free),
                2 => p.misses,
                3 => p.early_reuses,
                _ => p.unprotected_reuses,
            };
            let (worker, lip) = (p.worker.to_string(), p.lip.to_string());
            f.sample(name, &[("lip", &lip), ("worker", &worker)], value);
        }
    }
    out
}

/// The HTTP endpoint: `GET /metrics` answers the exposition text (`HEAD` its head,
/// another method 405, another path 404).
/// Each client is served on a thread of its own, [`CLIENTS_MAX`] at once and
/// [`CLIENTS_PER_SOURCE`] from one address (beyond either the connection is closed
/// unanswered), and has [`REQUEST_TIMEOUT`] to send its request and
/// [`ANSWER_TIMEOUT`] to take the answer. So a client that stalls, or one that
/// reconnects as soon as it is cut off, holds a slot for those 8 s plus the time its
/// scrape waits for its turn and is built (one at a time, the loop's part bounded by
/// the control handler's 2 s; writing the text about 0.3 s at 50,000 real servers),
/// and never keeps another address's scrape waiting. Scrapes share texts
/// ([`share_text`]), so the clients served at once hold two texts at most, not one
/// each (53 MB apiece at 50,000 real servers).
pub struct MetricsServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves on `listener`, bound before the EAL started.
    pub fn spawn(listener: TcpListener, handler: Handler) -> std::io::Result<MetricsServer> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_thread = stop.clone();
        let thread = spawn_helper(
            std::thread::Builder::new().name("sluice-metrics".into()),
            move || {
                let clients = Arc::new(Clients::default());
                // One scrape at a time, from asking the management loop to the text
                // written: clients served at once must not queue a report each for one
                // pass of the loop (VRRP and health ticks wait behind them), nor build
                // a text each at once (53 MB apiece at 50,000 real servers).
                let scrape: Arc<ScrapeFn> = {
                    let texts = Mutex::new(Texts::default());
                    Arc::new(move || {
                        let arrived = Instant::now();
                        let mut texts = texts.lock().unwrap_or_else(|e| e.into_inner());
                        let earliest = texts.build_started.map(|at| at + BUILD_GAP);
                        let started = std::cell::Cell::new(None);
                        let text = share_text(&mut texts, arrived, || {
                            // Scrapes waiting meanwhile share what this one builds.
                            if let Some(at) = earliest {
                                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                            }
                            started.set(Some(Instant::now()));
                            match handler(Request::Metrics)? {
                                Reply::Value(serde_json::Value::String(text)) => Ok(text),
                                _ => Ok(String::new()),
                            }
                        });
                        texts.build_started = started.get().or(texts.build_started);
                        text
                    })
                };
                let mut refusals = Refusals::default();
                while !stop_thread.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, peer)) => {
                            // Beyond the bounds the connection is closed unanswered.
                            let Some(slot) = clients.admit(peer.ip()) else {
                                if let Some(line) = refusals.refused(peer, Instant::now()) {
                                    log::warn!("{line}");
                                }
                                continue;
                            };
                            let scrape = Arc::clone(&scrape);
                            let spawned = spawn_helper(
                                std::thread::Builder::new().name("sluice-metrics-client".into()),
                                move || {
                                    serve(stream, &*scrape);
                                    drop(slot);
                                },
                            );
                            if let Err(e) = spawned {
                                log::warn!("metrics endpoint: no thread for {peer}: {e}");
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        Err(e) => {
                            log::warn!("metrics endpoint: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            },
        )?;
        log::info!("metrics on http://{addr}/metrics");
        Ok(MetricsServer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The least time from the start of one text's build to the start of the next. Anyone
/// who can reach the endpoint can ask for scrape after scrape, reading each answer at
/// once; each costs the management loop its report (about 30 ms at 50,000 real
/// servers) and a helper CPU the text (0.3 s). A scrape that would build sooner waits
/// for it, and scrapes arriving meanwhile share its text. Start to start, not end to
/// start: a Prometheus scraping every second would otherwise fall behind by a build's
/// time at each scrape; two scraping out of phase wait half a second at most.
const BUILD_GAP: Duration = Duration::from_millis(500);

/// Connections refused because every slot was taken: the first refusal of a minute is
/// logged as a warning (a scraper may be locked out by someone holding the slots), with
/// how many were refused in the minute before it.
#[derive(Default)]
struct Refusals {
    logged_at: Option<Instant>,
    since: u64,
}

impl Refusals {
    const LOG_GAP: Duration = Duration::from_secs(60);

    fn refused(&mut self, peer: std::net::SocketAddr, now: Instant) -> Option<String> {
        self.since += 1;
        if self
            .logged_at
            .is_some_and(|at| now.duration_since(at) < Refusals::LOG_GAP)
        {
            return None;
        }
        let line = format!(
            "metrics endpoint: refused {peer} and {} other connection(s) since the last such \
             line: {CLIENTS_MAX} clients at once, {CLIENTS_PER_SOURCE} per address (per /64 for \
             IPv6) are served; a scraper may be locked out",
            self.since - 1
        );
        self.logged_at = Some(now);
        self.since = 0;
        Some(line)
    }
}

/// The exposition text for a scrape, shared with other scrapes ([`share_text`]).
type ScrapeFn = dyn Fn() -> Result<Arc<String>, String> + Send + Sync;

/// The texts built for scrapes, alive while a client is still being sent them: none is
/// kept here (53 MB at 50,000 real servers, between scrapes a minute apart).
#[derive(Default)]
struct Texts {
    /// The newest, and when it was done.
    last: Option<(Instant, Weak<String>)>,
    /// The one before it.
    older: Weak<String>,
    /// When the last build began ([`BUILD_GAP`]).
    build_started: Option<Instant>,
}

/// The text for a scrape that arrived at `arrived`:
/// - a new one from `build` if no client holds the last one any more;
/// - the last one if the scrape arrived before it was done (it waited for that build,
///   so it gets values no older than its own wait: two Prometheus servers scraping one
///   node at once cost one report);
/// - a new one if the one before the last is gone;
/// - else the last one: two texts are already being sent to clients, and a third is
///   not built (53 MB apiece at 50,000 real servers).
///
/// So no more than two texts are alive at once, whatever the clients do. A scrape gets
/// values older than its arrival only while two texts are being sent (slow clients),
/// and then no older than the time a client may hold one: the older of the two is gone
/// [`ANSWER_TIMEOUT`] after the newer was built, and the next scrape builds again. A
/// failed build is not kept: the next scrape asks again.
fn share_text(
    texts: &mut Texts,
    arrived: Instant,
    build: impl FnOnce() -> Result<String, String>,
) -> Result<Arc<String>, String> {
    if let Some((done, last)) = &texts.last {
        if let Some(text) = last.upgrade() {
            if arrived <= *done || texts.older.strong_count() > 0 {
                return Ok(text);
            }
        }
    }
    let text = Arc::new(build()?);
    // The last text becomes the older one only if a client still holds it: one nobody
    // holds must not push out an older one that is still being sent, which would then
    // be alive but not counted.
    if let Some((_, last)) = texts.last.take() {
        if last.strong_count() > 0 {
            texts.older = last;
        }
    }
    texts.last = Some((Instant::now(), Arc::downgrade(&text)));
    Ok(text)
}

/// Clients served at once. Their descriptors are among those the preflight keeps
/// back for the daemon's own use (`FILES_RESERVED`).
const CLIENTS_MAX: usize = 8;
/// Clients served at once from one address: Prometheus scrapes a target one scrape at
/// a time, and a second slot covers a scrape that begins while the last one, given up
/// by a client that timed out, is still being cut off here.
const CLIENTS_PER_SOURCE: usize = 2;

/// The clients being served, by source ([`source_of`]).
#[derive(Default)]
struct Clients(Mutex<HashMap<IpAddr, usize>>);

/// What [`CLIENTS_PER_SOURCE`] counts: an IPv4 address (also written as IPv4-mapped
/// IPv6), or an IPv6 address's /64, which one host usually has to itself and can take
/// any address in.
fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !((1u128 << 64) - 1),
            )),
        },
    }
}

/// One client's place among [`Clients`], given back when dropped.
struct ClientSlot {
    clients: Arc<Clients>,
    source: IpAddr,
}

impl Clients {
    /// A place for a client from `peer`, unless [`CLIENTS_MAX`] are served or
    /// [`CLIENTS_PER_SOURCE`] from its source ([`source_of`]).
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<ClientSlot> {
        let source = source_of(peer);
        let mut served = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = served.values().sum();
        let from_source = served.entry(source).or_insert(0);
        if total >= CLIENTS_MAX || *from_source >= CLIENTS_PER_SOURCE {
            if *from_source == 0 {
                served.remove(&source);
            }
            return None;
        }
        *from_source += 1;
        Some(ClientSlot {
            clients: Arc::clone(self),
            source,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut served = self.clients.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = served.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                served.remove(&self.source);
            }
        }
    }
}

/// How long one client may take to send its whole request head. A bound on the whole
/// of it, not on each read: with only per-call timeouts a client trickling a byte a
/// second would hold its slot for hours, and a few of them every slot.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one client may take to receive the whole answer, bounded the same way:
/// with [`REQUEST_TIMEOUT`], a client that stalls holds its slot 8 s at most, under
/// Prometheus's default scrape timeout of 10 s, while a scraper on a slow link still
/// has 6 s for a large exposition.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(6);

/// The time left before `deadline` as a socket timeout; `None` once it has passed
/// (a zero timeout would mean "block for ever").
fn time_left(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left)
}

/// Whether `head` holds a whole request head: up to an empty line, its lines ended by
/// CRLF or, as RFC 9112 (section 2.2) lets a server accept, a bare LF.
fn head_complete(head: &[u8]) -> bool {
    head.windows(2).any(|w| w == b"\n\n") || head.windows(3).any(|w| w == b"\n\r\n")
}

/// What the endpoint answers a request line's method and target: `GET` of
/// `/metrics` (with any query) the text; `HEAD` of it the same head without the
/// text (which is not built: RFC 9110 lets a HEAD answer leave out a length known only
/// by generating the content, and it is 200 even when a scrape would fail); another
/// method on `/metrics` 405 with `Allow`; any other target 404 (to `HEAD` without its
/// content).
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Text,
    HeadOnly,
    MethodNotAllowed,
    NotFound,
}

fn route(method: &str, target: &str) -> Route {
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => Route::Text,
        ("HEAD", "/metrics") => Route::HeadOnly,
        (_, "/metrics") => Route::MethodNotAllowed,
        _ => Route::NotFound,
    }
}

fn serve(mut stream: TcpStream, scrape: &ScrapeFn) {
    let _ = stream.set_nonblocking(false);
    // The request head, at most 8 KiB.
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head_complete(&head) && head.len() < 8192 {
        let Some(left) = time_left(deadline) else {
            return;
        };
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    const TEXT_TYPE: &str = "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n";
    let (status, extra, body) = match route(method, target) {
        Route::Text => match scrape() {
            // The text itself, not a copy: it is 53 MB at 50,000 real servers.
            Ok(text) => ("200 OK", TEXT_TYPE, Some(text)),
            Err(e) => (
                "503 Service Unavailable",
                TEXT_TYPE,
                Some(Arc::new(format!("{e}\n"))),
            ),
        },
        Route::HeadOnly => ("200 OK", TEXT_TYPE, None),
        Route::MethodNotAllowed => (
            "405 Method Not Allowed",
            "Allow: GET, HEAD\r\nContent-Type: text/plain; charset=utf-8\r\n",
            Some(Arc::new(
                "only GET and HEAD /metrics are served\n".to_string(),
            )),
        ),
        Route::NotFound => (
            "404 Not Found",
            "Content-Type: text/plain; charset=utf-8\r\n",
            Some(Arc::new("only /metrics is served\n".to_string())),
        ),
    };
    let length = body.as_ref().map_or(String::new(), |b| {
        format!("Content-Length: {}\r\n", b.len())
    });
    let head = format!("HTTP/1.1 {status}\r\n{extra}{length}Connection: close\r\n\r\n");
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    // A HEAD answer has the head a GET's would have, and never content.
    let body = match (method, body.as_ref()) {
        ("HEAD", _) | (_, None) => "",
        (_, Some(b)) => b.as_str(),
    };
    for part in [head.as_bytes(), body.as_bytes()] {
        if !send_all(&mut stream, part, deadline) {
            return;
        }
    }
}

/// Writes `bytes` to `stream` by `deadline`; false when the client is gone or too slow.
fn send_all(stream: &mut TcpStream, bytes: &[u8], deadline: Instant) -> bool {
    let mut unsent = bytes;
    while !unsent.is_empty() {
        let Some(left) = time_left(deadline) else {
            return false;
        };
        let _ = stream.set_write_timeout(Some(left));
        match stream.write(unsent) {
            Ok(0) => return false,
            Ok(n) => unsent = &unsent[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// The exposition text of admission (access lists and rate limits), from the
/// `--acl-list` reports of the services that have rules (their rules not listed:
/// per-rule hits stay in `sluicectl --acl-list`, not in a series per prefix).
pub fn render_admission(reports: &[AdmissionReport]) -> String {
    let mut out = String::new();
    let o = &mut out;
    type Getter = fn(&AdmissionReport) -> u64;
    let families: [(&str, &str, &str, Getter); 5] = [
        (
            "sluice_acl_rules",
            "gauge",
            "Rules in the service's access list.",
            |r| r.rules_total as u64,
        ),
        (
            "sluice_acl_denied_total",
            "counter",
            "New connections the service's access list refused.",
            |r| r.totals.acl_denied,
        ),
        (
            "sluice_ratelimit_per_second",
            "gauge",
            "The service's per-source new-connection rate limit (0: none).",
            |r| r.rate_limit.map_or(0, |l| u64::from(l.rate)),
        ),
        (
            "sluice_ratelimit_dropped_total",
            "counter",
            "New connections over the service's per-source rate limit.",
            |r| r.totals.rate_limited,
        ),
        (
            "sluice_ratelimit_evictions_total",
            "counter",
            "Rate-limit buckets taken over by another source while not full.",
            |r| r.totals.rate_evicted_live,
        ),
    ];
    for (name, kind, help, get) in families {
        let mut f = Family::new(o, name, kind, help);
        for r in reports {
            let service = r.service.to_string();
            f.sample(name, &[("service", &service)], get(r));
        }
    }
    out
}

/// The exposition text of health checking, VRRP and session sync, from the reports of
/// `sluicectl health`, `vrrp` and `sync` (the last two only when configured).
pub fn render_ha(
    health: &HealthReport,
    vrrp: Option<&VrrpReport>,
    sync: Option<&SyncReport>,
) -> String {
    let mut o = String::new();
    let mut f = Family::new(
        &mut o,
        "sluice_health_probes_total",
        "counter",
        "Active health probes by outcome (ok, failed, timed_out: part of failed, skipped: not sent, plus one per 5 ms tick in which due probes waited for a free source port).",
    );
    let h = &health.stats;
    for (outcome, count) in [
        ("ok", h.probes_ok),
        ("failed", h.probes_failed),
        ("timed_out", h.probes_timed_out),
        ("skipped", h.probes_skipped),
    ] {
        f.sample("sluice_health_probes_total", &[("outcome", outcome)], count);
    }
    if let Some(v) = vrrp {
        let mut f = Family::new(
            &mut o,
            "sluice_vrrp_master",
            "gauge",
            "1 while this node is the VRRP master (serves the virtual addresses).",
        );
        f.sample("sluice_vrrp_master", &[], u8::from(v.state == "MASTER"));
        let counters = [
            (
                "sluice_vrrp_transitions_total",
                v.stats.transitions,
                "VRRP state changes.",
            ),
            (
                "sluice_vrrp_adverts_sent_total",
                v.stats.adverts_sent,
                "Advertisements sent.",
            ),
            (
                "sluice_vrrp_adverts_received_total",
                v.stats.adverts_received,
                "Valid advertisements received.",
            ),
            (
                "sluice_vrrp_adverts_rejected_total",
                v.stats.adverts_rejected,
                "Advertisements rejected (VRID, TTL, checksum, version, length).",
            ),
            (
                "sluice_vrrp_adverts_unsealed_total",
                v.stats.adverts_unsealed,
                "Advertisements taken without a seal while accept_unsealed = true.",
            ),
        ];
        for (name, value, help) in counters {
            Family::new(&mut o, name, "counter", help).sample(name, &[], value);
        }
        let mut f = Family::new(
            &mut o,
            "sluice_vrrp_adverts_refused_total",
            "counter",
            "Valid advertisements authentication refused: bad_auth (no trailer or a wrong \
             tag with a key, a trailer without one), replayed (not above the sender's last \
             counter), clock_skew (a counter too far ahead of our clock, or a sender's first \
             too far behind it).",
        );
        for (reason, value) in [
            ("bad_auth", v.stats.adverts_bad_auth),
            ("replayed", v.stats.adverts_replayed),
            ("clock_skew", v.stats.adverts_clock_skew),
        ] {
            f.sample(
                "sluice_vrrp_adverts_refused_total",
                &[("reason", reason)],
                value,
            );
        }
    }
    if let Some(s) = sync {
        if let Some(group) = s.multicast.as_deref() {
            Family::new(
                &mut o,
                "sluice_sync_multicast_info",
                "gauge",
                "The multicast group session batches are sent to and received from.",
            )
            .sample("sluice_sync_multicast_info", &[("group", group)], 1);
        }
        let counters = [
            (
                "sluice_sync_events_sent_total",
                s.stats.events_sent,
                "Session events sent to the peers.",
            ),
            (
                "sluice_sync_events_dropped_total",
                s.events_dropped,
                "Session events lost to full worker rings.",
            ),
            (
                "sluice_sync_messages_sent_total",
                s.stats.messages_sent,
                "Sync datagrams sent.",
            ),
            (
                "sluice_sync_bytes_sent_total",
                s.stats.bytes_sent,
                "Sync payload bytes sent.",
            ),
            (
                "sluice_sync_multicast_received_total",
                s.stats.multicast_received,
                "Sync datagrams received from the multicast group.",
            ),
            (
                "sluice_sync_records_accepted_total",
                s.accepted_records,
                "Records received in accepted messages.",
            ),
            (
                "sluice_sync_install_inbox_full_total",
                s.stats.install_inbox_full,
                "Records lost to a full worker install inbox.",
            ),
            (
                "sluice_sync_templates_sent_total",
                s.stats.templates_sent,
                "Persistence templates sent in batches (new, changed or resent).",
            ),
            (
                "sluice_sync_templates_received_total",
                s.stats.templates_received,
                "Persistence template records received in accepted messages.",
            ),
            (
                "sluice_sync_templates_installed_total",
                s.stats.templates_installed,
                "Received templates installed (created, refreshed or replaced).",
            ),
            (
                "sluice_sync_templates_skipped_total",
                s.stats.templates_skipped,
                "Received templates not installed (real server or service unknown here, other netmask, expired, slot busy, a later local template kept).",
            ),
            (
                "sluice_sync_frames_sent_total",
                s.stats.frames_sent,
                "Sync frames queued for worker 0 to transmit (sync over a DPDK port).",
            ),
            (
                "sluice_sync_frames_received_total",
                s.stats.frames_received,
                "Sync frames the workers handed to the management core (sync over a DPDK port).",
            ),
            (
                "sluice_sync_frames_malformed_total",
                s.stats.frames_malformed,
                "Sync frames dropped for their lengths or IPv4/UDP checksums (sync over a DPDK port).",
            ),
            (
                "sluice_sync_records_refused_service_total",
                s.stats.records_refused_service,
                "Synced records refused: their virtual service is not here.",
            ),
            (
                "sluice_sync_records_refused_real_server_total",
                s.stats.records_refused_real_server,
                "Synced records refused: their real server is not in the service here.",
            ),
            (
                "sluice_sync_records_refused_mode_total",
                s.stats.records_refused_mode,
                "Synced records refused: their real server forwards in another mode here.",
            ),
            (
                "sluice_sync_records_refused_local_total",
                s.stats.records_refused_local,
                "Synced FullNAT records refused: their local address is not the service's here.",
            ),
            (
                "sluice_sync_timeouts_clamped_total",
                s.stats.timeouts_clamped,
                "Synced records whose timeout was cut to this node's for their state.",
            ),
            (
                "sluice_sync_resync_requests_ignored_total",
                s.stats.resync_requests_ignored,
                "Resync requests ignored: a dump to that peer had started less than a second before.",
            ),
        ];
        for (name, value, help) in counters {
            Family::new(&mut o, name, "counter", help).sample(name, &[], value);
        }
        let mut f = Family::new(
            &mut o,
            "sluice_sync_rejected_total",
            "counter",
            "Sync datagrams rejected, by reason; nothing of them is installed.",
        );
        for (reason, count) in &s.rejected {
            f.sample(
                "sluice_sync_rejected_total",
                &[("reason", reason.as_str())],
                count,
            );
        }
        let peers = &s.peer_status;
        type PeerGetter = fn(&PeerReport) -> u64;
        let per_peer: [(&str, PeerGetter, &str); 8] = [
            (
                "sluice_sync_peer_messages_total",
                |p| p.messages,
                "Messages accepted from the peer.",
            ),
            (
                "sluice_sync_peer_lost_total",
                |p| p.lost,
                "Messages missing in the peer's sequence (lost on the way or rejected here; gaps up to the loss bound).",
            ),
            (
                "sluice_sync_peer_replayed_total",
                |p| p.replayed,
                "Authenticated messages of the peer refused: a sequence number already had.",
            ),
            (
                "sluice_sync_peer_too_old_total",
                |p| p.too_old,
                "Authenticated messages of the peer refused: behind the anti-replay window.",
            ),
            (
                "sluice_sync_peer_old_epoch_total",
                |p| p.old_epoch,
                "Authenticated messages of the peer refused: from an earlier life (epoch).",
            ),
            (
                "sluice_sync_peer_unconfirmed_epoch_total",
                |p| p.unconfirmed_epoch,
                "Authenticated messages of the peer refused: from a life not yet confirmed since this node started.",
            ),
            (
                "sluice_sync_peer_out_of_window_total",
                |p| p.out_of_window,
                "Messages of the peer accepted more than the loss bound ahead of the last (not counted as lost).",
            ),
            (
                "sluice_sync_peer_resync_rate_limited_total",
                |p| p.resync_rate_limited,
                "Resync requests of the peer ignored: a dump to it had started less than a second before.",
            ),
        ];
        for (name, get, help) in per_peer {
            let mut f = Family::new(&mut o, name, "counter", help);
            for p in peers {
                f.sample(name, &[("peer", p.addr.to_string().as_str())], get(p));
            }
        }
        let mut f = Family::new(
            &mut o,
            "sluice_sync_peer_last_heard_seconds",
            "gauge",
            "Seconds since the peer's last accepted message (absent: never heard).",
        );
        for p in peers {
            if let Some(ms) = p.last_heard_ms_ago {
                f.sample(
                    "sluice_sync_peer_last_heard_seconds",
                    &[("peer", p.addr.to_string().as_str())],
                    format!("{:.3}", ms as f64 / 1000.0),
                );
            }
        }
        let mut f = Family::new(
            &mut o,
            "sluice_sync_peer_resync_complete",
            "gauge",
            "1 once the bulk resync asked of the peer arrived whole.",
        );
        for p in peers {
            f.sample(
                "sluice_sync_peer_resync_complete",
                &[("peer", p.addr.to_string().as_str())],
                u8::from(p.resync.state == ResyncState::Complete),
            );
        }
    }
    o
}

/// BGP through BIRD (`[bgp]`, docs/CLUSTER.md): per VIP whether it is announced,
/// the drain and shutdown state, BIRD's sessions, and the `birdc configure` counts.
pub fn render_bgp(r: &crate::ha::bgp::ClusterReport) -> String {
    let mut o = String::new();
    let mut f = Family::new(
        &mut o,
        "sluice_bgp_vip_announced",
        "gauge",
        "1 while this node has BIRD announce the VIP, 0 while withdrawn (sluicectl cluster says why).",
    );
    for v in &r.vips {
        f.sample(
            "sluice_bgp_vip_announced",
            &[("vip", v.vip.as_str())],
            u8::from(v.announced),
        );
    }
    let mut f = Family::new(
        &mut o,
        "sluice_bgp_draining",
        "gauge",
        "1 while the node is drained (sluicectl drain) or shutting down.",
    );
    f.sample(
        "sluice_bgp_draining",
        &[],
        u8::from(r.draining || r.shutting_down),
    );
    let mut f = Family::new(
        &mut o,
        "sluice_bgp_session_established",
        "gauge",
        "1 while BIRD's BGP protocol is up and Established (from birdc show protocols).",
    );
    for s in &r.sessions {
        f.sample(
            "sluice_bgp_session_established",
            &[("name", s.name.as_str())],
            u8::from(s.state == "up" && s.info.starts_with("Established")),
        );
    }
    for (name, value, help) in [
        (
            "sluice_bgp_configures_total",
            r.applies,
            "birdc configure calls BIRD accepted.",
        ),
        (
            "sluice_bgp_configure_failures_total",
            r.failures,
            "birdc configure calls that failed (BIRD down, refused file, timeout).",
        ),
    ] {
        Family::new(&mut o, name, "counter", help).sample(name, &[], value);
    }
    o
}

#[cfg(test)]
mod label_tests {
    use super::{push_labels, Family, MetricsInputs};
    use crate::control::report::{RealServerStatus, ServiceStatus, ServicesReport, StatusReport};
    use crate::health::HealthReport;
    use std::collections::HashSet;

    /// The inputs of a scrape with `status` and `services`, nothing else.
    fn inputs(status: StatusReport, services: ServicesReport) -> MetricsInputs {
        MetricsInputs {
            status,
            services,
            pools: Vec::new(),
            admission: Vec::new(),
            health: HealthReport {
                source: "198.18.0.1".into(),
                sources6: Vec::new(),
                targets: Vec::new(),
                stats: Default::default(),
            },
            vrrp: None,
            sync: None,
            bgp: None,
        }
    }

    /// Each real server's series once in every real-server family, in the listing's
    /// order, its labels written once and reused: a listed sorry server once, one
    /// not listed after the others; and every family's samples together under its one
    /// `# TYPE`.
    #[test]
    fn real_server_families_list_each_server_once_in_order_under_one_type() {
        let rs = |ip: &str, port, weight, sorry| RealServerStatus {
            ip: ip.into(),
            port,
            weight,
            sorry,
            ..Default::default()
        };
        let listed_sorry = ServiceStatus {
            proto: "tcp".into(),
            vip: "198.18.1.1".into(),
            port: 80,
            real_servers: vec![
                rs("198.18.0.2", 8080, 1, false),
                rs("198.18.0.3", 8080, 2, false),
                rs("198.18.0.9", 8080, 0, true),
            ],
            sorry_server: Some(rs("198.18.0.9", 8080, 0, true)),
            ..Default::default()
        };
        let unlisted_sorry = ServiceStatus {
            proto: "udp".into(),
            vip: "2001:db8::1".into(),
            port: 53,
            real_servers: vec![rs("2001:db8::2", 53, 3, false)],
            sorry_server: Some(rs("2001:db8::9", 53, 0, false)),
            ..Default::default()
        };
        let services = ServicesReport {
            services: vec![listed_sorry, unlisted_sorry],
        };
        let text = inputs(StatusReport::default(), services).render();
        let weights: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("sluice_rs_weight{"))
            .collect();
        assert_eq!(
            weights,
            [
                r#"sluice_rs_weight{service="TCP 198.18.1.1:80",rs="198.18.0.2:8080"} 1"#,
                r#"sluice_rs_weight{service="TCP 198.18.1.1:80",rs="198.18.0.3:8080"} 2"#,
                r#"sluice_rs_weight{service="TCP 198.18.1.1:80",rs="198.18.0.9:8080"} 0"#,
                r#"sluice_rs_weight{service="UDP [2001:db8::1]:53",rs="[2001:db8::2]:53"} 3"#,
                r#"sluice_rs_weight{service="UDP [2001:db8::1]:53",rs="[2001:db8::9]:53"} 0"#,
            ]
        );
        let mut types = HashSet::new();
        let mut family = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(types.insert(name), "{name} typed twice");
                family = Some(name);
            } else if !line.starts_with('#') {
                // A summary's samples add `_sum` and `_count` to its name.
                let name = line.split(['{', ' ']).next().unwrap();
                let name = (name.strip_suffix("_sum"))
                    .or(name.strip_suffix("_count"))
                    .filter(|base| types.contains(base))
                    .unwrap_or(name);
                assert_eq!(Some(name), family, "{line:?} outside its family");
            }
        }
        assert!(types.len() > 40, "{} families", types.len());
    }

    /// The management loop's four families, none outside a daemon.
    #[test]
    fn management_turns_are_counted_and_the_longest_is_a_gauge() {
        use crate::control::report::ManagementReport;
        let inputs = |management| {
            let status = StatusReport {
                management,
                ..Default::default()
            };
            inputs(status, ServicesReport::default())
        };
        let text = inputs(Some(ManagementReport {
            turns: 1200,
            longest_turn_us: 17_500,
            control_requests: 9,
            control_turns_cut: 2,
        }))
        .render();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("sluice_management") || l.starts_with("sluice_control"))
            .collect();
        assert_eq!(
            lines,
            [
                "sluice_management_turns_total 1200",
                "sluice_management_turn_longest_seconds 0.0175",
                "sluice_control_requests_total 9",
                "sluice_control_turns_cut_total 2",
            ]
        );
        let text = inputs(None).render();
        assert!(!text.contains("sluice_management"), "{text}");
    }

    /// The template count: one gauge per table and standing, the slots per table,
    /// and the count's age; none before the first count.
    #[test]
    fn template_counts_are_gauges_by_family_and_standing() {
        use crate::control::report::{TemplateTableReport, TemplatesReport};
        let inputs = |templates| {
            let status = StatusReport {
                persistence_templates: templates,
                ..Default::default()
            };
            inputs(status, ServicesReport::default())
        };
        let text = inputs(Some(TemplatesReport {
            ipv4: TemplateTableReport {
                slots: 1024,
                unconfirmed: 7,
                unverified: 2,
                confirmed: 5,
            },
            ipv6: TemplateTableReport {
                slots: 256,
                confirmed: 1,
                ..Default::default()
            },
            counted_ms_ago: 1_500,
            pass_ms: 5_000,
        }))
        .render();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("sluice_persistence_template"))
            .collect();
        assert_eq!(
            lines,
            [
                r#"sluice_persistence_templates{family="ipv4",standing="unconfirmed"} 7"#,
                r#"sluice_persistence_templates{family="ipv4",standing="unverified"} 2"#,
                r#"sluice_persistence_templates{family="ipv4",standing="confirmed"} 5"#,
                r#"sluice_persistence_templates{family="ipv6",standing="unconfirmed"} 0"#,
                r#"sluice_persistence_templates{family="ipv6",standing="unverified"} 0"#,
                r#"sluice_persistence_templates{family="ipv6",standing="confirmed"} 1"#,
                r#"sluice_persistence_template_slots{family="ipv4"} 1024"#,
                r#"sluice_persistence_template_slots{family="ipv6"} 256"#,
                r#"sluice_persistence_templates_counted_seconds_ago 1.5"#,
            ]
        );
        let text = inputs(None).render();
        assert!(!text.contains("sluice_persistence_template"), "{text}");
    }

    /// The text format's rule: in a label value, `\` is `\\`, `"` is `\"` and a
    /// line feed is `\n`; everything else is itself.
    #[test]
    fn label_values_are_escaped_as_the_exposition_format_says() {
        let mut out = String::new();
        push_labels(&mut out, &[("a", "plain 10.0.0.1:80"), ("b", "x\\y\"z\nw")]);
        assert_eq!(out, r#"{a="plain 10.0.0.1:80",b="x\\y\"z\nw"}"#);
        let mut text = String::new();
        let mut f = Family::new(&mut text, "m", "gauge", "h");
        f.sample("m", &[], 1);
        f.sample("m", &[("k", "é\"")], 2.5);
        f.sample_labelled("m", &out, 3);
        assert_eq!(
            text,
            "# HELP m h\n# TYPE m gauge\nm 1\nm{k=\"é\\\"\"} 2.5\n".to_string()
                + "m{a=\"plain 10.0.0.1:80\",b=\"x\\\\y\\\"z\\nw\"} 3\n"
        );
    }
}

#[cfg(test)]
mod bgp_tests {
    use super::render_bgp;
    use crate::control::report::{BirdProtocol, ClusterReport, VipReport};
    use crate::ha::bgp::decide::Withdrawal;

    #[test]
    fn bgp_families_carry_vips_sessions_and_counts() {
        let r = ClusterReport {
            draining: false,
            shutting_down: false,
            vrrp_backup: false,
            socket: "/run/bird/bird.ctl".into(),
            include: "/run/sluice/bird-vips.conf".into(),
            in_sync: true,
            applies: 4,
            failures: 1,
            error: None,
            sessions: vec![BirdProtocol {
                name: "router1".into(),
                proto: "BGP".into(),
                table: "---".into(),
                state: "up".into(),
                since: "06:45:43.848".into(),
                info: "Established".into(),
            }],
            bfd: vec![],
            sessions_age_ms: Some(10),
            sessions_error: None,
            vips: vec![
                VipReport {
                    vip: "198.18.1.1".into(),
                    services: 1,
                    announced: true,
                    reason: None,
                },
                VipReport {
                    vip: "198.18.1.2".into(),
                    services: 1,
                    announced: false,
                    reason: Some(Withdrawal::NoHealthyServer),
                },
            ],
        };
        let text = render_bgp(&r);
        for line in [
            "sluice_bgp_vip_announced{vip=\"198.18.1.1\"} 1",
            "sluice_bgp_vip_announced{vip=\"198.18.1.2\"} 0",
            "sluice_bgp_draining 0",
            "sluice_bgp_session_established{name=\"router1\"} 1",
            "sluice_bgp_configures_total 4",
            "sluice_bgp_configure_failures_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }
}

#[cfg(test)]
mod admission_tests {
    use super::render_admission;
    use crate::control::report::AdmissionReport;
    use crate::model::{Protocol, ServiceKey};
    use crate::service::{AdmissionTotals, RateLimit};

    #[test]
    fn admission_families_carry_each_services_counts() {
        let mut r = AdmissionReport::empty(ServiceKey::new(
            Protocol::Tcp,
            "198.18.1.1".parse::<std::net::Ipv4Addr>().unwrap(),
            80,
        ));
        r.rules_total = 3;
        r.rate_limit = Some(RateLimit::new(20, 40, 32).unwrap());
        r.totals = AdmissionTotals {
            acl_denied: 7,
            rate_limited: 11,
            rate_evicted_live: 2,
        };
        let text = render_admission(&[r]);
        for line in [
            "sluice_acl_rules{service=\"TCP 198.18.1.1:80\"} 3",
            "sluice_acl_denied_total{service=\"TCP 198.18.1.1:80\"} 7",
            "sluice_ratelimit_per_second{service=\"TCP 198.18.1.1:80\"} 20",
            "sluice_ratelimit_dropped_total{service=\"TCP 198.18.1.1:80\"} 11",
            "sluice_ratelimit_evictions_total{service=\"TCP 198.18.1.1:80\"} 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}

#[cfg(test)]
mod ha_tests {
    use super::render_ha;
    use crate::control::report::{
        HealthReport, MonitorStats, PeerReport, ResyncReport, SyncReport, SyncStats, VrrpReport,
        VrrpStats,
    };
    use crate::ha::sync::peers::ResyncState;

    #[test]
    fn health_vrrp_and_sync_families_carry_the_reports_values() {
        let health = HealthReport {
            source: "198.18.0.254".into(),
            sources6: Vec::new(),
            targets: Vec::new(),
            stats: MonitorStats {
                probes_ok: 7,
                probes_failed: 2,
                probes_timed_out: 1,
                ..MonitorStats::default()
            },
        };
        let vrrp = VrrpReport {
            vrid: 51,
            state: "MASTER".into(),
            priority: 200,
            advert_interval_ms: 1000,
            preempt: true,
            primary: "198.18.0.1".into(),
            master: None,
            master_priority: None,
            since_change_ms: 0,
            stats: VrrpStats {
                transitions: 2,
                adverts_sent: 40,
                adverts_rejected: 3,
                adverts_replayed: 4,
                ..VrrpStats::default()
            },
            peers: vec!["198.18.0.2".into()],
            unicast: false,
            authenticated: true,
            accept_unsealed: false,
        };
        let sync = SyncReport {
            listen: "198.19.0.1:8848".into(),
            transport: "kernel socket".into(),
            multicast: Some("224.0.0.81:8848".into()),
            peers: vec!["198.19.0.2:8848".into()],
            authenticated: true,
            epoch: 1,
            stats: SyncStats {
                events_sent: 9,
                messages_sent: 4,
                bytes_sent: 400,
                templates_sent: 6,
                templates_received: 3,
                templates_installed: 2,
                templates_skipped: 1,
                multicast_received: 6,
                frames_sent: 11,
                frames_received: 8,
                frames_malformed: 2,
                ..SyncStats::default()
            },
            events_pushed: 9,
            events_dropped: 0,
            accepted_messages: 40,
            accepted_records: 5,
            rejected: [("bad_hmac".to_string(), 1), ("unknown_peer".to_string(), 0)].into(),
            peer_status: vec![PeerReport {
                addr: "198.19.0.2".parse().unwrap(),
                messages: 40,
                records: 5,
                lost: 3,
                out_of_window: 0,
                reordered: 0,
                restarts: 0,
                replayed: 0,
                too_old: 0,
                old_epoch: 0,
                unconfirmed_epoch: 0,
                resync_rate_limited: 0,
                epoch: Some(1),
                resync: ResyncReport {
                    state: ResyncState::Complete,
                    dump_id: 1,
                    attempts: 1,
                    chunks: 1,
                    records: 5,
                    took_ms: Some(3),
                },
                last_heard_ms_ago: Some(250),
            }],
        };
        let text = render_ha(&health, Some(&vrrp), Some(&sync));
        for line in [
            "sluice_health_probes_total{outcome=\"ok\"} 7",
            "sluice_health_probes_total{outcome=\"failed\"} 2",
            "sluice_vrrp_master 1",
            "sluice_vrrp_adverts_rejected_total 3",
            "sluice_vrrp_adverts_refused_total{reason=\"replayed\"} 4",
            "sluice_vrrp_adverts_refused_total{reason=\"bad_auth\"} 0",
            "sluice_sync_events_sent_total 9",
            "sluice_sync_bytes_sent_total 400",
            "sluice_sync_rejected_total{reason=\"bad_hmac\"} 1",
            "sluice_sync_templates_sent_total 6",
            "sluice_sync_templates_received_total 3",
            "sluice_sync_templates_installed_total 2",
            "sluice_sync_templates_skipped_total 1",
            "sluice_sync_multicast_info{group=\"224.0.0.81:8848\"} 1",
            "sluice_sync_multicast_received_total 6",
            "sluice_sync_peer_messages_total{peer=\"198.19.0.2\"} 40",
            "sluice_sync_peer_lost_total{peer=\"198.19.0.2\"} 3",
            "sluice_sync_peer_last_heard_seconds{peer=\"198.19.0.2\"} 0.250",
            "sluice_sync_peer_resync_complete{peer=\"198.19.0.2\"} 1",
            "sluice_sync_frames_sent_total 11",
            "sluice_sync_frames_received_total 8",
            "sluice_sync_frames_malformed_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        let unicast = SyncReport {
            multicast: None,
            ..sync
        };
        let text = render_ha(&health, None, Some(&unicast));
        assert!(!text.contains("sluice_sync_multicast_info"), "{text}");
        let plain = render_ha(&health, None, None);
        assert!(!plain.contains("vrrp") && !plain.contains("sync"));
    }
}

#[cfg(test)]
mod server_tests {
    use super::*;
    use crate::control::server::value_handler;
    use std::net::Shutdown;

    fn endpoint() -> (MetricsServer, std::net::SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handler = value_handler(|_| Ok(serde_json::json!("sluice_up 1\n")));
        (MetricsServer::spawn(listener, handler).unwrap(), addr)
    }

    /// One request as bytes, the whole answer as text.
    fn ask(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut client = TcpStream::connect(addr).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        client.write_all(request).unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        answer
    }

    fn scrape(addr: std::net::SocketAddr) -> String {
        ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n")
    }

    /// A connection to `addr` from `source` (any of 127/8 reaches the loopback).
    fn connect_from(source: std::net::Ipv4Addr, addr: std::net::SocketAddr) -> TcpStream {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let from = std::net::SocketAddr::new(source.into(), 0);
        socket.bind(&from.into()).unwrap();
        socket.connect(&addr.into()).unwrap();
        socket.into()
    }

    /// Whether the server closed `client` without an answer (within 1 s).
    fn closed_unanswered(mut client: TcpStream) -> bool {
        client
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut buf = [0u8; 64];
        match client.read(&mut buf) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    }

    /// A request whose lines end in a bare LF is answered at once (RFC 9112 lets a
    /// server take LF alone), not after its 2 s; `HEAD` gets the text's head without
    /// it, another method on `/metrics` 405 naming the allowed ones, another path 404.
    #[test]
    fn bare_lf_head_and_other_methods_are_answered_as_http_says() {
        let (_server, addr) = endpoint();
        let started = Instant::now();
        let answer = ask(addr, b"GET /metrics HTTP/1.1\nHost: x\n\n");
        assert!(
            started.elapsed() < REQUEST_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nsluice_up 1\n"), "{answer}");
        let head = ask(addr, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(head.ends_with("\r\n\r\n"), "no body: {head}");
        assert!(!head.contains("Content-Length"), "{head}");
        let post = ask(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(
            post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{post}"
        );
        assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
        let other = ask(addr, b"GET /other HTTP/1.1\r\n\r\n");
        assert!(other.starts_with("HTTP/1.1 404 Not Found\r\n"), "{other}");
        let head_other = ask(addr, b"HEAD /other HTTP/1.1\r\n\r\n");
        assert!(
            head_other.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{head_other}"
        );
        assert!(head_other.ends_with("\r\n\r\n"), "no content: {head_other}");
        let query = ask(addr, b"GET /metrics?x=1 HTTP/1.1\r\n\r\n");
        assert!(query.ends_with("sluice_up 1\n"), "{query}");
    }

    /// Stalled clients hold their own slots only: from one address two at most (a
    /// third is closed at once), eight in all, and while any slot is free a scrape
    /// is answered without waiting for them to be cut off. Served one at a time, the
    /// scrape would wait 2 s behind each stalled client.
    #[test]
    fn stalled_clients_hold_their_own_slots_only() {
        let (_server, addr) = endpoint();
        let local = |last: u8| std::net::Ipv4Addr::new(127, 0, 0, last);
        let started = Instant::now();
        let stalled: Vec<TcpStream> = (0..2).map(|_| connect_from(local(2), addr)).collect();
        std::thread::sleep(Duration::from_millis(200));
        assert!(closed_unanswered(connect_from(local(2), addr)));
        let answer = scrape(addr);
        assert!(answer.ends_with("sluice_up 1\n"), "{answer}");
        let answered = started.elapsed();
        assert!(
            answered < Duration::from_secs(2),
            "the scrape waited {answered:?} behind two stalled clients"
        );
        // Six more from three other addresses fill the eight slots: a scrape from a
        // fifth address is closed too, until the stalled are cut off (2 s).
        let more: Vec<TcpStream> = (3..6)
            .flat_map(|last| {
                [
                    connect_from(local(last), addr),
                    connect_from(local(last), addr),
                ]
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_millis(1800),
            "too slow to tell: {elapsed:?}"
        );
        assert!(closed_unanswered(connect_from(local(9), addr)));
        std::thread::sleep(Duration::from_secs(3).saturating_sub(started.elapsed()));
        assert!(scrape(addr).ends_with("sluice_up 1\n"));
        drop((stalled, more));
    }

    /// The text a scrape gets: a new one if nobody holds the last; the last one if it
    /// waited for that build; a new one if the one before the last is gone; else the
    /// last, so two are alive at most, also when the newer's client is done first or a
    /// build fails. None is kept once its clients are done.
    #[test]
    fn scrapes_share_texts_so_that_two_are_alive_at_most() {
        let builds = std::cell::Cell::new(0);
        let build = || {
            builds.set(builds.get() + 1);
            Ok(format!("build {}\n", builds.get()))
        };
        let mut texts = Texts::default();
        let waited = Instant::now();
        let first = share_text(&mut texts, waited, build).unwrap();
        assert_eq!(*first, "build 1\n");
        // Arrived while the first was being built: shares it.
        let shared = share_text(&mut texts, waited, build).unwrap();
        assert!(Arc::ptr_eq(&first, &shared));
        drop((first, shared));
        // Nobody holds it: built again, even for a scrape that waited for it.
        let second = share_text(&mut texts, waited, build).unwrap();
        assert_eq!(*second, "build 2\n");
        // The second held by its client: the third is built, the second kept as older.
        let third = share_text(&mut texts, Instant::now(), build).unwrap();
        assert_eq!(*third, "build 3\n");
        // Both held: the next scrapes get the third; no fourth text.
        for _ in 0..3 {
            let again = share_text(&mut texts, Instant::now(), build).unwrap();
            assert!(Arc::ptr_eq(&third, &again));
        }
        assert_eq!(builds.get(), 3);
        // The second's client is done: the next scrape builds, and the third becomes
        // the older one (the second is freed).
        let gone = Arc::downgrade(&second);
        drop(second);
        assert_eq!(gone.strong_count(), 0);
        let fourth = share_text(&mut texts, Instant::now(), build).unwrap();
        assert_eq!(*fourth, "build 4\n");
        assert!(Arc::ptr_eq(&texts.older.upgrade().unwrap(), &third));
        // The fourth's client is done while the third's is not: the next scrape
        // builds (two alive: the third and the fifth), and the third stays the
        // older one, so the scrape after shares the fifth instead of building a
        // sixth.
        drop(fourth);
        let fifth = share_text(&mut texts, Instant::now(), build).unwrap();
        assert_eq!(*fifth, "build 5\n");
        let shared = share_text(&mut texts, Instant::now(), build).unwrap();
        assert!(Arc::ptr_eq(&fifth, &shared), "a third text was built");
        drop(shared);
        // The third's client is done: the next scrape builds, but that build fails.
        // A failed build changes nothing: the fifth, still held, is still counted,
        // so after the sixth is built the scrape after shares it.
        drop(third);
        let failed = share_text(&mut texts, Instant::now(), || Err("loop busy".into()));
        assert_eq!(failed, Err("loop busy".into()));
        let sixth = share_text(&mut texts, Instant::now(), build).unwrap();
        assert_eq!(*sixth, "build 6\n");
        let shared = share_text(&mut texts, Instant::now(), build).unwrap();
        assert!(Arc::ptr_eq(&sixth, &shared), "a third text after a failure");
        // None is kept once its clients are done.
        drop((fifth, sixth, shared));
        assert_eq!(
            texts.older.strong_count() + texts.last.as_ref().unwrap().1.strong_count(),
            0
        );
        assert_eq!(builds.get(), 6);
    }

    /// Two slow clients (each sends its request, reads nothing yet), then a scrape
    /// while both are still being sent: two reports asked of the loop for the three,
    /// and each gets the whole text. Built once per client, three texts would be alive
    /// at once.
    #[test]
    fn a_third_client_shares_a_text_while_two_are_being_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let body = "x".repeat(16 << 20);
        let handler: Handler = {
            let asked = Arc::clone(&asked);
            value_handler(move |_| {
                asked.fetch_add(1, Ordering::Relaxed);
                Ok(serde_json::json!(body))
            })
        };
        let _server = MetricsServer::spawn(listener, handler).unwrap();
        let local = |last: u8| std::net::Ipv4Addr::new(127, 0, 0, last);
        let mut slow: Vec<TcpStream> = (2..4).map(|last| connect_from(local(last), addr)).collect();
        for client in &mut slow {
            client.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
            // Its answer has begun (so its text was built) before the next asks.
            client
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            assert_eq!(client.peek(&mut [0u8; 1]).unwrap(), 1);
        }
        assert_eq!(asked.load(Ordering::Relaxed), 2, "reports for the slow two");
        let answer = scrape(addr);
        assert!(answer.ends_with(&"x".repeat(16 << 20)));
        assert_eq!(asked.load(Ordering::Relaxed), 2, "a report for the third");
        for mut client in slow {
            let mut taken = String::new();
            client.read_to_string(&mut taken).unwrap();
            assert!(
                taken.ends_with(&"x".repeat(16 << 20)),
                "a slow client's answer"
            );
        }
        // Nobody holds a text now: the next scrape asks again.
        assert!(scrape(addr).ends_with('x'));
        assert_eq!(asked.load(Ordering::Relaxed), 3);
    }

    /// A client that sends its request a byte every 300 ms (each read well inside a
    /// per-read timeout) is cut off once the request's time (2 s) is up, and the scrape
    /// queued behind it is answered. Without the overall bound the trickler would be
    /// read for as long as it keeps sending: here 15 s, in the wild for hours.
    #[test]
    fn a_trickling_client_cannot_hold_the_endpoint() {
        let (_server, addr) = endpoint();
        let mut trickler = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        let trickle = std::thread::spawn(move || {
            // Until the server closes (a write fails) or 15 s pass.
            while started.elapsed() < Duration::from_secs(15) {
                if trickler.write_all(b"G").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
            let _ = trickler.shutdown(Shutdown::Both);
            started.elapsed()
        });
        std::thread::sleep(Duration::from_millis(200));
        let answer = scrape(addr);
        let answered = started.elapsed();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("sluice_up 1\n"), "{answer}");
        assert!(
            answered < Duration::from_secs(10),
            "the scrape waited {answered:?} behind a trickling client"
        );
        // The trickler's writes start failing once the server has dropped it.
        let cut_off = trickle.join().unwrap();
        assert!(
            cut_off < Duration::from_secs(10),
            "trickled for {cut_off:?}"
        );
    }

    /// A client that takes the answer a little at a time (each write making
    /// progress well inside a per-write timeout) is cut off once the answer's time is
    /// up (6 s), and the scrape queued behind it is answered in full.
    #[test]
    fn a_slow_reader_cannot_hold_the_endpoint() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let body = "x".repeat(64 << 20);
        let handler = value_handler(move |_| Ok(serde_json::json!(body)));
        let _server = MetricsServer::spawn(listener, handler).unwrap();
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let started = Instant::now();
        let scraped = Arc::new(AtomicBool::new(false));
        let reader = {
            let scraped = Arc::clone(&scraped);
            // 200 KB/s: minutes for all of it; it stops once the scrape is answered
            // (or after 30 s, the time an unbounded server would serve it).
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while !scraped.load(Ordering::Relaxed)
                    && started.elapsed() < Duration::from_secs(30)
                {
                    if matches!(slow.read(&mut buf), Ok(0) | Err(_)) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        let answer = scrape(addr);
        let answered = started.elapsed();
        scraped.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n"),
            "{:?}",
            answer.get(..64)
        );
        // The whole answer, for the scraper on a fast link.
        assert!(answer.ends_with(&format!("\r\n\r\n{}", "x".repeat(64 << 20))));
        // Inside Prometheus's default scrape timeout.
        assert!(
            answered < Duration::from_secs(10),
            "the scrape waited {answered:?} behind a slow reader"
        );
    }

    /// Scrape after scrape, each read at once: a text is built at most every
    /// [`BUILD_GAP`], the next scrape waiting for it to pass.
    #[test]
    fn texts_are_built_at_most_once_per_build_gap() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let asked: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let handler: Handler = {
            let asked = Arc::clone(&asked);
            value_handler(move |_| {
                asked.lock().unwrap().push(Instant::now());
                Ok(serde_json::json!("sluice_up 1\n"))
            })
        };
        let _server = MetricsServer::spawn(listener, handler).unwrap();
        for _ in 0..3 {
            assert!(scrape(addr).ends_with("sluice_up 1\n"));
        }
        let asked = asked.lock().unwrap();
        assert_eq!(
            asked.len(),
            3,
            "each scrape after the last text was let go builds"
        );
        // The server spaces the instants it calls the handler at; the handler's own
        // clock reads a little later, by however long its thread waited between the
        // two (microseconds, milliseconds for a thread preempted on a loaded machine).
        // Without the gap, builds come one scrape's round trip apart (about 20 ms).
        let slack = Duration::from_millis(20);
        for pair in asked.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(gap >= BUILD_GAP - slack, "built again after {gap:?}");
        }
    }

    #[test]
    fn an_ipv6_source_is_counted_by_its_64() {
        let clients = Arc::new(Clients::default());
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let held: Vec<ClientSlot> = ["2001:db8:1:2::1", "2001:db8:1:2:ffff::9"]
            .iter()
            .map(|a| clients.admit(ip(a)).expect("a slot"))
            .collect();
        assert!(
            clients.admit(ip("2001:db8:1:2:abcd::1")).is_none(),
            "same /64"
        );
        let other = clients.admit(ip("2001:db8:1:3::1")).expect("another /64");
        // An IPv4 address is itself, also written IPv4-mapped.
        let v4 = clients.admit(ip("198.18.0.1")).expect("a slot");
        let mapped = clients.admit(ip("::ffff:198.18.0.1")).expect("a slot");
        assert!(clients.admit(ip("198.18.0.1")).is_none());
        assert!(clients.admit(ip("198.18.0.2")).is_some());
        drop((held, other, v4, mapped));
        assert!(clients.0.lock().unwrap().is_empty());
    }

    #[test]
    fn refusals_are_logged_once_a_minute_with_their_count() {
        let mut r = Refusals::default();
        let peer: std::net::SocketAddr = "198.18.0.9:40000".parse().unwrap();
        let t = Instant::now();
        let first = r.refused(peer, t).expect("the first is logged");
        assert!(
            first.starts_with(
                "metrics endpoint: refused 198.18.0.9:40000 and 0 other connection(s)"
            ),
            "{first}"
        );
        for i in 1..=5 {
            assert_eq!(r.refused(peer, t + Duration::from_secs(i)), None);
        }
        let next = r.refused(peer, t + Duration::from_secs(61)).unwrap();
        assert!(next.contains("and 5 other connection(s)"), "{next}");
    }
}
