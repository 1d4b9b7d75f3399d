//! The appliance process: brings up the EAL, ports and workers from a config, runs the
//! management loop (control requests, periodic stats, shutdown) on the main lcore, and
//! tears everything down in reverse order.
mod adoption;
mod capture;
mod exception;
mod metrics;
mod preflight;
mod prepare;
mod rates;
mod reloads;
mod services;
mod signals;
mod stats;
mod sync;
mod systemd;
mod turns;

pub use services::Services;
pub use systemd::{journal_prefix, stderr_is_journal};

use crate::config::{Config, PortDevice};
use crate::control::protocol::{connections_bound, ConnectionsCursor, Request, Response};
use crate::control::report::{
    ConnectionStatus, ConnectionsReport, LaddrPoolStatus, LaddrReport, LaddrSizing,
    NeighboursReport, StatusReport,
};
use crate::control::server::{ControlServer, Handler, Reply, ServerLimits};
use crate::dataplane::capture::{Capture, CaptureTap};
use crate::dataplane::counters::WorkerCounters;
use crate::dataplane::exception::ExceptionLink;
use crate::dataplane::forwarder::{Forwarder, ForwarderConfig, HealthTap, RssView, VrrpSenders};
use crate::dataplane::loads::LoadView;
use crate::dataplane::local::LocalResponder;
use crate::dataplane::mesh::{Injected, Mesh, HEALTH_RING_SIZE, SYNC_PORT_RING_SIZE};
use crate::dataplane::probe_acks::ProbeAcks;
use crate::dataplane::query::{Mailbox, NeighbourTables, Query, CONNECTIONS_PER_CHUNK};
use crate::dataplane::realserver_stats::{self, RealServerCounters, RealServerTotals};
use crate::dataplane::worker::{Links, Worker, WorkerPort};
use crate::dpdk::{
    Burst, Eal, LcoreJobs, Mempool, Port, PortSettings, RingConsumer, RingPortPair, RingProducer,
    RssSettings,
};
use crate::emulator::{Emulator, NicRss};
use crate::flow::ownership::{self, DeviceRss, Ownership, QueueView, SteerReason};
use crate::ha::sync::report::SyncReport;
use crate::ha::vrrp::node::VrrpReport;
use crate::health::{HealthMonitor, HealthReport};
use crate::model::ForwardMode;
use crate::service::{Snapshot, SnapshotPublisher};
use crate::session::persist::{ByStanding, PersistTable, TemplateCensus, TemplateCounts, Trust};
use crate::session::{TcpState, Timeouts};
use crossbeam::channel::{self, Receiver, Sender};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Command-line options of `sluice`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub config: PathBuf,
    /// Stop by itself after this long (demos and tests).
    pub duration: Option<Duration>,
    /// Print testpmd-style stats this often; loopback configs default to their
    /// `stats_interval_ms`, others to never.
    pub stats_interval: Option<Duration>,
}

/// A port as the management core keeps it.
pub struct PortEntry {
    pub port: Port,
    pub name: String,
    pub mac: [u8; 6],
    pub addresses: Vec<String>,
    /// How this port's packets reach the worker owning their session.
    pub ownership: Ownership,
    /// Its kernel interface (`[ports.exception]`).
    pub exception: Option<exception::KernelInterface>,
}

/// Everything the management core owns while the appliance runs. Field order is drop
/// order: the workers stop first (on every path out of [`run`], a panic's included),
/// then ports before the rings they sit on, rings before the mempool, the EAL last.
struct Appliance {
    /// The worker lcores' jobs: dropping them stops and waits for every worker, before
    /// the ports they poll go and before `rte_eal_cleanup` would wait for them forever.
    workers: LcoreJobs,
    emulator: Option<Emulator>,
    ports: Vec<PortEntry>,
    /// The workers' inboxes (their rings hold mbufs: dropped before the pool).
    mesh: Arc<Mesh>,
    /// The management core's ends of the inject and punt rings.
    inject: RingProducer,
    punted: RingConsumer,
    vrrp_punted: RingConsumer,
    sync_punted: RingConsumer,
    /// Each worker's inbox, and worker 0's end of the inject ring, until the workers
    /// take them at launch.
    worker_inboxes: Vec<Option<RingConsumer>>,
    inject_out: Option<RingConsumer>,
    /// The software view of the ports' queue choice every worker shares.
    queues: QueueView,
    _emulator_ports: Vec<Port>,
    pool: Arc<Mempool>,
    _eal: Eal,
}

/// Requests from the control thread, answered on the management loop.
type ControlCall = (Request, Sender<Answer>);

/// A control answer as the management loop hands it over: ready, or the last of its
/// work, which needs nothing the loop owns and is done by the control thread that
/// waits for it. Writing out a listing or a Prometheus scrape of 50,000 real servers
/// (JSON values, 53 MB of text) takes hundreds of milliseconds that the loop, which
/// also sends VRRP advertisements and judges health probes, would otherwise spend.
enum Answer {
    Ready(Result<serde_json::Value, String>),
    Deferred(Box<dyn FnOnce() -> Result<Reply, String> + Send>),
}

impl Answer {
    /// `report`, written out as its response line by the control thread: not as a
    /// `Value` (see [`Reply`]).
    fn json_later(report: impl serde::Serialize + Send + 'static) -> Answer {
        Answer::Deferred(Box::new(move || {
            Response::success_line_of(&report)
                .map(Reply::Line)
                .map_err(|e| e.to_string())
        }))
    }

    fn into_result(self) -> Result<Reply, String> {
        match self {
            Answer::Ready(result) => result.map(Reply::Value),
            Answer::Deferred(work) => work(),
        }
    }
}

