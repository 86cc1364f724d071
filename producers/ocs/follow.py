"""Follow a growing accounting file the way qmaster and logrotate treat it: by polling, in whole lines.

Why these rules:

* **Whole lines only.** qmaster appends one record per line; a poll can land in the middle of a write. A line
  is handed on only once its `\\n` is there, so a half-written record is never parsed (and never reported
  as broken). The partial tail is simply read again on the next poll.
* **Rotation** (the path names a new inode: `mv accounting accounting.0`, logchecker.sh) — the open old
  file is read to its end first, then the new one from offset 0, so no record between the last poll and the
  rename is lost. A rotated file that ends without a newline gets one more poll to complete (a writer may
  still hold it open); after that its tail is reported as a `Problem` and skipped.
* **Truncation** (same inode, size below our offset: `> accounting`, logrotate `copytruncate`) — start
  again at 0. **Replacement in place** (same inode, but the first line changed) — likewise.
* **Restarts.** A `FollowState` (inode, offset, line number, hash of the first line) is kept in a small
  state file, written atomically (temp file, fsync, rename) by the caller once everything before the offset
  is acknowledged by JetStream. On start: same inode and same first line -> resume at the offset; another
  inode but the same first line and enough bytes -> the file was copied or moved back, resume; otherwise the
  old inode is looked for beside the file (a rotation while we were down: finish `accounting.0` first), and
  only when it is gone does reading start at 0 of the new file, with a warning saying what could be missed.
* **Deterministic chunks.** `cuts` remembers where chunks that were handed to the publisher but not yet
  acknowledged ended. After a crash the same chunks are cut again, so they get the same `Nats-Msg-Id`s
  and JetStream drops the copies it already stored.
* **Polling, not inotify**: works on NFS (where qmaster often writes the file), needs no extra dependency,
  and costs one `stat` per interval.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import deque
from pathlib import Path
from typing import BinaryIO

import msgspec

from hpcbus.retry import Trouble
from hpcbus.schemas.ocs import KIND
from hpcbus.schemas.ocs.lines import RawLine, split_lines
from hpcbus.schemas.problems import Problem
from hpcbus.statefile import write_atomically

__all__ = [
    "Chunk",
    "FollowState",
    "Follower",
    "Position",
    "StateError",
    "load_state",
    "save_state",
]

log = logging.getLogger("hpcbus.ocs")

MAX_CHUNK_BYTES = 4 << 20
"""Default bytes read per chunk: ~2,000-4,000 JSONL records, a jobs envelope of a few hundred KiB."""
_HEAD_LIMIT = 1 << 20
"""A first line longer than this is not hashed (the file cannot be told apart by it)."""
_BLOCK = 1 << 20


class Position(msgspec.Struct, frozen=True, kw_only=True):
    """A place in one accounting file: everything before `offset` has been read (or acknowledged)."""

    inode: int = 0
    offset: int = 0
    line: int = 0
    """Lines before `offset`; the next line read is `line + 1` (for `PATH:LINE` in problems)."""
    head: str = ""
    """Hash of the file's first line (with its newline); "" until a first complete line was read."""


