"""Shared helpers and fixtures of the converter tests: small files in each official layout, as the
released files look (see docs/datasets.md for the sources), and the checks every converter test makes."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from rag_plugin.data.kilt import read_kilt
from rag_plugin.datasets.writer import SPLITS
from tests.conftest import assert_one_line_error  # noqa: F401  (the converter tests take it from here)

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- helpers
def read_jsonl(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def splits(out):
    return {s: read_jsonl(Path(out) / f"{s}.jsonl") for s in SPLITS}


def check_readable(out):
    """Every split passes the task's own reader."""
    for s in SPLITS:
        assert read_kilt(str(Path(out) / f"{s}.jsonl"))


def run_prepare(dataset, *args):
    """``rag-prepare DATASET ARGS --quiet`` (the console script, as installed)."""
    return subprocess.run([str(Path(sys.executable).parent / "rag-prepare"), dataset, *map(str, args), "--quiet"],
                          capture_output=True, text=True, cwd=str(REPO), timeout=120)




def assert_nothing_left(parent, out):
    assert not Path(out).exists()
    assert not [p.name for p in Path(parent).iterdir() if p.name.startswith(f".{Path(out).name}.")]


# ----------------------------------------------------------------------------- fixtures
NQ_QAS_TRAIN = [  # DPR's nq-train.csv: question<TAB>Python list literal, no header
    "big little lies season 2 how many episodes\t['seven']",
    "who sings does he love me with reba\t['Linda Davis']",
    "how many pages is invisible man by ralph ellison\t['581 ( second edition )']",
    'what is the name of the "lion king" villain\t["Scar", "Taka"]',
    "who played o'neill in stargate\t[\"Richard Dean Anderson\", 'Kurt Russell']",
    "where did the titanic sink\t['North Atlantic Ocean', 'the North Atlantic']",
    "when was the first harry potter book published\t['1997']",
    "who wrote the declaration of independence\t['Thomas Jefferson']",
    "what is the capital of australia\t['Canberra']",
    "who invented the telephone\t['Alexander Graham Bell']",
]
NQ_QAS_DEV = [
    "who got the first nobel prize in physics\t['Wilhelm Conrad Röntgen']",
    "when is the next deadpool movie being released\t['May 18 , 2018']",
]
CT_QAS = [  # DPR's curatedtrec-*.csv: the answers are regular expressions
    "What is the largest city in the world?\t['Tokyo|Tokyo-Yokohama']",
    "how far is it from earth to mars\t['(35|35\\\\.0|48|140|2[0-9][0-9]) million miles']",
    "What is the name of the longest ruling dynasty of Japan?\t[\"Yamato\"]",
    "Who was the first president of the United States?\t['(George )?Washington']",
]


def dpr_json_records():
    """DPR's retriever-training JSON (biencoder-nq-*.json), as released (indent=4)."""
    return [
        {"dataset": "nq_train_psg_compass", "question": "big little lies season 2 how many episodes",
         "answers": ["seven"],
         "positive_ctxs": [{"title": "Big Little Lies (TV series)", "text": "series garnered several accolades. "
                            "It received 16 Emmy Award nominations", "score": 1000, "title_score": 1,
                            "passage_id": "18768923"},
                           {"title": "Big Little Lies (TV series)", "text": "second season of seven episodes",
                            "score": 13.4, "title_score": 0, "passage_id": "18768928"}],
         "negative_ctxs": [{"title": "Cormac McCarthy", "text": "chores of the house", "score": 0,
                            "title_score": 0, "passage_id": "2145653"}],
         "hard_negative_ctxs": [{"title": "Little People, Big World", "text": "final minutes of the season",
                                 "score": 13.2, "title_score": 0, "passage_id": "20676573"}]},
        {"dataset": "nq_train_psg_compass", "question": "who sings does he love me with reba",
         "answers": ["Linda Davis"],
         "positive_ctxs": [{"title": "Does He Love You", "text": "Does He Love You is a song written by Sandy "
                            "Knox and Billy Stritch", "score": 1000, "title_score": 1, "psg_id": "wiki:11828866"}],
         "negative_ctxs": [], "hard_negative_ctxs": []},
        {"dataset": "nq_train_psg_compass", "question": "what is the capital of australia",
         "answers": ["Canberra", "Canberra, ACT"], "positive_ctxs": [], "negative_ctxs": [],
         "hard_negative_ctxs": []},
    ]


