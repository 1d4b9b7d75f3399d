use super::error::DpdkError;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Why a closure could not be started on an lcore.
pub type LaunchError = DpdkError;

type Job = Box<dyn FnOnce() -> i32 + Send>;

extern "C" fn trampoline(arg: *mut c_void) -> c_int {
    // SAFETY: arg is the Box<Job> leaked by launch_on_lcore, handed to exactly one lcore
    // (launches are serialised and refused unless the lcore is idle), so we are its only
    // owner.
    let job: Box<Job> = unsafe { Box::from_raw(arg as *mut Job) };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        Ok(rc) => rc,
        Err(_) => {
            log::error!("lcore job panicked");
            -1
        }
    }
}

/// Refuses what the EAL's lcore calls would index out of bounds or misuse: an lcore
/// past `RTE_MAX_LCORE`, one the EAL was not given, or the main lcore (which runs no
/// launched job).
fn check_worker_lcore(op: &str, lcore: u32) -> Result<(), DpdkError> {
    if lcore >= dpdk_sys::RTE_MAX_LCORE {
        return Err(DpdkError::other(
            op,
            format!(
                "lcore {lcore} is out of range (< {})",
                dpdk_sys::RTE_MAX_LCORE
            ),
        ));
    }
    // SAFETY: lcore < RTE_MAX_LCORE (checked above); a plain read of the EAL's lcore
    // table, a static array.
    if unsafe { dpdk_sys::rte_lcore_is_enabled(lcore) } == 0 {
        return Err(DpdkError::other(
            op,
            format!("lcore {lcore} is not one of the EAL's lcores"),
        ));
    }
    // SAFETY: a plain read of the EAL's configuration.
    if lcore == unsafe { dpdk_sys::rte_get_main_lcore() } {
        return Err(DpdkError::other(
            op,
            format!("lcore {lcore} is the main lcore, not a worker"),
        ));
    }
    Ok(())
}

/// Runs `job` on worker lcore `lcore`, which must be idle. Its return value comes back
/// from `wait_lcore`. Refused when the EAL is not up, when `lcore` is not one of its
/// worker lcores, or when a job still runs there.
pub fn launch_on_lcore<F>(lcore: u32, job: F) -> Result<(), LaunchError>
where
    F: FnOnce() -> i32 + Send + 'static,
{
    let op = format!("launch on lcore {lcore}");
    // Launches are serialised (and the EAL kept up) by the EAL's lock: two threads
    // cannot both find the lcore idle and hand it two jobs.
    super::eal::while_up(&op, || {
        check_worker_lcore(&op, lcore)?;
        let boxed: Box<Job> = Box::new(Box::new(job));
        let raw = Box::into_raw(boxed) as *mut c_void;
        // SAFETY: trampoline matches lcore_function_t; lcore is an enabled worker lcore
        // (checked above, so its lcore_config entry exists); raw stays valid until the
        // trampoline takes it back, or is reclaimed or leaked below.
        let rc = unsafe { dpdk_sys::rte_eal_remote_launch(Some(trampoline), raw, lcore) };
        if rc >= 0 {
            return Ok(());
        }
        if rc == -libc::EBUSY {
            // SAFETY: -EBUSY is returned before the job is handed over (the lcore was
            // not idle), so nobody else owns raw.
            drop(unsafe { Box::from_raw(raw as *mut Job) });
        } else {
            // Any other failure (-EPIPE) may come after the wake-up was sent: the lcore
            // may run the job and free it, so it is leaked here rather than freed twice.
            log::error!("launch on lcore {lcore} failed after the hand-over: job leaked");
        }
        Err(DpdkError::from_code(op.clone(), rc))
    })
}