/// Runs the appliance until a signal or the duration ends it.
/// Why the appliance did not start. Each step of [`run`] fails with its own variant;
/// the message is the step's own (it names the file, line and field, the device, or
/// the resource), so `sluice: <message>` says what to fix.
#[derive(Debug)]
pub enum StartError {
    /// The config file could not be read or is not valid.
    Config(String),
    /// This machine cannot run this config (memory, lcores, another instance).
    Preflight(String),
    Signals(std::io::Error),
    /// The services of the config do not build a service table.
    Services(String),
    /// The EAL, a port, the mempool or the rings.
    Devices(String),
    /// A worker could not be built or launched.
    Workers(String),
    /// The control socket, the metrics listener or session sync's sockets.
    Control(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Signals(e) => write!(f, "installing signal handlers: {e}"),
            StartError::Config(m)
            | StartError::Preflight(m)
            | StartError::Services(m)
            | StartError::Devices(m)
            | StartError::Workers(m)
            | StartError::Control(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for StartError {}

/// Runs the appliance until a signal or `opts.duration`: each start-up step in turn
/// (config, preflight, shared state, devices, workers, control, management state),
/// then the management loop, then an orderly shutdown.
pub fn run(opts: &Options) -> Result<(), StartError> {
    let cfg = Config::load(&opts.config).map_err(|e| StartError::Config(e.to_string()))?;
    preflight::raise_open_file_limit();
    // Before the EAL: a config this machine cannot run leaves nothing behind.
    let _instance_locks = preflight::check(&cfg).map_err(StartError::Preflight)?;
    let listeners = preflight::Listeners::bind(&cfg).map_err(StartError::Preflight)?;
    signals::install().map_err(StartError::Signals)?;
    let started = Instant::now();
    let state = SharedState::new(&cfg).map_err(StartError::Services)?;
    let mut app = bring_up(&cfg).map_err(StartError::Devices)?;
    // From here on, every way out of this function (an error, a panic) drops `app`,
    // which stops and waits for the workers first.
    launch_workers(&cfg, &mut app, &state.for_workers()).map_err(StartError::Workers)?;
    let control = start_control(&cfg, listeners.metrics).map_err(StartError::Control)?;
    log::info!(
        "sluice up: {} port(s), {} worker(s), control socket {}",
        app.ports.len(),
        state.counters.len(),
        cfg.control.socket.display()
    );
    let stats_interval = opts.stats_interval.or_else(|| {
        app.emulator
            .as_ref()
            .map(|_| Duration::from_millis(cfg.loopback.stats_interval_ms))
    });
    let mut view = stats::StatsView::new(&cfg, started);
    let SharedState {
        counters,
        services,
        publisher,
        real_servers,
        mailboxes,
        persist,
        sync_rings,
        capture,
        probe_acks,
    } = state;
    view.capture = Some(capture.clone());
    let mut registry = Registry {
        health: health_monitor(&cfg, started, probe_acks),
        vrrp: vrrp_node(&cfg, &app),
        vrrp_started: false,
        bgp: bgp_node(&cfg).map_err(StartError::Control)?,
        sync: sync_node(&cfg, listeners.sync, &app, sync_rings.as_ref(), &persist)
            .map_err(StartError::Control)?,
        started,
        services,
        publisher,
        real_servers,
        mailboxes,
        tick_ms: cfg.sessions.tick_ms,
        server_time_wait_s: cfg.sessions.server_time_wait_s,
        ports_per_address: u32::from(cfg.sessions.local_port_last)
            - u32::from(cfg.sessions.local_port_first)
            + 1,
        census: TemplateCensus::new(&persist, CENSUS_STEPS_PER_PASS),
        census_started: Instant::now(),
        templates_counted: None,
        turns: turns::Turns::new(Instant::now()),
        persist,
        config_path: cfg.path.clone(),
        started_config: cfg.clone(),
        reloads: PendingReloads::new(),
        capture: capture::Capturing::new(capture),
        port_names: cfg.ports.iter().map(|p| p.name.clone()).collect(),
    };
    announce_at_start(&cfg, &app, &registry);
    // The control socket listens and the loop below answers it from its first turn:
    // ready for systemd (Type=notify) now, not before.
    let mut notifier = systemd::Notifier::from_env();
    notifier.ready(&format!(
        "serving: {} port(s), {} worker(s), {} service(s)",
        app.ports.len(),
        counters.len(),
        registry.services.table.len()
    ));
    management_loop(
        &mut app,
        &counters,
        &mut registry,
        &control.calls,
        &mut view,
        &mut notifier,
        Timing {
            duration: opts.duration,
            stats_interval,
            started,
        },
    );
    notifier.stopping();
    log::info!("shutting down");
    // A reload still being read is not applied; its askers hold control threads
    // that the control socket's shutdown waits for.
    for reply in registry.reloads.abandon() {
        let _ = reply.send(Answer::Ready(Err(
            "the daemon is stopping: the reload was not applied".into(),
        )));
    }
    registry.capture.stop();
    registry.stop_vrrp(app.plane());
    control.shut_down();
    shut_down(app, &counters, &mut view);
    Ok(())
}

/// How far `sluice --check-config` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckDepth {
    /// The file and its services only (a config written for another machine).
    File,
    /// The file, then this machine's resources as the daemon's start-up checks them.
    Machine,
}

/// `sluice --check-config`: everything the daemon checks before it starts DPDK, with
/// no DPDK, no socket and no lasting lock: the file (syntax, fields, cross-field
/// rules), its services as the service table builds them, then (with
/// [`CheckDepth::Machine`]) the lcores, memory, hugepages, `eal.memory_mb`, PCI and
/// kernel devices, the open-file limit and the listen addresses (bound and let go).
/// While another Sluice runs this config, its resources are in use by it and are not
/// checked; the answer says so. Returns a one-line summary (then a warning line each
/// when the file holds a key every user may read, and when others may write the
/// control socket's directory), or the first error (the same text the daemon would
/// stop with).
pub fn check_config(path: &std::path::Path, depth: CheckDepth) -> Result<String, StartError> {
    let cfg = Config::load(path).map_err(|e| StartError::Config(e.to_string()))?;
    let services = Services::from_config(&cfg).map_err(StartError::Services)?;
    let summary = format!(
        "{}: configuration valid: {} port(s), {} worker(s), {} service(s), {} real \
         server(s)",
        path.display(),
        cfg.ports.len(),
        cfg.lcores.workers.len(),
        cfg.services.len(),
        cfg.services
            .iter()
            .map(|s| s.real_servers.len())
            .sum::<usize>(),
    );
    drop(services);
    // Each warning goes on a line of its own after the summary.
    let warned = |line: String| {
        [
            preflight::readable_shared_keys(&cfg),
            preflight::shared_socket_directory(&cfg),
            preflight::exposed_metrics(&cfg),
        ]
        .into_iter()
        .flatten()
        .fold(line, |line, warning| {
            format!("{line}\nsluice: warning: {warning}")
        })
    };
    if depth == CheckDepth::File {
        return Ok(warned(format!("{summary}; machine resources not checked")));
    }
    // Taken and released at once: held means a running instance owns the resources.
    let checked =
        match preflight::InstanceLocks::take(&cfg, std::path::Path::new(preflight::LOCK_DIR)) {
            Ok(locks) => {
                preflight::check_resources(&cfg).map_err(StartError::Preflight)?;
                drop(preflight::Listeners::bind(&cfg).map_err(StartError::Preflight)?);
                drop(locks);
                Ok(format!(
                    "{summary}; fits this machine (lcores, memory, hugepages, eal.memory_mb, \
                 PCI devices, open files, listen addresses)"
                ))
            }
            Err(e) if e.contains("held by another Sluice") => {
                Ok(format!("{summary}; machine resources not checked: {e}"))
            }
            Err(e) => Err(StartError::Preflight(e)),
        };
    checked.map(warned)
}

/// `sluice --prepare`: reserves the hugepages and binds the PCI devices `path` needs
/// (see [`prepare`]), with `driver` for the PCI devices; returns what was done, a line
/// each.
pub fn prepare_host(
    path: &std::path::Path,
    driver: Option<&str>,
) -> Result<Vec<String>, StartError> {
    let cfg = Config::load(path).map_err(|e| StartError::Config(e.to_string()))?;
    let host = prepare::Host::default();
    let actions = prepare::plan(&cfg, &host, driver.unwrap_or(prepare::DEFAULT_PCI_DRIVER))
        .map_err(StartError::Preflight)?;
    prepare::apply(&actions, &host).map_err(StartError::Devices)
}

/// What the management core and the workers share, built from the config before any
/// device: counters, the service table and its first snapshot, the real servers'
/// counters, the mailboxes, the persistence templates and the sync event rings.
struct SharedState {
    counters: Vec<Arc<WorkerCounters>>,
    services: Services,
    publisher: SnapshotPublisher,
    real_servers: Vec<Arc<Box<[RealServerCounters]>>>,
    mailboxes: Vec<Arc<Mailbox>>,
    persist: Arc<PersistTable>,
    sync_rings: Option<Arc<Vec<crate::dataplane::sync_events::EventRing>>>,
    /// Packet capture: the filter and the workers' copy rings.
    capture: Arc<Capture>,
    /// The health probes' ISNs, written by the checker, read by the workers.
    probe_acks: Arc<ProbeAcks>,
}

impl SharedState {
    fn new(cfg: &Config) -> Result<SharedState, String> {
        let workers = cfg.lcores.workers.len();
        let mut services = Services::from_config(cfg)?;
        let publisher = SnapshotPublisher::new(
            Snapshot::build(1, &services.table)
                .with_timeouts(services.timeouts)
                .with_serving_vips(services.serving_vips)
                .with_extra_addresses(&services.vrrp_addresses),
        );
        services.generation = 1;
        services.alert_on_unavailable();
        Ok(SharedState {
            counters: (0..workers)
                .map(|_| Arc::new(WorkerCounters::default()))
                .collect(),
            services,
            publisher,
            real_servers: (0..workers)
                .map(|_| Arc::new(realserver_stats::new_table()))
                .collect(),
            mailboxes: (0..workers).map(|_| Arc::new(Mailbox::default())).collect(),
            persist: Arc::new(PersistTable::with_capacity(
                cfg.sessions.persistence_templates as usize,
            )),
            sync_rings: cfg.sync.as_ref().map(|_| {
                Arc::new(
                    (0..workers)
                        .map(|_| {
                            crate::dataplane::sync_events::EventRing::with_capacity(
                                SYNC_RING_EVENTS,
                            )
                        })
                        .collect(),
                )
            }),
            capture: Arc::new(Capture::new(workers)),
            probe_acks: Arc::new(ProbeAcks::new(cfg.health.source_ports.clone())),
        })
    }

    /// What each worker is built with.
    fn for_workers(&self) -> Shared<'_> {
        Shared {
            counters: &self.counters,
            real_servers: &self.real_servers,
            publisher: &self.publisher,
            mailboxes: &self.mailboxes,
            persist: &self.persist,
            sync_rings: &self.sync_rings,
            capture: &self.capture,
            probe_acks: &self.probe_acks,
        }
    }
}

/// The control socket and, if configured, the metrics endpoint on its listener; both
/// hand their requests to the management loop through one channel.
fn start_control(
    cfg: &Config,
    metrics: Option<std::net::TcpListener>,
) -> Result<ControlEnds, String> {
    let (calls_tx, calls_rx) = channel::bounded::<ControlCall>(64);
    let metrics_server = match metrics {
        Some(listener) => Some(
            metrics::MetricsServer::spawn(listener, control_handler(calls_tx.clone()))
                .map_err(|e| format!("{}: control.metrics: {e}", cfg.path.display()))?,
        ),
        None => None,
    };
    let max_connections = preflight::control_connection_limit(cfg);
    if max_connections < preflight::CONTROL_CONNECTIONS_MAX {
        log::info!(
            "control socket: at most {max_connections} connections at once (what the open-file limit leaves)"
        );
    }
    let server = ControlServer::spawn_with_group(
        &cfg.control.socket,
        control_handler(calls_tx),
        ServerLimits {
            max_connections,
            // A quarter at most, so that members cannot fill a small limit (a tight
            // open-file limit leaves as few as 32) and lock root out.
            user_connections: ServerLimits::default()
                .user_connections
                .min((max_connections / 4).max(1)),
            ..Default::default()
        },
        cfg.control.group.as_ref().map(|g| g.gid),
    )
    .map_err(|e| format!("control socket {}: {e}", cfg.control.socket.display()))?;
    Ok(ControlEnds {
        calls: calls_rx,
        server,
        _metrics_server: metrics_server,
    })
}

/// The listeners of the control socket and the metrics endpoint (each stops its
/// threads when dropped), and the requests they hand the management loop.
struct ControlEnds {
    calls: channel::Receiver<ControlCall>,
    server: ControlServer,
    _metrics_server: Option<metrics::MetricsServer>,
}

impl ControlEnds {
    /// Stops the control socket once the management loop no longer answers: every
    /// request still waiting for the loop is answered with an error until the server's
    /// thread has ended. Dropping the receiver alone would not do: a bounded channel
    /// keeps its messages (and so their reply senders) until its senders are gone too,
    /// and the server, which holds the sender, waits for those requests' answers.
    fn shut_down(self) {
        self.server.begin_stop();
        while !self.server.is_stopped() {
            while let Ok((_, reply)) = self.calls.try_recv() {
                let _ = reply.send(Answer::Ready(Err("the daemon is shutting down".into())));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The health monitor, probing from the config's source address.
fn health_monitor(cfg: &Config, started: Instant, acks: Arc<ProbeAcks>) -> HealthMonitor {
    let source = cfg
        .health_source()
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
    HealthMonitor::new(
        cfg.health.clone(),
        source,
        cfg.health_overrides(),
        // Different appliances probe at different moments.
        u64::from(std::process::id()) ^ started.elapsed().as_nanos() as u64,
    )
    .with_sources6(cfg.health_sources6())
    .with_probe_acks(acks)
}

/// The BGP node of `[bgp]`: its thread that talks to BIRD.
fn bgp_node(cfg: &Config) -> Result<Option<crate::ha::bgp::BgpNode>, String> {
    let Some(settings) = cfg.bgp.clone() else {
        return Ok(None);
    };
    log::info!(
        "bgp: VIPs announced through BIRD at {} (include file {})",
        settings.socket.display(),
        settings.include.display()
    );
    crate::ha::bgp::BgpNode::new(settings)
        .map(Some)
        .map_err(|e| format!("bgp: starting the birdc thread: {e}"))
}

/// The VRRP node of `[vrrp]`, on the first port.
fn vrrp_node(cfg: &Config, app: &Appliance) -> Option<crate::ha::vrrp::node::VrrpNode> {
    let v = cfg.vrrp.as_ref()?;
    if v.any_peer {
        log::warn!(
            "vrrp: adverts from ANY sender on the link count (`any_peer = true` in [vrrp]): \
             any host there can make this node master or backup; list the other routers \
             in `peers` instead"
        );
    }
    let primary = v
        .source
        .or_else(|| cfg.ports.first()?.addresses.first().map(|a| a.addr))
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
    let node = crate::ha::vrrp::node::VrrpNode::new(
        crate::ha::vrrp::router::VrrpConfig {
            vrid: v.vrid,
            priority: v.priority,
            advert_interval_cs: (v.advert_interval_ms / 10) as u16,
            preempt: v.preempt,
            primary_addr: primary,
        },
        crate::wire::MacAddr(app.ports[0].mac),
    )
    .with_peers(&v.peers, v.unicast);
    let Some(hex) = &v.key else {
        log::warn!(
            "vrrp: adverts are UNAUTHENTICATED (`unauthenticated = true` in [vrrp]): a host \
             on the link that forges a peer's address or sends its adverts again can make \
             this node master or backup"
        );
        return Some(node);
    };
    let key =
        crate::ha::auth::SharedKey::from_hex(hex.as_str()).expect("the config checked the key");
    if v.accept_unsealed {
        log::warn!(
            "vrrp: UNSEALED adverts are taken too (`accept_unsealed = true` in [vrrp]), for \
             switching the group to a key; remove it once every router has the key"
        );
    }
    let auth = crate::ha::vrrp::auth::AdvertAuth::new(key, v.max_clock_skew_ms)
        .accepting_unsealed(v.accept_unsealed);
    Some(node.with_auth(auth, wall_clock_us))
}

/// The wall clock in microseconds since the Unix epoch (0 before it).
fn wall_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The session sync node of `[sync]`, on its sockets bound before the EAL (or on its
/// port).
fn sync_node(
    cfg: &Config,
    sockets: Option<sync::SyncSockets>,
    app: &Appliance,
    rings: Option<&Arc<Vec<crate::dataplane::sync_events::EventRing>>>,
    persist: &Arc<PersistTable>,
) -> Result<Option<(sync::SyncNode, std::net::SocketAddrV4)>, String> {
    let (Some(settings), Some(rings)) = (&cfg.sync, rings) else {
        return Ok(None);
    };
    let view = rss_view(app, 0);
    let node = sync::SyncNode::bind(
        settings,
        sockets,
        rings.clone(),
        (view.toeplitz, view.reta, view.fields, view.fields6),
        persist.clone(),
        cfg.sessions.tick_ms,
        crate::wire::MacAddr(app.ports[0].mac),
    )?;
    if let Some(port) = &settings.port {
        log::info!(
            "sync: through port {port} as {} (no kernel socket)",
            settings.listen
        );
    }
    Ok(Some((node, settings.listen)))
}

/// After the management loop: the emulated network goes quiet first and the workers
/// get a moment to finish what is in their rings, so the final counts on both sides
/// describe the same packets; then the workers stop, the final statistics are
/// printed and the ports stop before the rest is dropped.
fn shut_down(mut app: Appliance, counters: &[Arc<WorkerCounters>], view: &mut stats::StatsView) {
    let final_stats = app.emulator.take().map(|em| {
        let stats = em.stop();
        std::thread::sleep(Duration::from_millis(200));
        stats
    });
    for (lcore, rc) in app.workers.stop() {
        if rc != 0 {
            log::warn!("worker on lcore {lcore} exited with {rc}");
        }
    }
    if let Some(stats) = final_stats {
        view.write_out(&stats.summary());
    }
    view.print(&app.ports, counters, None);
    for p in &mut app.ports {
        if let Err(e) = p.port.stop() {
            log::warn!("{e}");
        }
        if let Some(kernel) = p.exception.take() {
            kernel.stop();
        }
    }
    drop(app);
    log::info!("sluice stopped");
}

fn bring_up(cfg: &Config) -> Result<Appliance, String> {
    let eal = Eal::init(&cfg.eal_args())
        .map_err(|e| format!("{e} (EAL arguments: {})", cfg.eal_args().join(" ")))?;
    for &lcore in &cfg.lcores.workers {
        // SAFETY: plain query of the EAL's lcore table.
        if unsafe { dpdk_sys::rte_lcore_is_enabled(lcore) } == 0 {
            return Err(format!(
                "{}: lcores.workers: lcore {lcore} is not available to the EAL (this machine has {} CPUs)",
                cfg.path.display(),
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
            ));
        }
    }
    let queues = cfg.lcores.workers.len() as u16;
    // Sync over a DPDK port shares the health rings, which are larger then.
    let health_ring = match cfg.sync.as_ref().and_then(|s| s.port.as_ref()) {
        Some(_) => SYNC_PORT_RING_SIZE,
        None => HEALTH_RING_SIZE,
    };
    // Sized by the preflight's count, which checked that it fits in eal.memory_mb.
    let pool = Arc::new(
        Mempool::new(
            "sluice_mbufs",
            preflight::mbuf_count(cfg),
            preflight::MBUF_CACHE,
            preflight::mbuf_data_room(cfg),
        )
        .map_err(|e| e.to_string())?,
    );

    let mut ports = Vec::new();
    let mut emulator_ports = Vec::new();
    for (index, pc) in cfg.ports.iter().enumerate() {
        let claim = |id: Result<u16, _>| {
            id.and_then(Port::new)
                .map_err(|e| format!("port {}: {e}", pc.name))
        };
        let mut port = match &pc.device {
            PortDevice::Pci(addr) => claim(eal.port_by_name(addr))?,
            PortDevice::Vdev(spec) => {
                claim(eal.port_by_name(spec.split(',').next().unwrap_or(spec)))?
            }
            PortDevice::Loopback => {
                let RingPortPair { a, b: mut far } =
                    RingPortPair::new(&format!("lo_{}", pc.name), queues, 1024)
                        .map_err(|e| format!("port {}: {e}", pc.name))?;
                far.configure(
                    &PortSettings {
                        queues,
                        rx_desc: pc.rx_desc,
                        tx_desc: pc.tx_desc,
                        ..Default::default()
                    },
                    &pool,
                )
                .map_err(|e| e.to_string())?;
                far.start().map_err(|e| e.to_string())?;
                emulator_ports.push(far);
                a
            }
        };
        let id = port.id();
        let limits = port
            .limits()
            .map_err(|e| format!("port {}: {e}", pc.name))?;
        preflight::check_device(cfg, index, &port.driver_name(), &limits)?;
        let settings = PortSettings {
            queues,
            rx_desc: pc.rx_desc,
            tx_desc: pc.tx_desc,
            mtu: pc.mtu,
            mac: pc.mac,
            rss: (queues > 1 || pc.rss_key.is_some()).then(|| RssSettings {
                hash_fields: dpdk_sys::SLUICE_ETH_RSS_IP
                    | dpdk_sys::SLUICE_ETH_RSS_TCP
                    | dpdk_sys::SLUICE_ETH_RSS_UDP,
                key: pc.rss_key.clone(),
            }),
        };
        port.configure(&settings, &pool)
            .map_err(|e| format!("port {}: {e}", pc.name))?;
        port.start().map_err(|e| format!("port {}: {e}", pc.name))?;
        let mac = port.mac().map_err(|e| e.to_string())?;
        log::info!(
            "port {} ({}): id {id}, driver {}, MAC {}, {} queue(s), link {}",
            pc.name,
            port.device_name(),
            port.driver_name(),
            crate::wire::ethernet::MacAddr(mac),
            queues,
            if port.link().up { "up" } else { "down" }
        );
        ports.push(PortEntry {
            port,
            name: pc.name.clone(),
            mac,
            addresses: (pc.addresses.iter().map(|a| a.to_string()))
                .chain(pc.addresses6.iter().map(|a| a.to_string()))
                .collect(),
            ownership: Ownership::Single,
            exception: match &pc.exception {
                Some(e) => Some(exception::KernelInterface::open(
                    &eal,
                    ports.len(),
                    pc,
                    e,
                    mac,
                    &pool,
                )?),
                None => None,
            },
        });
    }

    let queue_view = decide_queue_view(cfg, &mut ports)?;
    let emulator = match emulator_ports.first_mut() {
        Some(far) => {
            let idx = cfg
                .ports
                .iter()
                .position(|p| matches!(p.device, PortDevice::Loopback))
                .expect("a loopback port exists when an emulator port does");
            let pc = &cfg.ports[idx];
            let view = &queue_view;
            let (toeplitz, reta) = (view.toeplitz.clone(), view.reta.clone());
            Some(
                Emulator::start(
                    far.take_queues().map_err(|e| e.to_string())?,
                    Some(NicRss { toeplitz, reta }),
                    pool.clone(),
                    &cfg.loopback,
                    &cfg.services,
                    ports[idx].mac,
                    pc.addresses[0],
                )
                .map_err(|e| format!("peer emulator: {e}"))?,
            )
        }
        None => None,
    };
    let (mesh, ends) = Mesh::with_management_ring("sluice", cfg.lcores.workers.len(), health_ring)
        .map_err(|e| format!("worker rings: {e}"))?;
    Ok(Appliance {
        workers: LcoreJobs::new(),
        emulator,
        ports,
        mesh: Arc::new(mesh),
        inject: ends.inject_in,
        punted: ends.punted,
        vrrp_punted: ends.vrrp_punted,
        sync_punted: ends.sync_punted,
        worker_inboxes: ends.redirect_inboxes.into_iter().map(Some).collect(),
        inject_out: Some(ends.inject_out),
        queues: queue_view,
        _emulator_ports: emulator_ports,
        pool,
        _eal: eal,
    })
}

impl Appliance {
    /// What the management core sends and receives through the data plane with.
    fn plane(&self) -> sync::Plane<'_> {
        sync::Plane {
            mesh: &self.mesh,
            pool: &self.pool,
            inject: &self.inject,
            punted: &self.punted,
            vrrp_punted: &self.vrrp_punted,
            sync_punted: &self.sync_punted,
        }
    }
}

pub(crate) fn timeouts_from_config(cfg: &Config) -> Timeouts {
    let t = &cfg.timeouts;
    let mut out = Timeouts::default();
    for (state, secs) in [
        (TcpState::Established, t.tcp_s),
        (TcpState::FinWait, t.tcpfin_s),
        (TcpState::SynRecv, t.syn_recv_s),
        (TcpState::SynSent, t.syn_sent_s),
        (TcpState::TimeWait, t.time_wait_s),
        (TcpState::Close, t.close_s),
        (TcpState::CloseWait, t.close_wait_s),
        (TcpState::LastAck, t.last_ack_s),
    ] {
        out.set_tcp_ms(state, secs.saturating_mul(1000));
    }
    out.set_udp_ms(t.udp_s.saturating_mul(1000));
    out
}

/// What every worker shares with the management core.
struct Shared<'a> {
    counters: &'a [Arc<WorkerCounters>],
    real_servers: &'a [Arc<Box<[RealServerCounters]>>],
    publisher: &'a SnapshotPublisher,
    mailboxes: &'a [Arc<Mailbox>],
    persist: &'a Arc<PersistTable>,
    sync_rings: &'a Option<Arc<Vec<crate::dataplane::sync_events::EventRing>>>,
    capture: &'a Arc<Capture>,
    probe_acks: &'a Arc<ProbeAcks>,
}

fn launch_workers(cfg: &Config, app: &mut Appliance, shared: &Shared) -> Result<(), String> {
    let Shared {
        counters,
        real_servers,
        publisher,
        mailboxes,
        persist,
        sync_rings,
        capture,
        probe_acks,
    } = shared;
    let timeouts = timeouts_from_config(cfg).in_ticks(cfg.sessions.tick_ms);
    let hz = crate::dpdk::tsc_hz();
    let tsc_per_tick = hz / 1000 * cfg.sessions.tick_ms as u64;
    let mut queues: Vec<_> = app
        .ports
        .iter_mut()
        .map(|p| p.port.take_queues().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    // Each worker builds its forwarder on its own lcore, so that the session table is
    // first written, and so placed, on that lcore's NUMA node. Start-up waits for every
    // worker's answer: a table the memory cannot hold stops the workers already
    // running and is a start-up error (the preflight check makes it rare).
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let mut launched = 0;
    for (w, &lcore) in cfg.lcores.workers.iter().enumerate().rev() {
        let ports: Vec<WorkerPort> = queues
            .iter_mut()
            .zip(&cfg.ports)
            .zip(&app.ports)
            .map(|((q, pc), entry)| {
                let (rx, tx) = q.pop().expect("one queue pair per worker");
                let addrs: Vec<_> = pc.addresses.iter().map(|a| a.addr).collect();
                let subnets: Vec<_> = pc
                    .addresses
                    .iter()
                    .map(|a| (a.addr, a.prefix_len))
                    .collect();
                WorkerPort {
                    rx,
                    tx,
                    responder: LocalResponder::new(entry.mac, &subnets)
                        .with_ipv6(&pc.addresses6.iter().map(|a| a.addr).collect::<Vec<_>>()),
                    addr: addrs[0],
                    mtu: pc.mtu.unwrap_or(1500),
                    exception: entry.exception.as_ref().map(|k| {
                        ExceptionLink::new(k.rings(), k.config().rate, cfg.lcores.workers.len(), hz)
                    }),
                }
            })
            .collect();
        let config = ForwarderConfig {
            local_ports: cfg.sessions.local_port_first..=cfg.sessions.local_port_last,
            server_time_wait_ms: cfg.sessions.server_time_wait_s.saturating_mul(1000),
            rewrite_timestamps: cfg.sessions.rewrite_timestamps,
            icmp_error_limit: cfg
                .sessions
                .icmp_error_limit
                .per_worker(cfg.lcores.workers.len(), hz),
            load_view: Some(LoadView::new(real_servers.to_vec(), w, hz)),
            persistence: Some((*persist).clone()),
            health: cfg.health_source().map(|source| HealthTap {
                source,
                sources6: cfg.health_sources6(),
                acks: Arc::clone(probe_acks),
                passive_syn_ms: cfg.health.passive_syn_ms,
            }),
            vrrp: match &cfg.vrrp {
                None => VrrpSenders::Off,
                Some(v) if v.any_peer => VrrpSenders::Any,
                Some(v) => VrrpSenders::Peers(v.peers.clone()),
            },
            vrrp_unicast: cfg.vrrp.as_ref().is_some_and(|v| v.unicast),
            sync: match (sync_rings, &cfg.sync) {
                (Some(rings), Some(settings)) => Some(crate::dataplane::forwarder::SyncLink {
                    rings: rings.clone(),
                    index: w,
                    policy: crate::dataplane::sync_events::SyncPolicy {
                        threshold: settings.threshold,
                        period_ms: settings.period_ms,
                    },
                }),
                _ => None,
            },
            sync_port: match (sync_rings, &cfg.sync) {
                (Some(_), Some(settings)) if settings.port.is_some() => {
                    Some((settings.listen, settings.multicast))
                }
                _ => None,
            },
            sync_peers: cfg
                .sync
                .as_ref()
                .map_or_else(Vec::new, |s| s.peers.iter().map(|p| *p.ip()).collect()),
            neighbour_capacity: cfg.sessions.neighbours as usize,
            static_neighbours: cfg
                .ports
                .iter()
                .flat_map(|p| &p.static_neighbours)
                .map(|n| (n.address, crate::wire::MacAddr(n.mac)))
                .collect(),
            ..ForwarderConfig::new(
                cfg.sessions.capacity as usize,
                publisher.reader(),
                timeouts,
                tsc_per_tick,
                hz,
                real_servers[w].clone(),
                rss_view(app, w as u16),
            )
        };
        let pool = app.pool.clone();
        let counters = counters[w].clone();
        let links = Links {
            stop: app.workers.stop_flag().clone(),
            mesh: app.mesh.clone(),
            inbox: app.worker_inboxes[w]
                .take()
                .ok_or_else(|| format!("worker {w}: no inbox"))?,
            inject: if w == 0 { app.inject_out.take() } else { None },
            mailbox: mailboxes[w].clone(),
            capture: CaptureTap::new((*capture).clone(), w),
        };
        let (capacity, path) = (cfg.sessions.capacity, cfg.path.clone());
        let idle_sleep = std::time::Duration::from_micros(u64::from(cfg.lcores.idle_sleep_us));
        let ready = ready_tx.clone();
        let job = move || match Forwarder::try_new(config) {
            Ok(forwarder) => {
                let _ = ready.send(Ok(()));
                // Answered: let go of the channel, so that a worker which ends without
                // answering closes it for start-up instead of leaving it waiting.
                drop(ready);
                Worker::new(w as u16, pool, ports, forwarder, counters, links)
                    .with_idle_sleep(Some(idle_sleep))
                    .run()
            }
            Err(e) => {
                let _ = ready.send(Err(format!(
                    "{}: sessions.capacity = {capacity}: worker {w}'s session table: {e}",
                    path.display()
                )));
                1
            }
        };
        if let Err(e) = app.workers.launch(lcore, job) {
            app.workers.stop();
            return Err(format!("worker lcore {lcore}: {e}"));
        }
        launched += 1;
    }
    drop(ready_tx);
    let mut failure = None;
    for _ in 0..launched {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some("a worker ended before it was ready".to_string())),
        }
    }
    if let Some(e) = failure {
        app.workers.stop();
        return Err(e);
    }
    Ok(())
}

/// Worker `queue`'s copy of the shared view of how packets spread over the workers'
/// queues, for FullNAT local-port choice, NAT redirects and software steering.
fn rss_view(app: &Appliance, queue: u16) -> RssView {
    let view = &app.queues;
    RssView {
        toeplitz: view.toeplitz.clone(),
        reta: view.reta.clone(),
        fields: view.fields,
        fields6: view.view_fields6(),
        queue,
        steer: view.ownership.steers(),
        steer6: view.steers6(),
    }
}

/// Reads back from every port what its device says about RSS and decides how the
/// workers find a packet's owner (`flow::ownership`): each port's entry records its
/// own decision; the workers share one view, so any port that cannot be trusted, or
/// ports that hash differently, make every port steered.
fn decide_queue_view(cfg: &Config, ports: &mut [PortEntry]) -> Result<QueueView, String> {
    let queues = cfg.lcores.workers.len() as u16;
    let mut shared: Option<QueueView> = None;
    for (index, (entry, pc)) in ports.iter_mut().zip(&cfg.ports).enumerate() {
        let loopback = matches!(pc.device, PortDevice::Loopback);
        let device = if queues > 1 && !loopback {
            let conf = entry.port.rss_conf().ok();
            DeviceRss {
                offloads: entry.port.rss_offloads().unwrap_or(0),
                hash_fields: conf.as_ref().map_or(0, |c| c.hash_fields),
                key: conf.and_then(|c| c.key),
                reta: match entry.port.reta_size() {
                    Ok(n) if n > 0 => entry.port.reta().ok(),
                    _ => None,
                },
            }
        } else {
            DeviceRss::default()
        };
        let view =
            ownership::decide(&device, pc.rss_key.as_deref(), queues, loopback).map_err(|e| {
                format!(
                    "{}: ports[{index}].rss_key: {e}",
                    cfg.place(&format!("ports[{index}].rss_key"))
                )
            })?;
        match &view.ownership {
            Ownership::Steered(why) => log::warn!(
                "port {}: {} workers but {why}: packets a worker receives for another \
                 worker's session are steered to it through its redirect ring (one ring \
                 hop for those that land off their owner)",
                pc.name,
                queues
            ),
            o => log::info!("port {}: packet ownership: {o}", pc.name),
        }
        if view.steers6() && !view.ownership.steers() && view.ownership != Ownership::Single {
            log::info!(
                "port {}: IPv6 TCP/UDP not hashed as Sluice can model: IPv6 packets are \
                 steered to their owner worker in software",
                pc.name
            );
        }
        entry.ownership = view.ownership.clone();
        shared = Some(match shared {
            None => view,
            Some(first) if same_hash(&first, &view) => first,
            Some(mut first) => {
                if !first.ownership.steers() {
                    log::warn!(
                        "port {}: hashes differently from port {}: all ports are steered",
                        pc.name,
                        cfg.ports[0].name
                    );
                    first.ownership = Ownership::Steered(SteerReason::PortsDiffer);
                }
                first
            }
        });
    }
    if shared.as_ref().is_some_and(|v| v.ownership.steers()) {
        for entry in ports.iter_mut() {
            if !entry.ownership.steers() {
                entry.ownership = Ownership::Steered(SteerReason::PortsDiffer);
            }
        }
    }
    match shared {
        Some(view) => Ok(view),
        None => ownership::decide(&DeviceRss::default(), None, queues, false)
            .map_err(|e| format!("RSS view: {e}")),
    }
}

/// Whether two ports' views send every packet to the same worker.
fn same_hash(a: &QueueView, b: &QueueView) -> bool {
    a.ownership.steers() == b.ownership.steers()
        && a.toeplitz.key() == b.toeplitz.key()
        && a.reta == b.reta
        && a.fields == b.fields
        && a.fields6 == b.fields6
}

/// The control thread forwards each request to the management loop and waits for the
/// answer, so every piece of appliance state has exactly one owner.
fn control_handler(calls: Sender<ControlCall>) -> Handler {
    Arc::new(move |req: Request| {
        // A batch or a reload may carry a whole table (a restore of 100k services
        // takes about a second, a reload of 50,000 real servers about as long), and a
        // listing or save answers with one: give them longer than a single change,
        // which a loaded machine can stretch past 2 s.
        let answer_within = if req.is_batch() || req == Request::Reload {
            Duration::from_secs(60)
        } else if matches!(req, Request::ListServices | Request::SaveServices) {
            Duration::from_secs(30)
        } else {
            Duration::from_secs(2)
        };
        let (reply_tx, reply_rx) = channel::bounded(1);
        calls
            .send_timeout((req, reply_tx), Duration::from_secs(1))
            .map_err(|_| "the management loop is busy or shutting down".to_string())?;
        reply_rx
            .recv_timeout(answer_within)
            .map_err(|_| "the management loop did not answer in time".to_string())?
            .into_result()
    })
}

/// What the management loop edits and publishes: the services and their counters, and
/// the workers' mailboxes for what only they can read.
struct Registry {
    services: Services,
    publisher: SnapshotPublisher,
    real_servers: Vec<Arc<Box<[RealServerCounters]>>>,
    mailboxes: Vec<Arc<Mailbox>>,
    tick_ms: u32,
    /// `[sessions] server_time_wait` and the local ports per address, for
    /// `--get-laddr`'s sizing rule.
    server_time_wait_s: u32,
    ports_per_address: u32,
    persist: Arc<PersistTable>,
    /// Counts the live templates by standing, a slice per loop turn, and the last
    /// whole count with when it was finished.
    census: TemplateCensus,
    census_started: Instant,
    templates_counted: Option<(TemplateCounts, Instant, Duration)>,
    /// The management loop's turns and control requests, for `status`.
    turns: turns::Turns,
    /// The config file, for `sluicectl reload`.
    config_path: PathBuf,
    /// The config the daemon started with: a reload names what it changes of the
    /// settings only a restart applies.
    started_config: Config,
    /// Reloads asked for, their file read off the loop ([`reloads`]).
    reloads: PendingReloads,
    health: HealthMonitor,
    /// The health monitor's clock starts here.
    started: Instant,
    vrrp: Option<crate::ha::vrrp::node::VrrpNode>,
    vrrp_started: bool,
    /// BGP announcements through BIRD (`[bgp]`).
    bgp: Option<crate::ha::bgp::BgpNode>,
    /// Session sync and its listen address.
    sync: Option<(sync::SyncNode, std::net::SocketAddrV4)>,
    /// `sluicectl capture`, and the ports' names by index.
    capture: capture::Capturing,
    port_names: Vec<String>,
}

/// Queues one frame of the management core's, of kind `kind`, for worker 0 to
/// transmit.
fn inject(plane: sync::Plane, kind: Injected, frame: &[u8]) -> bool {
    let mut out = Burst::new();
    if !out.push_copy(plane.pool, frame) {
        return false;
    }
    out.set_user_tag(0, kind.tag());
    // A full ring leaves the mbuf in `out`, which frees it.
    plane.inject.enqueue(&mut out) == 1
}

/// Gratuitous ARP and unsolicited Neighbor Advertisements, through worker 0 on the
/// first port, for that port's addresses and, unless VRRP decides who serves them
/// (its master announces them when it takes over), the VIPs and FullNAT local
/// addresses: neighbours that cached another MAC for them (an earlier appliance, a
/// restart with a new MAC) learn ours now rather than when their entry expires. Not
/// on an emulated port (no neighbour caches).
fn announce_at_start(cfg: &Config, app: &Appliance, registry: &Registry) {
    let (Some(port), Some(pc)) = (app.ports.first(), cfg.ports.first()) else {
        return;
    };
    if matches!(pc.device, PortDevice::Loopback) || writes_a_capture_file(&pc.device) {
        return;
    }
    let mut addrs = crate::ha::vrrp::node::VirtualAddresses {
        v4: pc.addresses.iter().map(|a| a.addr).collect(),
        v6: pc.addresses6.iter().map(|a| a.addr).collect(),
    };
    if registry.vrrp.is_none() {
        let virtual_addresses = registry.services.virtual_addresses();
        addrs.v4.extend(virtual_addresses.v4);
        addrs.v6.extend(virtual_addresses.v6);
    }
    addrs.v4.sort_unstable();
    addrs.v4.dedup();
    addrs.v6.sort_unstable();
    addrs.v6.dedup();
    let plane = app.plane();
    let mut send = |frame: &[u8]| inject(plane, Injected::Addressed, frame);
    let mac = crate::wire::MacAddr(port.mac);
    let sent = crate::ha::vrrp::node::send_gratuitous_arps(mac, &addrs.v4, &mut send);
    log::info!(
        "port {}: gratuitous ARP for {sent} of {} address(es)",
        port.name,
        addrs.v4.len()
    );
    if !addrs.v6.is_empty() {
        let sent = crate::ha::vrrp::node::send_unsolicited_adverts(mac, &addrs.v6, &mut send);
        log::info!(
            "port {}: unsolicited neighbor advertisement for {sent} of {} IPv6 address(es)",
            port.name,
            addrs.v6.len()
        );
    }
}

/// A `net_pcap` port that writes its output to a file (`tx_pcap=`) has no neighbour
/// to tell: gratuitous ARP would only add frames to a replay's golden output.
fn writes_a_capture_file(device: &PortDevice) -> bool {
    match device {
        PortDevice::Vdev(spec) => spec
            .split(',')
            .skip(1)
            .any(|arg| arg.starts_with("tx_pcap=")),
        _ => false,
    }
}

/// Session events a worker's sync ring holds.
const SYNC_RING_EVENTS: usize = 65_536;

/// Loop turns (they start [`crate::dataplane::MANAGEMENT_TICK_MS`] apart) per whole
/// count of the persistence templates: a pass of about 5 s, each turn reading at
/// most 1/1000 of the tables (19,000 slots, 0.6 MiB, at the largest size).
const CENSUS_STEPS_PER_PASS: usize = 1000;

/// How long a worker may take to answer one question (it answers between two polls).
const QUERY_TIMEOUT: Duration = Duration::from_secs(1);

/// One question to worker `w`: its sessions from table position `from` on, at most
/// `room`, and where to go on (None: the end of its table).
fn ask_connections(
    mailbox: &Mailbox,
    w: usize,
    from: usize,
    room: usize,
) -> Result<(Vec<crate::dataplane::query::ConnectionEntry>, Option<usize>), String> {
    let query = Query::Connections {
        from,
        out: Vec::with_capacity(room),
        next: None,
    };
    let Query::Connections { out, next, .. } = mailbox
        .ask(query, QUERY_TIMEOUT)
        .map_err(|e| format!("worker {w}: {e}"))?
    else {
        return Err(format!("worker {w}: answered another question"));
    };
    Ok((out, next))
}

/// The tables a bulk resync dump lists, a slice per turn: the workers' sessions
/// through their mailboxes, and the shared template table read directly.
struct DumpTables<'a> {
    mailboxes: &'a [Arc<Mailbox>],
    persist: &'a PersistTable,
    services: &'a crate::service::ServiceTable,
    /// The services by id, built at the first template listed in the turn.
    by_id: Option<crate::ha::sync::templates::ServicesById<'a>>,
    now: u32,
    tick_ms: u32,
}

impl crate::ha::sync::cursor::DumpSource for DumpTables<'_> {
    fn workers(&self) -> usize {
        self.mailboxes.len()
    }

