"""Run the training demo (or the aggregation benchmark) inside a Mininet star and report JSON.

    sudo /usr/bin/python3 mininet/run.py --workers 4 --bw 20 --workload train --steps 10 [--loss 1]
    sudo /usr/bin/python3 mininet/run.py --workers 4 --bw 1000 --model vgg19 --steps 5
    sudo /usr/bin/python3 mininet/run.py --workers 2 --workload bench --length 200000
    sudo /usr/bin/python3 mininet/run.py --topology leafspine --workers 8 --bw 20 --steps 10

Starts the emulated cluster (mininet/topo.py), softswitch on the switch-side veths (AF_PACKET) or BMv2
``simple_switch_grpc`` (``--switch bmv2``), and ``lhc-controller serve`` with the cluster's topology (so
ordinary traffic, torch.distributed's TCP included, crosses the switch by the controller's routes). With
``--topology leafspine`` the hosts sit under two leaves linked to a spine (three switch processes, one
controller driving them; jobs span the fabric), and the summary adds ``leaf_spine_links``: per run and
leaf, the lhc packets that crossed its link up and down against those its first worker sent. Then
runs the workload's processes inside the hosts with the project's virtualenv, collects their JSON, prints
the summary and tears everything down, also after a failure or Ctrl-C.

``--pcap DIR`` captures while the workload runs: ``DIR/hI.pcap`` at every worker host's interface
(tcpdump in the host's namespace, lhc's UDP ports only unless ``--pcap-filter`` says otherwise) and, with
softswitch, ``DIR/switch.pcapng`` (over a leaf/spine fabric one file per switch, ``DIR/<name>.pcapng``),
every frame the switch receives and sends (``lhc-softswitch --pcap``).
Open them with Wireshark and ``wireshark/lhc.lua`` (docs/testing.md).

The controller runs with an operator token (``--token-file``, a fresh one per run), and each job's workers
join with that job's credential only (``job create --credential-file``, handed to them as
``LHC_TOKEN_FILE``), from their own host's address, as tenants of a shared switch would.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import model_train
import topo

REPO = Path(__file__).resolve().parent.parent
RUNS = ("ddp", "dense", "lhc")
READY_TIMEOUT_S = 60
BMV2_JSON = REPO / "build" / "p4" / "v1model" / "lhc.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mininet/run.py", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="worker hosts (%(default)s)")
    parser.add_argument("--bw", type=float, default=20.0,
                        help="link rate in Mbit/s, 0: unshaped (%(default)s)")
    parser.add_argument("--loss", type=int, default=0, help="percent of frames dropped at every host (0)")
    parser.add_argument("--delay", default="", help="link delay: refused, this kernel has no netem")
    parser.add_argument("--switch", choices=("softswitch", "bmv2"), default="softswitch")
    parser.add_argument("--topology", choices=("star", "leafspine"), default="star",
                        help="one switch, or two leaves of W/2 hosts and a spine (%(default)s)")
    parser.add_argument("--workload", choices=("train", "bench"), default="train")
    parser.add_argument("--steps", type=int, default=10, help="training steps per run (%(default)s)")
    parser.add_argument("--model", choices=("ncf", "lstm", "vgg19", "bert"),
                        help="train: this model of benchmarks/models every way lhc-bench train does, "
                             "instead of the demo's three runs")
    parser.add_argument("--ways", help="with --model: only these ways, comma-separated (default: all)")
    parser.add_argument("--size", choices=("tiny", "small", "full"), default="full",
                        help="--model's; small: BERT only (%(default)s)")
    parser.add_argument("--users", type=int, default=20_000, help="train: user embedding rows (%(default)s)")
    parser.add_argument("--items", type=int, default=20_000, help="train: item embedding rows (%(default)s)")
    parser.add_argument("--length", type=int, default=200_000, help="bench: bucket length (%(default)s)")
    parser.add_argument("--density", type=float, default=0.01, help="bench: density (%(default)s)")
    parser.add_argument("--process-group", action="store_true",
                        help="bench: also Gloo's allreduce and the codec's dense mode over the hosts' "
                             "process group (rows gloo and hosts), their TCP through the same switch")
    parser.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"),
                        help="the project's interpreter, run inside the hosts (%(default)s)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "emulation", help="(%(default)s)")
    parser.add_argument("--pcap", type=Path, default=None, metavar="DIR",
                        help="capture at every worker host's interface (DIR/hI.pcap, tcpdump) and, with "
                             "softswitch, in the switch (DIR/switch.pcapng)")
    parser.add_argument("--pcap-filter", default=topo.LHC_CAPTURE_FILTER,
                        help="the hosts' capture filter (tcpdump syntax; default: %(default)s)")
    return parser


class Processes:
    """Every child process the run starts, stopped in reverse order whatever happens."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def add(self, proc: subprocess.Popen) -> subprocess.Popen:
        self.started.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.started):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.started):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _ready_line(proc: subprocess.Popen, prefix: str, log: Path) -> dict[str, str]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return dict(part.split("=", 1) for part in line[len(prefix):].split())
        if not line and proc.poll() is not None:
            break
    raise RuntimeError(f"{prefix.strip(':')} did not start; its log: {log.read_text()[-3000:]}")


