use super::error::{check, DpdkError};
use std::ffi::CString;
use std::os::raw::c_char;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

static INITIALISED: AtomicBool = AtomicBool::new(false);

/// Whether the EAL is up. One lock orders object creation, lcore launches and the
/// cleanup; an object's end does not take it (see [`LIVE`]).
struct EalState {
    up: bool,
}

static STATE: Mutex<EalState> = Mutex::new(EalState { up: false });

/// How many objects built on the EAL (pools, rings, ports) are alive. Raised only under
/// [`STATE`]'s lock, while the EAL is up; lowered without it, so that dropping an
/// object never waits for the lock (a job refused at launch is dropped while the
/// launch holds it). The cleanup reads it under the lock: nothing can raise it then,
/// and a count that falls meanwhile only makes the cleanup skip needlessly.
static LIVE: AtomicUsize = AtomicUsize::new(0);

fn state() -> MutexGuard<'static, EalState> {
    // The state is two plain fields, consistent after any panic.
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Held by every object that lives in the EAL's memory or drives its devices (a
/// mempool, a ring, a port): it can only be taken while the EAL is up, and while one
/// exists dropping the [`Eal`] does not run `rte_eal_cleanup`. An object whose memory
/// must outlive it (a pool with mbufs still out) forgets its guard.
pub(super) struct EalGuard(());

impl EalGuard {
    /// A guard, or an error naming `op` when the EAL is not up.
    pub(super) fn acquire(op: &str) -> Result<EalGuard, DpdkError> {
        let s = state();
        if !s.up {
            return Err(not_up(op));
        }
        LIVE.fetch_add(1, Ordering::AcqRel);
        Ok(EalGuard(()))
    }
}

impl Drop for EalGuard {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

fn not_up(op: &str) -> DpdkError {
    DpdkError::other(op, "the EAL is not initialised (or was cleaned up)")
}

/// Runs `f` while the EAL is up, holding it up (and keeping other launches out) until
/// `f` returns; an error naming `op` when it is not up.
pub(super) fn while_up<R>(
    op: &str,
    f: impl FnOnce() -> Result<R, DpdkError>,
) -> Result<R, DpdkError> {
    let s = state();
    if !s.up {
        return Err(not_up(op));
    }
    let result = f();
    drop(s);
    result
}

/// The DPDK Environment Abstraction Layer. `rte_eal_init` may run once per process, so
/// `Eal::init` succeeds once; dropping the `Eal` runs `rte_eal_cleanup`, unless a port,
/// ring or mempool is still alive or a job launched on a worker lcore still runs
/// ([`LcoreJobs`](super::LcoreJobs)): then the cleanup is skipped (with a log line),
/// since the survivors still use the EAL's memory and devices.
pub struct Eal {
    /// `/var/run/dpdk/<file-prefix>`: the EAL creates it and `rte_eal_cleanup` leaves
    /// it behind, so we remove it on drop.
    runtime_dir: Option<std::path::PathBuf>,
}

impl Eal {
    /// Initialises the EAL with `args` (argv\[0\] first, as on a command line).
    pub fn init(args: &[String]) -> Result<Eal, DpdkError> {
        if INITIALISED.swap(true, Ordering::SeqCst) {
            return Err(DpdkError::other(
                "rte_eal_init",
                "the EAL is already initialised in this process (it runs once per process)",
            ));
        }
        let owned: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| DpdkError::other("rte_eal_init", "argument contains a NUL byte"))?;
        // rte_eal_init may permute argv; give it its own array of pointers. The strings
        // themselves outlive the call (and the EAL keeps no pointer into them that we
        // later free: they live until the end of this function, and the EAL copies what
        // it keeps, e.g. vdev specs, into its own devargs).
        let mut argv: Vec<*mut c_char> = owned.iter().map(|s| s.as_ptr() as *mut c_char).collect();
        // The CPUs this thread may use before the EAL pins it to the main lcore: what
        // helper threads may run on ([`super::spawn_helper`]).
        let allowed = super::threads::thread_cpus().unwrap_or_default();
        // SAFETY: argv holds argc valid NUL-terminated strings; the EAL is not yet
        // initialised in this process (guarded by INITIALISED).
        let rc = unsafe { dpdk_sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if rc < 0 {
            return Err(DpdkError::from_code("rte_eal_init", rc));
        }
        state().up = true;
        log::info!("EAL up: {}", args.join(" "));
        super::threads::settle_helper_cpus(&allowed);
        // SAFETY: returns a pointer to a static string inside the EAL, valid after init.
        let dir = unsafe { std::ffi::CStr::from_ptr(dpdk_sys::rte_eal_get_runtime_dir()) };
        let runtime_dir = Some(std::path::PathBuf::from(dir.to_string_lossy().into_owned()))
            .filter(|p| !p.as_os_str().is_empty());
        Ok(Eal { runtime_dir })
    }

