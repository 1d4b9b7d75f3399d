//! SIGINT/SIGTERM set a flag the management loop polls to stop, SIGHUP one it polls
//! to reload the config file; nothing else runs in the handler (it must be
//! async-signal-safe).
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static RECEIVED: AtomicI32 = AtomicI32::new(0);
static HANGUP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    if sig == libc::SIGHUP {
        HANGUP.store(true, Ordering::SeqCst);
    } else {
        RECEIVED.store(sig, Ordering::SeqCst);
    }
}

/// Installs the handlers for SIGINT, SIGTERM and SIGHUP.
pub fn install() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: sigaction with a zeroed struct plus a handler that only stores to an
        // atomic (async-signal-safe); SA_RESTART keeps blocking syscalls in other
        // threads from failing with EINTR.
        let rc = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal that asked us to stop, if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Whether SIGHUP came since the last call (a reload is asked for).
pub fn take_hangup() -> bool {
    HANGUP.swap(false, Ordering::SeqCst)
}
