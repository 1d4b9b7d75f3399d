use std::ffi::CStr;
use std::fmt;

/// A failed DPDK call: which operation, and DPDK's own error text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkError {
    pub op: String,
    pub code: i32,
    pub message: String,
}

impl DpdkError {
    /// Builds an error from a negative errno-style return code (`-EINVAL`, ...) or from
    /// `rte_errno` when `code` is 0 or positive.
    pub fn from_code(op: impl Into<String>, code: i32) -> Self {
        let code = if code < 0 { -code } else { current_errno() };
        DpdkError {
            op: op.into(),
            code,
            message: strerror(code),
        }
    }

    /// An error raised by our own checks rather than by DPDK.
    pub fn other(op: impl Into<String>, message: impl Into<String>) -> Self {
        DpdkError {
            op: op.into(),
            code: 0,
            message: message.into(),
        }
    }
}

fn current_errno() -> i32 {
    // SAFETY: sluice_errno reads this thread's rte_errno TLS slot; no preconditions.
    unsafe { dpdk_sys::sluice_errno() }
}

fn strerror(code: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated
    // string that stays valid until the next call on this thread; we copy it at once.
    unsafe {
        let p = dpdk_sys::rte_strerror(code);
        if p.is_null() {
            format!("error {code}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

impl fmt::Display for DpdkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.message)
    }
}

impl std::error::Error for DpdkError {}

/// Turns a DPDK `int` return (negative = error) into a `Result`.
pub(crate) fn check(op: &str, rc: i32) -> Result<i32, DpdkError> {
    if rc < 0 {
        Err(DpdkError::from_code(op, rc))
    } else {
        Ok(rc)
    }
}
