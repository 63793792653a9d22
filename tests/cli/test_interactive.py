"""rag-interactive --device: a GPU asked for where CUDA is not available, or no device at all, is a one-line error,
given before the checkpoint is read."""
import pytest
import torch

from tests.cli.helpers import assert_one_line_error, run_module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_device_without_cuda_is_a_one_line_error(tmp_path):
    ckpt = tmp_path / "none.pt"
    assert_one_line_error(run_module("rag_plugin.cli.interactive", ckpt, "--device", "cuda"),
                          "device cuda: CUDA is not available")
    assert_one_line_error(run_module("rag_plugin.cli.interactive", ckpt, "--device", "gpu0"), "'gpu0' is not a device")
    assert_one_line_error(run_module("rag_plugin.cli.interactive", ckpt, "--device", "cpu"), "checkpoint not found")
