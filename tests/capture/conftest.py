import pytest
import torch

from tests.capture.fake_model import FakeModel, fake_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    pytest.importorskip("tokenizers")
    return fake_tokenizer()


@pytest.fixture
def model(tokenizer):
    torch.manual_seed(0)
    return FakeModel(tokenizer.get_vocab_size()).eval()


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


@pytest.fixture
def texts():
    return list(TEXTS)
