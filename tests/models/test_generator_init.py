"""The generator's initialisations (rag_plugin.models.generator): BART's N(0, 0.02) and the
Xavier / N(0, d^-1/2) one used by default for the tiny size trained from scratch."""
import pytest
import torch

pytest.importorskip("fairseq")
from fairseq.data import Dictionary  # noqa: E402
from fairseq.modules import MultiheadAttention  # noqa: E402

from rag_plugin.models.generator import GeneratorShape, build_bart  # noqa: E402
from rag_plugin.models.rag_config import RagConfig, generator_init  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402


def _dictionary(n=500):
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"w{i}")
    return d


def _build(init, positions="learned", dim=64):
    torch.manual_seed(0)
    return build_bart(GeneratorShape(max_source_positions=32, max_target_positions=32, dropout=0.0, embed_dim=dim,
                                     heads=4, ffn_dim=4 * dim, positions=positions, init=init), _dictionary())


def test_xavier_init_scales_embeddings_and_attention():
    dim = 64
    bart, xavier = _build("bart", dim=dim), _build("xavier", dim=dim)
    emb = xavier.encoder.embed_tokens.weight
    assert abs(emb[4:].std().item() - dim ** -0.5) < 0.01          # N(0, d^-1/2) instead of N(0, 0.02)
    assert abs(bart.encoder.embed_tokens.weight[4:].std().item() - 0.02) < 0.002
    pad = xavier.encoder.embed_tokens.padding_idx
    assert torch.count_nonzero(emb[pad]) == 0
    for e in (xavier.encoder.embed_positions, xavier.decoder.embed_positions):
        assert abs(e.weight.std().item() - dim ** -0.5) < 0.02 and torch.count_nonzero(e.weight[e.padding_idx]) == 0
    # input and output embeddings stay one tensor (BART shares all embeddings)
    assert xavier.decoder.output_projection.weight is emb
    assert xavier.decoder.embed_tokens.weight is emb
    attn = next(m for m in xavier.modules() if isinstance(m, MultiheadAttention))
    bound = (6 / (2 * dim)) ** 0.5  # xavier-uniform bound of a d x d projection (gain 1/sqrt(2) for q/k/v)
    assert attn.out_proj.weight.abs().max() <= bound + 1e-6
    assert attn.out_proj.weight.std() > 3 * 0.02
    # layer norms untouched
    ln = xavier.encoder.layernorm_embedding
    assert torch.equal(ln.weight, torch.ones_like(ln.weight)) and torch.equal(ln.bias, torch.zeros_like(ln.bias))


def test_sinusoidal_positions_have_no_learned_table():
    model = _build("xavier", positions="sinusoidal")
    assert not any("embed_positions" in name for name, _ in model.named_parameters())


def test_unknown_init_and_positions_are_user_errors():
    with pytest.raises(UserError, match="initialisation"):
        _build("kaiming")
    with pytest.raises(UserError, match="positions"):
        _build("xavier", positions="rotary")


@pytest.mark.parametrize("size,init,expected", [("tiny", "auto", "xavier"), ("base", "auto", "bart"),
                                                ("large", "auto", "bart"), ("tiny", "bart", "bart"),
                                                ("base", "xavier", "xavier")])
def test_auto_init_is_xavier_for_tiny_only(size, init, expected):
    assert generator_init(RagConfig(generator_size=size, generator_init=init)) == expected
