"""Words, sentences and tokenizers built in memory (no download), for the tests' tiny models.

``fake_tokenizer``: BERT-style WordPiece over ``WORDS`` and single characters; ``word_piece_tokenizer``:
the same as a ``transformers`` tokenizer; ``byte_level_tokenizer``: a byte-level BPE set up as
transformers converts GPT-2's.
"""

from __future__ import annotations

import functools
import string

import pytest

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "big", "red"]

# Short texts over WORDS, of different lengths (one word up to 23 pieces), for captures and corpora.
TEXTS = [
    "the cat sat on the mat",
    "a dog ran",
    "the big red dog sat on a mat, and the cat ran!",
    "cats",
    "the dogs sat",
    "on a mat the cat sat, then the dog sat, and a big red cat ran on the mat",
    "red",
    "a cat, a dog, a mat",
]

# English sentences of varied length and punctuation for MiniLM's analyses (the first six: analyze's tests).
ENGLISH = [
    "The cat sat on the mat, and the dog watched it.",
    "Attention heads learn different things when their weights start apart.",
    "She said that the report, which was long, would be finished by Monday.",
    "Numbers like 42 and 3.14 appear in technical text.",
    "Why do some heads attend to the separator token?",
    "A short one.",
    "The report was finished on Monday, as she said it would be.",
    "Some heads attend to the previous word; others to the next.",
]

# The byte-level BPE's training text; the dependency-syntax tests parse it too.
SENTENCES = [
    "The cat sat on the mat.",
    "A big dog ran to the red car.",
    "She said that the dog was happy.",
    "The old man gave the boy a book.",
    "Birds sing in the morning and sleep at night.",
]
EOS = "<|endoftext|>"


def fake_tokenizer():
    """A BERT-style WordPiece ``tokenizers.Tokenizer``: [CLS] … [SEP], words split into characters when unknown."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab_list = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, *chars, *[f"##{c}" for c in chars]]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return tokenizer


@functools.cache
def word_piece_tokenizer():
    """``fake_tokenizer`` as a ``transformers.PreTrainedTokenizerFast`` with every special token named
    ([CLS] doubles as BOS, [SEP] as EOS); one instance per session."""
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=fake_tokenizer(), pad_token="[PAD]",
                                                unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                                bos_token="[CLS]", eos_token="[SEP]")


@functools.cache
def _byte_level_backend():
    pytest.importorskip("tokenizers")
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[EOS], show_progress=False)
    tokenizer.train_from_iterator(SENTENCES, trainer)
    return tokenizer


def byte_level_tokenizer():
    """A ``transformers.PreTrainedTokenizerFast`` over a byte-level BPE trained on ``SENTENCES``.

    ByteLevel pre-tokenizer and decoder, and the ByteLevel post-processor with ``trim_offsets=False``:
    a piece's offsets then include the space before it ("Ġcat" spans " cat"), which is what the GPT-2
    family gives headlab. No special token is added around a text (GPT-2 adds none); EOS doubles as
    BOS and padding.
    """
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=_byte_level_backend(), bos_token=EOS,
                                                eos_token=EOS, pad_token=EOS)
