#!/usr/bin/env python3
"""Writes a loopback config with many services, for timing `sluice --check-config`,
start-up and `sluicectl reload` at scale.

    perf/config_scale.py OUT.toml SERVICES REAL_SERVERS_PER_SERVICE [SCHEDULER]

Services are TCP port 80 on 10.0.0.1, 10.0.0.2, ...; every real server has its own
address from 198.18.1.0 on (NAT, port 8080), and `[sessions] neighbours` is raised to
hold them (every worker keeps a neighbour entry for each). Then, for example:

    /usr/bin/time -f "%e s" ./target/release/sluice --check-config OUT.toml --file-only
"""
import ipaddress
import sys

out_path, services, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
scheduler = sys.argv[4] if len(sys.argv) > 4 else "wlc"
lines = ['''[eal]
hugepages = false
memory_mb = 256
file_prefix = "config-scale"

[lcores]
management = 0
workers = [1]

[control]
socket = "/run/sluice/config-scale.sock"

[[ports]]
name = "lan0"
loopback = true
mac = "02:53:4c:00:00:01"
addresses = ["198.18.0.1/15"]

[loopback]
peers = 1

[sessions]
capacity = 65536
''']
# Real-server addresses may fill three quarters of the neighbour tables.
neighbours = max(4096, -(-services * per * 4 // 3))
lines[0] += f"neighbours = {neighbours}\n"
first_vip = int(ipaddress.IPv4Address("10.0.0.0"))
first_rs = int(ipaddress.IPv4Address("198.18.1.0"))
k = 0
for s in range(services):
    vip = ipaddress.IPv4Address(first_vip + s + 1)
    lines.append(f'[[services]]\nproto = "tcp"\nvip = "{vip}"\nport = 80\nscheduler = "{scheduler}"\n')
    for _ in range(per):
        rs = ipaddress.IPv4Address(first_rs + k)
        k += 1
        lines.append(f'  [[services.real_servers]]\n  ip = "{rs}"\n  port = 8080\n  mode = "nat"\n')
with open(out_path, "w") as f:
    f.write("\n".join(lines))
print(f"{out_path}: {services} services, {k} real servers")
