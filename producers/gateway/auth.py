"""Who may publish what for which cluster: the gateway's auth file of hashed secrets, checking credentials,
and the role each credential has.

The file (TOML, `--auth-file`) names each cluster the gateway serves, its credentials and their roles:

    [clusters."fox.educloud.no"]
    secret = "pbkdf2-sha256$200000$<salt>$<hash>"      # hpcbus gateway --hash-secret < secret.txt
    role = "master"                                    # the batch-system master: job and cluster records
    sonar_token = "pbkdf2-sha256$..."                  # optional: Sonar's meta.token must match

    [clusters."fox.educloud.no".credentials.n001]       # a node's own credential: password "n001:<secret>"
    secret = "pbkdf2-sha256$..."
    hosts = ["n001", "n001.fox.educloud.no"]           # default: [the credential's name]; hostlists allowed

    [clusters."fox.educloud.no".credentials.profile]    # one credential all nodes share (Slurm's profile
    secret = "pbkdf2-sha256$..."                       # plugin has one password in slurm.conf)
    hosts = ["c[001-500]"]

A `node` credential may send what `schemas.trust` allows a node (metrics, its logs, `nodejob`, Sonar
samples and sysinfo) about its `hosts` only, as `consume ingest` checks a node's ingest subject; a `master`
credential may send everything the gateway forwards (Sonar job and cluster records too). Every credential
says its role: there is no default, so an auth file written before roles existed stops the gateway with the
reason instead of leaving every node able to post Slurm records.

The cluster of a request comes from its credentials, never from its body: HTTP Basic with the cluster name
as user (what Sonar's HTTP sink and the Slurm profile plugin send, and InfluxDB 1.x's `u`/`p` parameters), or
`Authorization: Token <cluster>:<secret>` (InfluxDB 1.8's form of a v2 token). A named credential's secret is
given as `<name>:<secret>` where the cluster's own goes (the user stays the cluster: Sonar sends its cluster
name as the user and cannot be told otherwise). Hashes are PBKDF2-SHA256 from the standard library, so a
leaked file does not give the secrets away; checking one costs tens of milliseconds, so it runs in a thread
and a secret that checked out once is remembered (as a keyed digest, bounded) for the requests after it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import tomllib
from collections import OrderedDict

import msgspec

from hpcbus.options import SettingsError
from hpcbus.schemas import noderange, subjects
from hpcbus.schemas.names import host_problem
from hpcbus.schemas.trust import Role

SCHEME = "pbkdf2-sha256"
ITERATIONS = 200_000
"""PBKDF2 rounds of new hashes (OWASP's 2023 advice for SHA-256 is 600,000; a secret here is a random
token, not a person's password, so a third of that costs attackers the same as a long password would)."""

MAX_REMEMBERED = 1024
"""Checked credentials kept in memory (one per cluster and secret in use)."""


class Credential(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A named credential of a cluster (`[clusters.<c>.credentials.<name>]`): a node's, or a master's."""

    secret: str
    """Hash of its secret (given as `<name>:<secret>` where the password goes)."""
    role: Role = "node"
    """`node` (what `schemas.trust` allows a node, about `hosts` only) or `master` (everything)."""
    hosts: list[str] = []
    """Role node: the hosts it speaks for, host names or Slurm hostlists (`c[001-500]`); default its name."""


class ClusterAuth(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    secret: str = ""
    """Hash of the cluster's own secret (Basic password, or the part after `<cluster>:` of a Token); "" for a
    cluster whose every client has a named credential."""
    role: Role | None = None
    """The role of the cluster's own secret (required with it): `master` or `node` (with `hosts`)."""
    hosts: list[str] = []
    """Role node: the hosts the cluster's own secret speaks for (host names or hostlists)."""
    sonar_token: str = ""
    """Hash of the `meta.token` every Sonar envelope of this cluster must carry ("" = not checked)."""
    credentials: dict[str, Credential] = {}
    """Named credentials (`<name>:<secret>` as the password), each with its role and hosts."""


class Identity(msgspec.Struct, frozen=True):
    """Who a request's credentials prove it is: the cluster, the role, and for a node the hosts."""

    cluster: str
    role: Role
    hosts: frozenset[str] = frozenset()
    name: str = ""
    """The credential's name in reasons: the cluster for its own secret, else `<cluster>/<name>`."""


class AuthFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    clusters: dict[str, ClusterAuth]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_secret(secret: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    """`pbkdf2-sha256$<rounds>$<salt>$<hash>` of `secret` (salt and hash unpadded base64url)."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, iterations)
    return f"{SCHEME}${iterations}${_b64(salt)}${_b64(digest)}"


def _parse_hash(hashed: str) -> tuple[int, bytes, bytes]:
    """(rounds, salt, digest); ValueError naming what is wrong."""
    parts = hashed.split("$")
    if len(parts) != 4 or parts[0] != SCHEME:
        raise ValueError(
            f"not a {SCHEME}$<rounds>$<salt>$<hash> string (make one with `hpcbus gateway --hash-secret`)"
        )
    try:
        rounds = int(parts[1])
        salt, digest = _unb64(parts[2]), _unb64(parts[3])
    except (ValueError, binascii.Error) as exc:
        raise ValueError(f"unreadable hash ({exc})") from None
    if rounds < 1 or not salt or len(digest) != 32:
        raise ValueError("unreadable hash (rounds, salt or digest length)")
    return rounds, salt, digest


def verify(secret: str, hashed: str) -> bool:
    """Does `secret` match `hashed` (constant-time comparison)."""
    rounds, salt, digest = _parse_hash(hashed)
    return hmac.compare_digest(hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, rounds), digest)


def load_auth_file(path: str) -> dict[str, ClusterAuth]:
    """The clusters of an auth file; `SettingsError` (exit 2) naming the file and the key that is wrong."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise SettingsError(f"--auth-file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"--auth-file {path}: not TOML: {exc}") from None
    try:
        parsed = msgspec.convert(raw, AuthFile)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"--auth-file {path}: {exc}") from None
    if not parsed.clusters:
        raise SettingsError(f'--auth-file {path}: no [clusters."<name>"] table')
    for name, entry in parsed.clusters.items():
        try:
            subjects.metrics(name)
        except subjects.SubjectError as exc:
            raise SettingsError(f"--auth-file {path}: clusters.{name}: {exc}") from None
        where = f'--auth-file {path}: clusters."{name}"'
        if not entry.secret and not entry.credentials:
            raise SettingsError(f"{where}: no secret and no [credentials]: nothing could post for it")
        if entry.secret and entry.role is None:
            raise SettingsError(
                f'{where}.role: missing: say who holds this secret, "master" (the batch-system master: may post '
                'job and cluster records) or "node" with hosts = [...] (may post what a node sends, about those '
                "hosts only; docs/security.md)"
            )
        for key in ("secret", "sonar_token"):
            value = getattr(entry, key)
            if value:
                _check_hash(f"{where}.{key}", value)
        if entry.secret:
            _check_hosts(f"{where}.hosts", entry.role, entry.hosts, None)
        for cred_name, cred in entry.credentials.items():
            at = f'{where}.credentials."{cred_name}"'
            if ":" in cred_name or not cred_name:
                raise SettingsError(
                    f"{at}: a credential's name may not be empty or hold ':' (it ends at the first ':')"
                )
            _check_hash(f"{at}.secret", cred.secret)
            _check_hosts(f"{at}.hosts", cred.role, cred.hosts, cred_name)
    return parsed.clusters


def _check_hash(where: str, value: str) -> None:
    try:
        _parse_hash(value)
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from None


def _check_hosts(where: str, role: Role | None, hosts: list[str], name: str | None) -> None:
    """A node credential names hosts (or is named by one); a master's names none (it speaks for any)."""
    if role == "master":
        if hosts:
            raise SettingsError(
                f"{where}: a master credential speaks for every host; hosts are for role node"
            )
        return
    if not hosts and name is None:
        raise SettingsError(f"{where}: role node needs the hosts it speaks for (host names or hostlists)")
    try:
        expanded = host_set(hosts, name)
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    bad = next((h for h in expanded if host_problem(h) is not None), None)
    if bad is not None:
        raise SettingsError(f"{where}: {host_problem(bad)}")


def host_set(hosts: list[str], name: str | None) -> frozenset[str]:
    """The hosts a node credential speaks for: its `hosts` (hostlists expanded), else its name."""
    if not hosts:
        return frozenset({name or ""})
    for entry in hosts:
        if not noderange.is_valid(entry):
            raise ValueError(f"{entry!r} is neither a host name nor a hostlist")
    return frozenset(noderange.expand_all(hosts))


class Busy(Exception):
    """`max_checks` secrets are being hashed already: the request is answered 503 instead of queueing."""


class Authenticator:
    """The clusters a gateway serves and how their requests prove it. `clusters is None`: open mode, every
    request is for `default` and credentials are not asked for.

    At most `max_checks` secrets that were not seen before are hashed at once: requests with wrong
    secrets cost tens of milliseconds of CPU each and come before any other admission, so without a bound
    a flood of them would queue without limit (memory) and keep good first-time clients waiting behind it.
    Beyond it `identity_of` raises `Busy` at once; credentials that checked out before are not hashed again
    and pass however busy it is."""

    def __init__(
        self, clusters: dict[str, ClusterAuth] | None, default: str = "", *, max_checks: int = 4
    ) -> None:
        self.entries = clusters
        self.default = default
        self.max_checks = max_checks
        self.checking = 0
        self._key = os.urandom(32)
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._identities: dict[tuple[str, str], tuple[str, Identity]] = {}
        """(cluster, credential name or "") -> (the hash to check, who it proves), hostlists expanded once."""
        for cluster, entry in (clusters or {}).items():
            if entry.secret and entry.role is not None:
                hosts = host_set(entry.hosts, cluster) if entry.role == "node" else frozenset()
                self._identities[cluster, ""] = entry.secret, Identity(cluster, entry.role, hosts, cluster)
            for name, cred in entry.credentials.items():
                hosts = host_set(cred.hosts, name) if cred.role == "node" else frozenset()
                self._identities[cluster, name] = (
                    cred.secret,
                    Identity(cluster, cred.role, hosts, f"{cluster}/{name}"),
                )

    @property
    def open(self) -> bool:
        return self.entries is None

    @property
    def clusters(self) -> list[str]:
        return [self.default] if self.entries is None else list(self.entries)

    def remembered(self, what: str, cluster: str, secret: str) -> tuple[bytes, bool]:
        """(key, whether these credentials checked out before); the key is a keyed digest, never the secret."""
        key = hmac.new(self._key, f"{what}\0{cluster}\0{secret}".encode(), "sha256").digest()
        if key in self._good:
            self._good.move_to_end(key)
            return key, True
        return key, False

    def remember(self, key: bytes) -> None:
        """Credentials that checked out (the oldest forgotten beyond `MAX_REMEMBERED`)."""
        self._good[key] = None
        while len(self._good) > MAX_REMEMBERED:
            self._good.popitem(last=False)

    def _credential(self, user: str, secret: str) -> tuple[str, str, Identity] | None:
        """(secret to check, its hash, who it proves) for `user`'s cluster: a named credential when the
        secret starts with `<name>:` of one, else the cluster's own secret."""
        name, sep, rest = secret.partition(":")
        named = self._identities.get((user, name)) if sep else None
        if named is not None:
            return rest, named[0], named[1]
        own = self._identities.get((user, ""))
        return None if own is None else (secret, own[0], own[1])

    async def identity_of(self, user: str, secret: str) -> Identity | None:
        """Who these credentials prove the request is, or None when they are not good."""
        if self.entries is None:
            return Identity(self.default, "master", name=self.default)
        found = self._credential(user, secret)
        if found is None:
            return None
        checked, hashed, identity = found
        key, known = self.remembered("secret", identity.name, checked)
        if known:
            return identity
        if self.checking >= self.max_checks:
            raise Busy(f"{self.checking} credential checks in progress")
        self.checking += 1
        try:
            good = await asyncio.to_thread(verify, checked, hashed)
        finally:
            self.checking -= 1
        if not good:
            return None
        self.remember(key)
        return identity

    def sonar_token_check(self, cluster: str) -> TokenCheck | None:
        """A check of Sonar's `meta.token` for `cluster`, or None when the cluster has no token set."""
        entry = None if self.entries is None else self.entries.get(cluster)
        if entry is None or not entry.sonar_token:
            return None
        return TokenCheck(self, cluster, entry.sonar_token)


class TokenCheck:
    """`check(token)`: synchronous (it runs inside the envelope reader, itself run in a thread)."""

    def __init__(self, auth: Authenticator, cluster: str, hashed: str) -> None:
        self.auth, self.cluster, self.hashed = auth, cluster, hashed

    def __call__(self, token: str) -> bool:
        try:
            token.encode()
        except UnicodeEncodeError:  # a lone surrogate (JSON `\ud800`) cannot be a token, nor be hashed
            return False
        if not token:
            return False
        key, known = self.auth.remembered("sonar", self.cluster, token)
        if known:
            return True
        if verify(token, self.hashed):
            self.auth.remember(key)
            return True
        return False
