//! Threads that are not lcores: the control socket's acceptor and executors, the
//! metrics endpoint's, a reload's reader, the BGP speaker, the loopback emulator.
//!
//! `rte_eal_init` pins the main thread to the management lcore's CPU, and a new thread
//! inherits its creator's CPUs. Started the plain way from the management loop, these
//! threads would all share that one CPU with the loop: while one of them writes a 53 MB
//! exposition text or a listing of 50,000 real servers, the loop (VRRP adverts, health
//! probes, commands) gets the CPU only in the kernel scheduler's turns.
//! [`spawn_helper`] places them where DPDK places its own control threads
//! (`eal-intr-thread`, `telemetry-v2`): on the CPUs this process could use before the
//! EAL pinned it, less every lcore's CPU, and on the management lcore's CPU only when
//! no other is left (a two-CPU machine with one worker has none to spare). The cost is
//! one `sched_setaffinity` per thread started.

use std::sync::OnceLock;

/// Where helper threads run; set once, when the EAL comes up.
static HELPER_CPUS: OnceLock<Vec<u32>> = OnceLock::new();

/// The CPUs the calling thread may run on (`sched_getaffinity`), ascending.
pub fn thread_cpus() -> std::io::Result<Vec<u32>> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size is the set's own.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as u32)
        // SAFETY: the index is below CPU_SETSIZE, the set's size.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu as usize, &set) })
        .collect())
}

/// The CPUs for threads that are not lcores, by DPDK's rule for its control threads:
/// `allowed` (the process's CPUs before the EAL pinned anything) less `lcores` (every
/// CPU an lcore runs on); when that leaves none, `main` (the main lcore's CPUs).
fn helper_cpus(allowed: &[u32], lcores: &[u32], main: &[u32]) -> Vec<u32> {
    let spare: Vec<u32> = allowed
        .iter()
        .copied()
        .filter(|cpu| !lcores.contains(cpu))
        .collect();
    if spare.is_empty() {
        main.to_vec()
    } else {
        spare
    }
}

/// The CPUs each lcore the EAL runs (main, workers, service or registered threads)
/// may use, all together, and the main lcore's alone. After `rte_eal_init` only.
fn lcore_cpus() -> (Vec<u32>, Vec<u32>) {
    let on_cpus = |lcore: u32| -> Vec<u32> {
        (0..libc::CPU_SETSIZE as u32)
            // SAFETY: sluice_lcore_on_cpu refuses ids out of range and reads the EAL's
            // lcore configuration, set once by rte_eal_init.
            .filter(|&cpu| unsafe { dpdk_sys::sluice_lcore_on_cpu(lcore, cpu) } == 1)
            .collect()
    };
    let mut all = Vec::new();
    for lcore in 0..dpdk_sys::RTE_MAX_LCORE {
        // SAFETY: lcore < RTE_MAX_LCORE; a plain read of the EAL's lcore roles.
        if unsafe { dpdk_sys::rte_lcore_has_role(lcore, dpdk_sys::rte_lcore_role_t_ROLE_OFF) } > 0 {
            continue;
        }
        all.extend(on_cpus(lcore));
    }
    all.sort_unstable();
    all.dedup();
    // SAFETY: a plain read of the EAL's configuration.
    let main = on_cpus(unsafe { dpdk_sys::rte_get_main_lcore() });
    (all, main)
}

/// Settles where helper threads run, from `allowed` (this thread's CPUs read before
/// `rte_eal_init`). Called once by [`Eal::init`](super::Eal::init), right after it.
pub(super) fn settle_helper_cpus(allowed: &[u32]) {
    let (lcores, main) = lcore_cpus();
    let cpus = helper_cpus(allowed, &lcores, &main);
    const WHO: &str = "helper threads (control socket, metrics, reloads, BGP, emulator)";
    if allowed.is_empty() {
        log::warn!(
            "{WHO} share the management lcore's CPU {}: this process's CPUs could not \
             be read",
            cpu_list(&cpus)
        );
    } else if cpus == main {
        log::info!(
            "{WHO} share the management lcore's CPU {}: every other CPU of this process \
             runs an lcore",
            cpu_list(&cpus)
        );
    } else {
        log::info!(
            "{WHO} run on CPU(s) {}, which no lcore uses",
            cpu_list(&cpus)
        );
    }
    let _ = HELPER_CPUS.set(cpus);
}

/// A CPU list as `taskset -c` and `/proc/*/status` write it: `0-3,6` for
/// `[0, 1, 2, 3, 6]` (ascending input), `none` for no CPU.
pub fn cpu_list(cpus: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", cpus[i], cpus[j])
        } else {
            cpus[i].to_string()
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

/// Pins the calling thread to `cpus`; a failure is logged and the thread stays where
/// it was (it still runs, only not where intended).
fn pin_current_thread(cpus: &[u32]) {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus
        .iter()
        .filter(|&&c| (c as usize) < libc::CPU_SETSIZE as usize)
    {
        // SAFETY: the index is below CPU_SETSIZE, the set's size.
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    }
    // SAFETY: pid 0 is this thread; the size is the set's own.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        log::warn!(
            "cannot move a helper thread to CPU(s) {}: {}",
            cpu_list(cpus),
            std::io::Error::last_os_error()
        );
    }
}

/// Starts `f` on a thread of `builder` that runs on the helper CPUs (see the module
/// documentation). Before the EAL is up (tests, tools) the thread is started the plain
/// way, on its creator's CPUs.
pub fn spawn_helper<F, T>(
    builder: std::thread::Builder,
    f: F,
) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let cpus = HELPER_CPUS.get();
    builder.spawn(move || {
        if let Some(cpus) = cpus {
            pin_current_thread(cpus);
        }
        f()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_take_the_cpus_no_lcore_uses_else_the_main_lcores() {
        // (allowed, lcore CPUs, main lcore's CPUs) -> helper CPUs
        type Row<'a> = (&'a [u32], &'a [u32], &'a [u32], &'a [u32]);
        let table: &[Row] = &[
            // Two CPUs, management and one worker: nothing spare.
            (&[0, 1], &[0, 1], &[0], &[0]),
            // A worker mapped onto the management CPU leaves CPU 1.
            (&[0, 1], &[0], &[0], &[1]),
            // Sixteen CPUs, management 0, workers 1-8.
            (
                &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                &[0, 1, 2, 3, 4, 5, 6, 7, 8],
                &[0],
                &[9, 10, 11, 12, 13, 14, 15],
            ),
            // Started under `taskset -c 2-5`: only those count.
            (&[2, 3, 4, 5], &[2, 3], &[2], &[4, 5]),
            // An lcore outside the allowed CPUs frees none of them.
            (&[0, 1], &[0, 7], &[0], &[1]),
        ];
        for &(allowed, lcores, main, want) in table {
            assert_eq!(
                helper_cpus(allowed, lcores, main),
                want,
                "allowed {allowed:?}, lcores {lcores:?}, main {main:?}"
            );
        }
    }

    #[test]
    fn cpu_lists_are_compact() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(cpu_list(&[3]), "3");
        assert_eq!(cpu_list(&[]), "none");
    }

    #[test]
    fn a_helper_without_an_eal_runs_where_its_creator_may() {
        let here = thread_cpus().unwrap();
        let there = spawn_helper(std::thread::Builder::new(), || thread_cpus().unwrap())
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(here, there);
    }
}