    fn sessions(
        &mut self,
        worker: usize,
        from: usize,
        max: usize,
        each: &mut dyn FnMut(crate::session::replication::RecordRepr),
    ) -> Result<Option<usize>, String> {
        use crate::dataplane::query::ListedSession;
        use crate::session::replication::{RecordOp, RecordRepr};
        let room = max.min(CONNECTIONS_PER_CHUNK);
        let (out, next) = ask_connections(&self.mailboxes[worker], worker, from, room)?;
        for c in &out {
            let left_ms = c.expires_ticks.saturating_mul(self.tick_ms);
            let mut record = match &c.session {
                ListedSession::V4(s) => RecordRepr::connection(s, RecordOp::Update, left_ms),
                ListedSession::V6(s) => RecordRepr::connection6(s, RecordOp::Update, left_ms),
            };
            record.synproxy = c.synproxy;
            each(record);
        }
        Ok(next)
    }

    fn template_slots(&self, v6: bool) -> usize {
        if v6 {
            self.persist.capacity6()
        } else {
            self.persist.capacity()
        }
    }

    fn templates(
        &mut self,
        v6: bool,
        slots: std::ops::Range<usize>,
        each: &mut dyn FnMut(crate::session::replication::RecordRepr),
    ) {
        let (now, tick_ms, services) = (self.now, self.tick_ms, self.services);
        let by_id = self
            .by_id
            .get_or_insert_with(|| crate::ha::sync::templates::ServicesById::new(services));
        if v6 {
            (self.persist.live6_in(slots, now))
                .filter_map(|(key, template)| by_id.record(key, template, now, tick_ms))
                .for_each(each);
        } else {
            (self.persist.live_in(slots, now))
                .filter_map(|(key, template)| by_id.record(key, template, now, tick_ms))
                .for_each(each);
        }
    }
}

impl Registry {
    /// `-Lnc`: the workers' sessions from `start` on, chunk by chunk (each worker
    /// answers between two polls), at most `max`; returns where the listing stopped
    /// when `max` cut it short (the templates' turn when the workers are done).
    fn for_each_connection(
        &self,
        start: ConnectionsCursor,
        max: u32,
        mut each: impl FnMut(&crate::dataplane::query::ConnectionEntry),
    ) -> Result<Option<ConnectionsCursor>, String> {
        let mut seen = 0usize;
        for (w, mailbox) in self.mailboxes.iter().enumerate().skip(start.worker) {
            let mut from = Some(if w == start.worker { start.from } else { 0 });
            while let Some(at) = from {
                let room = (max as usize)
                    .saturating_sub(seen)
                    .min(CONNECTIONS_PER_CHUNK);
                if room == 0 {
                    return Ok(Some(ConnectionsCursor {
                        worker: w,
                        from: at,
                    }));
                }
                let (out, next) = ask_connections(mailbox, w, at, room)?;
                from = next;
                seen += out.len();
                out.iter().for_each(&mut each);
            }
        }
        Ok(None)
    }

