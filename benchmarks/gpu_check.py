"""`make gpu-check`: everything a GPU machine must prove, in one run of a few minutes.

    python3 -m benchmarks.gpu_check [--out build/gpu-check] [--wheels .whl] [--budget 450] [--steps ...]

Made for a fresh machine lent for minutes (Python with torch + CUDA, Triton, grpcio, no network): it uses
that machine's torch, never installs one, brings what else the project needs as wheels from ``--wheels``
(``make gpu-wheels`` downloads them), and builds the C extensions in place with the machine's compiler.
Steps, in order (each logs to OUT/STEP.log; one that fails does not stop the others; each gets at most
its own cap and what is left of ``--budget``):

* ``environment``: versions of Python, torch, CUDA, Triton, nvcc, gcc; the device (OUT/environment.json);
* ``wheels``: the wheels installed into a folder of their own, put first on PYTHONPATH;
* ``build``: the C extensions, where they do not import yet;
* ``bench``: ``lhc-bench codec --device cuda`` at the default case (both layouts, and union), at 0.1% and
  5% (OUT/codec.jsonl), with the issue's targets checked: encode <= 5 and decode <= 20 memcpys of the
  bucket, decode launches <= 64, exact; the summary prints each case's encode, decode and decode stages
  (index query, peel, output, granularity choice) in memcpys of the bucket, and its launches and host
  waits;
* ``tests``: the ``gpu``-marked tests: CUDA against CPU results, the DDP hook with CUDA buckets through
  softswitch (two ranks on the one GPU), FSDP and reduce_scatter on CUDA (two ranks on the one GPU), the
  NCCL hook and the lhc backend's NCCL path with CUDA tensors (one rank: NCCL refuses two on one GPU);
* ``kernels``: tests/test_codec_gpu.py on the device: every Triton kernel against the CPU's, bit for bit
  (last: the CPU machines already run them in Triton's interpreter).

OUT/summary.json and OUT/summary.txt say what passed, failed or was skipped and why. On a machine without
a CUDA device the device steps are skipped, saying so. Exit status 0 when nothing failed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("environment", "wheels", "build", "bench", "tests", "kernels")
#: The most each step may take, seconds (the budget may leave it less).
CAPS = {"environment": 60, "wheels": 60, "build": 180, "kernels": 150, "bench": 200, "tests": 240}
TARGETS = {"encode_memcpy": 5.0, "decode_memcpy": 20.0, "decode_launches": 64}
_ENV_PROBE = """
import json, platform, shutil, subprocess, sys
info = {"python": sys.version.split()[0], "platform": platform.platform()}
def version(*argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout
        return out.strip().splitlines()[-1]
    except Exception as exc:
        return f"unavailable: {exc}"
info["nvcc"] = version("nvcc", "--version") if shutil.which("nvcc") else None
info["gcc"] = version("gcc", "--version") if shutil.which("gcc") else None
try:
    import torch
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda=torch.cuda.is_available())
    if info["cuda"]:
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                    capability=f"{p.major}.{p.minor}")
except Exception as exc:
    info["torch"] = f"unavailable: {exc}"
    info["cuda"] = False
try:
    import triton
    info["triton"] = triton.__version__
except Exception as exc:
    info["triton"] = f"unavailable: {exc}"
print(json.dumps(info))
"""
_EXTENSIONS = ("host_agent.codec.cpu._kernels", "host_agent.transport._engine", "softswitch._dataplane",
               "lhc_ina._udp")


class Check:
    """The run: where it writes, what is left of its budget, and what each step did."""

    def __init__(self, out: Path, wheels: Path, site: Path, budget: float) -> None:
        self.out, self.wheels, self.site = out, wheels, site
        self.deadline = time.monotonic() + budget
        self.steps: list[dict] = []
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                                                if os.environ.get("PYTHONPATH") else []))
        self.env.pop("TRITON_INTERPRET", None)  # the device runs the compiled kernels
        self.cuda = False
        self.cases: list[dict] = []
        self.targets: dict[str, str] | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, argv: list[str], cap: float, log: Path | None = None) -> tuple[int, str]:
        """Run one command of a step with at most ``cap`` seconds (and what the budget leaves), its output
        to the step's log; (exit status or 124 on timeout, output)."""
        limit = max(1.0, min(cap, self.left()))
        log = log or self.out / f"{name}.log"
        with log.open("a") as sink:
            sink.write(f"$ {' '.join(argv)}  (at most {limit:.0f} s)\n")
            sink.flush()
            try:
                done = subprocess.run(argv, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=limit)
                sink.write(done.stdout)
                return done.returncode, done.stdout
            except subprocess.TimeoutExpired as exc:
                text = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(
                    "utf-8", "replace")
                sink.write(text + f"\n[gpu-check] timed out after {limit:.0f} s\n")
                return 124, text

    def record(self, name: str, status: str, seconds: float, detail: str, **more) -> None:
        entry = {"step": name, "status": status, "seconds": round(seconds, 1), "detail": detail, **more}
        self.steps.append(entry)
        print(f"[gpu-check] {name}: {status} ({seconds:.0f} s) {detail}", flush=True)


