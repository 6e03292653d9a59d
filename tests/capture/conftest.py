"""The capture tests' tokenizer, model and texts (tests/support: the word-piece tokenizer, the pruned BERT)."""

import pytest

from tests.support.text import TEXTS, fake_tokenizer
from tests.support.tiny import pruned_bert


@pytest.fixture(scope="session")
def tokenizer():
    pytest.importorskip("tokenizers")
    return fake_tokenizer()


@pytest.fixture
def model(tokenizer):
    return pruned_bert(tokenizer.get_vocab_size())


@pytest.fixture
def texts():
    return list(TEXTS)
