"""Fixtures of tests/serving: the real rag-serve over the tiny world's trained checkpoints (tests/conftest.py's
``trained``), one server per module."""
import pytest

from tests.serving.live import LiveServer


@pytest.fixture(scope="module")
def token_server(trained, tmp_path_factory):
    """rag-serve over rag_token_tiny with an admin token, batching up to 8 questions waiting 50 ms."""
    server = LiveServer(trained["rag_token_tiny"], tmp_path_factory.mktemp("serve") / "rag-serve.log",
                        ["--admin-token", "secret-token-1", "--max-batch", "8", "--max-wait-ms", "50"]).wait_up()
    yield server
    server.stop()
