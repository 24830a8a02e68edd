import os

import pytest


@pytest.fixture
def data_file(tmp_path):
    """A 3 MiB + 123-byte file of random bytes, and its contents."""
    data = os.urandom((3 << 20) + 123)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return path, data
