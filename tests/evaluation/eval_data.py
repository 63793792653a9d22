"""Gold/guess/passages fixture data shared by the evaluation tests."""
import json

GOLD_QA = [
    {"id": "q1", "input": "What is the capital of France?",
     "output": [{"answer": "Paris", "provenance": [{"id": "p1", "title": "Paris"}]},
                {"answer": "City of Paris"}]},
    {"id": "q2", "input": "Who wrote Hamlet?",
     "output": [{"answer": "William Shakespeare", "provenance": [{"id": "p2"}, {"id": "p3"}]}]},
    {"id": "q3", "input": "What is the largest planet?",
     "output": [{"answer": "Jupiter", "provenance": [{"wikipedia_id": "p4"}]}]},
]

# fairseq-generate output for GOLD_QA (examples out of order, nbest 2, log lines in between)
GENERATE_QA = """\
2024-05-01 10:00:00 | INFO | fairseq_cli.generate | loading model(s) from ckpt.pt
S-2\tWhat is the largest planet?
T-2\tJupiter
H-2\t-0.2\t\u2581Jupiter
D-2\t-0.2\tJupiter
P-2\t-0.1 -0.1
H-2\t-1.5\t\u2581Saturn
D-2\t-1.5\tSaturn
P-2\t-0.7 -0.8
Z-2\t1\t0.3\tp9\tSaturn
Z-2\t0\t0.7\tp4\tJupiter
S-0\tWhat is the capital of France?
T-0\tParis
H-0\t-0.3\tthe \u2581paris
D-0\t-0.3\tThe Paris!
P-0\t-0.2 -0.1
Z-0\t0\t0.9\tp1\tParis
Z-0\t1\t0.1\tp5\tLyon
2024-05-01 10:00:01 | INFO | fairseq.logging | batch 2
S-1\tWho wrote Hamlet?
T-1\tWilliam Shakespeare
H-1\t-0.4\tshake speare
D-1\t-0.4\tShakespeare
P-1\t-0.2 -0.2
A-1\t0-0 1-1
Z-1\t0\t0.5\tp2\tHamlet
Z-1\t1\t0.3\tp7\tMacbeth
Z-1\t2\t0.2\tp3\tShakespeare
Generate test with beam=2: BLEU4 = 10.00, 40.0/20.0/10.0/5.0 (BP=1.000, ratio=1.000, syslen=5, reflen=5)
"""

PASSAGES = [
    {"id": "p1", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "p2", "title": "Hamlet", "text": "Hamlet is a tragedy by William Shakespeare."},
    {"id": "p3", "title": "Shakespeare", "text": "An English playwright and poet."},
    {"id": "p4", "title": "Jupiter", "text": "Jupiter is the fifth planet from the Sun."},
    {"id": "p5", "title": "Lyon", "text": "Lyon is a city in France."},
    {"id": "p7", "title": "Macbeth", "text": "Macbeth is a tragedy."},
    {"id": "p9", "title": "Saturn", "text": "Saturn is the sixth planet."},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