def start_switch(args: argparse.Namespace, switch_ports: dict[int, str], scratch: Path, procs: Processes,
                 name: str = "switch") -> str:
    log = scratch / f"{name}.log"
    if args.switch == "bmv2":
        return start_bmv2(switch_ports, log, procs)
    ports = [arg for port, intf in switch_ports.items() for arg in ("--port", f"{port}@{intf}")]
    if args.pcap:
        ports += ["--pcap", str(args.pcap / f"{name}.pcapng")]
    proc = procs.add(subprocess.Popen(
        [args.python, "-m", "softswitch.cli", "--grpc-addr", "127.0.0.1:0", *ports],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=REPO, env=_env(),
    ))
    return _ready_line(proc, "lhc-softswitch ready:", log)["grpc"]


def start_bmv2(switch_ports: dict[int, str], log: Path, procs: Processes) -> str:
    """``simple_switch_grpc --no-p4`` on the switch-side veths; the controller pushes the program."""
    grpc, thrift = _free_port(), _free_port()
    ports = [arg for port, name in switch_ports.items() for arg in ("-i", f"{port}@{name}")]
    proc = procs.add(subprocess.Popen(
        ["simple_switch_grpc", "--device-id", "1", "--thrift-port", str(thrift), *ports, "--no-p4", "--",
         "--grpc-server-addr", f"127.0.0.1:{grpc}"], stdout=log.open("w"), stderr=subprocess.STDOUT,
    ))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", grpc)) == 0:
                return f"127.0.0.1:{grpc}"
        time.sleep(0.2)
    raise RuntimeError(f"simple_switch_grpc did not start; its log: {log.read_text()[-3000:]}")


