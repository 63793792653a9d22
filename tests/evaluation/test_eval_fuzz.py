"""Hypothesis fuzzing of the fairseq-generate parser: random input fails only with UserError,
and well-formed output (shuffled, with log lines) always parses to what was written."""
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_plugin.evaluation.fairseq_output import align_fairseq, check_fairseq_examples, parse_fairseq_lines
from rag_plugin.evaluation.records import GoldExample
from rag_plugin.util.errors import UserError

PREFIXES = ["S-", "T-", "H-", "D-", "P-", "Z-", "A-", "W-", "X-", "", "2024-05-01 | INFO | ", "Generate "]
FIELD = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["0", "1", "2", "-0.5", "0.3", "1e-3", "nan", "inf", "-inf", "1_0", "٣", "", " ", "p1"]),
    st.integers(-3, 30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
LINE = st.builds(
    lambda prefix, index, fields: prefix + index + ("\t" + "\t".join(fields) if fields else ""),
    st.sampled_from(PREFIXES),
    st.one_of(st.integers(0, 4).map(str), st.text(max_size=3)),
    st.lists(FIELD, max_size=5),
)
GOLD = [GoldExample(f"id{i}", f"q{i}", [f"a{i}"], [[f"p{i}"]]) for i in range(4)]


def _parse_all(lines):
    examples = parse_fairseq_lines(list(enumerate(lines, 1)), "fuzz.out")
    if examples:
        check_fairseq_examples(examples, "fuzz.out")
        guesses = align_fairseq("fuzz.out", examples, GOLD)
        assert [g.id for g in guesses] == [g.id for g in GOLD]
        for g in guesses:
            assert isinstance(g.answer, str)
            assert all(0 - 1e-4 <= p <= 1 + 1e-4 for p in g.doc_scores)
    return examples


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(LINE, st.text(max_size=40)), max_size=25))
def test_random_lines_raise_only_user_error(lines):
    try:
        _parse_all(lines)
    except UserError as err:
        assert "\n" not in err.render()
        assert err.render().startswith("fuzz.out")


@st.composite
def generate_output(draw):
    """Well-formed output for 4 examples, nbest 1-3, 0-4 passages each, plus log lines."""
    blocks, expected = [], {}
    text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=15)
    for i in range(4):
        nbest = draw(st.integers(1, 3))
        hyps = [draw(text) for _ in range(nbest)]
        lines = [f"S-{i}\tq{i}", f"T-{i}\t{draw(text)}"]  # S: the gold question (checked by the alignment)
        for h in hyps:
            lines += [f"H-{i}\t-0.5\t{h}", f"D-{i}\t-0.5\t{h}", f"P-{i}\t-0.1 -0.2"]
        n = draw(st.integers(0, 4))
        ids = [f"doc {i}-{r}" for r in range(n)]
        probs = draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))
        zlines = [f"Z-{i}\t{r}\t{p!r}\t{pid}\t{draw(text)}" for r, (p, pid) in enumerate(zip(probs, ids))]
        lines += draw(st.permutations(zlines))
        blocks.append(lines)
        expected[i] = (hyps[0].strip(), ids)
    order = draw(st.permutations(list(range(4))))
    seed = draw(st.integers(0, 10 ** 6))
    out = []
    rng = random.Random(seed)
    for i in order:
        for line in blocks[i]:
            if rng.random() < 0.2:
                out.append("2024-05-01 12:00:00 | INFO | fairseq.logging | step")
            out.append(line)
    out.append("Generate test with beam=5: BLEU4 = 1.00")
    return out, expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generate_output())
def test_well_formed_output_round_trips(data):
    lines, expected = data
    examples = parse_fairseq_lines(list(enumerate(lines, 1)), "gen.out")
    check_fairseq_examples(examples, "gen.out")
    guesses = align_fairseq("gen.out", examples, GOLD)
    for i, g in enumerate(guesses):
        hyp, ids = expected[i]
        assert g.answer == hyp
        assert g.retrieved == ids
