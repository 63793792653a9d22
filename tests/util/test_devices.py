"""--device values (rag_plugin/util/devices.py): the default is this process's GPU when CUDA is available, else the
CPU; ``cuda`` is the GPU fairseq (or torchrun's build) selected for the process, never LOCAL_RANK's; a GPU asked for
where there is none, or not that many, is a one-line error."""
import pytest
import torch

from rag_plugin.util.devices import current_cuda_device, model_device, resolve_device
from rag_plugin.util.errors import UserError


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def gpu_three_of_four(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setenv("LOCAL_RANK", "0")  # not what the process was given: never read


def test_without_cuda_the_default_is_the_cpu_and_cuda_is_a_one_line_error(no_gpu):
    assert resolve_device(None) == resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("meta") == torch.device("meta")
    for name in ("cuda", "cuda:1", "CUDA"):
        with pytest.raises(UserError, match="CUDA is not available here") as err:
            resolve_device(name, "--device")
        assert "\n" not in str(err.value) and "--device cpu" in str(err.value)
    with pytest.raises(UserError, match="'gpu' is not a device"):
        resolve_device("gpu")


def test_with_cuda_the_default_and_cuda_are_the_processs_current_gpu(gpu_three_of_four):
    assert resolve_device(None) == resolve_device("cuda") == current_cuda_device() == torch.device("cuda", 3)
    assert resolve_device("cuda:1") == torch.device("cuda", 1) and resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="has 4 GPU"):
        resolve_device("cuda:4")


def test_the_model_device_is_its_first_parameters():
    assert model_device(torch.nn.Linear(2, 2).to("meta")) == torch.device("meta")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")