def start_captures(args: argparse.Namespace, cluster: topo.Cluster, procs: Processes) -> None:
    """tcpdump at every worker host's interface, in the host's namespace, until the run ends (SIGTERM:
    tcpdump writes what it holds and exits); returns once every one listens."""
    args.pcap.mkdir(parents=True, exist_ok=True)
    logs = []
    for host in cluster.hosts:
        log = args.pcap / f"{host.name}.tcpdump.log"
        # --immediate-mode and -U: each packet is written as it comes (without them the last second's
        # packets can still sit in the kernel's ring when SIGTERM ends tcpdump); -Z root: no drop to user
        # tcpdump, which could not write into DIR
        procs.add(host.popen(["tcpdump", "-i", f"{host.name}-eth0", "-n", "--immediate-mode", "-U", "-s", "0",
                              "-Z", "root", "-w", str(args.pcap / f"{host.name}.pcap"), args.pcap_filter],
                             stdout=subprocess.DEVNULL, stderr=log.open("w")))
        logs.append(log)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all("listening on" in log.read_text() for log in logs):
        if time.monotonic() > deadline or any(proc.poll() is not None for proc in procs.started[-len(logs):]):
            raise RuntimeError("tcpdump did not start: " + " ".join(log.read_text()[-500:] for log in logs))
        time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_controller(args: argparse.Namespace, grpc: str | None, topology: Path, scratch: Path,
                     procs: Processes) -> str:
    """The controller of the switch at ``grpc``, or (None) of every switch of a fabric ``topology``."""
    log = scratch / "controller.log"
    listen = f"{topo.CONTROLLER_IP}:9560"
    token = _operator_token(scratch)
    token.write_text(secrets.token_urlsafe(32) + "\n")
    token.chmod(0o600)
    proc = procs.add(subprocess.Popen(
        [args.python, "-m", "controller.cli", "serve", *(["--switch", grpc] if grpc else []),
         "--target", args.switch,
         "--listen", listen, "--state-dir", str(scratch / "state"), "--topology", str(topology),
         "--token-file", str(token),
         *(["--device-config", str(BMV2_JSON)] if args.switch == "bmv2" else [])],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=REPO, env=_env(),
    ))
    return _ready_line(proc, "lhc-controller ready:", log)["listen"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def _operator_token(scratch: Path) -> Path:
    return scratch / "operator.token"


def create_job(args: argparse.Namespace, controller: str, scratch: Path, job: str) -> Path:
    """Create ``job`` with the operator's token; the file that holds its credential, for its workers."""
    credential = scratch / f"{job}.credential"
    argv = [args.python, "-m", "controller.cli", "--controller", controller, "--token-file",
            str(_operator_token(scratch)), "job", "create", job, "--workers", str(args.workers),
            "--credential-file", str(credential)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=_env())
    if done.returncode != 0:
        raise RuntimeError(f"the controller refused job {job}: {done.stderr.strip()[-2000:]}")
    return credential


def run_training(args: argparse.Namespace, cluster: topo.Cluster, controller: str, scratch: Path,
                 started: Processes, probe: LinkProbe | None = None) -> dict:
    """The demo's three runs, or with ``--model`` the model's ways (``model_train``): per run, W workers
    in the hosts, their results in rank order."""
    plan = model_train.plan(args, _env(), REPO) if args.model else [(run, run != "ddp") for run in RUNS]
    runs = {}
    for run, through_switch in plan:
        if probe is not None:
            probe.start()
        job = model_train.job(args, run) if args.model else f"train-{run}"
        credential = create_job(args, controller, scratch, job) if through_switch else None
        master = f"{topo.host_ip(1)}:29500"
        procs = []
        for index, host in enumerate(cluster.hosts, start=1):
            out = scratch / f"{run}-{index - 1}.json"
            argv = model_train.worker_argv(args, run, index - 1, master, out, topo.host_ip(index), host.name,
                                           controller) if args.model else [
                args.python, "-m", "lhc_demo.worker", "--rank", str(index - 1), "--world", str(args.workers),
                "--master", master, "--run", run, "--steps", str(args.steps), "--json-out", str(out), "--ip",
                topo.host_ip(index), "--host", host.name, "--users", str(args.users), "--items",
                str(args.items), *(["--controller", controller, "--job", job] if through_switch else [])]
            env = _env(GLOO_SOCKET_IFNAME=f"{host.name}-eth0",
                       **({"LHC_TOKEN_FILE": str(credential)} if credential else {}))
            proc = host.popen(argv, cwd=str(REPO), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append((started.add(proc), out))
        failed = []
        for rank, (proc, _) in enumerate(procs):
            _, err = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                failed.append(f"rank {rank}: {err[-1500:]}")
        if failed:
            raise RuntimeError(f"run {run} failed:\n" + "\n".join(failed))
        # a model's worker writes a list of (model, way) results: here one
        runs[run] = [json.loads(out.read_text())[0] if args.model else json.loads(out.read_text())
                     for _, out in procs]
        if probe is not None:
            probe.stop(run)
    return runs


class LinkProbe:
    """The leaf-spine links' counters (``topo.link_counts``) over each run: per leaf, the lhc packets that
    went up and came down its link and those its first worker sent (one per round, retransmissions
    aside), so ``up_per_worker_packet`` is 1.0 when one packet per leaf and round crossed the link; and the
    link interfaces' kernel byte counters."""

    def __init__(self, fabric: topo.Fabric) -> None:
        self.fabric = fabric
        self.before: dict = {}
        self.runs: dict[str, dict] = {}

    def start(self) -> None:
        self.before = topo.link_counts(self.fabric)

    def stop(self, run: str) -> None:
        after = topo.link_counts(self.fabric)
        delta = {key: {k: after[key][k] - self.before[key][k] for k in after[key]} for key in after}
        per_leaf = {}
        for leaf, (uplink, _) in self.fabric.links.items():
            up, down = delta[f"{leaf}-up"], delta[f"{leaf}-down"]
            worker = delta[f"{leaf}-worker"]["packets"]
            per_leaf[leaf] = {
                "up_packets": up["packets"], "down_packets": down["packets"], "up_bytes": up["bytes"],
                "down_bytes": down["bytes"], "worker_packets": worker,
                "up_per_worker_packet": up["packets"] / worker if worker else None,
                "down_per_worker_packet": down["packets"] / worker if worker else None,
                "link_tx_bytes": delta[uplink]["tx_bytes"], "link_rx_bytes": delta[uplink]["rx_bytes"],
            }
        self.runs[run] = per_leaf


def summarize(args: argparse.Namespace, runs: dict, extra: dict) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    runs_file = args.out / "runs.json"
    runs_file.write_text(json.dumps(runs))
    done = subprocess.run(
        [args.python, "-m", "lhc_demo.summary", str(runs_file), "--plot", str(args.out / "emulation.png")],
        check=True, capture_output=True, text=True, cwd=REPO, env=_env(),
    )
    result = json.loads(done.stdout)
    result["step_speedup"] = result["step_speedup_vs_ddp"]
    return {**result, **extra}


def run_bench(args: argparse.Namespace, cluster: topo.Cluster, controller: str, scratch: Path,
              started: Processes, probe: LinkProbe | None = None) -> list[dict]:
    job = "bench"
    if probe is not None:
        probe.start()
    credential = create_job(args, controller, scratch, job)
    procs = []
    for index, host in enumerate(cluster.hosts, start=1):
        argv = [args.python, "-m", "benchmarks.aggregate_worker", "--controller", controller, "--job", job,
                "--length", str(args.length), "--density", str(args.density), "--workers", str(args.workers),
                "--modes", "dense,sketch,auto", "--ip", topo.host_ip(index), "--host", host.name]
        if args.process_group:  # then Gloo's allreduce and the codec over the hosts, through the same switch
            # rank 0 where the rendezvous listens: the switch job's ranks follow the order of joining
            argv += ["--gloo-init", f"tcp://{topo.host_ip(1)}:29500", "--gloo-rank", str(index - 1)]
        env = _env(LHC_TOKEN_FILE=str(credential), GLOO_SOCKET_IFNAME=f"{host.name}-eth0")
        procs.append(started.add(host.popen(argv, cwd=str(REPO), env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)))
    rows = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"a bench worker failed: {err[-2000:]}")
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if probe is not None:
        probe.stop("bench")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("mininet/run.py needs root (network namespaces, veths, AF_PACKET)")
    if args.delay:
        raise SystemExit("--delay: this kernel has no netem, so TCLink cannot delay; refused rather "
                         "than run an unimpaired link under that name")
    if args.switch == "bmv2" and not (shutil.which("simple_switch_grpc") and BMV2_JSON.exists()):
        raise SystemExit("--switch bmv2 needs simple_switch_grpc on PATH and the compiled program "
                         f"{BMV2_JSON} (`make p4-v1model`, with p4c on PATH)")
    if not Path(args.python).exists():
        raise SystemExit(f"no project interpreter at {args.python}: run `make venv` first or pass --python")
    if args.pcap and not shutil.which("tcpdump"):
        raise SystemExit("--pcap needs tcpdump on PATH (`make system-deps` installs it)")
    procs = Processes()
    cluster = None
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # tear down on SIGTERM too
    # Ctrl-C tears down even when started from a shell that ignores SIGINT in background jobs (Python
    # then installs no KeyboardInterrupt handler of its own, and the run would outlive its interrupt).
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with tempfile.TemporaryDirectory(prefix="lhc-emu-") as tmp:
            scratch = Path(tmp)
            probe = None
            if args.topology == "leafspine":
                cluster = topo.build_leafspine(args.workers, args.bw or None)
            else:
                cluster = topo.build(args.workers, args.bw or None)
            if args.loss:
                topo.apply_loss(cluster, args.loss)
            if args.pcap:
                start_captures(args, cluster, procs)
            if args.topology == "leafspine":
                grpcs = {name: start_switch(args, ports, scratch, procs, name)
                         for name, ports in cluster.switch_ports.items()}
                topology = scratch / "topo.json"
                topology.write_text(json.dumps(cluster.topology(grpcs), indent=1))
                controller = start_controller(args, None, topology, scratch, procs)
                probe = LinkProbe(cluster)
            else:
                grpc = start_switch(args, cluster.switch_ports, scratch, procs)
                controller = start_controller(args, grpc, cluster.write_topology(scratch / "topo.json"),
                                              scratch, procs)
            extra = {"workers": args.workers, "bw_mbit": args.bw, "loss_percent": args.loss,
                     "loss_model": topo.LOSS_MODEL if args.loss else None, "switch": args.switch,
                     "topology": args.topology}
            if args.workload == "train":
                runs = run_training(args, cluster, controller, scratch, procs, probe)
                if args.loss:
                    extra["dropped_frames"] = topo.dropped(cluster)
                if probe is not None:
                    extra["leaf_spine_links"] = probe.runs
                print(json.dumps(model_train.summarize(args, runs, extra, _env(), REPO) if args.model
                                 else summarize(args, runs, extra)))
            else:
                for row in run_bench(args, cluster, controller, scratch, procs, probe):
                    print(json.dumps({**row, **extra}))
                if probe is not None:
                    print(json.dumps({"leaf_spine_links": probe.runs, **extra}))
    finally:
        procs.stop()
        if cluster is not None:
            cluster.net.stop()
        topo.remove_controller_veth()
        topo.remove_link_counters()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
