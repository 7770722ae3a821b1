"""Which filesystem holds a path — the ledger must not run SQLite in WAL mode on a network one.

SQLite: "WAL does not work over a network filesystem" (all processes must share memory on one
host; https://sqlite.org/wal.html, "Disadvantages"). On Linux the filesystem type of a path is
the ``fstype`` of the longest mount point that contains it in ``/proc/self/mountinfo``
(proc(5)). Elsewhere nothing is detected; ``$TRAINLEDGER_LEDGER_JOURNAL`` (``wal`` | ``delete``)
overrides the choice everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

#: filesystem types whose files are shared between hosts (no shared-memory WAL index)
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph",
                        "fuse.sshfs", "fuse.glusterfs", "glusterfs", "9p", "afs", "panfs", "wekafs",
                        "fuse.juicefs", "fuse.s3fs", "fuse.gcsfuse", "davfs", "fuse.davfs2"})
MOUNTINFO = "/proc/self/mountinfo"
JOURNAL_ENV = "TRAINLEDGER_LEDGER_JOURNAL"


def _unescape(s: str) -> str:
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, fstype) of every line: fields 5 and the first after the ' - ' separator."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if sep and len(parts) >= 5 and rparts:
            out.append((_unescape(parts[4]), rparts[0]))
    return out


def fs_type(path: str | os.PathLike[str], mountinfo: str | None = None) -> str | None:
    """The filesystem type of ``path`` (its nearest existing parent), or None when unknown."""
    if mountinfo is None:
        try:
            mountinfo = Path(MOUNTINFO).read_text()
        except OSError:
            return None
    p = Path(path).expanduser().absolute()
    head, tail = p, []
    while not head.exists() and head != head.parent:  # resolve symlinks of the part that exists
        tail.append(head.name)
        head = head.parent
    try:
        head = head.resolve()
    except OSError:
        pass
    target = str(head.joinpath(*reversed(tail)))
    best, kind = "", None
    for mnt, fstype in parse_mountinfo(mountinfo):
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/") or mnt == "/"
        if inside and len(mnt) >= len(best):
            best, kind = mnt, fstype
    return kind


def is_network_fs(path: str | os.PathLike[str], mountinfo: str | None = None) -> bool:
    kind = fs_type(path, mountinfo)
    return kind is not None and (kind in NETWORK_FS or kind.split(".")[0] in NETWORK_FS)


def ledger_journal_mode(path: str | os.PathLike[str]) -> str:
    """``WAL`` on a local disk, ``DELETE`` (rollback journal) on a network filesystem."""
    forced = os.environ.get(JOURNAL_ENV, "").strip().lower()
    if forced in ("wal", "delete"):
        return forced.upper()
    return "DELETE" if is_network_fs(path) else "WAL"