    /// `max` sessions from `page` on (the first page without one), then templates.
    /// The sessions are gathered here and turned into text by the control thread
    /// (`Answer::Deferred`): a page of 200,000 is over a million strings, hundreds of
    /// milliseconds the management loop's VRRP, health checks and sync would wait.
    fn connections(&self, max: u32, page: Option<ConnectionsCursor>) -> Result<Answer, String> {
        let mut report = ConnectionsReport::default();
        let tick_ms = self.tick_ms as u64;
        let start = page.unwrap_or_default();
        let workers = self.mailboxes.len();
        let mut next = None;
        let mut sessions = Vec::new();
        if start.worker < workers {
            next = self.for_each_connection(start, max, |c| sessions.push(*c))?;
        }
        if next.is_none() {
            let skip = if start.worker >= workers {
                start.from
            } else {
                0
            };
            // The page's room left after its sessions (gathered apart, made text
            // later).
            let room = max.saturating_sub(sessions.len() as u32);
            next = self
                .templates(&mut report, skip, room)
                .map(|from| ConnectionsCursor {
                    worker: workers,
                    from,
                });
        }
        report.truncated = next.is_some();
        if page.is_some() {
            report.next = next;
        }
        Ok(Answer::Deferred(Box::new(move || {
            let templates = std::mem::take(&mut report.connections);
            report.connections = (sessions.iter())
                .map(|c| ConnectionStatus {
                    worker: Some(c.worker),
                    proto: c.proto.name().to_ascii_lowercase(),
                    expires_s: (c.expires_ticks as u64 * tick_ms / 1000) as u32,
                    state: c.state.to_string(),
                    client: c.client.to_string(),
                    virtual_service: c.virtual_service.to_string(),
                    local: c.local.map(|l| l.to_string()),
                    destination: c.real_server.to_string(),
                    standing: None,
                })
                .chain(templates)
                .collect();
            Response::success_line_of(&report)
                .map(Reply::Line)
                .map_err(|e| e.to_string())
        })))
    }

