"""TLS for the gateway (docs/security.md, "TLS on the gateway"): the certificate LiteLLM serves, either
one the user gives (`tls: {cert_file, key_file}`) or one rigkit issues from a CA it keeps for the fleet
(`tls: rigkit`, the default), on the control machine in `ca_dir`.

Nothing here writes while a deploy is only being planned (`--dry` only reads): `gateway_tls` returns
what should be served and, when rigkit issued something new, `TlsMaterial.save`, which the gateway
role runs as an operation before the files reach the rig. A deploy interrupted before it leaves the
old state (the next one issues again); one interrupted after it finds the saved certificate valid
and sends it. A saved certificate is reused while it names the same hosts, is signed by the fleet's
CA and has more than RENEW_DAYS left, so a second deploy changes nothing.

rigkit's own clients trust exactly the certificate deployed (`TlsMaterial.cert_pem`, through
rigkit.rigside.probe.pinned_context, which the rig-side probes use too) and skip the host name check:
they reach the gateway over SSH forwards and on the rig's loopback, where the name is the tunnel's, not
the certificate's. Pinning the deployed certificate is the stronger check there. Users' clients verify
the fleet CA (`ca.pem`) and the name.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rigkit.config.yamlfile import read_small_file

CA_DIR_NAME = "rigkit-ca"  # ca_dir's default: this folder beside the gateway's master_key_file
CA_CERT, CA_KEY = "ca.pem", "ca.key"
CA_DAYS = 3650
CERT_DAYS = 397  # the longest validity browsers accept; rigkit renews well before
RENEW_DAYS = 30  # a deploy issues a new certificate when the old one has fewer days left
MAX_PEM_BYTES = 64 * 1024  # a certificate chain or a key; not a log file given by mistake
LOOPBACK_NAMES = ("127.0.0.1", "localhost")  # rigkit's own probes on the gateway's rig


class TlsError(Exception):
    pass


@dataclass(frozen=True)
class TlsMaterial:
    """What the gateway serves and what rigkit's clients pin. `pending`: {path: (bytes, mode)} to
    write on the control machine before the rig gets the files (empty when nothing was issued)."""

    cert_pem: bytes  # the chain LiteLLM serves (leaf first)
    key_pem: bytes  # its private key: root-only on the rig, never in a rendered file
    issued_by_rigkit: bool
    pending: tuple[tuple[str, bytes, int], ...] = ()

    def save(self) -> None:
        """Write what was issued (the CA first, once: a CA that appeared meanwhile is not replaced)."""
        for path, data, mode in self.pending:
            _write_private(Path(path), data, mode, exclusive=Path(path).name in (CA_CERT, CA_KEY))


def wanted_names(gateway_address: str | None, bind_address: str, extra: tuple[str, ...]) -> tuple[str, ...]:
    """The names a gateway certificate covers: the rig's loopback (rigkit's probes), the address its
    clients use (the gateway rig's inventory address), the address it binds and `tls_names`."""
    names = [*LOOPBACK_NAMES]
    for name in (gateway_address, None if bind_address == "0.0.0.0" else bind_address, *extra):
        if name and name not in names:
            names.append(name)
    return tuple(names)


def gateway_tls(tls, ca_dir: Path, names: tuple[str, ...], now: dt.datetime | None = None) -> TlsMaterial:
    """The certificate the gateway serves. `tls`: "rigkit" or a TlsFiles (cert_file, key_file)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if tls == "rigkit":
        return _fleet_certificate(Path(ca_dir).expanduser(), names, now)
    return _user_certificate(tls, now)


# ----- rigkit's fleet CA ------------------------------------------------------


def _fleet_certificate(ca_dir: Path, names: tuple[str, ...], now: dt.datetime) -> TlsMaterial:
    pending: list[tuple[str, bytes, int]] = []
    ca = _load_ca(ca_dir)
    if ca is None:
        ca = _new_ca(now)
        pending += [(str(ca_dir / CA_KEY), _key_pem(ca[1]), 0o600), (str(ca_dir / CA_CERT), _cert_pem(ca[0]), 0o644)]
    ca_cert, ca_key = ca
    # One file pair per set of names, so two gateways sharing a CA folder never take turns replacing
    # each other's certificate (host names never become paths).
    stem = "gateway-" + hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:12]
    cert_path, key_path = ca_dir / f"{stem}.pem", ca_dir / f"{stem}.key"
    saved = _load_saved(cert_path, key_path)
    if saved is not None and not pending and _still_good(saved[0], ca_cert, names, now):
        cert, key = saved
    else:
        cert, key = _issue(ca_cert, ca_key, names, now)
        pending += [(str(key_path), _key_pem(key), 0o600), (str(cert_path), _cert_pem(cert), 0o644)]
    chain = _cert_pem(cert) + _cert_pem(ca_cert)
    return TlsMaterial(chain, _key_pem(key), True, tuple(pending))


def _load_ca(ca_dir: Path):
    cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
    if not cert_path.exists() and not key_path.exists():
        return None
    if not (cert_path.exists() and key_path.exists()):
        missing = cert_path if not cert_path.exists() else key_path
        raise TlsError(f"gateway.ca_dir {ca_dir}: {missing.name} is missing beside {CA_CERT if missing == key_path else CA_KEY}; "
                       "restore it from a backup, or move the folder away to make a new CA (every client then "
                       "needs the new ca.pem)")
    cert = _read_cert(cert_path, f"gateway.ca_dir {ca_dir}: {CA_CERT}")[0]
    key = _read_key(key_path, f"gateway.ca_dir {ca_dir}: {CA_KEY}")
    if not _same_key(cert, key):
        raise TlsError(f"gateway.ca_dir {ca_dir}: {CA_KEY} is not the key of {CA_CERT}")
    return cert, key


def _load_saved(cert_path: Path, key_path: Path):
    """A certificate rigkit issued before, or None when it is missing or unreadable (issued again)."""
    try:
        cert = _read_cert(cert_path, str(cert_path))[0]
        key = _read_key(key_path, str(key_path))
    except TlsError:
        return None
    return (cert, key) if _same_key(cert, key) else None


def _still_good(cert: x509.Certificate, ca_cert: x509.Certificate, names: tuple[str, ...], now: dt.datetime) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return set(_san_names(cert)) == set(names) and cert.not_valid_after_utc - now > dt.timedelta(days=RENEW_DAYS)


def _new_ca(now: dt.datetime):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rigkit fleet CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rigkit")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _issue(ca_cert: x509.Certificate, ca_key, names: tuple[str, ...], now: dt.datetime):
    key = ec.generate_private_key(ec.SECP256R1())
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rigkit gateway")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(min(now + dt.timedelta(days=CERT_DAYS), ca_cert.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _san_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName), *(str(a) for a in san.get_values_for_type(x509.IPAddress))]


# ----- a certificate the user gives -------------------------------------------


def _user_certificate(tls, now: dt.datetime) -> TlsMaterial:
    chain = _read_cert(Path(tls.cert_file).expanduser(), "gateway.tls.cert_file")
    key = _read_key(Path(tls.key_file).expanduser(), "gateway.tls.key_file")
    leaf = chain[0]
    if not _same_key(leaf, key):
        raise TlsError(f"gateway.tls.key_file {tls.key_file} is not the key of the first certificate in "
                       f"gateway.tls.cert_file {tls.cert_file}")
    if leaf.not_valid_after_utc <= now:
        raise TlsError(f"gateway.tls.cert_file {tls.cert_file}: the certificate expired on "
                       f"{leaf.not_valid_after_utc:%Y-%m-%d}; give a current one")
    pem = b"".join(_cert_pem(c) for c in chain)
    return TlsMaterial(pem, _key_pem(key), False)


# ----- files ------------------------------------------------------------------


def _read_cert(path: Path, what: str) -> list[x509.Certificate]:
    data = _read(path, what)
    try:
        chain = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TlsError(f"{what} {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)") from None
    return chain


def _read_key(path: Path, what: str):
    data = _read(path, what)
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TlsError(f"{what} {path} is readable by others; run chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TlsError(f"{what} {path} is encrypted; the gateway needs the key without a passphrase") from None
    except ValueError:
        raise TlsError(f"{what} {path} holds no PEM private key (-----BEGIN PRIVATE KEY-----)") from None
    return key


def _read(path: Path, what: str) -> bytes:
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise TlsError(f"{what} {path} is not a regular file")
        return read_small_file(path, MAX_PEM_BYTES)
    except FileNotFoundError:
        raise TlsError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise TlsError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None


def _write_private(path: Path, data: bytes, mode: int, exclusive: bool) -> None:
    """Write `data` with `mode` from the first byte (never briefly readable by others); a file that
    must not be replaced (`exclusive`) and exists already is an error."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.rigkit-new")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(temporary, flags, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if exclusive:
        try:
            os.link(temporary, path)  # fails if the file appeared meanwhile
        except FileExistsError:
            raise TlsError(f"{path} appeared while this deploy made a new CA (another deploy at once?); run again") from None
        finally:
            temporary.unlink(missing_ok=True)
    else:
        os.replace(temporary, path)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _same_key(cert: x509.Certificate, key) -> bool:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return (cert.public_key().public_bytes(serialization.Encoding.DER, spki)
            == key.public_key().public_bytes(serialization.Encoding.DER, spki))


def ca_dir(spec) -> Path:
    """The fleet CA's folder: `ca_dir`, else rigkit-ca beside the master key file."""
    if spec.ca_dir:
        return Path(spec.ca_dir).expanduser()
    return Path(spec.master_key_file).expanduser().parent / CA_DIR_NAME


def plain_http_warning(host: str, spec) -> str | None:
    """A gateway beyond loopback without TLS sends its keys and every prompt in clear."""
    if spec.tls == "none" and not spec.bind_address.startswith("127."):
        return (f"host {host}: the gateway listens on {spec.bind_address}:{spec.port} with tls: none: its key and every "
                "prompt cross the network in clear; remove `tls: none` (rigkit's CA) or give cert_file and key_file")
    return None


def plan_tls(plan) -> TlsMaterial | None:
    """What the gateway of `plan` (a GatewayPlan) serves, or None for `tls: none`. Raises TlsError."""
    if plan.spec.tls == "none":
        return None
    names = wanted_names(plan.address, plan.spec.bind_address, tuple(plan.spec.tls_names))
    return gateway_tls(plan.spec.tls, ca_dir(plan.spec), names)