def kilt_nq_records():
    prov = {"wikipedia_id": "42271", "title": "The Walking Dead (season 8)", "section": "Section::::Production.",
            "start_paragraph_id": 3, "start_character": 0, "end_paragraph_id": 3, "end_character": 150,
            "bleu_score": 1.0, "meta": {}}
    return [
        {"id": "-1381557374982285430", "input": "when is the last episode of season 8 of the walking dead",
         "output": [{"answer": "March 18, 2018", "provenance": [prov]}, {"answer": "March 18 , 2018"},
                    {"provenance": [dict(prov, start_paragraph_id=1, end_paragraph_id=1)]}],
         "meta": {}},
        {"id": "8921476712341", "input": "who plays the voice of the beast in beauty and the beast",
         "output": [{"answer": "Dan Stevens"}], "meta": {}},
        {"id": "-6341222344", "input": "what is the currency of japan",
         "output": [{"answer": "yen"}, {"answer": "Japanese yen"}], "meta": {}},
        {"id": "123", "input": "who was the first man on the moon",
         "output": [{"answer": "Neil Armstrong"}], "meta": {}},
    ]


def triviaqa_json(questions):
    """TriviaQA's unfiltered-web-*.json."""
    data = [{"Answer": {"Aliases": aliases, "MatchedWikiEntityName": value,
                        "NormalizedAliases": [a.lower() for a in aliases], "NormalizedMatchedWikiEntityName":
                        value.lower(), "NormalizedValue": value.lower(), "Type": "WikipediaEntity", "Value": value},
             "EntityPages": [{"DocSource": "TagMe", "Filename": f"{value}.txt", "Title": value}],
             "Question": q, "QuestionId": qid, "QuestionSource": "http://www.quizwise.com/",
             "SearchResults": [{"Description": "...", "DisplayUrl": "example.com", "Filename": "1.txt", "Rank": 0,
                                "Title": value, "Url": "http://example.com/"}]}
            for qid, q, value, aliases in questions]
    return {"Data": data, "Domain": "Web", "Split": "train", "VerifiedEval": False, "Version": 1.0}


TQA_QUESTIONS = [
    ("qw_3935", "Which metropolitan county was created in 1974 around Newcastle?", "Tyne and Wear",
     ["Tyne & Wear", "Tyne and Wear", "Tyne and wear"]),
    ("tc_33", "Which Lloyd Webber musical premiered in the US on 10th December 1993?", "Sunset Boulevard",
     ["Sunset Boulevard", "Sunset Blvd"]),
    ("sfq_1", "Who was the man behind The Chipmunks?", "David Seville", ["David Seville"]),
    ("bt_7", "What is the capital of Peru?", "Lima", ["Lima", "Lima, Peru"]),
    ("dev_1", "In which country is Timbuktu?", "Mali", ["Mali", "Republic of Mali"]),
]


def kilt_tqa_line(qid, answers):
    """KILT's triviaqa-*_id-kilt.jsonl: ids and outputs only, no 'input'."""
    return {"id": qid, "output": [{"answer": a} for a in answers]
            + [{"provenance": [{"wikipedia_id": "52780", "title": "Tyne and Wear"}]}]}


def msmarco_v21(rows):
    """MS-MARCO v2.1's columnar JSON: one dict per column, keyed by row number as a string."""
    doc = {"answers": {}, "passages": {}, "query": {}, "query_id": {}, "query_type": {}, "wellFormedAnswers": {}}
    for i, (query, answers, wfa) in enumerate(rows):
        k = str(i)
        doc["answers"][k] = answers
        doc["passages"][k] = [{"is_selected": int(j == 0), "passage_text": f"passage {j} about {query}",
                               "url": f"http://example.com/{i}/{j}"} for j in range(3)]
        doc["query"][k] = query
        doc["query_id"][k] = 1185860 + i
        doc["query_type"][k] = "DESCRIPTION"
        doc["wellFormedAnswers"][k] = wfa
    return doc