/// Waits for the job on worker lcore `lcore` to finish and returns its return value
/// (0 at once when the lcore runs nothing). Refused for an lcore that is not one of the
/// EAL's worker lcores.
pub fn wait_lcore(lcore: u32) -> Result<i32, DpdkError> {
    check_worker_lcore(&format!("wait for lcore {lcore}"), lcore)?;
    // SAFETY: lcore is an enabled worker lcore (checked above); the wait only reads its
    // lcore_config entry, which any thread may do.
    Ok(unsafe { dpdk_sys::rte_eal_wait_lcore(lcore) })
}

/// The jobs one owner launched on worker lcores, and the flag that tells them to
/// return. Dropping it, on an error return or while a panic unwinds as much as at an
/// orderly stop, raises the flag and waits for every job: `rte_eal_cleanup` waits for
/// running lcores without telling them anything, so an owner that dropped its [`Eal`]
/// (or the ports its jobs poll) with jobs still running would hang, or pull the ports
/// out from under them. Keep it where it drops before those.
///
/// [`Eal`]: super::Eal
pub struct LcoreJobs {
    stop: Arc<AtomicBool>,
    running: Vec<u32>,
}

impl LcoreJobs {
    /// No job yet; the stop flag starts lowered.
    pub fn new() -> LcoreJobs {
        LcoreJobs {
            stop: Arc::new(AtomicBool::new(false)),
            running: Vec::new(),
        }
    }

    /// The flag the jobs poll: they return once it is set.
    pub fn stop_flag(&self) -> &Arc<AtomicBool> {
        &self.stop
    }

    /// Runs `job` on `lcore` (see [`launch_on_lcore`]); from now on stopping waits for it.
    pub fn launch<F>(&mut self, lcore: u32, job: F) -> Result<(), LaunchError>
    where
        F: FnOnce() -> i32 + Send + 'static,
    {
        launch_on_lcore(lcore, job)?;
        self.running.push(lcore);
        Ok(())
    }

    /// Raises the stop flag and waits for every job still running, in launch order;
    /// returns each one's lcore and return value. Once stopped, stopping again (or the
    /// drop) waits for nothing.
    pub fn stop(&mut self) -> Vec<(u32, i32)> {
        self.stop.store(true, Ordering::SeqCst);
        self.running
            .drain(..)
            .map(|lcore| {
                let rc = wait_lcore(lcore).unwrap_or_else(|e| {
                    log::error!("{e}");
                    -1
                });
                (lcore, rc)
            })
            .collect()
    }
}

impl Default for LcoreJobs {
    fn default() -> Self {
        LcoreJobs::new()
    }
}

impl Drop for LcoreJobs {
    fn drop(&mut self) {
        if self.running.is_empty() {
            return;
        }
        if std::thread::panicking() {
            log::error!("panicking: stopping the jobs on lcores {:?}", self.running);
        }
        for (lcore, rc) in self.stop() {
            if rc != 0 {
                log::warn!("the job on lcore {lcore} returned {rc}");
            }
        }
    }
}

/// The calling thread's lcore id (`u32::MAX` on a thread the EAL does not know).
pub fn current_lcore() -> u32 {
    // SAFETY: reads a TLS variable; valid on any thread.
    unsafe { dpdk_sys::rte_lcore_id() }
}

/// Registers a non-EAL thread (control, emulator) so DPDK calls that need an lcore id
/// (mempool caches, rings in some modes) work from it.
pub fn register_thread() -> Result<(), DpdkError> {
    // SAFETY: may be called from any thread after rte_eal_init.
    let rc = unsafe { dpdk_sys::rte_thread_register() };
    if rc < 0 {
        return Err(DpdkError::from_code("rte_thread_register", rc));
    }
    Ok(())
}

/// Time-stamp counter, read inline (no FFI).
#[inline(always)]
pub fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// TSC ticks per second, as measured by the EAL.
pub fn tsc_hz() -> u64 {
    // SAFETY: valid after rte_eal_init; a plain read of an EAL global.
    unsafe { dpdk_sys::rte_get_tsc_hz() }
}
