//! `sluice --prepare FILE`: what the host needs before `sluice --config FILE` can
//! start, done from the same file (the systemd unit's `ExecStartPre`):
//!
//! - with `eal.hugepages = true`: `eal.memory_mb` of free hugepages, reserving more of
//!   the default size (`/proc/meminfo` Hugepagesize) when fewer are free, and a
//!   hugetlbfs mount (`/dev/hugepages`, mounted when there is none);
//! - each `pci = "..."` port bound to a DPDK driver (vfio-pci, or
//!   `$SLUICE_PCI_DRIVER`), as `dpdk-devbind.py --bind` does: `driver_override`, unbind,
//!   `drivers_probe`. A device already on vfio-pci, uio_pci_generic or igb_uio is left
//!   alone, and so is an mlx5 NIC (its kernel driver is DPDK's). An interface that is
//!   up is refused, not taken: it may be how the host is reached.
//!
//! [`plan`] only reads (so it is tested on a fake sysfs tree); [`apply`] writes.
use crate::config::{Config, PortDevice};
use std::path::{Path, PathBuf};

/// Drivers DPDK's PCI probing uses through userspace I/O.
const DPDK_DRIVERS: [&str; 3] = ["vfio-pci", "uio_pci_generic", "igb_uio"];
/// Kernel drivers DPDK works through (bifurcated): the device stays bound to them.
const BIFURCATED: [&str; 2] = ["mlx5_core", "mlx4_core"];
/// The driver devices are bound to unless `$SLUICE_PCI_DRIVER` names another.
pub const DEFAULT_PCI_DRIVER: &str = "vfio-pci";
/// Where hugetlbfs is mounted when nothing is.
const HUGEPAGE_MOUNT: &str = "/dev/hugepages";

/// The host as [`plan`] sees it: where sysfs and procfs are (a fake tree in tests).
#[derive(Clone, Debug)]
pub struct Host {
    pub sys: PathBuf,
    pub proc: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            sys: PathBuf::from("/sys"),
            proc: PathBuf::from("/proc"),
        }
    }
}

/// One thing to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write `pages` to this `nr_hugepages` (the total wanted of that size).
    ReserveHugepages { nr_file: PathBuf, pages: u64 },
    /// Mount hugetlbfs at this directory.
    MountHugetlbfs(PathBuf),
    /// Bind `address` to `driver`, unbinding it from `from` first.
    Bind {
        port: String,
        address: String,
        from: Option<String>,
        driver: String,
    },
    /// Nothing to do for this; said so (already bound, bifurcated, enough pages).
    Note(String),
}

/// What [`apply`] has to do for `cfg` on `host`, or why it cannot be done.
pub fn plan(cfg: &Config, host: &Host, driver: &str) -> Result<Vec<Action>, String> {
    let file = cfg.path.display();
    let mut actions = Vec::new();
    if cfg.eal.hugepages {
        actions.extend(plan_hugepages(cfg, host)?);
    }
    for (i, port) in cfg.ports.iter().enumerate() {
        let PortDevice::Pci(address) = &port.device else {
            continue;
        };
        let dev = host.sys.join("bus/pci/devices").join(address);
        if !dev.exists() {
            return Err(format!(
                "{file}: ports[{i}].pci: port {}: no PCI device {address} on this machine \
                 (no {})",
                port.name,
                dev.display()
            ));
        }
        let current = std::fs::read_link(dev.join("driver"))
            .ok()
            .and_then(|l| Some(l.file_name()?.to_string_lossy().into_owned()));
        match current.as_deref() {
            Some(d) if DPDK_DRIVERS.contains(&d) => {
                actions.push(Action::Note(format!(
                    "port {}: {address} already bound to {d}",
                    port.name
                )));
                continue;
            }
            Some(d) if BIFURCATED.contains(&d) => {
                actions.push(Action::Note(format!(
                    "port {}: {address} stays on {d} (DPDK drives it through the kernel \
                     driver)",
                    port.name
                )));
                continue;
            }
            _ => {}
        }
        if let Some(iface) = interfaces_up(&dev).first() {
            return Err(format!(
                "{file}: ports[{i}].pci: port {}: {address} is the kernel's interface \
                 {iface}, which is up; Sluice does not take an interface in use (it may be \
                 how this host is reached): `ip link set {iface} down` first",
                port.name
            ));
        }
        actions.push(Action::Bind {
            port: port.name.clone(),
            address: address.clone(),
            from: current,
            driver: driver.to_string(),
        });
    }
    Ok(actions)
}

