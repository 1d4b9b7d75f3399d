//! `sluicectl capture` on the management core: starts a capture in the workers
//! (`dataplane::capture`), drains their copy rings every management-loop pass into a
//! pcapng file (pcap-file's writer: one interface description per DPDK port, named
//! as in the config, nanosecond timestamps, each packet's direction in its flags),
//! and ends it after a packet count, a duration, or a stop.
use crate::control::protocol::Requester;
use crate::control::report::CaptureReport;
use crate::dataplane::capture::{
    Capture, CaptureFilter, Copied, Direction, MAX_SNAPLEN, RING_SLOTS,
};
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;
use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A capture without a duration ends when nobody asked for its status this long:
/// its `sluicectl` (which asks every 100 ms) is gone, and the file would grow
/// unwatched.
const ORPHAN_AFTER: Duration = Duration::from_secs(5);

/// pcapng's EPB flags: inbound and outbound (the two low bits).
const FLAG_INBOUND: u32 = 0b01;
const FLAG_OUTBOUND: u32 = 0b10;

/// What a capture is asked for.
pub struct CaptureSpec {
    pub filter: CaptureFilter,
    pub path: PathBuf,
    /// Whose permissions create the file, and who owns it.
    pub requester: Requester,
    pub count: Option<u64>,
    pub duration: Option<Duration>,
    pub snaplen: u16,
}

/// Creates the capture file with the requester's permissions, owned by them. The
/// daemon runs as root, and a member of the control socket's group must not be able
/// to create a file where they could not: the calling thread's filesystem user and
/// group (`setfsuid`/`setfsgid`, which are per thread) are the requester's while the
/// file is opened, then root's again. The thread keeps its supplementary groups
/// (root's). Never an existing file, and never through a symbolic link.
fn create_as(path: &Path, requester: Requester) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: setfsgid and setfsuid change only this thread's filesystem identity and
    // return the previous one; they touch no memory. Given -1 (no such id) they change
    // nothing and return the current one.
    let (gid, uid) = unsafe { (libc::setfsgid(requester.gid), libc::setfsuid(requester.uid)) };
    // Without CAP_SETUID and CAP_SETGID the calls fail silently, and the file would be
    // created with root's permissions: then it is not created at all.
    // SAFETY: as above.
    let switched = unsafe {
        libc::setfsuid(u32::MAX) as u32 == requester.uid
            && libc::setfsgid(u32::MAX) as u32 == requester.gid
    };
    let file = if switched {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the daemon cannot take the asking user's identity to create the file \
             (it lacks CAP_SETUID or CAP_SETGID)",
        ))
    };
    // SAFETY: as above; the previous identity comes back.
    unsafe {
        libc::setfsuid(uid as libc::uid_t);
        libc::setfsgid(gid as libc::gid_t);
    }
    file
}

/// One capture being written.
struct Running {
    generation: u32,
    path: PathBuf,
    writer: PcapNgWriter<BufWriter<File>>,
    count: Option<u64>,
    deadline: Option<Instant>,
    /// The last start or status request.
    watched: Instant,
    written: u64,
    /// The workers' dropped copies when the capture started.
    dropped_base: u64,
    /// The wall clock and TSC at the start, to date copies.
    wall: Duration,
    tsc: u64,
    hz: u64,
}

/// The management core's side of packet capture.
pub struct Capturing {
    shared: Arc<Capture>,
    running: Option<Running>,
    /// The last capture's final report, until the next one starts.
    last: Option<CaptureReport>,
}

impl Capturing {
    pub fn new(shared: Arc<Capture>) -> Capturing {
        Capturing {
            shared,
            running: None,
            last: None,
        }
    }

    fn dropped_total(&self) -> u64 {
        self.shared
            .rings
            .iter()
            .map(|r| r.dropped.load(Relaxed))
            .sum()
    }

