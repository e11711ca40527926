"""TLS for the Dask connections of a fit: client ↔ scheduler ↔ workers, encrypted and mutually authenticated.

``tls_security()`` returns a ``distributed.security.Security`` with ``require_encryption=True`` and a key/certificate
for each role (client, scheduler, worker), so every connection of the cluster must use ``tls://``:

- ``tls_security(cert_dir)``: files ``ca.pem`` (the CA certificate every side trusts), ``cert.pem`` and ``key.pem``
  (a certificate signed by that CA, and its private key) in ``cert_dir``; or give ``ca_file``/``cert_file``/
  ``key_file`` explicitly. Use files when the scheduler, workers and client start separately (``dask scheduler
  --tls-ca-file ca.pem --tls-cert cert.pem --tls-key key.pem``, batch jobs reading them from a shared filesystem).
- ``tls_security()``: a temporary self-signed certificate made in memory by ``Security.temporary()`` (which needs
  ``cryptography``); enough for an embedded ``LocalCluster`` and for dask-jobqueue (which writes the temporary
  files for its jobs to its ``shared_temp_directory``).

``write_tls_files(cert_dir)`` creates such a self-signed ``ca.pem``/``cert.pem``/``key.pem`` set with
``cryptography`` (the key readable by its owner only). A self-signed certificate authenticates "holds the key", not a
host name: keep ``key.pem`` private, and use your site's CA for anything beyond one user's own cluster.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from spatialfed.errors import SpatialFedError

CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "cert.pem", "key.pem"
ROLES = ("client", "scheduler", "worker")


class TLSConfigError(SpatialFedError, ValueError):
    """Certificate files missing or unreadable."""


def _security_from(ca: str, cert: str, key: str):
    """Security requiring TLS with the same CA, certificate and key for every role (file paths or PEM text)."""
    from distributed.security import Security

    roles = {}
    for role in ROLES:
        roles[f"tls_{role}_cert"] = cert
        roles[f"tls_{role}_key"] = key
    return Security(require_encryption=True, tls_ca_file=ca, **roles)


def self_signed_pem(common_name: str = "spatialfed", days: int = 365) -> tuple[str, str]:
    """(certificate PEM, private key PEM) of a new self-signed certificate that serves as its own CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(tz=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=int(days)))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return cert_pem, key_pem


def write_tls_files(cert_dir, *, common_name: str = "spatialfed", days: int = 365, overwrite: bool = False) -> Path:
    """Write a self-signed ca.pem / cert.pem / key.pem set into `cert_dir` (key mode 0600); returns the directory."""
    out = Path(cert_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / CA_FILE, out / CERT_FILE, out / KEY_FILE]
    if not overwrite and any(p.exists() for p in paths):
        raise TLSConfigError(f"{out} already holds TLS files; pass overwrite=True to replace them")
    cert_pem, key_pem = self_signed_pem(common_name, days)
    paths[0].write_text(cert_pem)
    paths[1].write_text(cert_pem)
    fd = os.open(paths[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key_pem)
    os.chmod(paths[2], 0o600)
    return out


def tls_security(cert_dir=None, *, ca_file=None, cert_file=None, key_file=None):
    """A ``distributed.security.Security`` requiring TLS for client, scheduler and workers.

    From files (``cert_dir`` with ca.pem, cert.pem, key.pem, each overridable by ``ca_file``/``cert_file``/
    ``key_file``), or, with no argument, a temporary in-memory self-signed certificate (``Security.temporary()``,
    falling back to ``self_signed_pem`` where that method is missing).
    """
    explicit = (ca_file, cert_file, key_file)
    if cert_dir is None and all(f is None for f in explicit):
        from distributed.security import Security

        if hasattr(Security, "temporary"):
            return Security.temporary()
        cert_pem, key_pem = self_signed_pem()  # pragma: no cover - older distributed
        return _security_from(cert_pem, cert_pem, key_pem)  # pragma: no cover
    base = Path(cert_dir) if cert_dir is not None else None
    files = []
    for given, default, what in zip(explicit, (CA_FILE, CERT_FILE, KEY_FILE), ("CA certificate", "certificate", "key")):
        if given is None and base is None:
            raise TLSConfigError(f"no {what} file given: pass cert_dir or all of ca_file, cert_file, key_file")
        path = Path(given) if given is not None else base / default
        if not path.is_file():
            raise TLSConfigError(f"TLS {what} file {path} not found (expected {CA_FILE}, {CERT_FILE}, {KEY_FILE} in "
                                 "the certificate directory; spatialfed.runtime.security.write_tls_files makes a "
                                 "self-signed set)")
        files.append(str(path.resolve()))
    _check_pem(*files)
    return _security_from(*files)


def _check_pem(ca_file: str, cert_file: str, key_file: str) -> None:
    """Load the three files into an SSL context now, so a malformed PEM is one TLSConfigError naming the file
    instead of a cluster that fails to start."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    checks = ((f"CA certificate {ca_file}", lambda: ctx.load_verify_locations(cafile=ca_file)),
              (f"certificate {cert_file} or key {key_file}", lambda: ctx.load_cert_chain(cert_file, key_file)))
    for what, load in checks:
        try:
            load()
        except (ssl.SSLError, ValueError) as exc:
            raise TLSConfigError(f"TLS {what} is not a valid PEM file ({exc}); replace it (write_tls_files in "
                                 "spatialfed.runtime.security makes a self-signed set)") from None


#: address schemes whose connections are encrypted and authenticated
SECURE_SCHEMES = ("tls", "wss")


class InsecureSchedulerError(SpatialFedError, ValueError):
    """A plain-TCP scheduler off this machine, refused unless the user says insecure."""


def off_machine_plain(address: str) -> str | None:
    """The host of `address` when it is plain TCP (no tls:// or wss://) and not a loopback address (127.0.0.0/8,
    ::1, localhost); None otherwise. A name other than localhost counts as off the machine (it is not resolved)."""
    import ipaddress

    scheme, sep, rest = str(address).partition("://")
    if not sep:
        scheme, rest = "tcp", str(address)
    if scheme.lower() in SECURE_SCHEMES or scheme.lower() == "inproc":
        return None
    host = rest[1:rest.index("]")] if rest.startswith("[") and "]" in rest else rest.rsplit(":", 1)[0]
    host = host or "0.0.0.0"  # tcp://:8786 listens everywhere
    if host.lower() == "localhost":
        return None
    try:
        return None if ipaddress.ip_address(host).is_loopback else host
    except ValueError:
        return host


def refuse_plain_remote(where: str, host: str, how: str, insecure_flag: str) -> None:
    """Raise the one line refusing plain TCP to/on `host` (`where`: what connects or listens)."""
    raise InsecureSchedulerError(
        f"{where} is plain TCP on {host}, not this machine: anyone who can reach it, or any worker that joins, can "
        f"run code in this process (Dask's results are pickles); {how}, or give {insecure_flag} to use it "
        "unencrypted (docs/hpc.md)")