JEOPARDY = [  # JEOPARDY_QUESTIONS1.json
    {"category": "HISTORY", "air_date": "2004-12-31",
     "question": "'For the last 8 years of his life, Galileo was under house arrest for espousing this man's theory'",
     "value": "$200", "answer": "Copernicus", "round": "Jeopardy!", "show_number": "4680"},
    {"category": "ESPN's TOP 10 ALL-TIME ATHLETES", "air_date": "2004-12-31",
     "question": "'No. 2: 1912 Olympian; football star at Carlisle Indian School; 6 MLB seasons with the Reds, "
                 "Giants & Braves'", "value": "$200", "answer": "Jim Thorpe", "round": "Jeopardy!",
     "show_number": "4680"},
    {"category": "EVERYBODY TALKS ABOUT IT...", "air_date": "2004-12-31",
     "question": "'<a href=\"http://www.j-archive.com/media/2004-12-31_DJ_23.mp3\" target=\"_blank\">Beyond "
                 "ideology</a>, this &quot;Great Communicator&quot; was known for his <i>humor</i>'",
     "value": "$1,200", "answer": "Ronald Reagan", "round": "Double Jeopardy!", "show_number": "4680"},
    {"category": "THE COMPANY LINE", "air_date": "2004-12-31",
     "question": "'In 1963, live on \"The Art Linkletter Show\", this company served its billionth burger'",
     "value": None, "answer": "McDonald\\'s", "round": "Final Jeopardy!", "show_number": "4680"},
    {"category": "EPITAPHS & TRIBUTES", "air_date": "2004-12-31", "question": "''", "value": "$2,000",
     "answer": "nothing", "round": "Jeopardy!", "show_number": "4680"},
] + [{"category": "SCIENCE", "air_date": "2005-01-03", "question": f"'This element has atomic number {i}'",
      "value": "$400", "answer": f"Element {i}", "round": "Jeopardy!", "show_number": "4681"} for i in range(1, 26)]

FEVER_ORIGINAL = [  # FEVER's train.jsonl / paper_dev.jsonl
    {"id": 75397, "verifiable": "VERIFIABLE", "label": "SUPPORTS",
     "claim": "Nikolaj Coster-Waldau worked with the Fox Broadcasting Company.",
     "evidence": [[[92206, 104971, "Nikolaj_Coster-Waldau", 7], [92206, 104971, "Fox_Broadcasting_Company", 0]]]},
    {"id": 150448, "verifiable": "VERIFIABLE", "label": "SUPPORTS", "claim": "Roman Atwood is a content creator.",
     "evidence": [[[174271, 187498, "Roman_Atwood", 1]], [[174271, 187499, "Roman_Atwood", 3]],
                  [[174271, 187498, "Roman_Atwood", 1]]]},
    {"id": 214861, "verifiable": "VERIFIABLE", "label": "REFUTES",
     "claim": "History of art includes architecture, dance, sculpture, music, painting, poetry literature, "
              "theatre, narrative, film, photography and graphic arts.",
     "evidence": [[[255136, 254645, "History_of_art", 2]]]},
    {"id": 156709, "verifiable": "NOT VERIFIABLE", "label": "NOT ENOUGH INFO",
     "claim": "Adrienne Bailon is an accountant.", "evidence": [[[180581, None, None, None]]]},
    {"id": 83235, "verifiable": "VERIFIABLE", "label": "REFUTES", "claim": "System of a Down briefly disbanded in "
     "limbo.", "evidence": [[[100277, 113694, "System_of_a_Down_-LRB-album-RRB-", 0]]]},
    {"id": 129629, "verifiable": "NOT VERIFIABLE", "label": "NOT ENOUGH INFO",
     "claim": "Homeland is an American television spy thriller.", "evidence": [[[151831, None, None, None]]]},
]


def write_lines(path, lines):
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_json(path, obj, indent=None):
    Path(path).write_text(json.dumps(obj, indent=indent), encoding="utf-8")
    return path


MARCO_TRAIN = [
    (")what was the immediate impact of the success of the manhattan project?",
     ["The success of the Manhattan Project had an immediate impact."], "[]"),
    ("what is rba", ["Results-Based Accountability is a disciplined way of thinking."],
     ["Results-Based Accountability is a disciplined way of thinking and taking action."]),
    ("was ronald reagan a democrat", ["Yes"], ["Yes, Ronald Reagan was a democrat."]),
    ("how long do you need for sydney and surrounding areas", ["No Answer Present."], "[]"),
    ("price to install tile in shower", ["$11 to $22 per square foot"], "[]"),
    ("why conversion observed in body", ["No Answer Present."], "[]"),
    ("where are the benefits of eating oat", ["Oats are rich in fiber"], ["Oats are rich in fiber."]),
]
MARCO_DEV = [
    (". what is a corporation?", ["A corporation is a company or group of people authorized to act as a single "
                                  "entity."], ["A corporation is a company."]),
    ("where is whitemarsh island", ["No Answer Present."], "[]"),
    ("how much do hockey refs make", ["$65,000 a year"], "[]"),
]


def write_gz(path, text):
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(text)
    return path