    /// Number of lcores the EAL was given.
    pub fn lcore_count(&self) -> u32 {
        // SAFETY: the EAL is initialised (we exist).
        unsafe { dpdk_sys::rte_lcore_count() }
    }

    /// Number of ethdev ports that exist (probed or created).
    pub fn port_count(&self) -> u16 {
        // SAFETY: the EAL is initialised.
        unsafe { dpdk_sys::rte_eth_dev_count_avail() }
    }

    /// Port id of the ethdev with this name (a vdev name such as `net_pcap0`, or a PCI
    /// address as the EAL names it).
    pub fn port_by_name(&self, name: &str) -> Result<u16, DpdkError> {
        let c = CString::new(name).map_err(|_| DpdkError::other("port lookup", "NUL in name"))?;
        let mut id = 0u16;
        // SAFETY: c is a valid C string; id is a valid out pointer.
        check(&format!("rte_eth_dev_get_port_by_name({name})"), unsafe {
            dpdk_sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id)
        })?;
        Ok(id)
    }
}

impl Drop for Eal {
    fn drop(&mut self) {
        // The lock is held to the end of the cleanup: no object is made and no job is
        // launched between the checks and the cleanup.
        let mut s = state();
        // rte_eal_cleanup waits for every worker lcore's job and has no way to tell one
        // to stop: with one still running it would never return. Their owner stops them
        // first (`LcoreJobs`); should one still run, the process is better off ending
        // without the cleanup than hanging in it.
        let running = running_worker_lcores();
        let live = LIVE.load(Ordering::Acquire);
        if live > 0 {
            log::error!(
                "{live} DPDK objects (ports, rings, mempools) are still alive: \
                 rte_eal_cleanup skipped (they still use the EAL's memory)"
            );
        } else if running.is_empty() {
            // SAFETY: the EAL is up and no object built on it is alive (LIVE read 0, and
            // none can be made while we hold the lock); no worker lcore runs a job
            // (checked just above, and none can be launched while we hold the lock), so
            // the wait inside returns.
            let rc = unsafe { dpdk_sys::rte_eal_cleanup() };
            s.up = false;
            if rc < 0 {
                log::warn!(
                    "rte_eal_cleanup: {}",
                    DpdkError::from_code("rte_eal_cleanup", rc)
                );
            }
        } else {
            log::error!(
                "lcores {running:?} still run a job: rte_eal_cleanup skipped (it would wait \
                 for them forever)"
            );
        }
        if let Some(dir) = &self.runtime_dir {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    log::warn!("removing DPDK runtime directory {}: {e}", dir.display());
                }
            }
        }
    }
}

/// The worker lcores whose job has not returned yet.
fn running_worker_lcores() -> Vec<u32> {
    let mut running = Vec::new();
    // SAFETY: plain reads of the EAL's lcore table, valid while the EAL is up.
    let mut lcore = unsafe { dpdk_sys::rte_get_next_lcore(u32::MAX, 1, 0) };
    while lcore < dpdk_sys::RTE_MAX_LCORE {
        // SAFETY: as above; lcore is an enabled worker lcore.
        let state = unsafe { dpdk_sys::rte_eal_get_lcore_state(lcore) };
        if state == dpdk_sys::rte_lcore_state_t_RUNNING {
            running.push(lcore);
        }
        // SAFETY: as above.
        lcore = unsafe { dpdk_sys::rte_get_next_lcore(lcore, 1, 0) };
    }
    running
}