    /// The workers' session clock (`[sessions] tick_ms` ticks of the TSC), the time
    /// base of persistence templates.
    fn now_tick(&self) -> u32 {
        let tsc_per_tick = (crate::dpdk::tsc_hz() / 1000 * self.tick_ms as u64).max(1);
        (crate::dpdk::tsc() / tsc_per_tick) as u32
    }

    /// Persistence templates as IPVS lists them among the connections: state `NONE`,
    /// the client network with port 0, no worker (all workers share them); the
    /// first `skip` left out, until the report holds `max`. Returns how many
    /// templates come before the first one left for the next page, if any.
    fn templates(&self, report: &mut ConnectionsReport, skip: usize, max: u32) -> Option<usize> {
        let now = self.now_tick();
        // IPv4 templates, then IPv6 ones (their client network `[address]:0`).
        let v4 = self.persist.live(now).map(|(key, t)| {
            let network = std::net::Ipv4Addr::from(key.network);
            (key.service, crate::control::render::endpoint(network, 0), t)
        });
        let v6 = self.persist.live6(now).map(|(key, t)| {
            (
                key.service,
                crate::control::render::endpoint(key.network, 0),
                t,
            )
        });
        for (i, (service_id, client, template)) in v4.chain(v6).enumerate().skip(skip) {
            if report.connections.len() >= max as usize {
                return Some(i);
            }
            let Some(service) = self.services.table.services().find(|s| s.id == service_id) else {
                continue;
            };
            let destination = service
                .real_servers
                .iter()
                .find(|r| r.id == template.real)
                .map_or_else(
                    || "-".to_string(),
                    |r| crate::control::render::endpoint(r.ip, r.port),
                );
            let left = template.expires.wrapping_sub(now) as u64;
            report.connections.push(ConnectionStatus {
                worker: None,
                proto: service.key.proto.name().to_ascii_lowercase(),
                expires_s: (left * self.tick_ms as u64 / 1000) as u32,
                state: "NONE".into(),
                client,
                virtual_service: crate::control::render::endpoint(
                    service.key.vip,
                    service.key.port,
                ),
                local: None,
                destination,
                standing: Some(template.trust.name().into()),
            });
        }
        None
    }

