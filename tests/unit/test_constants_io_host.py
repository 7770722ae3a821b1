"""Host-side constants of the run sections (pinned batches, token files, random reads), checked
against the libraries and formats they model rather than against the estimator's own output."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from transformers import default_data_collator

from trainledger.estimate.run.host import pinned_batch_bytes
from trainledger.estimate.run.io import blocks_per_sample, tokenized_bytes_per_token


@pytest.mark.parametrize("workers, micro_batch, seq_len", [(1, 1, 16), (4, 2, 64), (8, 3, 128)])
def test_pinned_batches_are_what_a_dataloader_keeps_in_flight(workers, micro_batch, seq_len):
    """W workers × torch's default prefetch_factor batches, each the int64 tensors of a causal-LM
    batch as transformers' collator builds them (input_ids, attention_mask, labels)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more workers than this machine's cores: never started
        dl = torch.utils.data.DataLoader(range(4), num_workers=workers, batch_size=micro_batch)
    ids = list(range(seq_len))
    batch = default_data_collator([{"input_ids": ids, "attention_mask": [1] * seq_len, "labels": ids}]
                                  * micro_batch)
    batch_bytes = sum(t.nbytes for t in batch.values())
    assert pinned_batch_bytes(workers, micro_batch, seq_len) == workers * dl.prefetch_factor * batch_bytes


@pytest.mark.parametrize("vocab, nbytes", [(32_000, 2), (50_257, 2), (65_536, 2), (65_537, 4),
                                           (128_256, 4), (151_936, 4)])
def test_token_files_use_uint16_while_every_id_fits(vocab, nbytes):
    """Pre-tokenized corpora (nanoGPT/Megatron .bin) store ids as uint16 when the vocabulary fits
    (ids 0..vocab-1 ≤ the uint16 maximum) and as a 4-byte integer otherwise."""
    fits = vocab - 1 <= np.iinfo(np.uint16).max
    expected = np.dtype(np.uint16).itemsize if fits else np.dtype(np.int32).itemsize
    assert expected == nbytes
    assert tokenized_bytes_per_token(vocab) == expected


@pytest.mark.parametrize("sample_bytes", [1, 4096, 4097, 8192, 100_000])
def test_random_reads_count_4k_blocks(sample_bytes):
    """Storage datasheets state random-read IOPS for 4 KiB reads (e.g. fio --bs=4k randread, the
    figure NVMe drive datasheets quote); an unaligned sample touches ceil(bytes/4 KiB) + 1 blocks."""
    block = 4 * 1024
    assert blocks_per_sample(sample_bytes) == -(-sample_bytes // block) + 1