    /// Starts a capture to `spec.path` over the ports named `port_names` (in index
    /// order). A capture already running, a bad filter or a file that cannot be
    /// created is an error, and nothing starts.
    pub fn start(
        &mut self,
        spec: CaptureSpec,
        port_names: &[String],
    ) -> Result<CaptureReport, String> {
        if let Some(r) = &self.running {
            return Err(format!(
                "a capture is already running (to {}); stop it first (sluicectl capture --stop)",
                r.path.display()
            ));
        }
        spec.filter.validate()?;
        if let Some(p) = spec
            .filter
            .ports
            .iter()
            .find(|p| usize::from(**p) >= port_names.len())
        {
            return Err(format!("ports: no port with index {p}"));
        }
        if spec.snaplen == 0 || spec.snaplen > MAX_SNAPLEN {
            return Err(format!("snaplen: {} not in 1-{MAX_SNAPLEN}", spec.snaplen));
        }
        if !spec.path.is_absolute() {
            return Err(format!("path: {} is not absolute", spec.path.display()));
        }
        let file = create_as(&spec.path, spec.requester)
            .map_err(|e| format!("path: cannot create {}: {e}", spec.path.display()))?;
        let mut writer = PcapNgWriter::new(BufWriter::new(file))
            .map_err(|e| format!("{}: {e}", spec.path.display()))?;
        for name in port_names {
            let mut idb =
                InterfaceDescriptionBlock::new(DataLink::ETHERNET, u32::from(spec.snaplen));
            idb.options = vec![
                InterfaceDescriptionOption::IfName(Cow::Owned(name.clone())),
                // pcap-file writes EPB timestamps in nanoseconds.
                InterfaceDescriptionOption::IfTsResol(9),
            ];
            writer
                .write_pcapng_block(idb)
                .map_err(|e| format!("{}: {e}", spec.path.display()))?;
        }
        // Copies of an earlier capture still in the rings go back unread.
        self.discard_all();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let tsc = crate::dpdk::tsc();
        let generation = self.shared.start(&spec.filter, spec.snaplen);
        self.last = None;
        self.running = Some(Running {
            generation,
            path: spec.path,
            writer,
            count: spec.count,
            deadline: spec.duration.map(|d| Instant::now() + d),
            watched: Instant::now(),
            written: 0,
            dropped_base: self.dropped_total(),
            wall,
            tsc,
            hz: crate::dpdk::tsc_hz().max(1),
        });
        Ok(self.report())
    }

    fn discard_all(&self) {
        for ring in self.shared.rings.iter() {
            while let Some(slot) = ring.full.pop() {
                let _ = ring.free.push(slot);
            }
        }
    }

    /// Writes what the workers copied, a ring's worth ([`RING_SLOTS`]) of each
    /// worker's at most; ends the capture when its count or duration is reached.
    /// Called every management-loop pass (nothing to do, one branch, while no
    /// capture runs). The bound keeps the pass short when the workers refill their
    /// rings as fast as it writes (a busy port captured whole, a file written at disk
    /// speed): the loop's other work comes next, and copies beyond what a pass takes
    /// wait, or are dropped by the workers (`capture_dropped`) when the ring is full.
    pub fn drain(&mut self) {
        let Some(run) = self.running.as_mut() else {
            return;
        };
        let mut failed = None;
        'rings: for ring in self.shared.rings.iter() {
            for slot in std::iter::from_fn(|| ring.full.pop()).take(RING_SLOTS) {
                let keep = slot.generation == run.generation
                    && run.count.is_none_or(|c| run.written < c)
                    && failed.is_none();
                if keep {
                    if let Err(e) = write(run, &slot) {
                        failed = Some(e);
                    } else {
                        run.written += 1;
                    }
                }
                let _ = ring.free.push(slot);
                if failed.is_some() {
                    break 'rings;
                }
            }
        }
        let counted = run.count.is_some_and(|c| run.written >= c);
        let timed = run.deadline.is_some_and(|d| Instant::now() >= d);
        let orphaned = run.deadline.is_none() && run.watched.elapsed() >= ORPHAN_AFTER;
        if let Some(e) = failed {
            self.finish(&format!("write error: {e}"));
        } else if counted {
            self.finish("count");
        } else if timed {
            self.finish("duration");
        } else if orphaned {
            self.finish("no status asked for 5 s: sluicectl gone");
        }
    }

    /// Stops the running capture (`sluicectl capture --stop`, or Ctrl-C in it).
    pub fn stop(&mut self) -> CaptureReport {
        if self.running.is_some() {
            self.drain();
        }
        if self.running.is_some() {
            self.finish("stopped");
        }
        self.report()
    }

    fn finish(&mut self, reason: &str) {
        self.shared.stop();
        let Some(mut run) = self.running.take() else {
            return;
        };
        let flushed = run.writer.get_mut().flush();
        let dropped = self.dropped_total() - run.dropped_base;
        self.last = Some(CaptureReport {
            running: false,
            path: run.path.display().to_string(),
            written: run.written,
            dropped,
            ended: Some(match flushed {
                Ok(()) => reason.to_string(),
                Err(e) => format!("write error: {e}"),
            }),
        });
        log::info!(
            "capture to {} ended ({reason}): {} packets, {dropped} copies dropped",
            run.path.display(),
            run.written
        );
    }

    /// `capture_status`: the report, and the running capture is still watched.
    pub fn status(&mut self) -> CaptureReport {
        if let Some(run) = self.running.as_mut() {
            run.watched = Instant::now();
        }
        self.report()
    }

    /// The running capture, else the last one's final figures.
    pub fn report(&self) -> CaptureReport {
        match &self.running {
            Some(run) => CaptureReport {
                running: true,
                path: run.path.display().to_string(),
                written: run.written,
                dropped: self.dropped_total() - run.dropped_base,
                ended: None,
            },
            None => self.last.clone().unwrap_or_default(),
        }
    }
}

