"""TLS for the gateway (rigkit.gateway.tls): the fleet CA kept on the control machine, the certificate
it issues and renews, a certificate the user gives, and how rigkit's clients check what they reach.
Real: the `cryptography` library, files with their modes, and TLS handshakes by Python's ssl with a
server on 127.0.0.1 serving what rigkit issued. Nothing is simulated."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import ssl
import stat
import threading
from contextlib import contextmanager

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from rigkit.config.schema import GatewaySpec, GatewayTlsFiles
from rigkit.gateway import tls
from rigkit.gateway.plan import GatewayPlan
from rigkit.rigside.probe import pinned_context, pinned_file
from rigkit.gateway.stack import TLS_KEY_ENV, TLS_KEY_SECRET, render_compose, settings

NAMES = ("127.0.0.1", "localhost", "10.0.0.5", "gw.lan")
NOW = dt.datetime(2026, 12, 4, tzinfo=dt.timezone.utc)


def issued(folder, names=NAMES, now=NOW):
    material = tls.gateway_tls("rigkit", folder, names, now)
    material.save()
    return material


def leaf(material) -> x509.Certificate:
    return x509.load_pem_x509_certificates(material.cert_pem)[0]


def test_the_first_deploy_makes_the_ca_and_a_certificate_and_a_second_reuses_both(tmp_path):
    folder = tmp_path / "rigkit-ca"
    first = tls.gateway_tls("rigkit", folder, NAMES, NOW)
    assert not folder.exists()  # planning writes nothing: a dry run only reads
    assert {p.rsplit("/", 1)[1].split(".")[-1] for p, _, _ in first.pending} == {"pem", "key"}
    first.save()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((folder / "ca.pem").stat().st_mode) == 0o644
    keys = [p for p in folder.iterdir() if p.suffix == ".key"]
    assert len(keys) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in keys)
    second = tls.gateway_tls("rigkit", folder, NAMES, NOW + dt.timedelta(days=1))
    assert second.pending == () and second.cert_pem == first.cert_pem and second.key_pem == first.key_pem
    cert = leaf(second)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "gw.lan"}
    assert {str(a) for a in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.0.0.5"}
    assert cert.not_valid_after_utc - NOW <= dt.timedelta(days=tls.CERT_DAYS)


def test_new_names_or_a_near_expiry_get_a_new_certificate_from_the_same_ca(tmp_path):
    folder = tmp_path / "ca"
    first = issued(folder)
    ca = (folder / "ca.pem").read_bytes()
    renamed = tls.gateway_tls("rigkit", folder, (*NAMES, "gw2.lan"), NOW)
    assert renamed.pending and all(not p.endswith(("ca.pem", "ca.key")) for p, _, _ in renamed.pending)
    assert renamed.cert_pem.endswith(ca)  # the chain ends with the fleet's CA
    late = NOW + dt.timedelta(days=tls.CERT_DAYS - tls.RENEW_DAYS + 1)
    renewed = tls.gateway_tls("rigkit", folder, NAMES, late)
    assert renewed.pending and leaf(renewed).not_valid_after_utc > leaf(first).not_valid_after_utc
    assert (folder / "ca.pem").read_bytes() == ca


def test_a_half_present_or_mismatched_ca_is_refused_with_what_to_do(tmp_path):
    folder = tmp_path / "ca"
    issued(folder)
    (folder / "ca.key").unlink()
    with pytest.raises(tls.TlsError, match="ca.key is missing beside ca.pem; restore it"):
        tls.gateway_tls("rigkit", folder, NAMES, NOW)
    other = tmp_path / "other"
    issued(other)
    (folder / "ca.key").write_bytes((other / "ca.key").read_bytes())
    (folder / "ca.key").chmod(0o600)
    with pytest.raises(tls.TlsError, match="ca.key is not the key of ca.pem"):
        tls.gateway_tls("rigkit", folder, NAMES, NOW)
    (folder / "ca.key").chmod(0o644)
    with pytest.raises(tls.TlsError, match="readable by others; run chmod 600"):
        tls.gateway_tls("rigkit", folder, NAMES, NOW)


@contextmanager
def https_server(material, folder):
    """A real TLS server on 127.0.0.1 serving `material` (what LiteLLM would serve)."""
    (folder / "chain.pem").write_bytes(material.cert_pem)
    (folder / "key.pem").write_bytes(material.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "chain.pem", folder / "key.pem")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_rigkits_clients_accept_only_the_certificate_deployed_and_users_verify_the_ca_and_the_name(tmp_path):
    folder = tmp_path / "ca"
    deployed = issued(folder, now=dt.datetime.now(dt.timezone.utc))
    with https_server(deployed, tmp_path) as port:
        # rigkit's own clients: the deployed certificate pinned, at whatever name (an SSH forward's 127.0.0.1).
        assert httpx.get(f"https://127.0.0.1:{port}/", verify=pinned_context(deployed.cert_pem.decode())).text == "ok"
        # A user's client: the fleet CA and the host name, as any HTTPS client checks them.
        ca = ssl.create_default_context(cafile=str(folder / "ca.pem"))
        assert httpx.get(f"https://localhost:{port}/", verify=ca).text == "ok"
        # Not the system's CAs (the fleet CA is rigkit's own), not another certificate of the same CA.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"https://127.0.0.1:{port}/")
        sibling = tls.gateway_tls("rigkit", folder, ("127.0.0.1", "other"), dt.datetime.now(dt.timezone.utc))
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"https://127.0.0.1:{port}/", verify=pinned_context(sibling.cert_pem.decode()))
        # The rig-side probes (the helper, `rigkit status`) pin the deployed chain file's leaf the same way.
        (tmp_path / "deployed.pem").write_bytes(deployed.cert_pem)
        (tmp_path / "sibling.pem").write_bytes(sibling.cert_pem)
        assert httpx.get(f"https://127.0.0.1:{port}/", verify=pinned_file(str(tmp_path / "deployed.pem"))).text == "ok"
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"https://127.0.0.1:{port}/", verify=pinned_file(str(tmp_path / "sibling.pem")))


def user_files(tmp_path, material, key_mode=0o600):
    cert, key = tmp_path / "user.pem", tmp_path / "user.key"
    cert.write_bytes(material.cert_pem)
    key.write_bytes(material.key_pem)
    key.chmod(key_mode)
    return GatewayTlsFiles(cert_file=str(cert), key_file=str(key))


def test_a_users_certificate_is_served_as_given_and_checked_first(tmp_path):
    material = issued(tmp_path / "theirs")
    files = user_files(tmp_path, material)
    given = tls.gateway_tls(files, tmp_path / "unused", NAMES, NOW)
    assert given.cert_pem == material.cert_pem and given.pending == () and not given.issued_by_rigkit
    assert not (tmp_path / "unused").exists()
    other = issued(tmp_path / "other")
    (tmp_path / "user.key").write_bytes(other.key_pem)
    with pytest.raises(tls.TlsError, match="is not the key of the first certificate"):
        tls.gateway_tls(files, tmp_path, NAMES, NOW)
    user_files(tmp_path, material, key_mode=0o640)
    with pytest.raises(tls.TlsError, match="gateway.tls.key_file .* readable by others"):
        tls.gateway_tls(files, tmp_path, NAMES, NOW)
    user_files(tmp_path, material)
    with pytest.raises(tls.TlsError, match="expired on"):
        tls.gateway_tls(files, tmp_path, NAMES, NOW + dt.timedelta(days=tls.CERT_DAYS + 1))
    encrypted = serialization.load_pem_private_key(material.key_pem, None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"))
    (tmp_path / "user.key").write_bytes(encrypted)
    with pytest.raises(tls.TlsError, match="is encrypted; the gateway needs the key without a passphrase"):
        tls.gateway_tls(files, tmp_path, NAMES, NOW)
    (tmp_path / "user.pem").write_text("not a certificate\n")
    with pytest.raises(tls.TlsError, match="holds no PEM certificate"):
        tls.gateway_tls(files, tmp_path, NAMES, NOW)


def test_the_compose_file_carries_the_chain_and_names_the_key_without_holding_it(tmp_path):
    material = issued(tmp_path / "ca")
    spec = GatewaySpec(master_key_file=str(tmp_path / "master.key"))
    plan = GatewayPlan("gw", spec, (), (), "10.0.0.5")
    text = render_compose(plan, material.cert_pem)
    document = json.loads(text[text.index("{"):])
    service = document["services"]["litellm"]
    assert service["command"][-4:] == ["--ssl_certfile_path", "/etc/litellm/tls-cert.pem",
                                       "--ssl_keyfile_path", f"/run/secrets/{TLS_KEY_SECRET}"]
    assert document["secrets"] == {TLS_KEY_SECRET: {"environment": TLS_KEY_ENV}}
    assert service["secrets"] == [{"source": TLS_KEY_SECRET, "target": TLS_KEY_SECRET, "mode": 0o400}]
    assert document["configs"]["tls_cert"]["content"].encode() == material.cert_pem
    assert b"PRIVATE KEY" not in text.encode() and material.key_pem.decode().splitlines()[1] not in text
    helper = json.loads(settings(plan))
    assert helper["url"] == "https://127.0.0.1:4000" and helper["tls_key_env"] == TLS_KEY_ENV
    plain = GatewayPlan("gw", spec.model_copy(update={"tls": "none"}), (), (), "10.0.0.5")
    assert "ssl" not in render_compose(plain, None) and json.loads(settings(plain))["url"] == "http://127.0.0.1:4000"


def test_the_names_and_where_the_ca_lives(tmp_path):
    assert tls.wanted_names("gw.lan", "0.0.0.0", ("10.1.1.1",)) == ("127.0.0.1", "localhost", "gw.lan", "10.1.1.1")
    assert tls.wanted_names("127.0.0.1", "127.0.0.1", ()) == ("127.0.0.1", "localhost")
    spec = GatewaySpec(master_key_file="~/fleet/master.key")
    assert str(tls.ca_dir(spec)).endswith("/fleet/rigkit-ca") and "~" not in str(tls.ca_dir(spec))
    assert tls.ca_dir(spec.model_copy(update={"ca_dir": str(tmp_path)})) == tmp_path
    lan = spec.model_copy(update={"tls": "none", "bind_address": "10.0.0.5"})
    assert "cross the network in clear" in tls.plain_http_warning("gw", lan)
    assert tls.plain_http_warning("gw", spec.model_copy(update={"tls": "none"})) is None
    assert tls.plain_http_warning("gw", spec.model_copy(update={"bind_address": "10.0.0.5"})) is None