class FollowState(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What survives a restart (the state file's JSON)."""

    path: str
    """The accounting file this state belongs to; a state of another path is ignored."""
    position: Position = Position()
    """Acknowledged position: every line before it is stored in JetStream."""
    cuts: list[tuple[int, int]] = []
    """(inode, end offset) of chunks handed to the publisher after `position`, oldest first."""
    version: int = 1


class StateError(RuntimeError):
    """The state file exists but cannot be read; the admin must look (deleting it re-reads the file)."""


class Chunk(msgspec.Struct, kw_only=True):
    """Consecutive complete lines of one file, the unit that is mapped, published and acknowledged."""

    place: str
    """The file's path as opened (for `PATH:LINE`)."""
    start: Position
    end: Position
    lines: list[RawLine]
    digest: str = ""
    """Hash of the chunk's bytes: with the byte range, names the chunk in message ids."""
    problems: list[Problem] = []
    """Problems of the file itself (an unterminated tail of a rotated file), not of a record."""

    @property
    def inode(self) -> int:
        return self.end.inode


def load_state(path: str | os.PathLike[str]) -> FollowState | None:
    """The saved state, or None when there is no state file yet."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"state file {path}: {exc}") from None
    try:
        return msgspec.json.decode(data, type=FollowState)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StateError(f"state file {path}: {exc} (delete it to read the accounting file again)") from None


def save_state(path: str | os.PathLike[str], state: FollowState) -> None:
    """Write atomically: a crash leaves either the old or the new state, never a torn one."""
    write_atomically(path, msgspec.json.encode(state) + b"\n")


def _digest(first_line: bytes) -> str:
    return hashlib.blake2b(first_line, digest_size=8).hexdigest()


class _File:
    """One open accounting file and how far it has been read."""

    def __init__(self, place: str, fh: BinaryIO, st: os.stat_result) -> None:
        self.place = place
        self.fh = fh
        self.inode = st.st_ino
        self.dev = st.st_dev
        self.pos = 0
        self.line = 0
        self.head = ""
        self.rotated = False
        """The path names another file now: read this one to its end, then move on."""
        self.tail_size = -1
        """Size seen when a rotated file's unterminated tail was first noticed."""
        self.signature: tuple[int, int] = (st.st_size, st.st_mtime_ns)

    def position(self) -> Position:
        return Position(inode=self.inode, offset=self.pos, line=self.line, head=self.head)

    def size(self) -> int:
        return os.fstat(self.fh.fileno()).st_size

    def first_line_hash(self) -> str:
        """Hash of the first line as it is in the file now ("" when it has no newline yet)."""
        data = b""
        while len(data) < _HEAD_LIMIT:
            block = os.pread(self.fh.fileno(), _BLOCK, len(data))
            if not block:
                return ""
            data += block
            nl = data.find(b"\n")
            if nl >= 0:
                return _digest(data[: nl + 1])
        return ""

    def reset(self) -> None:
        self.pos = self.line = 0
        self.head = ""

    def close(self) -> None:
        self.fh.close()


class Follower:
    """Reads complete lines of `path` in chunks; see the module docstring for the rules.

    `read()` returns the chunks available now (possibly none). `behind` is True when a chunk was cut short
    by `max_chunk_bytes` (or by a remembered cut) and more can be read at once, so a caller can catch up on
    a backlog without waiting a poll interval per chunk.
    """

    def __init__(
        self,
        path: str,
        state: FollowState | None = None,
        *,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
        from_end: bool = False,
    ) -> None:
        self.path = path
        self.max_chunk_bytes = max(1, max_chunk_bytes)
        self.behind = False
        self._cur: _File | None = None
        self._cuts: deque[tuple[int, int]] = deque()
        self.missing = Trouble(log, f"accounting file {path}")
        """The file cannot be opened (not there yet, NFS not mounted, permissions): one episode."""
        self._partial: tuple[int, int] = (0, -1)
        """(inode, byte) of the incomplete last line last reported."""
        self._pending: Position | None = None
        """A saved position not yet applied because its file could not be found or opened."""
        if state is not None and state.path != path:
            log.warning("state belongs to %s, not %s: ignored", state.path, path)
            state = None
        if state is not None:
            self._cuts.extend((int(i), int(e)) for i, e in state.cuts)
            self._resume(state.position)
        else:
            self._cur = self._open(path)
            if self._cur is not None and from_end:
                self._skip_to_end(self._cur)

    # --- starting -------------------------------------------------------------------------------------------

    def _open(self, place: str) -> _File | None:
        try:
            fh = open(place, "rb")  # noqa: SIM115 - kept open across polls, closed by _File.close
        except OSError as exc:
            self.missing.failed(f"cannot read {place}: {exc.strerror or exc}; waiting for it")
            return None
        self.missing.ok()
        return _File(place, fh, os.fstat(fh.fileno()))

    def _resume(self, p: Position) -> None:
        """Find where to go on from a saved position; while that cannot be decided (the path is missing and
        no rotated copy is beside it, e.g. NFS not mounted yet), keep it pending rather than start over."""
        self._pending = None
        if p.inode == 0:
            self._cur = self._open(self.path)
            return
        try:
            st: os.stat_result | None = os.stat(self.path)
        except OSError:
            st = None
        if st is not None and st.st_ino == p.inode:
            cur = self._open(self.path)
            if cur is None:
                self._pending = p
                return
            self._seek(cur, p)
            self._cur = cur
            return
        if st is not None and p.head:
            cur = self._open(self.path)
            if cur is not None and cur.first_line_hash() == p.head and cur.size() >= p.offset:
                log.info(
                    "%s has a new inode but the same first line: resuming at byte %d", self.path, p.offset
                )
                self._cuts = deque((cur.inode, e) for i, e in self._cuts if i == p.inode)
                self._apply(cur, p)
                self._cur = cur
                return
            if cur is not None:
                cur.close()
        old = self._find_rotated(p)
        if old is not None:
            log.info(
                "%s was rotated while stopped: finishing %s from byte %d first",
                self.path,
                old.place,
                p.offset,
            )
            old.rotated = True
            self._apply(old, p)
            self._cur = old
            return
        if st is None:
            self.missing.failed(f"{self.path} is missing; waiting for it (saved position: line {p.line})")
            self._pending = p
            return
        log.warning(
            "%s: the file last read (inode %d, up to byte %d, line %d) is gone; reading the present file from "
            "the start (records appended to the old one after that point were not read)",
            self.path,
            p.inode,
            p.offset,
            p.line,
        )
        self._cuts.clear()
        self._cur = self._open(self.path)

    def _seek(self, cur: _File, p: Position) -> None:
        """Resume `cur` (same inode as `p`) at `p` unless it was truncated or replaced meanwhile."""
        size = cur.size()
        if size < p.offset:
            log.warning(
                "%s is shorter (%d bytes) than the saved offset %d: truncated, reading from the start",
                cur.place,
                size,
                p.offset,
            )
            self._drop_cuts(cur.inode)
        elif p.head and p.offset > 0 and cur.first_line_hash() != p.head:
            log.warning(
                "%s: first line changed since the last run (file replaced): reading from the start", cur.place
            )
            self._drop_cuts(cur.inode)
        else:
            self._apply(cur, p)

    @staticmethod
    def _apply(cur: _File, p: Position) -> None:
        cur.pos, cur.line, cur.head = p.offset, p.line, p.head

    def _find_rotated(self, p: Position) -> _File | None:
        """The file with the saved inode beside `path` (e.g. `accounting.0`), if it still holds our lines."""
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return None
        for entry in entries:
            try:
                if entry.inode() != p.inode or not entry.is_file(follow_symlinks=False):
                    continue
            except OSError:
                continue
            cur = self._open(entry.path)
            if cur is None:
                continue
            if (
                cur.inode == p.inode
                and cur.size() >= p.offset
                and (not p.head or cur.first_line_hash() == p.head)
            ):
                return cur
            cur.close()
        return None

    def _skip_to_end(self, cur: _File) -> None:
        """Start after the last complete line (`--from-end`), counting lines so numbers stay right."""
        fd, pos, lines, last_nl = cur.fh.fileno(), 0, 0, 0
        while True:
            block = os.pread(fd, _BLOCK, pos)
            if not block:
                break
            lines += block.count(b"\n")
            nl = block.rfind(b"\n")
            if nl >= 0:
                last_nl = pos + nl + 1
            pos += len(block)
        cur.pos, cur.line = last_nl, lines
        cur.head = cur.first_line_hash() if last_nl else ""

    def _drop_cuts(self, inode: int) -> None:
        self._cuts = deque(c for c in self._cuts if c[0] != inode)

    # --- reading --------------------------------------------------------------------------------------------

    @property
    def position(self) -> Position:
        """Where the next read starts (not what is acknowledged); a pending saved position while its file
        is not found yet."""
        if self._cur is not None:
            return self._cur.position()
        return self._pending if self._pending is not None else Position()

    def read(self) -> list[Chunk]:
        """The chunks of complete lines available now: the rest of a rotated file first, then the file."""
        chunks: list[Chunk] = []
        self.behind = False
        for _ in range(3):  # a rotated file, then the new one (which may itself have been rotated already)
            if self._cur is None:
                if self._pending is not None:
                    self._resume(self._pending)
                else:
                    self._cur = self._open(self.path)
                if self._cur is None:
                    return chunks
            cur = self._cur
            if not cur.rotated:
                try:
                    st: os.stat_result | None = os.stat(self.path)
                except OSError:
                    st = None  # renamed away, new one not created yet: keep reading the open file
                if st is not None and (st.st_ino, st.st_dev) != (cur.inode, cur.dev):
                    log.info(
                        "%s rotated: finishing the old file (inode %d), then the new one",
                        self.path,
                        cur.inode,
                    )
                    cur.rotated = True
            if not cur.rotated:
                self._check_same_file(cur)
                chunk = self._read_lines(cur)
                if chunk is not None:
                    chunks.append(chunk)
                return chunks
            chunk = self._read_lines(cur)
            if chunk is not None:
                chunks.append(chunk)
            if self.behind:
                return chunks
            size = cur.size()
            if size > cur.pos:
                if size != cur.tail_size:
                    cur.tail_size = size  # give the writer one more poll to finish the line
                    return chunks
                chunks.append(self._give_up_tail(cur, size))
            cur.close()
            self._drop_cuts(cur.inode)
            self._cur = None
        return chunks

    def _check_same_file(self, cur: _File) -> None:
        """Truncated or replaced in place since the last poll: start again at 0."""
        st = os.fstat(cur.fh.fileno())
        signature = (st.st_size, st.st_mtime_ns)
        if signature == cur.signature:
            return
        cur.signature = signature
        if st.st_size < cur.pos:
            log.warning(
                "%s truncated (%d < %d bytes read): reading from the start", cur.place, st.st_size, cur.pos
            )
        elif cur.pos > 0 and cur.head and cur.first_line_hash() != cur.head:
            log.warning("%s: first line changed (file rewritten in place): reading from the start", cur.place)
        else:
            return
        cur.reset()
        self._drop_cuts(cur.inode)

    def _next_cut(self, cur: _File) -> int | None:
        while self._cuts and self._cuts[0][0] == cur.inode and self._cuts[0][1] <= cur.pos:
            self._cuts.popleft()
        if self._cuts and self._cuts[0][0] == cur.inode:
            return self._cuts[0][1]
        return None

    def _read_lines(self, cur: _File) -> Chunk | None:
        fd = cur.fh.fileno()
        cut = self._next_cut(cur)
        if cut is not None:
            want = cut - cur.pos
            data = os.pread(fd, want, cur.pos)
            if len(data) == want and data.endswith(b"\n"):
                self._cuts.popleft()
                self.behind = True
                return self._chunk(cur, data)
            log.warning(
                "%s: a remembered chunk boundary (byte %d) no longer fits the file; ignored", cur.place, cut
            )
            self._drop_cuts(cur.inode)
        want = self.max_chunk_bytes
        data = os.pread(fd, want, cur.pos)
        end = data.rfind(b"\n") + 1
        while end == 0 and len(data) >= want:  # one line longer than a chunk: read on to its end
            more = os.pread(fd, want, cur.pos + len(data))
            if not more:
                break
            data += more
            end = data.rfind(b"\n") + 1
        self.behind = len(data) >= want
        if len(data) > end and self._partial != (cur.inode, cur.pos + end):
            self._partial = (cur.inode, cur.pos + end)  # said once per place: a writer may take a while
            log.info(
                "%s: an incomplete last line at byte %d (%d bytes so far); waiting for its end",
                cur.place,
                cur.pos + end,
                len(data) - end,
            )
        if end == 0:
            return None
        return self._chunk(cur, data[:end])

    @staticmethod
    def _chunk(cur: _File, body: bytes) -> Chunk:
        start = cur.position()
        lines, number, offset = split_lines(body, cur.line, cur.pos)
        if cur.pos == 0 and lines:
            cur.head = _digest(lines[0].text + b"\n")
        cur.pos, cur.line = offset, number
        return Chunk(place=cur.place, start=start, end=cur.position(), lines=lines, digest=_digest(body))

    @staticmethod
    def _give_up_tail(cur: _File, size: int) -> Chunk:
        start = cur.position()
        problem = Problem(
            kind=KIND,
            place=cur.place,
            line=cur.line + 1,
            path="line",
            reason=f"the file was rotated and its last line ({size - cur.pos} bytes) never got its newline; skipped",
        )
        cur.pos, cur.line = size, cur.line + 1
        return Chunk(place=cur.place, start=start, end=cur.position(), lines=[], problems=[problem])

    def close(self) -> None:
        if self._cur is not None:
            self._cur.close()
            self._cur = None