    /// Health checking's turn of the management loop: answers from the workers, then
    /// timeouts, passive counts and due probes; evictions and restorations are logged
    /// and published as a new snapshot.
    fn tick_health(&mut self, plane: sync::Plane) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let mut send_probe = |frame: &[u8]| inject(plane, Injected::HealthProbe, frame);
        let mut send_vrrp = |frame: &[u8]| inject(plane, Injected::Addressed, frame);
        let mut events = Vec::new();
        let mut answers = Burst::new();
        // Sync over a DPDK port: its datagrams come on a ring of their own.
        let when = crate::daemon::sync::When {
            now: self.now_tick(),
            now_ms,
            backup: self.vrrp.as_ref().is_some_and(|v| !v.serving()),
            master: self.vrrp.as_ref().is_some_and(|v| v.serving()),
            timeouts: self.services.timeouts,
        };
        // VRRP's own ring first, whatever waits on the others; then at most a ring's
        // worth of each of the others per tick.
        let rings = [
            (plane.vrrp_punted, crate::dataplane::mesh::VRRP_RING_SIZE),
            (plane.punted, plane.mesh.management_ring_size()),
            (plane.sync_punted, plane.mesh.management_ring_size()),
        ];
        for (ring, size) in rings {
            for _ in 0..(size as usize).div_ceil(crate::dpdk::BURST_SIZE) {
                if ring.dequeue(&mut answers) == 0 {
                    break;
                }
                for i in 0..answers.len() {
                    let frame = answers.packet(i);
                    let ip_protocol = (frame.len() > 23 && frame[12..14] == [0x08, 0x00])
                        .then(|| crate::wire::IpProtocol(frame[23]));
                    match (&mut self.vrrp, &mut self.sync) {
                        (Some(node), _) if crate::wire::vrrp::carries_vrrp(frame) => {
                            let addrs = self.services.virtual_addresses();
                            for line in node.on_frame(frame, now_ms, &addrs, &mut send_vrrp) {
                                self.services.record(line);
                            }
                        }
                        // Sync over a DPDK port: the workers hand up UDP to the listen
                        // address or the group only (probe answers are TCP).
                        (_, Some((node, _)))
                            if ip_protocol == Some(crate::wire::IpProtocol::UDP) =>
                        {
                            node.on_frame(frame, &self.services.table, plane.mesh, when);
                        }
                        _ => events.extend(self.health.on_frame(frame, now_ms, &mut send_probe)),
                    }
                }
                answers.free_all();
            }
        }
        let counters = &self.real_servers;
        let (more, _) = self.health.tick(
            &self.services.table,
            now_ms,
            |id| RealServerTotals::sum(counters, id).passive,
            &mut send_probe,
        );
        events.extend(more);
        if let Some(node) = &mut self.vrrp {
            let addrs = self.services.virtual_addresses();
            let lines = if self.vrrp_started {
                node.tick(now_ms, &addrs, &mut send_vrrp)
            } else {
                self.vrrp_started = true;
                node.start(now_ms, &addrs, &mut send_vrrp)
            };
            for line in lines {
                self.services.record(line);
            }
            if node.serving() != self.services.serving_vips {
                self.services.serving_vips = node.serving();
                if let Err(e) = self.services.publish(&self.publisher) {
                    log::warn!("vrrp: publishing the VIPs' owner failed: {e}");
                }
            }
        }
        for e in &events {
            if matches!(e.change, crate::health::verdict::Change::Evicted { .. }) {
                *self.services.evictions.entry(e.id).or_default() += 1;
            }
            self.services.record(e.line());
        }
        let changed = self.health.overlay_if_changed(now_ms);
        if let Some(overlay) = changed.filter(|o| *o != self.services.health) {
            self.services.health = overlay;
            if let Err(e) = self.services.publish(&self.publisher) {
                log::warn!("health: publishing the evictions failed: {e}");
            }
        }
    }

    /// Resigns the master role (a priority-0 advertisement) while worker 0 can still
    /// send it, so a backup takes over after its skew time instead of 3 intervals.
    fn stop_vrrp(&mut self, plane: sync::Plane) {
        let Some(node) = &mut self.vrrp else {
            return;
        };
        let now_ms = self.started.elapsed().as_millis() as u64;
        let addrs = self.services.virtual_addresses();
        let mut send = |frame: &[u8]| inject(plane, Injected::Addressed, frame);
        for line in node.shutdown(now_ms, &addrs, &mut send) {
            self.services.record(line);
        }
        // Worker 0 sends it at its next poll: microseconds; leave it a margin.
        std::thread::sleep(Duration::from_millis(20));
    }

    /// Counts the next slice of the template tables (a whole count every
    /// [`CENSUS_STEPS_PER_PASS`] turns of the loop).
    fn tick_census(&mut self) {
        let now = self.now_tick();
        if let Some(counts) = self.census.step(&self.persist, now) {
            let done = Instant::now();
            let took = done - std::mem::replace(&mut self.census_started, done);
            self.templates_counted = Some((counts, done, took));
        }
    }

    /// The last whole count of the templates, for `status` and the metrics.
    fn templates_report(&self) -> Option<crate::control::report::TemplatesReport> {
        use crate::control::report::{TemplateTableReport, TemplatesReport};
        let (counts, at, took) = self.templates_counted?;
        let table = |slots: usize, by: ByStanding| TemplateTableReport {
            slots: slots as u64,
            unconfirmed: by[Trust::Unconfirmed as usize],
            unverified: by[Trust::Unverified as usize],
            confirmed: by[Trust::Confirmed as usize],
        };
        Some(TemplatesReport {
            ipv4: table(self.persist.capacity(), counts.ipv4),
            ipv6: table(self.persist.capacity6(), counts.ipv6),
            counted_ms_ago: at.elapsed().as_millis() as u64,
            pass_ms: took.as_millis() as u64,
        })
    }

    fn tick_sync(&mut self, plane: sync::Plane) {
        let now = self.now_tick();
        let Some((node, _)) = &mut self.sync else {
            return;
        };
        let when = sync::When {
            now,
            now_ms: self.started.elapsed().as_millis() as u64,
            backup: self.vrrp.as_ref().is_some_and(|v| !v.serving()),
            master: self.vrrp.as_ref().is_some_and(|v| v.serving()),
            timeouts: self.services.timeouts,
        };
        node.tick(&self.services.table, plane, when);
        // A peer asked for our whole table (it started or reconnected): a dump from
        // the first slot, listed from the workers' tables and sent a slice per turn.
        for (peer, dump_id) in node.take_resync_requests() {
            node.start_dump(peer, dump_id, when.now_ms);
        }
        let mut tables = DumpTables {
            mailboxes: &self.mailboxes,
            persist: &self.persist,
            services: &self.services.table,
            by_id: None,
            now,
            tick_ms: self.tick_ms,
        };
        node.step_dumps(&mut tables, plane, when.now_ms);
    }

    fn sync_report(&self) -> Result<SyncReport, String> {
        let Some((node, listen)) = &self.sync else {
            return Err("session sync is off: the config has no [sync] section".into());
        };
        let now_ms = self.started.elapsed().as_millis() as u64;
        Ok(node.report(*listen, now_ms))
    }

    /// BGP's turn of the management loop: decides every VIP from the services and
    /// their health (a real server of weight above 0 that is not evicted), hands BIRD
    /// a new include file when the announced set changed, and logs the changes.
    fn tick_bgp(&mut self) {
        let Some(node) = &mut self.bgp else {
            return;
        };
        let services: Vec<crate::ha::bgp::decide::ServiceHealth> = self
            .services
            .table
            .services()
            .map(|s| crate::ha::bgp::decide::ServiceHealth {
                vip: s.key.vip,
                available: self.services.has_available_server(s),
            })
            .collect();
        // A VRRP backup does not serve the VIPs: it leaves their routes to the master.
        let backup = self.vrrp.as_ref().is_some_and(|v| !v.serving());
        if node.set_vrrp_backup(backup) {
            log::info!(
                "bgp: VRRP {}",
                if backup {
                    "backup: the VIPs are withdrawn"
                } else {
                    "master: the VIPs may be announced"
                }
            );
        }
        for line in node.tick(&services) {
            self.services.record(line);
        }
    }

    fn cluster_report(&self) -> Result<crate::ha::bgp::ClusterReport, String> {
        let Some(node) = &self.bgp else {
            return Err("BGP is off: the config has no [bgp] section".into());
        };
        Ok(node.report())
    }

    /// `sluicectl drain` / `undrain`: decided at once (the new include file is handed
    /// to the birdc thread before the answer), answered with the cluster report.
    fn drain(&mut self, on: bool) -> Result<crate::ha::bgp::ClusterReport, String> {
        let Some(node) = &mut self.bgp else {
            return Err("BGP is off: the config has no [bgp] section".into());
        };
        if node.shutting_down() {
            return Err("shutting down: every VIP is being withdrawn already".into());
        }
        if node.set_draining(on) {
            self.services
                .record(format!("lb=bgp {}", if on { "drain" } else { "undrain" }));
        }
        self.tick_bgp();
        self.cluster_report()
    }

    fn vrrp_report(&self) -> Result<VrrpReport, String> {
        let Some(node) = &self.vrrp else {
            return Err("VRRP is off: the config has no [vrrp] section".into());
        };
        let now_ms = self.started.elapsed().as_millis() as u64;
        Ok(node.report(now_ms))
    }

    fn health_report(&self) -> HealthReport {
        let now_ms = self.started.elapsed().as_millis() as u64;
        HealthReport {
            source: self.health.source().to_string(),
            sources6: self
                .health
                .sources6()
                .iter()
                .map(|a| a.to_string())
                .collect(),
            targets: self.health.report(now_ms),
            stats: self.health.stats,
        }
    }

