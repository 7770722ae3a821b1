"""The ledger on network filesystems: no WAL there (SQLite's WAL needs one host)."""

from __future__ import annotations

from trainledger.ledger import fsdetect
from trainledger.ledger import Ledger

# /proc/self/mountinfo lines in the format of proc(5)
MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home rw,relatime shared:20 - nfs4 fileserver:/export/home rw,vers=4.2
41 40 0:36 / /home/scratch\\040space rw,relatime - lustre 10.0.0.1@o2ib:/scratch rw
"""


def test_mountinfo_parsing_and_longest_mount_wins():
    assert fsdetect.parse_mountinfo(MOUNTINFO)[2] == ("/home/scratch space", "lustre")
    assert fsdetect.fs_type("/home/alice/.local/share/trainledger/ledger.db", MOUNTINFO) == "nfs4"
    assert fsdetect.fs_type("/home/scratch space/x.db", MOUNTINFO) == "lustre"
    assert fsdetect.fs_type("/var/tmp/x.db", MOUNTINFO) == "ext4"
    assert fsdetect.is_network_fs("/home/alice/x.db", MOUNTINFO)
    assert not fsdetect.is_network_fs("/var/tmp/x.db", MOUNTINFO)


def test_ledger_uses_a_rollback_journal_on_nfs(tmp_path, monkeypatch):
    monkeypatch.setattr(fsdetect, "is_network_fs", lambda p, m=None: True)
    with Ledger(tmp_path / "l.db") as led:
        assert led.journal_mode == "delete"
        rid = led.add("measurement", "verify memory", {"x": 1}, env={"env_id": "e"})
        assert led.get(rid).result == {"x": 1}
    assert not (tmp_path / "l.db-wal").exists()


def test_ledger_uses_wal_on_a_local_disk_and_the_override(tmp_path, monkeypatch):
    monkeypatch.setattr(fsdetect, "is_network_fs", lambda p, m=None: False)
    with Ledger(tmp_path / "a.db") as led:
        assert led.journal_mode == "wal"
    monkeypatch.setenv("TRAINLEDGER_LEDGER_JOURNAL", "delete")
    with Ledger(tmp_path / "b.db") as led:
        assert led.journal_mode == "delete"