/// The kernel interfaces of PCI device `dev` whose operstate is up.
fn interfaces_up(dev: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dev.join("net")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("operstate")).is_ok_and(|s| s.trim() == "up")
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn plan_hugepages(cfg: &Config, host: &Host) -> Result<Vec<Action>, String> {
    let file = cfg.path.display();
    let need = u64::from(cfg.eal.memory_mb) << 20;
    let mut actions = Vec::new();
    let meminfo = std::fs::read_to_string(host.proc.join("meminfo"))
        .map_err(|e| format!("{}: {e}", host.proc.join("meminfo").display()))?;
    let size_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("Hugepagesize:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| {
            format!(
                "{file}: eal.hugepages = true, but this kernel has no hugepages \
                 (no Hugepagesize in /proc/meminfo)"
            )
        })?;
    let dir = host
        .sys
        .join(format!("kernel/mm/hugepages/hugepages-{size_kb}kB"));
    let free_bytes: u64 = std::fs::read_dir(host.sys.join("kernel/mm/hugepages"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let kb: u64 = name
                        .strip_prefix("hugepages-")?
                        .strip_suffix("kB")?
                        .parse()
                        .ok()?;
                    Some(read_number(&e.path().join("free_hugepages"))? * kb * 1024)
                })
                .sum()
        })
        .unwrap_or(0);
    if free_bytes >= need {
        actions.push(Action::Note(format!(
            "hugepages: {} MiB free, eal.memory_mb = {} needs no more",
            free_bytes >> 20,
            cfg.eal.memory_mb
        )));
    } else {
        let nr = read_number(&dir.join("nr_hugepages")).unwrap_or(0);
        let page = size_kb * 1024;
        let more = (need - free_bytes).div_ceil(page);
        actions.push(Action::ReserveHugepages {
            nr_file: dir.join("nr_hugepages"),
            pages: nr + more,
        });
    }
    let mounted = std::fs::read_to_string(host.proc.join("mounts"))
        .map(|m| {
            m.lines()
                .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
        })
        .unwrap_or(false);
    if !mounted {
        actions.push(Action::MountHugetlbfs(PathBuf::from(HUGEPAGE_MOUNT)));
    }
    Ok(actions)
}

