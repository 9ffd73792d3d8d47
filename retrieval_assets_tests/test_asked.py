"""What a question asks for (answers/asked.py) and the answer-type check of the extractive answerer (Picking.asked)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_assets.answers import answer, asked
from retrieval_assets.answers.asked import CODE, NUMBER
from retrieval_assets.types import Chunk


@pytest.mark.parametrize("question, kind", [
    ("How many lamps does the lighthouse keep?", NUMBER),
    ("how much paraffin does the burner use in a night", NUMBER),
    ("How long does the relief boat take to reach the rock?", NUMBER),
    ("Which port does the radio listen on by default?", NUMBER),
    ("What is the default port of the harbour radio?", NUMBER),
    ("In which year was the lighthouse first lit?", NUMBER),
    ("When was the Fresnel lens installed?", NUMBER),
    ("What version of the log format is current?", NUMBER),
    ("What is the largest lens a tower can hold?", NUMBER),
    ("Which command restarts the fog signal?", CODE),
    ("which option turns the beacon's flashing off", CODE),
    ("What environment variable points the logger at its file?", CODE),
    ("Which config file lists the keepers?", CODE),
    # no type asked: how-to, why, yes/no, conditions, and wh-words that name no number or name to type
    ("How do I clean the Fresnel lens?", None),
    ("How often is the burner wick trimmed?", None),  # "every four hours", but also "every morning"
    ("Why is the wick trimmed every evening?", None),
    ("When does the keeper start the fog signal?", None),
    ("What happens when the compressor fails?", None),
    ("Which file attributes have to match for a file to count as unchanged?", None),
    ("What does the keeper count before the boat leaves?", None),
    ("Does the relief boat carry paraffin?", None),
])
def test_the_wh_phrase_gives_the_answer_type(question, kind):
    assert asked.expected(question) == kind


@pytest.mark.parametrize("sentence, kinds", [
    ("The lens is cleaned every 4 hours.", {NUMBER}),
    ("The boat calls every six weeks.", {NUMBER}),
    ("Run `fogctl restart` to restart it.", {CODE}),
    ("Pass --dry-run to see what would happen.", {CODE}),
    ("The keepers are listed in /etc/keepers and keepers.yaml.", {CODE}),
    ("Set LOG_PATH or $LOGDIR before starting; see fsck(8).", {CODE, NUMBER}),
    ("The keeper trims the wick in the evening.", set()),
    ("A self-consistency check runs on the lens.", set()),  # a hyphenated word is no flag
])
def test_what_a_sentence_carries(sentence, kinds):
    assert asked.carries(sentence) == kinds


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=400))
def test_any_text_is_read_without_raising(text):
    assert asked.expected(text) in (None, NUMBER, CODE)
    assert asked.carries(text) <= {NUMBER, CODE}


RADIO_TEXT = "The radio room listens for ships on the harbour channel through the night."
BOAT_TEXT = "The relief boat brings paraffin to the rock every six weeks in sealed drums."
RADIO = [Chunk("radio#000", "radio", "Radio", 0, len(RADIO_TEXT), RADIO_TEXT), Chunk("boat#000", "boat", "Relief boat", 0, len(BOAT_TEXT), BOAT_TEXT)]
ON, OFF = dataclasses.replace(answer.PICKING, asked=True), dataclasses.replace(answer.PICKING, asked=False)


def test_the_type_check_refuses_what_main_picking_answered():
    question = "Which port does the radio room listen on by default?"
    # the sentence is about the radio room, every word of the question but the port is there: answered without the check
    assert "radio room listens" in answer.extractive_answer(question, RADIO[:1], scores=[1.0], floor=0.0, picking=OFF).text
    assert answer.extractive_answer(question, RADIO[:1], scores=[1.0], floor=0.0, picking=ON).faithfulness.refused
    # a question whose asked-for number the quoted sentence holds is answered with the check on
    answered = answer.extractive_answer("How many weeks pass between the relief boat's visits?", RADIO, scores=[1.0, 1.0], floor=0.0, picking=ON)
    assert not answered.faithfulness.refused and "six weeks" in answered.text
    # a question that asks for no type is answered as before
    assert not answer.extractive_answer("What does the radio room listen for?", RADIO, scores=[1.0, 1.0], floor=0.0, picking=ON).faithfulness.refused


def test_the_table_records_the_type_asked_and_each_sentences_types():
    table = answer.sentence_table("How many weeks pass between the relief boat's visits?", RADIO, [1.0, 1.0])
    assert table.asked == NUMBER
    assert [kinds for kinds, (s, _) in zip(table.carries, table.candidates) if "six weeks" in s] == [frozenset({NUMBER})]
