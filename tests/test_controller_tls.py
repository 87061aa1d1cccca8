"""TLS on every control socket, with real processes over real gRPC: softswitch's P4Runtime server and the
controller's switch session (server TLS and mutual TLS; a wrong certificate on either side is refused with
an error that says so), the job service and its clients (the library, the CLI by flag and by environment),
and the warning for plaintext off loopback. Certificates are made fresh in the test's temporary folder.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from lhc_ina.jobservice.client import JobClient
from lhc_ina.jobservice.errors import ControllerError
from lhc_ina.p4rt import P4RuntimeClient, P4RuntimeError
from lhc_ina.tls import TlsConfig, is_loopback
from lhc_launch.processes import ControllerProcess, SoftswitchProcess
from tests.harness.certs import CertificateAuthority, Leaf

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Leaf]:
    """One CA for the deployment, and a stranger's CA whose certificates it must refuse."""
    folder = tmp_path_factory.mktemp("pki")
    ca, stranger = CertificateAuthority(folder, "lhc"), CertificateAuthority(folder, "stranger")
    return {"switch": ca.issue("switch"), "controller": ca.issue("controller"),
            "intruder": stranger.issue("intruder")}


def _tls_args(leaf: Leaf, ca: Path | None = None) -> tuple[str, ...]:
    return ("--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key), "--tls-ca", str(ca or leaf.ca))


def _switch_status(ctl: ControllerProcess, timeout: float = 20.0, *, connected: bool):
    """The controller's view of the switch once it is (or, after some attempts, still is not) connected."""
    deadline = time.monotonic() + timeout
    status = ctl.client.switch_status()
    while status.connected != connected or (not connected and not status.last_error):
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
        status = ctl.client.switch_status()
    return status


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli", *argv], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=60)


@pytest.mark.slow
def test_mutual_tls_between_controller_and_softswitch(pki, tmp_path):
    switch, controller, intruder = pki["switch"], pki["controller"], pki["intruder"]
    with SoftswitchProcess(args=_tls_args(switch)) as sw:
        assert sw.tls == "mutual"
        with ControllerProcess(sw, tmp_path / "ok", *_tls_args(controller), tls=TlsConfig(ca=controller.ca)
                               ) as ctl:  # fmt: skip
            assert (ctl.ready["tls"], ctl.ready["switch_tls"], ctl.ready["auth"]) == ("tls", "mutual", "open")
            ctl.wait_for_switch()
            ctl.client.create_job("secure", workers=1, slots=2)
            ctl.client.join("secure", ip="127.0.0.1", udp_port=4000)
            assert ctl.client.status("secure").installed

        # The switch's CA did not sign the intruder's certificate: the handshake is refused, and the
        # controller says so (in switch status and its log) instead of "no switch there".
        with ControllerProcess(sw, tmp_path / "intruder", *_tls_args(intruder, ca=switch.ca),
                               tls=TlsConfig(ca=intruder.ca)) as ctl:  # fmt: skip
            status = _switch_status(ctl, connected=False)
            assert "refused this client's certificate" in status.last_error, status.last_error
        assert "refused this client's certificate" in ctl.log()

        # The same from a bare P4Runtime client: no certificate at all, a stranger's, plaintext, and a
        # server certificate this client's CA did not sign.
        refusals = {
            "no client certificate": (TlsConfig(ca=switch.ca), "refused this client's certificate"),
            "a stranger's certificate": (intruder.tls(ca=switch.ca), "refused this client's certificate"),
            "plaintext": (None, "it may require TLS"),
            "a stranger's CA": (controller.tls(ca=intruder.ca), "does not accept the server's certificate"),
        }
        for case, (tls, words) in refusals.items():
            with pytest.raises(P4RuntimeError) as info:
                P4RuntimeClient(sw.grpc_addr, tls=tls, timeout=2).connect()
            assert words in str(info.value), (case, info.value)
            assert info.value.code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.slow
def test_server_tls_without_client_certificates(pki, tmp_path):
    switch = pki["switch"]
    with SoftswitchProcess(args=("--tls-cert", str(switch.cert), "--tls-key", str(switch.key))) as sw:
        assert sw.tls == "tls"
        with ControllerProcess(sw, tmp_path, "--tls-ca", str(switch.ca)) as ctl:
            assert (ctl.ready["tls"], ctl.ready["switch_tls"]) == ("plaintext", "tls")
            ctl.wait_for_switch()
        with ControllerProcess(sw, tmp_path) as ctl:  # plaintext to a TLS switch: refused, and said so
            assert "it may require TLS" in _switch_status(ctl, connected=False).last_error


def test_softswitch_refuses_a_ca_without_its_own_certificate(pki):
    done = subprocess.run([sys.executable, "-m", "softswitch.cli", "--grpc-addr", "127.0.0.1:0",
                           "--tls-ca", str(pki["switch"].ca)], capture_output=True, text=True, cwd=REPO,
                          timeout=60)  # fmt: skip
    assert done.returncode != 0 and "needs a certificate and its key" in done.stderr


def test_job_service_over_tls(pki, tmp_path):
    controller, intruder = pki["controller"], pki["intruder"]
    served = ("--tls-cert", str(controller.cert), "--tls-key", str(controller.key))
    with (
        SoftswitchProcess() as sw,
        ControllerProcess(sw, tmp_path, *served, tls=TlsConfig(ca=controller.ca)) as ctl,
    ):
        assert (ctl.ready["tls"], ctl.ready["switch_tls"]) == ("tls", "plaintext")
        ctl.wait_for_switch()
        ctl.client.create_job("tls-job", workers=1)
        with JobClient(ctl.listen) as plain, pytest.raises(ControllerError) as info:
            plain.list_jobs()
        assert info.value.code == grpc.StatusCode.UNAVAILABLE and "may require TLS" in info.value.message
        doubtful = JobClient(ctl.listen, tls=TlsConfig(ca=intruder.ca))
        with doubtful, pytest.raises(ControllerError) as info:
            doubtful.list_jobs()
        assert "does not accept the server's certificate" in info.value.message, info.value.message

        by_flag = _cli("--controller", ctl.listen, "--tls-ca", str(controller.ca), "job", "list")
        assert by_flag.returncode == 0 and "tls-job" in by_flag.stdout, by_flag.stderr
        by_env = _cli("--controller", ctl.listen, "job", "list", env={"LHC_TLS_CA": str(controller.ca)})
        assert by_env.returncode == 0 and "tls-job" in by_env.stdout, by_env.stderr
        refused = _cli("--controller", ctl.listen, "job", "list")
        assert refused.returncode == 6 and "may require TLS" in refused.stderr


def test_plaintext_off_loopback_warns(caplog, tmp_path, pki):
    assert is_loopback("127.0.0.1:9559") and is_loopback("[::1]:1") and is_loopback("localhost:9560")
    assert not is_loopback("0.0.0.0:9560") and not is_loopback("10.0.0.254:9560")
    # Channels connect lazily: these make no connection, they only say what they would do.
    with caplog.at_level(logging.WARNING, logger="lhc.tls"):
        JobClient("127.0.0.1:9560").close()
        JobClient("192.0.2.1:9560", tls=TlsConfig(ca=pki["controller"].ca)).close()
        assert not caplog.records
        JobClient("192.0.2.1:9560").close()
    assert [r.getMessage() for r in caplog.records] == [
        "plaintext gRPC to 192.0.2.1:9560, which is not loopback: anyone on the path can read and change it; "
        "give a CA (--tls-ca or LHC_TLS_CA) to use TLS"
    ]
    # Servers listening on every interface in plaintext say so; the open job service says it too.
    with SoftswitchProcess(args=("--grpc-addr", "0.0.0.0:0")) as everywhere:
        pass
    assert "plaintext gRPC server on 0.0.0.0:0, which is not loopback" in everywhere.log()
    with SoftswitchProcess() as sw, ControllerProcess(sw, tmp_path, "--listen", "0.0.0.0:0") as ctl:
        pass
    assert "plaintext gRPC server on 0.0.0.0:0, which is not loopback" in ctl.log()
    assert "no --token-file and listening on 0.0.0.0:0" in ctl.log()
    assert "which is not loopback" not in sw.log()
