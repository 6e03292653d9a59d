import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("default", deadline=None, max_examples=40, derandomize=True)
settings.register_profile("thorough", deadline=None, max_examples=400)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
