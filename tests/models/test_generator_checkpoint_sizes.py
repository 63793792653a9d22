"""--generator-checkpoint whose sizes differ from --arch: the error names the options that fix it
(issue 25, item 3: a checkpoint made with other position sizes used to be told to pick another arch)."""
import pytest
import torch
from fairseq.data import Dictionary

from rag_plugin.models.generator import GeneratorShape, build_bart, load_generator_weights
from rag_plugin.util.errors import UserError


def _generator(dictionary, src, tgt, dim=16):
    return build_bart(GeneratorShape(max_source_positions=src, max_target_positions=tgt, dropout=0.0, embed_dim=dim,
                                     layers=1, heads=2, ffn_dim=32), dictionary)


def test_other_position_sizes_name_the_position_options(tiny_world, tmp_path):
    dictionary = Dictionary.load(str(tiny_world["root"] / "dict.txt"))
    trained = _generator(dictionary, 96, 64)
    path = tmp_path / "pretrained.pt"
    torch.save({"model": {f"generator.{k}": v for k, v in trained.state_dict().items()}}, path)
    with pytest.raises(UserError) as err:
        load_generator_weights(_generator(dictionary, 128, 128), str(path), dictionary)
    message = err.value.render()
    assert "other input/output lengths" in message
    assert message.endswith("(pass --max-source-positions 96 --max-target-positions 64 (the checkpoint's lengths))")
    follows = _generator(dictionary, 96, 64)            # the fix named works
    load_generator_weights(follows, str(path), dictionary)
    assert all(torch.equal(a, b) for a, b in zip(follows.state_dict().values(), trained.state_dict().values()))


def test_another_model_size_names_the_size(tiny_world, tmp_path):
    dictionary = Dictionary.load(str(tiny_world["root"] / "dict.txt"))
    path = tmp_path / "pretrained.pt"
    torch.save({"model": _generator(dictionary, 64, 64, dim=32).state_dict()}, path)
    with pytest.raises(UserError, match=r"another model size .* d=32, 1 encoder layers"):
        load_generator_weights(_generator(dictionary, 64, 64, dim=16), str(path), dictionary)
