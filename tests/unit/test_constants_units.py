"""The unit constants are definitions: IEC binary prefixes, SI decimal prefixes, the calendar."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from trainledger import units


def test_iec_binary_prefixes():
    # IEC 80000-13: kibi = 2^10, mebi = 2^20, gibi = 2^30, tebi = 2^40
    assert (units.KIB, units.MIB, units.GIB, units.TIB) == (2**10, 2**20, 2**30, 2**40)


def test_si_decimal_prefixes():
    # SI: kilo 10^3, mega 10^6, giga 10^9, tera 10^12, peta 10^15
    assert (units.KB, units.MB, units.GB, units.TB) == (10**3, 10**6, 10**9, 10**12)
    assert (units.TERA, units.PETA) == (1e12, 1e15)


def test_bits_per_byte_and_time():
    assert units.BITS_PER_BYTE == np.iinfo(np.uint8).bits
    assert units.SECONDS_PER_HOUR == timedelta(hours=1).total_seconds()
    assert units.SECONDS_PER_DAY == timedelta(days=1).total_seconds()
