"""Helpers of the corpus tests: generated texts and tokenizers trained here, in the test."""

from __future__ import annotations

import random


SYLLABLES = ["ka", "lo", "mi", "ten", "ra", "vo", "sun", "e", "tri", "dal", "qu", "ix", "é", "naï", "日本", "ß"]
CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{{ eos_token }}"


def make_texts(n: int, seed: int = 7, mu: float = 3.2, sigma: float = 0.9) -> list[str]:
    """Texts with log-normal word counts: a long tail, like real fine-tuning data."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    out = []
    for _ in range(n):
        k = max(1, int(rng.lognormvariate(mu, sigma)))
        text = " ".join(rng.choice(words) for _ in range(k))
        if rng.random() < 0.2:
            text += ', "quoted", ok.'
        out.append(text)
    return out


def train_tokenizer(texts: list[str], kind: str = "bpe", specials: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"])
    else:
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainer)
    if specials:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    return tok