    /// `sluicectl reload`: the config file's services and timeouts, applied as the
    /// difference to the running table in one batch (all or nothing), then its VRRP
    /// priority, advertisement interval and preempt flag (a planned switchover: raise
    /// the standby's priority). Other sections (ports, lcores, EAL, sessions, VRID,
    /// sync) need a restart: a change to them is not applied but named in the answer
    /// (`needs_restart`) and the log, so that nobody takes it for live.
    ///
    /// This is the applying half, on the loop; the file was read, checked and turned
    /// into `desired` by [`read_reload`] on a thread of its own.
    fn apply_reload(
        &mut self,
        (cfg, desired): (Config, Services),
        plane: sync::Plane,
    ) -> Result<serde_json::Value, String> {
        let needs_restart = self.started_config.restart_only_changes(&cfg);
        let mut requests = services::diff(&self.services.table, &desired.table)?;
        let (tcp, tcpfin, udp) = desired.timeouts.get();
        if desired.timeouts != self.services.timeouts {
            requests.push(Request::SetTimeouts { tcp, tcpfin, udp });
        }
        let mut answer = if requests.is_empty() {
            serde_json::json!({ "applied": 0, "generation": self.services.generation })
        } else {
            let file = self.config_path.display().to_string();
            let preface = format!(
                "lb=config op=reload file={file} commands={}",
                requests.len()
            );
            let Registry {
                services,
                publisher,
                real_servers,
                ..
            } = self;
            services
                .batch(requests, false, Some(preface), publisher, real_servers)
                .inspect_err(|e| {
                    services.record(format!(
                        "lb=config op=reload-refused file={file} error={e:?}"
                    ))
                })
                .map_err(|e| match needs_restart.is_empty() {
                    true => e,
                    // A raised [sessions] neighbours, say, that the running table
                    // cannot know of yet.
                    false => format!(
                        "{e} (the file also changes what needs a restart: {})",
                        needs_restart.join(", ")
                    ),
                })?
        };
        // Only once the services took the file: a refused reload changes nothing.
        // Health settings apply from the next tick (the probe source and ports stay
        // until a restart: the workers were told them at start).
        let count_one = |answer: &mut serde_json::Value| {
            let applied = answer["applied"].as_u64().unwrap_or(0);
            answer["applied"] = serde_json::json!(applied + 1);
        };
        if self
            .health
            .reconfigure(cfg.health.clone(), cfg.health_overrides())
        {
            count_one(&mut answer);
        }
        if let (Some(node), Some(v)) = (&mut self.vrrp, &cfg.vrrp) {
            let now_ms = self.started.elapsed().as_millis() as u64;
            let addrs = self.services.virtual_addresses();
            let mut send = |frame: &[u8]| inject(plane, Injected::Addressed, frame);
            let interval_cs = (v.advert_interval_ms / 10) as u16;
            if let Some(line) = node.reconfigure(
                v.priority,
                interval_cs,
                v.preempt,
                now_ms,
                &addrs,
                &mut send,
            ) {
                self.services.record(line);
                count_one(&mut answer);
            }
        }
        if !needs_restart.is_empty() {
            log::warn!(
                "reload of {}: not applied, needs a restart: {}",
                self.config_path.display(),
                needs_restart.join(", ")
            );
            answer["needs_restart"] = serde_json::json!(needs_restart);
        }
        Ok(answer)
    }

    /// What a Prometheus scrape shows: the same reports as `sluicectl status`, `-L -n`
    /// and `--get-laddr`, gathered from the loop's state; the text is written by
    /// [`metrics::MetricsInputs::render`], off the loop.
    fn metrics_inputs(
        &mut self,
        mut status: StatusReport,
    ) -> Result<metrics::MetricsInputs, String> {
        status.persistence_templates = self.templates_report();
        status.management = Some(self.turns.report());
        let services = self
            .services
            .report(&self.real_servers, rates::DEFAULT_WINDOW);
        // One pass over every worker's pools, whatever the number of services.
        let with_laddrs = self
            .services
            .table
            .services()
            .any(|s| !s.local_addresses.is_empty());
        let pools = match with_laddrs {
            true => self.pool_rows()?,
            false => Vec::new(),
        };
        let health = self.health_report();
        let vrrp = self
            .vrrp
            .is_some()
            .then(|| self.vrrp_report())
            .transpose()?;
        let sync = self
            .sync
            .is_some()
            .then(|| self.sync_report())
            .transpose()?;
        Ok(metrics::MetricsInputs {
            status,
            services,
            pools,
            admission: self.services.admission_reports(),
            health,
            vrrp,
            sync,
            bgp: self.bgp.as_ref().map(|node| node.report()),
        })
    }

    /// `sluicectl capture`: start, status and stop.
    fn capture_request(&mut self, req: Request) -> Result<serde_json::Value, String> {
        let report = match req {
            Request::CaptureStart {
                path,
                requester,
                mut filter,
                interfaces,
                count,
                duration_ms,
                snaplen,
            } => {
                for name in &interfaces {
                    match self.port_names.iter().position(|p| p == name) {
                        Some(i) => filter.ports.push(i as u16),
                        None => {
                            return Err(format!(
                                "interface {name:?}: no such port (ports: {})",
                                self.port_names.join(", ")
                            ))
                        }
                    }
                }
                if count == Some(0) {
                    return Err("count: must be at least 1".into());
                }
                let Some(requester) = requester else {
                    return Err("capture: who asks is unknown (no peer credentials on the \
                                control connection), so no file is created"
                        .into());
                };
                let spec = capture::CaptureSpec {
                    filter: *filter,
                    path,
                    requester,
                    count,
                    duration: duration_ms.map(Duration::from_millis),
                    snaplen: snaplen.unwrap_or(crate::dataplane::capture::MAX_SNAPLEN),
                };
                self.capture.start(spec, &self.port_names)?
            }
            Request::CaptureStop => self.capture.stop(),
            _ => self.capture.status(),
        };
        serde_json::to_value(report).map_err(|e| e.to_string())
    }

    /// `--get-laddr`: the service's local addresses with every worker's pool on them.
    fn laddrs(&mut self, req: Request) -> Result<serde_json::Value, String> {
        let Request::GetLaddr { service } = req else {
            return Err("not a --get-laddr request".into());
        };
        let answer = self
            .services
            .handle(req, &self.publisher, &self.real_servers)?;
        let mut report: LaddrReport = serde_json::from_value(answer).map_err(|e| e.to_string())?;
        let Some(found) = self.services.table.get(service) else {
            return serde_json::to_value(report).map_err(|e| e.to_string());
        };
        let cps: f64 = found
            .real_servers
            .iter()
            .filter(|r| r.mode == ForwardMode::FullNat)
            .map(|r| self.services.rates.rate(r.id, rates::DEFAULT_WINDOW).cps)
            .sum();
        report.sizing = Some(LaddrSizing {
            connections_per_second: cps.round() as u64,
            server_time_wait_s: self.server_time_wait_s,
            ports_per_address: self.ports_per_address,
        });
        // A local address's pool is shared by the services that list it: its rows,
        // per worker in the service's order, once the service has FullNAT real servers.
        if found
            .real_servers
            .iter()
            .any(|r| r.mode == ForwardMode::FullNat)
        {
            let lips: Vec<std::net::Ipv4Addr> = found.local_addresses4().collect();
            report.pools = service_pools(&self.pool_rows()?, &lips);
        }
        serde_json::to_value(report).map_err(|e| e.to_string())
    }

    /// `sluicectl neigh`: every worker's neighbour entries, and the current real
    /// servers some worker has none for.
    fn neighbours_report(&self) -> Result<NeighboursReport, String> {
        let snapshot = self.publisher.current();
        let real_servers: Vec<IpAddr> = (snapshot.real_servers_v4().iter().map(|&a| a.into()))
            .chain(snapshot.real_servers_v6().iter().map(|&a| a.into()))
            .collect();
        collect_neighbours(self.mailboxes.len(), &real_servers, |w, query| {
            self.mailboxes[w].ask(query, QUERY_TIMEOUT)
        })
    }

    /// Every worker's local-address pools, each address once per worker whichever
    /// services share it: one question per worker, and more only for a worker with
    /// more addresses than [`crate::dataplane::query::POOLS_PER_CHUNK`].
    fn pool_rows(&self) -> Result<Vec<LaddrPoolStatus>, String> {
        collect_pool_rows(self.mailboxes.len(), |w, query| {
            self.mailboxes[w].ask(query, QUERY_TIMEOUT)
        })
    }
}

/// Every worker's neighbour tables, asking worker `w` with `ask(w, query)` (a
/// [`Query::Neighbours`] answered a bounded number of slots at a time), as the
/// report of `sluicectl neigh` with `real_servers` the current real servers.
pub(crate) fn collect_neighbours(
    workers: usize,
    real_servers: &[IpAddr],
    mut ask: impl FnMut(usize, Query) -> Result<Query, String>,
) -> Result<NeighboursReport, String> {
    let (mut tables, mut entries) = (Vec::new(), Vec::new());
    for w in 0..workers {
        let mut from = 0;
        let last = loop {
            let query = Query::Neighbours {
                from,
                out: Vec::with_capacity(crate::dataplane::query::NEIGHBOUR_SLOTS_PER_ANSWER),
                next: None,
                tables: NeighbourTables::default(),
            };
            let Query::Neighbours {
                out,
                next,
                tables: t,
                ..
            } = ask(w, query).map_err(|e| format!("worker {w}: {e}"))?
            else {
                return Err(format!("worker {w}: answered another question"));
            };
            entries.extend(out);
            match next {
                Some(next) if next > from => from = next,
                _ => break t,
            }
        };
        tables.push((w as u16, last));
    }
    Ok(NeighboursReport::build(&tables, &entries, real_servers))
}

/// Every worker's local-address pools, asking worker `w` with `ask(w, query)` (a
/// [`Query::Pools`] answered page after page, each address once per worker).
pub(crate) fn collect_pool_rows(
    workers: usize,
    mut ask: impl FnMut(usize, Query) -> Result<Query, String>,
) -> Result<Vec<LaddrPoolStatus>, String> {
    let mut rows = Vec::new();
    for w in 0..workers {
        let mut from = 0;
        loop {
            let query = Query::Pools {
                from,
                out: Vec::with_capacity(crate::dataplane::query::POOLS_PER_CHUNK),
                next: None,
            };
            let Query::Pools { out, next, .. } =
                ask(w, query).map_err(|e| format!("worker {w}: {e}"))?
            else {
                return Err(format!("worker {w}: answered another question"));
            };
            rows.extend(out.iter().map(|p| LaddrPoolStatus {
                worker: p.worker,
                lip: p.counters.lip,
                used: p.counters.used,
                free: p.counters.free,
                misses: p.counters.misses,
                early_reuses: p.counters.early_reuses,
                unprotected_reuses: p.counters.unprotected_reuses,
            }));
            match next {
                Some(next) if next > from => from = next,
                _ => break,
            }
        }
    }
    Ok(rows)
}

/// The rows of `rows` (every worker's pools, as `Registry::pool_rows` gets them)
/// on the local addresses `lips` of one service: per worker, in the service's order.
pub(crate) fn service_pools(
    rows: &[LaddrPoolStatus],
    lips: &[std::net::Ipv4Addr],
) -> Vec<LaddrPoolStatus> {
    let position = |lip| lips.iter().position(|&l| l == lip);
    let mut mine: Vec<LaddrPoolStatus> = rows
        .iter()
        .filter(|p| position(p.lip).is_some())
        .cloned()
        .collect();
    mine.sort_by_key(|p| (p.worker, position(p.lip)));
    mine
}

/// When the management loop stops by itself and prints statistics.
struct Timing {
    duration: Option<Duration>,
    stats_interval: Option<Duration>,
    started: Instant,
}

/// The reloads asked for and who waits for each: the answer channel of a `sluicectl
/// reload` (a SIGHUP has none).
type PendingReloads = reloads::Reloads<Result<(Config, Services), String>, ReplyTo>;
type ReplyTo = Sender<Answer>;

/// The reading half of a reload, off the management loop: the file's text, its
/// checks, and the table it describes.
fn read_reload(path: PathBuf) -> impl FnOnce() -> Result<(Config, Services), String> + Send {
    move || {
        let cfg = Config::load(&path).map_err(|e| e.to_string())?;
        let desired = Services::from_config(&cfg)?;
        Ok((cfg, desired))
    }
}

/// A reload asked for (`reply` waits for its outcome): its read starts now, told to
/// systemd with `RELOADING=1`, or after the one under way; refused at once while a
/// read given up is still stuck.
fn ask_reload(registry: &mut Registry, reply: Option<ReplyTo>, notifier: &systemd::Notifier) {
    let read = read_reload(registry.config_path.clone());
    let asked = registry.reloads.ask(reply, read);
    started_reload(registry, asked, notifier);
}