def _environment(check: Check) -> tuple[str, str]:
    code, text = check.run("environment", [sys.executable, "-c", _ENV_PROBE], CAPS["environment"])
    if code != 0:
        return "failed", f"the probe exited {code}"
    info = json.loads(text.strip().splitlines()[-1])
    (check.out / "environment.json").write_text(json.dumps(info, indent=2))
    check.cuda = bool(info.get("cuda"))
    where = info.get("device") if check.cuda else "no CUDA device: the device steps will be skipped"
    versions = f"python {info['python']}, torch {info.get('torch')}, triton {info.get('triton')}"
    return "passed", f"{versions}: {where}"


def _wheels(check: Check) -> tuple[str, str]:
    wheels = sorted(glob.glob(str(check.wheels / "*.whl")))
    if not wheels:
        return "skipped", f"no wheels in {check.wheels} (make gpu-wheels downloads them; fine where the " \
                          "dependencies are installed)"
    code, _ = check.run("wheels", [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                   "--upgrade", "--target", str(check.site), *wheels], CAPS["wheels"])
    if code != 0:
        return "failed", f"pip install exited {code}"
    check.env["PYTHONPATH"] = os.pathsep.join([str(check.site), check.env["PYTHONPATH"]])
    names = ", ".join(Path(w).name.split("-")[0] for w in wheels)
    return "passed", f"{len(wheels)} wheels into {check.site}: {names}"


def _imports(check: Check, module: str) -> bool:
    code, _ = check.run("build", [sys.executable, "-c", f"import {module}"], 60)
    return code == 0


def _build(check: Check) -> tuple[str, str]:
    missing = [m for m in _EXTENSIONS if not _imports(check, m)]
    if not missing:
        return "passed", "the C extensions import already"
    code, _ = check.run("build", [sys.executable, "setup.py", "build_ext", "--inplace", "--parallel", "8"],
                        CAPS["build"])
    still = [m for m in _EXTENSIONS if not _imports(check, m)]
    if code != 0 or still:
        return "failed", f"build_ext exited {code}; not importable: {still or 'none'}"
    return "passed", f"built {', '.join(missing)}"


def _pytest(check: Check, name: str, args: list[str]) -> tuple[str, str]:
    if not check.cuda:
        return "skipped", "no CUDA device (torch.cuda.is_available() is False); on a CPU the GPU path's " \
                          "tests run in Triton's interpreter under plain pytest (tests/test_codec_gpu.py)"
    report = check.out / f"{name}.xml"
    code, text = check.run(name, [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                                  "--timeout", "240", f"--junitxml={report}", *args], CAPS[name])
    tail = (text.strip().splitlines() or ["no output"])[-1]
    return ("passed" if code == 0 else "failed"), tail


#: The ``tests`` step runs the gpu-marked tests of these files; ``kernels`` runs the first file whole.
KERNEL_TESTS = "tests/test_codec_gpu.py"
DEVICE_TESTS = [KERNEL_TESTS, "tests/test_codec.py", "tests/test_torch_hook.py",
                "tests/test_torch_backend.py"]


def _kernels(check: Check) -> tuple[str, str]:
    return _pytest(check, "kernels", ["-n", "4", KERNEL_TESTS])


def _tests(check: Check) -> tuple[str, str]:
    return _pytest(check, "tests", ["-m", "gpu", *DEVICE_TESTS])


_BENCH = [  # (what, lhc-bench codec arguments): the default case first
    ("default case", ["--density", "0.01", "--mode", "sketch,union", "--layout", "plain,fused"]),
    ("0.1% and 5%", ["--density", "0.001,0.05", "--mode", "sketch"]),
]


def _bench(check: Check) -> tuple[str, str]:
    if not check.cuda:
        return "skipped", "no CUDA device: lhc-bench codec --device cuda needs one (on a CPU, " \
                          "lhc-bench codec --json counts the GPU path's launches in Triton's interpreter)"
    failures = []
    jsonl = check.out / "codec.jsonl"
    for what, args in _BENCH:
        code, text = check.run("bench", [sys.executable, "-m", "benchmarks.cli", "codec", "--device", "cuda",
                                         "--repeats", "7", "--json", *args], CAPS["bench"] / 2)
        rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        with jsonl.open("a") as sink:
            sink.writelines(json.dumps(row) + "\n" for row in rows)
        check.cases.extend(rows)
        if code != 0 or not rows:
            failures.append(f"{what}: exit {code}, {len(rows)} rows")
    targets = _targets(check.cases)
    failures += [f"{name}: {verdict}" for name, verdict in targets.items() if not verdict.startswith("met")]
    check.targets = targets
    if failures:
        return "failed", "; ".join(failures)
    return "passed", "; ".join(f"{name} {verdict}" for name, verdict in targets.items())


