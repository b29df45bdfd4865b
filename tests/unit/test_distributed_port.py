"""The rendezvous port never comes from the kernel's ephemeral range, where outgoing connections live."""
from __future__ import annotations

import socket
from pathlib import Path

from launch.distributed import JOB_PORTS, detect, job_port


def test_master_port_in_the_environment_wins():
    assert job_port("518_1", 4, {"MASTER_PORT": "29400"}) == 29400


def test_a_single_rank_takes_a_port_that_is_free_now():
    port = job_port("518_1", 1, {})
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        sock.listen()


def test_ranks_agree_on_a_port_below_the_ephemeral_range():
    ports = {job_id: job_port(job_id, 2, {}) for job_id in ("518_1", "518_0", "692_0", "177", "9999999")}
    assert all(JOB_PORTS[0] <= p <= JOB_PORTS[1] for p in ports.values()), ports
    assert job_port("518_1", 2, {}) == ports["518_1"]  # every rank, every requeue: the same port
    assert len(set(ports.values())) > 1
    # submitit's own choice for array task 518_1 (port 46758) failed with EADDRINUSE on the local cluster.
    assert ports["518_1"] != 46758
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if path.exists():
        assert JOB_PORTS[1] < int(path.read_text().split()[0])


def test_plain_slurm_variables_use_the_same_rule():
    environ = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "518", "SLURM_JOB_NODELIST": "node1"}
    env = detect(environ, use_submitit=False)
    assert (env.rank, env.world_size, env.master_addr) == (1, 2, "node1")
    assert env.master_port == job_port("518", 2, {})