/// Does the planned actions; returns one line per action, for the log.
pub fn apply(actions: &[Action], host: &Host) -> Result<Vec<String>, String> {
    let mut done = Vec::new();
    for action in actions {
        match action {
            Action::Note(n) => done.push(n.clone()),
            Action::ReserveHugepages { nr_file, pages } => {
                write(nr_file, &pages.to_string())?;
                let got = read_number(nr_file).unwrap_or(0);
                if got < *pages {
                    return Err(format!(
                        "hugepages: asked the kernel for {pages} pages ({}), it gave {got} \
                         (memory too fragmented? reserve them at boot: hugepages=N on the \
                         kernel command line)",
                        nr_file.display()
                    ));
                }
                done.push(format!("hugepages: {} now {pages}", nr_file.display()));
            }
            Action::MountHugetlbfs(dir) => {
                mount_hugetlbfs(dir)?;
                done.push(format!("hugepages: hugetlbfs mounted at {}", dir.display()));
            }
            Action::Bind {
                port,
                address,
                from,
                driver,
            } => {
                bind(host, address, from.as_deref(), driver)?;
                done.push(format!(
                    "port {port}: {address} bound to {driver}{}",
                    from.as_ref()
                        .map(|f| format!(" (was {f})"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    Ok(done)
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

fn mount_hugetlbfs(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: a NUL in the path", dir.display()))?;
    let fstype = c"hugetlbfs";
    // SAFETY: NUL-terminated strings that outlive the call; no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "mounting hugetlbfs at {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn bind(host: &Host, address: &str, from: Option<&str>, driver: &str) -> Result<(), String> {
    let pci = host.sys.join("bus/pci");
    let drivers = pci.join("drivers");
    if !drivers.join(driver).exists() {
        let out = std::process::Command::new("modprobe")
            .arg(driver)
            .output()
            .map_err(|e| format!("modprobe {driver}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "modprobe {driver}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    let dev = pci.join("devices").join(address);
    write(&dev.join("driver_override"), driver)?;
    if let Some(from) = from {
        write(&drivers.join(from).join("unbind"), address)?;
    }
    write(&pci.join("drivers_probe"), address)?;
    let now = std::fs::read_link(dev.join("driver"))
        .ok()
        .and_then(|l| Some(l.file_name()?.to_string_lossy().into_owned()));
    if now.as_deref() != Some(driver) {
        return Err(format!(
            "{address}: still on {} after binding to {driver} (for vfio-pci: is the IOMMU \
             on? intel_iommu=on or amd_iommu=on)",
            now.as_deref().unwrap_or("no driver")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config whose `[eal]` lines and port device the caller chooses.
    fn config(eal: &str, port: &str) -> Config {
        let emulator = match port.starts_with("loopback") {
            true => "[loopback]\npeers = 1\n",
            false => "",
        };
        let text = format!(
            "[eal]\n{eal}\n[lcores]\nmanagement = 0\nworkers = [1]\n\
             [control]\nsocket = \"/run/sluice/t.sock\"\n\
             [[ports]]\nname = \"wan0\"\n{port}\naddresses = [\"198.18.0.1/24\"]\n\
             {emulator}"
        );
        Config::parse(&text, Path::new("t.toml")).unwrap()
    }

    /// A fake /sys and /proc: 2 MiB pages with `nr` reserved and `free` free, no
    /// hugetlbfs mount unless `mounted`.
    fn host(nr: u64, free: u64, mounted: bool) -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        let proc = dir.path().join("proc");
        let pages = sys.join("kernel/mm/hugepages/hugepages-2048kB");
        std::fs::create_dir_all(&pages).unwrap();
        std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
        std::fs::create_dir_all(&proc).unwrap();
        std::fs::write(pages.join("nr_hugepages"), format!("{nr}\n")).unwrap();
        std::fs::write(pages.join("free_hugepages"), format!("{free}\n")).unwrap();
        std::fs::write(
            proc.join("meminfo"),
            "MemTotal: 1000 kB\nHugepagesize:       2048 kB\n",
        )
        .unwrap();
        let mounts = match mounted {
            true => "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n",
            false => "sysfs /sys sysfs rw 0 0\n",
        };
        std::fs::write(proc.join("mounts"), mounts).unwrap();
        (dir, Host { sys, proc })
    }

    /// A PCI device on `driver` (none: unbound), with interface `iface` up or down.
    fn device(host: &Host, address: &str, driver: Option<&str>, iface: Option<(&str, bool)>) {
        let dev = host.sys.join("bus/pci/devices").join(address);
        std::fs::create_dir_all(&dev).unwrap();
        if let Some(d) = driver {
            let drv = host.sys.join("bus/pci/drivers").join(d);
            std::fs::create_dir_all(&drv).unwrap();
            std::os::unix::fs::symlink(&drv, dev.join("driver")).unwrap();
        }
        if let Some((name, up)) = iface {
            let net = dev.join("net").join(name);
            std::fs::create_dir_all(&net).unwrap();
            std::fs::write(net.join("operstate"), if up { "up\n" } else { "down\n" }).unwrap();
        }
    }

    const PCI: &str = "pci = \"0000:03:00.0\"";

    #[test]
    fn hugepages_are_reserved_up_to_memory_mb_and_mounted_when_missing() {
        let cfg = config("hugepages = true\nmemory_mb = 100", "loopback = true");
        let (_d, h) = host(10, 4, false);
        // 100 MiB = 50 pages of 2 MiB; 4 free: 46 more on top of the 10 reserved.
        assert_eq!(
            plan(&cfg, &h, "vfio-pci").unwrap(),
            [
                Action::ReserveHugepages {
                    nr_file: h
                        .sys
                        .join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
                    pages: 56
                },
                Action::MountHugetlbfs(PathBuf::from("/dev/hugepages")),
            ]
        );
        let (_d, h) = host(50, 50, true);
        let actions = plan(&cfg, &h, "vfio-pci").unwrap();
        assert!(matches!(&actions[..], [Action::Note(n)] if n.contains("100 MiB free")));
        let cfg = config("hugepages = false", "loopback = true");
        assert_eq!(plan(&cfg, &h, "vfio-pci").unwrap(), []);
    }

    #[test]
    fn reserving_writes_the_total_and_checks_what_the_kernel_gave() {
        let (_d, h) = host(10, 4, true);
        let nr_file = h
            .sys
            .join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages");
        let done = apply(
            &[Action::ReserveHugepages {
                nr_file: nr_file.clone(),
                pages: 56,
            }],
            &h,
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&nr_file).unwrap(), "56");
        assert!(done[0].ends_with("now 56"), "{done:?}");
    }

    #[test]
    fn pci_ports_are_bound_unless_already_on_a_dpdk_or_bifurcated_driver() {
        let cfg = config("hugepages = false", PCI);
        let (_d, h) = host(0, 0, true);
        let err = plan(&cfg, &h, "vfio-pci").unwrap_err();
        assert!(
            err.starts_with("t.toml: ports[0].pci: port wan0: no PCI device 0000:03:00.0"),
            "{err}"
        );

        device(&h, "0000:03:00.0", Some("ixgbe"), Some(("enp3s0", false)));
        assert_eq!(
            plan(&cfg, &h, "vfio-pci").unwrap(),
            [Action::Bind {
                port: "wan0".into(),
                address: "0000:03:00.0".into(),
                from: Some("ixgbe".into()),
                driver: "vfio-pci".into()
            }]
        );
        for (driver, says) in [("vfio-pci", "already bound"), ("mlx5_core", "stays on")] {
            let (_d, h) = host(0, 0, true);
            device(&h, "0000:03:00.0", Some(driver), None);
            let actions = plan(&cfg, &h, "vfio-pci").unwrap();
            assert!(
                matches!(&actions[..], [Action::Note(n)] if n.contains(says)),
                "{driver}: {actions:?}"
            );
        }
        let (_d, h) = host(0, 0, true);
        device(&h, "0000:03:00.0", None, None);
        assert!(matches!(
            &plan(&cfg, &h, "uio_pci_generic").unwrap()[..],
            [Action::Bind { from: None, driver, .. }] if driver == "uio_pci_generic"
        ));
    }

    #[test]
    fn an_interface_that_is_up_is_refused() {
        let cfg = config("hugepages = false", PCI);
        let (_d, h) = host(0, 0, true);
        device(&h, "0000:03:00.0", Some("ixgbe"), Some(("enp3s0", true)));
        let err = plan(&cfg, &h, "vfio-pci").unwrap_err();
        assert!(
            err.contains("is the kernel's interface enp3s0, which is up"),
            "{err}"
        );
    }

    #[test]
    fn binding_writes_override_unbind_and_probe_then_checks_the_driver() {
        let (_d, h) = host(0, 0, true);
        device(&h, "0000:03:00.0", Some("ixgbe"), None);
        std::fs::create_dir_all(h.sys.join("bus/pci/drivers/vfio-pci")).unwrap();
        let err = bind(&h, "0000:03:00.0", Some("ixgbe"), "vfio-pci").unwrap_err();
        // No kernel behind the fake tree: the device is still on ixgbe afterwards.
        assert!(
            err.contains("still on ixgbe after binding to vfio-pci"),
            "{err}"
        );
        let dev = h.sys.join("bus/pci/devices/0000:03:00.0");
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(dev.join("driver_override")), "vfio-pci");
        assert_eq!(
            read(h.sys.join("bus/pci/drivers/ixgbe/unbind")),
            "0000:03:00.0"
        );
        assert_eq!(read(h.sys.join("bus/pci/drivers_probe")), "0000:03:00.0");
    }
}
