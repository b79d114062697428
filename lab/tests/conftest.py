"""The lab's tests share rowgate's test fixtures (isolated keys and cache dir, real git
repositories, the GPU skip): the lab is tested from the rowgate checkout's root."""

from tests.conftest import *  # noqa: F403
from tests.conftest import pytest_collection_modifyitems, pytest_configure  # noqa: F401
