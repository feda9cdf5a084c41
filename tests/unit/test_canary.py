"""`warden canary`'s judgement and its reference files, without an engine (the real-engine runs are in
tests/integration/test_run_tiny_cpu.py). A bad reference is refused before anything is asked of the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import free_port

from service.canary.reference import reference_json
from service.canary.runner import Answer, first_difference, judge
from service.canary.suites import SUITES, Case
from service.cli import main

JSON_CASE = SUITES["json"][0]
TEXT_CASE = Case("t", "a prompt of words", 4)


@pytest.mark.parametrize(
    ("expected", "got", "says"),
    [
        ([1, 2, 3], [1, 9, 3], "token 1 is 9, expected 2 (3 tokens against 3)"),
        ([1, 2, 3], [1, 2], "token 2 is the end, expected 3 (2 tokens against 3)"),
        ([1, 2], [1, 2, 3], "token 2 is 3, expected the end (3 tokens against 2)"),
    ],
)
def test_a_mismatch_names_the_first_differing_token(expected: list[int], got: list[int], says: str) -> None:
    assert first_difference(expected, got) == says
    assert judge(TEXT_CASE, Answer(got, "", "length"), expected) == says


def test_a_json_answer_must_parse_when_it_finished() -> None:
    assert judge(JSON_CASE, Answer([1], '{"device": 3, "light": "red"}', "stop"), [1]) is None
    assert "not JSON" in (judge(JSON_CASE, Answer([1], '{"device": 3', "stop"), [1]) or "")
    assert judge(JSON_CASE, Answer([1], '{"device": 3', "length"), [1]) is None  # out of tokens: tokens decide
    assert judge(TEXT_CASE, Answer([1], "not json", "stop"), None) is None  # no reference yet: the first repeat


def good_reference() -> dict:
    answers = {suite: {case.name: [1, 2, 3] for case in cases} for suite, cases in SUITES.items()}
    return reference_json("tiny", answers)


def spoil(what: str) -> str:
    data = good_reference()
    if what == "prompt":
        data["suites"]["json"]["pair-0"]["prompt"] = "another question"
        return json.dumps(data)
    if what == "tokens":
        data["suites"]["color"]["color-1"]["tokens"] = [1, "2"]
        return json.dumps(data)
    if what == "suite":
        del data["suites"]["color"]
        return json.dumps(data)
    if what == "format":
        return json.dumps({**data, "format": "something-else/1"})
    return "{"


@pytest.mark.parametrize(
    ("what", "says"),
    [
        ("prompt", "suite 'json' case 'pair-0' was made with another prompt than this warden's"),
        ("tokens", "suite 'color' case 'color-1': tokens are not all integers"),
        ("suite", "has no suite 'color'"),
        ("format", "is not a warden canary reference"),
        ("json", "is not JSON"),
    ],
)
def test_a_reference_that_does_not_fit_is_refused_before_asking_anything(
    tmp_path: Path, what: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = tmp_path / "ref.json"
    reference.write_text(spoil(what))
    nobody = f"http://127.0.0.1:{free_port()}"  # were anything asked, the error would be "not reachable"
    assert main(["canary", "--url", nobody, "--reference", str(reference)]) == 1
    err = capsys.readouterr().err
    assert says in err and "make a new reference" in err and "not reachable" not in err


def test_a_reference_of_one_suite_serves_that_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = good_reference()
    del data["suites"]["color"]
    reference = tmp_path / "ref.json"
    reference.write_text(json.dumps(data))
    nobody = f"http://127.0.0.1:{free_port()}"
    assert main(["canary", "--url", nobody, "--model", "tiny", "--suite", "json", "--reference", str(reference)]) == 1
    assert "engine not reachable" in capsys.readouterr().err  # the reference passed; the engine is what is missing


def test_repeats_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["canary", "--repeats", "0"])
    assert exited.value.code == 2 and "argument --repeats: 0 is less than 1" in capsys.readouterr().err