fn write(run: &mut Running, slot: &Copied) -> Result<(), String> {
    let since = slot.tsc.saturating_sub(run.tsc);
    let offset =
        Duration::from_nanos((u128::from(since) * 1_000_000_000 / u128::from(run.hz)) as u64);
    let flags = match slot.direction {
        Direction::Rx => FLAG_INBOUND,
        Direction::Tx => FLAG_OUTBOUND,
    };
    let block = EnhancedPacketBlock {
        interface_id: u32::from(slot.port),
        timestamp: run.wall + offset,
        original_len: slot.original_len,
        data: Cow::Borrowed(slot.bytes()),
        options: vec![EnhancedPacketOption::Flags(flags)],
    };
    run.writer
        .write_pcapng_block(block)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A worker that refills its ring as fast as the management core empties it
    /// cannot hold a drain pass: one pass writes a ring's worth at most, and returns.
    #[test]
    fn a_drain_pass_writes_a_rings_worth_at_most() {
        let shared = Arc::new(Capture::new(1));
        let mut capturing = Capturing::new(shared.clone());
        let dir = tempfile::tempdir().unwrap();
        let spec = CaptureSpec {
            filter: CaptureFilter::default(),
            path: dir.path().join("all.pcapng"),
            // The test's own user: switching to it needs no capability.
            // SAFETY: geteuid and getegid only read the process's credentials.
            requester: unsafe {
                crate::control::protocol::Requester {
                    uid: libc::geteuid(),
                    gid: libc::getegid(),
                }
            },
            count: None,
            duration: None,
            snaplen: 64,
        };
        capturing.start(spec, &["lan0".to_string()]).unwrap();
        let generation = capturing.running.as_ref().unwrap().generation;
        let stop = Arc::new(AtomicBool::new(false));
        // The worker's side: every slot the management core frees comes back full.
        let worker = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::spawn(move || {
                let ring = &shared.rings[0];
                while !stop.load(Relaxed) {
                    if let Some(mut slot) = ring.free.pop() {
                        (slot.generation, slot.len, slot.original_len) = (generation, 60, 60);
                        let _ = ring.full.push(slot);
                    }
                }
            })
        };
        while shared.rings[0].full.len() < RING_SLOTS {
            std::thread::yield_now();
        }
        let (done, passed) = std::sync::mpsc::channel();
        let drainer = std::thread::spawn(move || {
            capturing.drain();
            let _ = done.send(capturing.running.as_ref().map(|r| r.written));
        });
        let written = passed.recv_timeout(Duration::from_secs(10));
        stop.store(true, Relaxed);
        worker.join().unwrap();
        let written = written.expect("the drain pass did not return within 10 s");
        drainer.join().unwrap();
        let written = written.expect("the capture went on");
        assert!(
            (1..=RING_SLOTS as u64).contains(&written),
            "{written} written in one pass"
        );
    }
}