/// Tells systemd of a reload's read that starts now (`RELOADING=1`), or refuses the
/// reloads that cannot start because an earlier read given up is still stuck.
fn started_reload(
    registry: &Registry,
    asked: reloads::Asked<ReplyTo>,
    notifier: &systemd::Notifier,
) {
    match asked {
        reloads::Asked::Started => notifier.reloading(),
        reloads::Asked::Queued => {}
        reloads::Asked::Stuck(stuck_for, waiting) => {
            let error = format!(
                "not read: the read of {} that started {} s ago, given up after {} s, is \
                 still stuck (a hung file system?); no second reader starts until it ends",
                registry.config_path.display(),
                stuck_for.as_secs(),
                reloads::READ_LIMIT.as_secs()
            );
            log::error!("reload refused, nothing changed: {error}");
            for reply in waiting {
                let _ = reply.send(Answer::Ready(Err(error.clone())));
            }
        }
    }
}

/// A reload whose read is done, applied; `READY=1` with its outcome, the answer to
/// everyone who asked for it once the workers have the change (`settle`, which holds
/// the statistics view and counters this function cannot borrow beside the
/// registry); then the reload asked for meanwhile, if any, is read.
fn finish_reload(
    registry: &mut Registry,
    plane: sync::Plane,
    notifier: &systemd::Notifier,
    settle: impl FnOnce(&mut Registry, u64),
) {
    let Some((read, waiting)) = registry.reloads.done(Instant::now()) else {
        return;
    };
    let generation = registry.services.generation;
    let answer = match read {
        Ok(read) => read.and_then(|read| registry.apply_reload(read, plane)),
        Err(reloads::ReadLost::Stopped) => {
            Err("the config was not read: its reading thread stopped (see the log)".into())
        }
        Err(reloads::ReadLost::TooSlow) => Err(format!(
            "reading {} took longer than {} s: given up (a hung file system?)",
            registry.config_path.display(),
            reloads::READ_LIMIT.as_secs()
        )),
    };
    match &answer {
        Ok(a) => notifier.ready(&format!(
            "serving: reloaded, {} change(s) applied",
            a["applied"].as_u64().unwrap_or(0)
        )),
        Err(e) => {
            log::error!("reload refused, nothing changed: {e}");
            notifier.ready(&format!("serving: reload refused: {e}"));
        }
    }
    settle(registry, generation);
    for reply in waiting {
        let _ = reply.send(Answer::Ready(answer.clone()));
    }
    let read = read_reload(registry.config_path.clone());
    if let Some(asked) = registry.reloads.start_next(read) {
        started_reload(registry, asked, notifier);
    }
}

/// After a request that may have published a change (the generation moved from
/// `generation`): waits (bounded) until every worker has the new snapshot, so that an
/// answer sent after this means new sessions see the change, and frees the snapshot
/// they let go of.
fn settle_publish(
    registry: &mut Registry,
    view: &mut stats::StatsView,
    counters: &[Arc<WorkerCounters>],
    generation: u64,
) {
    if let Some((at, tsc)) = registry.services.published_at {
        if registry.services.generation != generation {
            let published = adoption::Published {
                generation: registry.services.generation,
                at,
                tsc,
                tsc_hz: crate::dpdk::tsc_hz(),
            };
            view.adoption
                .measure(&published, counters, adoption::ADOPTION_TIMEOUT);
            // Every worker let go of the replaced snapshot: free it here.
            registry.publisher.reap();
        }
    }
}

fn management_loop(
    app: &mut Appliance,
    counters: &[Arc<WorkerCounters>],
    registry: &mut Registry,
    calls: &Receiver<ControlCall>,
    view: &mut stats::StatsView,
    notifier: &mut systemd::Notifier,
    timing: Timing,
) {
    let Timing {
        duration,
        stats_interval,
        started,
    } = timing;
    let mut next_stats = stats_interval.map(|i| Instant::now() + i);
    let mut next_rates = Instant::now();
    let tick = Duration::from_millis(crate::dataplane::MANAGEMENT_TICK_MS.into());
    let mut next_tick = Instant::now() + tick;
    loop {
        let turn_started = Instant::now();
        notifier.watchdog_tick(turn_started);
        let stop = if let Some(sig) = signals::received() {
            Some(format!("signal {sig} received"))
        } else {
            duration
                .is_some_and(|d| started.elapsed() >= d)
                .then(|| "duration elapsed".to_string())
        };
        if let Some(why) = stop {
            // With BGP, the VIPs are withdrawn first and the loop (forwarding, health,
            // control) goes on through the grace; then the workers stop.
            match &mut registry.bgp {
                Some(node) if !node.shutdown_done() => {
                    if !node.shutting_down() {
                        log::info!("{why}");
                        node.begin_shutdown();
                    }
                }
                _ => {
                    if registry.bgp.is_none() {
                        log::info!("{why}");
                    }
                    break;
                }
            }
        }
        if signals::take_hangup() {
            log::info!(
                "SIGHUP received: reload of {} asked for",
                registry.config_path.display()
            );
            ask_reload(registry, None, notifier);
        }
        // Control requests for a budget of time, then this turn's ticks: clients
        // that pipeline costly requests must not hold VRRP, health checks and sync
        // off (`turns`).
        let answered = turns::answer_calls(calls, turns::CONTROL_BUDGET, |(req, reply)| {
            if req == Request::Reload {
                ask_reload(registry, Some(reply), notifier);
                return;
            }
            // A scrape or a listing: its report gathered here, written out by the
            // control thread.
            if req == Request::Metrics {
                let status = view.status(
                    &app.ports,
                    counters,
                    app.emulator.as_ref().map(Emulator::stats),
                );
                let answer = match registry.metrics_inputs(status) {
                    Ok(inputs) => Answer::Deferred(Box::new(move || {
                        Ok(Reply::Value(serde_json::Value::String(inputs.render())))
                    })),
                    Err(e) => Answer::Ready(Err(e)),
                };
                let _ = reply.send(answer);
                return;
            }
            if let Some(report) = registry
                .services
                .listing_report(&req, &registry.real_servers)
            {
                let _ = reply.send(Answer::json_later(report));
                return;
            }
            if let Request::ListConnections { max, page } = req {
                let answer = registry.connections(connections_bound(max), page);
                let _ = reply.send(answer.unwrap_or_else(|e| Answer::Ready(Err(e))));
                return;
            }
            // About 22 MB of JSON with a check on each of 50,000 real servers.
            if req == Request::Health {
                let _ = reply.send(Answer::json_later(registry.health_report()));
                return;
            }
            let generation = registry.services.generation;
            let answer = if req == Request::Status {
                let mut status = view.status(
                    &app.ports,
                    counters,
                    app.emulator.as_ref().map(Emulator::stats),
                );
                status.real_server_ids = registry.services.id_report();
                status.persistence_templates = registry.templates_report();
                status.management = Some(registry.turns.report());
                serde_json::to_value(status).map_err(|e| e.to_string())
            } else if matches!(
                req,
                Request::CaptureStart { .. } | Request::CaptureStatus | Request::CaptureStop
            ) {
                registry.capture_request(req)
            } else if req == Request::Vrrp {
                registry
                    .vrrp_report()
                    .and_then(|r| serde_json::to_value(r).map_err(|e| e.to_string()))
            } else if req == Request::Cluster {
                registry
                    .cluster_report()
                    .and_then(|r| serde_json::to_value(r).map_err(|e| e.to_string()))
            } else if let Request::Drain { on } = req {
                registry
                    .drain(on)
                    .and_then(|r| serde_json::to_value(r).map_err(|e| e.to_string()))
            } else if req == Request::Neighbours {
                registry
                    .neighbours_report()
                    .and_then(|r| serde_json::to_value(r).map_err(|e| e.to_string()))
            } else if req == Request::Sync {
                registry
                    .sync_report()
                    .and_then(|r| serde_json::to_value(r).map_err(|e| e.to_string()))
            } else if matches!(req, Request::GetLaddr { .. }) {
                registry.laddrs(req)
            } else if Services::handles(&req) {
                let Registry {
                    services,
                    publisher,
                    real_servers,
                    ..
                } = registry;
                services.handle(req, publisher, real_servers)
            } else {
                if req == Request::ZeroCounters {
                    registry.services.zero_all(&registry.real_servers);
                }
                view.answer(
                    req,
                    &app.ports,
                    counters,
                    app.emulator.as_ref().map(Emulator::stats),
                )
            };
            // A change was published: reply once every worker has it (or the bound
            // passed), so `sluicectl` returning means new sessions see the change.
            settle_publish(registry, view, counters, generation);
            let _ = reply.send(Answer::Ready(answer));
        });
        registry.turns.answered(answered.0, answered.1);
        finish_reload(registry, app.plane(), notifier, |registry, generation| {
            settle_publish(registry, view, counters, generation)
        });
        registry.capture.drain();
        for port in &mut app.ports {
            if let Some(kernel) = &mut port.exception {
                kernel.pump(&app.inject);
            }
        }
        registry.tick_health(app.plane());
        registry.tick_bgp();
        registry.tick_sync(app.plane());
        registry.tick_census();
        let now = Instant::now();
        if now >= next_rates {
            next_rates = now + Duration::from_secs(1);
            // What a late worker still held at the last publish.
            registry.publisher.reap();
            let tick = registry.now_tick();
            let Registry {
                services,
                real_servers,
                persist,
                ..
            } = registry;
            services.sample_rates(real_servers, now);
            let adopted = (counters.iter())
                .map(|c| {
                    c.snapshot_generation
                        .load(std::sync::atomic::Ordering::Acquire)
                })
                .min()
                .unwrap_or(0);
            services.release_server_ids(real_servers, adopted, now, |ready| {
                // A slot a worker kept writing: every id counts as named this round.
                persist
                    .reals_named(ready, tick)
                    .unwrap_or_else(|| ready.clone())
            });
        }
        if let (Some(at), Some(every)) = (next_stats, stats_interval) {
            if Instant::now() >= at {
                view.print(
                    &app.ports,
                    counters,
                    app.emulator.as_ref().map(Emulator::stats),
                );
                next_stats = Some(at + every);
            }
        }
        // Ticks start a tick apart, whatever their work took (a flood's exception
        // frames, about 4 ms of writes and reads at most): the exception path's
        // bound of 64 frames from the kernel per tick is then 12,800 a second, as
        // `[ports.exception] rate` is checked against. Every tick sleeps a little
        // at least (the core may be shared, with a reload's reader for one); one
        // that ran past the next one's start restarts the schedule from now rather
        // than catching up.
        let now = Instant::now();
        registry.turns.done(now - turn_started, now);
        let pause = match next_tick.checked_duration_since(now) {
            Some(left) => left.max(MIN_MANAGEMENT_SLEEP),
            None => {
                next_tick = now;
                MIN_MANAGEMENT_SLEEP
            }
        };
        next_tick += tick;
        std::thread::sleep(pause);
    }
}

/// The least a management tick sleeps when its work ran past the next tick's start.
const MIN_MANAGEMENT_SLEEP: Duration = Duration::from_micros(500);
