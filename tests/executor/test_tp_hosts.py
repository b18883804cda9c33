#!/usr/bin/env python3
"""test_tp_hosts.py — tensor parallelism across hosts: two network namespaces joined by a veth pair.

The test makes two network namespaces, joins them with a veth pair whose ends it gives addresses on
a private /24, and runs test_tp (the runner against Hugging Face's f32 logits) as a 2-rank OpenMPI
job started in the first namespace with `--host A,B`: OpenMPI starts the remote rank through its rsh
launch agent, which here is `ip netns exec` into the second namespace instead of ssh, and every byte
between the ranks goes over TCP on the veth (the shared-memory transport is switched off, as between
real hosts). It deletes what it made, whatever happens. Where namespaces cannot be made (not root, no
`ip`), it says why and reports itself skipped (exit 77).

Usage: test_tp_hosts.py TEST_TP_BINARY   (ctest runs it as test_tp_hosts)
"""
import os
import shutil
import subprocess
import sys
import tempfile

TEST_TP = os.path.abspath(sys.argv[1])
SKIP = 77
PID = os.getpid()
NS = (f"cvllm-a-{PID}", f"cvllm-b-{PID}")
LINK = (f"cva{PID % 100000}", f"cvb{PID % 100000}")
SUBNET = f"10.{200 + PID % 50}.{PID % 250}"
ADDR = (f"{SUBNET}.1", f"{SUBNET}.2")


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check)


def skip(why):
    print(f"test_tp_hosts: skipped: {why}")
    sys.exit(SKIP)


def make_network():
    sh("ip", "netns", "add", NS[0])
    sh("ip", "netns", "add", NS[1])
    sh("ip", "link", "add", LINK[0], "type", "veth", "peer", "name", LINK[1])
    for i in (0, 1):
        sh("ip", "link", "set", LINK[i], "netns", NS[i])
        sh("ip", "-n", NS[i], "addr", "add", f"{ADDR[i]}/24", "dev", LINK[i])
        sh("ip", "-n", NS[i], "link", "set", LINK[i], "up")
        sh("ip", "-n", NS[i], "link", "set", "lo", "up")


def delete_network():
    for ns in NS:  # deleting a namespace deletes its end of the veth, and with it the pair
        sh("ip", "netns", "del", ns, check=False)


def main():
    if os.geteuid() != 0:
        skip("network namespaces need root")
    if not shutil.which("ip") or not shutil.which("mpirun"):
        skip("needs ip (iproute2) and mpirun (openmpi-bin)")
    tmp = tempfile.mkdtemp(prefix="cvllm-tp-hosts-")
    try:
        try:
            make_network()
        except subprocess.CalledProcessError as e:
            skip(f"cannot make network namespaces here: {e.stderr.strip()}")
        agent = os.path.join(tmp, "netns-agent")
        with open(agent, "w") as f:  # OpenMPI calls it as `agent HOST COMMAND...`, the way it calls ssh
            f.write("#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n"
                    f"  {ADDR[0]}) ns={NS[0]} ;;\n  {ADDR[1]}) ns={NS[1]} ;;\n"
                    "  *) echo \"netns-agent: unknown host $host\" >&2; exit 1 ;;\nesac\n"
                    "exec ip netns exec \"$ns\" sh -c \"$*\"\n")
        os.chmod(agent, 0o755)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = ["ip", "netns", "exec", NS[0], "mpirun", "-np", "2", "--host", f"{ADDR[0]},{ADDR[1]}",
               "--mca", "plm_rsh_agent", agent, "--mca", "btl", "tcp,self",
               "--mca", "btl_tcp_if_include", f"{SUBNET}.0/24", "--mca", "oob_tcp_if_include", f"{SUBNET}.0/24",
               "-x", "CVLLM_CACHE_ROOT", "-x", "ASAN_OPTIONS", "-x", "LSAN_OPTIONS", "-x", "UBSAN_OPTIONS",
               "-x", "CVLLM_SANITIZED", "sh", "-c",
               f"echo \"rank $OMPI_COMM_WORLD_RANK in network namespace $(ip netns identify $$)\"; exec {TEST_TP}"]
        for k in ("CVLLM_CACHE_ROOT", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "CVLLM_SANITIZED"):
            env.setdefault(k, "")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        out = r.stdout + r.stderr
        print(out[-4000:])
        placed = f"rank 0 in network namespace {NS[0]}" in out and f"rank 1 in network namespace {NS[1]}" in out
        ok = r.returncode == 0 and placed
        if not placed:
            print("FAIL: the ranks did not run one in each namespace")
        print(f"test_tp_hosts: {'passed' if ok else 'FAILED'} (mpirun exit {r.returncode})")
        return 0 if ok else 1
    finally:
        delete_network()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