def _targets(cases: list[dict]) -> dict[str, str]:
    """The issue's targets at the default case (sketch, the layout a GPU job takes by default)."""
    default = [c for c in cases if c["mode"] == "sketch" and c["density"] == 0.01 and c["layout"] == "plain"]
    if not default:
        return {"default case": "missing: no sketch row at 1% with the plain layout"}
    case = default[0]
    launches = (case.get("gpu_launches") or {}).get("decode")
    return {
        "encode_memcpy": _verdict(case["encode_memcpy"], TARGETS["encode_memcpy"]),
        "decode_memcpy": _verdict(case["decode_memcpy"], TARGETS["decode_memcpy"]),
        "decode_launches": _verdict(launches, TARGETS["decode_launches"]),
        "exact": "met" if all(c["exact"] for c in cases) else "missed: a total was not exact",
    }


def _verdict(value: float | None, bound: float) -> str:
    if value is None:
        return "missed: not measured"
    return f"{'met' if value <= bound else 'missed'} ({value:.3g} <= {bound:g})"


RUNNERS = {"environment": _environment, "wheels": _wheels, "build": _build, "kernels": _kernels,
           "bench": _bench, "tests": _tests}


def _summary(check: Check, started: float) -> int:
    failed = [s["step"] for s in check.steps if s["status"] == "failed"]
    summary = {"passed": not failed, "failed": failed, "seconds": round(time.monotonic() - started, 1),
               "steps": check.steps, "targets": check.targets,
               "default_case": [c for c in check.cases if c["density"] == 0.01]}
    (check.out / "summary.json").write_text(json.dumps(summary, indent=2))
    lines = [f"gpu-check: {'PASSED' if not failed else 'FAILED: ' + ', '.join(failed)} "
             f"in {summary['seconds']:.0f} s"]
    lines += [f"  {s['step']:<12} {s['status']:<8} {s['seconds']:>5.0f} s  {s['detail']}"
              for s in check.steps]
    lines += [_case_line(case) for case in check.cases]
    text = "\n".join(lines) + "\n"
    (check.out / "summary.txt").write_text(text)
    print(text, end="")
    return 1 if failed else 0


def _case_line(case: dict) -> str:
    """One benchmark case: encode, decode and each decode stage in memcpys of the bucket, the device
    operations and host waits counted, exactness."""
    launches = case.get("gpu_launches") or {}
    memcpy = case["memcpy_s"]
    stages = ", ".join(f"{name} {seconds / memcpy:.2f}"
                       for name, seconds in (case.get("stage_s") or {}).items())
    return (f"  codec {case['mode']} {case['density']:g} {case['layout']}: encode {case['encode_memcpy']:.2f}"
            f" / decode {case['decode_memcpy']:.2f} memcpy ({memcpy * 1e6:.0f} us; decode stages:"
            f" {stages or 'none'}), launches {launches.get('encode')}/{launches.get('decode')}, host waits"
            f" {launches.get('encode_waits')}/{launches.get('decode_waits')}, exact {case['exact']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-check")
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    parser.add_argument("--site", type=Path, default=Path("/tmp/lhc-gpu-site"),
                        help="where the wheels are installed (default %(default)s)")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for every step together")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"a subset of {','.join(STEPS)}")
    args = parser.parse_args(argv)
    chosen = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(chosen) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}: choose among {', '.join(STEPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*"):
        if old.is_file():
            old.unlink()
    started = time.monotonic()
    check = Check(args.out.resolve(), args.wheels.resolve(), args.site, args.budget)
    for name in STEPS:
        if name not in chosen:
            continue
        if name != "environment" and "environment" not in chosen and not check.steps:
            _environment(check)  # the device steps need to know whether there is a device
        if check.left() < 15:
            check.record(name, "skipped", 0.0, "out of time (--budget)")
            continue
        begun = time.monotonic()
        try:
            status, detail = RUNNERS[name](check)
        except Exception as exc:  # one step's failure must not stop the others
            status, detail = "failed", f"{type(exc).__name__}: {exc}"
        check.record(name, status, time.monotonic() - begun, detail)
    return _summary(check, started)


if __name__ == "__main__":
    sys.exit(main())
