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
credential may send everything the gateway forwards (Sonar job and cluster records too). A cluster's own
secret must say its role (no default), so an auth file written before roles existed stops the gateway with
the reason instead of leaving every node able to post Slurm records; a named credential is a node's unless
it says `role = "master"`.

The cluster of a request comes from its credentials, never from its body: HTTP Basic with the cluster name
as user (what Sonar's HTTP sink and the Slurm profile plugin send, and InfluxDB 1.x's `u`/`p` parameters), or
`Authorization: Token <cluster>:<secret>` (InfluxDB 1.8's form of a v2 token). A named credential's secret is
given as `<name>:<secret>` where the cluster's own goes (the user stays the cluster: Sonar sends its cluster
name as the user and cannot be told otherwise). Hashes are PBKDF2-SHA256 from the standard library, so a
leaked file does not give the secrets away; checking one costs tens of milliseconds, so it runs in a thread,
at most `max_checks` at once and as many failed ones per peer address as its budget allows, and the result
(good or bad) is remembered as a keyed digest, bounded, for the requests after it (`Authenticator`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import os
import threading
import time
import tomllib
from collections import OrderedDict
from collections.abc import Callable

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
"""Credentials that checked out, kept in memory (one per cluster and secret in use)."""

MAX_FAILURES_REMEMBERED = 4096
"""Credentials that did not, kept in memory: a client retrying the same wrong secret is not hashed again,
and a flood of different ones cannot push the good ones out (they are kept apart)."""

MAX_PEERS = 16384
"""Peer addresses whose failed checks are counted (`FailureBudget`)."""


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
    """No check may start now (`max_checks` hashes under way, or the gateway stopping): answered 503 at
    once instead of queueing, nothing hashed."""


class Limited(Busy):
    """This peer address has spent its failed checks (`FailureBudget`): 503 at once, nothing hashed."""


def peer_key(address: str) -> str:
    """What a failed-check budget is kept for: the address, but an IPv6 address's /64 (one host commonly
    has a whole /64, so single addresses would give an attacker endless budgets)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class FailureBudget:
    """Failed credential checks per peer address: `burst` at first, then one more every `refill` seconds
    (a token bucket). A check takes one before it hashes and gives it back when the credentials were good,
    so only failures spend it; a peer without one is refused at once. At most `MAX_PEERS` addresses are
    kept (the least recently seen forgotten, which gives it a full budget again: bounded memory matters
    more). `burst` 0: no limit."""

    def __init__(self, burst: int, refill: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.refill = refill
        self.clock = clock
        self._peers: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """peer key -> (checks left, when that was counted)."""

    def _left(self, key: str, now: float) -> float:
        left, at = self._peers.get(key, (float(self.burst), now))
        return min(float(self.burst), left + (now - at) / self.refill)

    def take(self, peer: str) -> float:
        """0 when a check may start (one is taken), else the seconds until this peer has one again."""
        if not self.burst:
            return 0.0
        key, now = peer_key(peer), self.clock()
        left = self._left(key, now)
        if left < 1.0:
            return (1.0 - left) * self.refill
        self._peers[key] = (left - 1.0, now)
        self._peers.move_to_end(key)
        while len(self._peers) > MAX_PEERS:
            self._peers.popitem(last=False)
        return 0.0

    def spent(self, peer: str) -> bool:
        """This peer failed a check lately (its budget is not full)."""
        return bool(self.burst) and self._left(peer_key(peer), self.clock()) < self.burst

    def give_back(self, peer: str) -> None:
        """The check taken for good credentials."""
        if not self.burst:
            return
        key, now = peer_key(peer), self.clock()
        if key in self._peers:
            self._peers[key] = (min(float(self.burst), self._left(key, now) + 1.0), now)


class Authenticator:
    """The clusters a gateway serves and how their requests prove it. `clusters is None`: open mode, every
    request is for `default` and credentials are not asked for.

    Every check of a secret or a Sonar token goes through `check`: a keyed digest of recent results, good
    and bad (`MAX_REMEMBERED`, `MAX_FAILURES_REMEMBERED`), answers what was checked before without hashing
    (a client retrying a wrong secret costs nothing); otherwise at most `max_checks` hashes run at once,
    and each peer address only as many failed ones as its `FailureBudget` allows; beyond either `Busy` at
    once, and an address that failed lately never takes the last free slot. Hashing is tens of
    milliseconds of CPU each and comes before any other admission, so without these a flood of wrong
    secrets would queue without limit and keep good first-time clients out.

    Hashes run in daemon threads, one each (`max_checks` at most): a hash cannot be interrupted, and the
    process must not wait for one at exit (SIGTERM: 5 s in any state). A check slot is freed when its hash
    ends, not when the request that asked left, so clients that go away cannot start more than
    `max_checks` hashes either. `stop()` refuses every check not answered from memory from then on."""

    def __init__(
        self,
        clusters: dict[str, ClusterAuth] | None,
        default: str = "",
        *,
        max_checks: int = 4,
        budget: FailureBudget | None = None,
    ) -> None:
        self.entries = clusters
        self.default = default
        self.max_checks = max_checks
        self.budget = budget or FailureBudget(0, 1.0)
        self.checking = 0
        self.stopped = False
        self._key = os.urandom(32)
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()
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
        # credentials of no cluster are checked against this, so that their answer takes as long as a wrong
        # secret's (the time does not tell which cluster names exist)
        first = next(iter(self._identities.values()), None)
        rounds = _parse_hash(first[0])[0] if first is not None else ITERATIONS
        self._unknown = f"{SCHEME}${rounds}${_b64(os.urandom(16))}${_b64(os.urandom(32))}"

    @property
    def open(self) -> bool:
        return self.entries is None

    @property
    def clusters(self) -> list[str]:
        return [self.default] if self.entries is None else list(self.entries)

    def stop(self) -> None:
        """From now on only remembered results are answered (a request still reading envelopes gets `Busy`
        instead of more hashes while the process stops)."""
        self.stopped = True

    def _digest(self, what: str, user: str, secret: str) -> bytes:
        return hmac.new(self._key, f"{what}\0{user}\0{secret}".encode(), "sha256").digest()

    def _recall(self, key: bytes) -> bool | None:
        for results, good in ((self._good, True), (self._bad, False)):
            if key in results:
                results.move_to_end(key)
                return good
        return None

    def _remember(self, key: bytes, good: bool) -> None:
        results, bound = (self._good, MAX_REMEMBERED) if good else (self._bad, MAX_FAILURES_REMEMBERED)
        results[key] = None
        while len(results) > bound:
            results.popitem(last=False)

    async def check(self, what: str, user: str, secret: str, hashed: str, peer: str) -> bool:
        """Does `secret` match `hashed` (`what`: "secret" or "sonar", with `user` the key of the memory);
        `Busy` (or `Limited`) when it would have to be hashed and may not be now."""
        key = self._digest(what, user, secret)
        known = self._recall(key)
        if known is not None:
            return known
        if self.stopped:
            raise Busy("stopping")
        # the last slot is kept for addresses that failed no check lately: a flood of wrong secrets from
        # a few addresses cannot keep good first-time clients elsewhere out while it spends its budgets
        kept = 1 if self.max_checks > 1 and self.budget.spent(peer) else 0
        if self.checking >= self.max_checks - kept:
            raise Busy(f"{self.checking} credential checks in progress")
        wait = self.budget.take(peer)
        if wait:
            raise Limited(f"too many failed credential checks from {peer}; the next in {wait:.0f} s")
        self.checking += 1

        def settle(good: bool) -> None:
            self.checking -= 1
            self._remember(key, good)
            if good:
                self.budget.give_back(peer)

        return await _hash_aside(secret, hashed, settle)

    def _credential(self, user: str, secret: str) -> tuple[str, str, Identity] | None:
        """(secret to check, its hash, who it proves) for `user`'s cluster: a named credential when the
        secret starts with `<name>:` of one, else the cluster's own secret."""
        name, sep, rest = secret.partition(":")
        named = self._identities.get((user, name)) if sep else None
        if named is not None:
            return rest, named[0], named[1]
        own = self._identities.get((user, ""))
        return None if own is None else (secret, own[0], own[1])

    async def identity_of(self, user: str, secret: str, *, peer: str = "") -> Identity | None:
        """Who these credentials prove the request is, or None when they are not good (`Busy` when they
        would need a hash that may not start now)."""
        if self.entries is None:
            return Identity(self.default, "master", name=self.default)
        found = self._credential(user, secret)
        if found is None:  # checked all the same (the memory, the budget, the time a hash takes)
            await self.check("secret", f"?{user}", secret, self._unknown, peer)
            return None
        checked, hashed, identity = found
        good = await self.check("secret", identity.name, checked, hashed, peer)
        return identity if good else None

    def sonar_token_check(self, cluster: str, peer: str = "") -> TokenCheck | None:
        """A check of Sonar's `meta.token` for `cluster`, or None when the cluster has no token set. Made on
        the event loop, called from the thread that reads the envelopes."""
        entry = None if self.entries is None else self.entries.get(cluster)
        if entry is None or not entry.sonar_token:
            return None
        return TokenCheck(self, cluster, entry.sonar_token, peer)


async def _hash_aside(secret: str, hashed: str, settle: Callable[[bool], None]) -> bool:
    """`verify(secret, hashed)` in a daemon thread of its own; `settle(result)` runs on the loop when the
    hash ends, also when the caller was cancelled meanwhile (its check slot is held until then)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[bool] = loop.create_future()

    def finish(good: bool) -> None:
        settle(good)
        if not future.done():
            future.set_result(good)

    def work() -> None:
        try:
            good = verify(secret, hashed)
        except ValueError:  # an unreadable hash: load_auth_file refuses them, so never in practice
            good = False
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
            loop.call_soon_threadsafe(finish, good)

    threading.Thread(target=work, name="hpcbus-gateway-hash", daemon=True).start()
    return await future


class TokenCheck:
    """`check(token)` for the envelope reader, which runs in a thread: the check itself is `Authenticator
    .check` on the event loop (the memory, the slots and the budget are the loop's), waited for here.
    Never call it on the loop's own thread."""

    def __init__(self, auth: Authenticator, cluster: str, hashed: str, peer: str = "") -> None:
        self.auth, self.cluster, self.hashed, self.peer = auth, cluster, hashed, peer
        self.loop = asyncio.get_running_loop()

    def __call__(self, token: str) -> bool:
        try:
            token.encode()
        except UnicodeEncodeError:  # a lone surrogate (JSON `\ud800`) cannot be a token, nor be hashed
            return False
        if not token:
            return False
        asked = self.auth.check("sonar", self.cluster, token, self.hashed, self.peer)
        return asyncio.run_coroutine_threadsafe(asked, self.loop).result()
