use super::error::DpdkError;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Why a closure could not be started on an lcore.
pub type LaunchError = DpdkError;

type Job = Box<dyn FnOnce() -> i32 + Send>;

extern "C" fn trampoline(arg: *mut c_void) -> c_int {
    // SAFETY: arg is the Box<Job> leaked by launch_on_lcore, handed to exactly one lcore,
    // so we are its only owner.
    let job: Box<Job> = unsafe { Box::from_raw(arg as *mut Job) };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        Ok(rc) => rc,
        Err(_) => {
            log::error!("lcore job panicked");
            -1
        }
    }
}

/// Runs `job` on worker lcore `lcore` (which must be idle). Its return value comes back
/// from `wait_lcore`.
pub fn launch_on_lcore<F>(lcore: u32, job: F) -> Result<(), LaunchError>
where
    F: FnOnce() -> i32 + Send + 'static,
{
    let boxed: Box<Job> = Box::new(Box::new(job));
    let raw = Box::into_raw(boxed) as *mut c_void;
    // SAFETY: trampoline matches lcore_function_t; raw stays valid until the trampoline
    // takes it back. On failure the lcore never runs it, so we reclaim it below.
    let rc = unsafe { dpdk_sys::rte_eal_remote_launch(Some(trampoline), raw, lcore) };
    if rc < 0 {
        // SAFETY: the launch failed, so nobody else owns raw.
        drop(unsafe { Box::from_raw(raw as *mut Job) });
        return Err(DpdkError::from_code(format!("launch on lcore {lcore}"), rc));
    }
    Ok(())
}

/// Waits for the job on `lcore` to finish and returns its return value.
pub fn wait_lcore(lcore: u32) -> i32 {
    // SAFETY: lcore ids come from the config, validated against the EAL's lcores.
    unsafe { dpdk_sys::rte_eal_wait_lcore(lcore) }
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
            .map(|lcore| (lcore, wait_lcore(lcore)))
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
