"""Pure parts of the AI jobs: splitting without loss, combine grouping, the strict schema,
Retry-After, error text, settings resolution."""

from __future__ import annotations

import pytest

from sidelinja_worker.jobs.ai import openrouter_analyze
from sidelinja_worker.jobs.ai.common import (
    DEFAULT_MODEL,
    TranscriptSource,
    resolve_settings,
)
from sidelinja_worker.jobs.ai.dictation_cleanup import Note, NoteTask, merge_notes
from sidelinja_worker.jobs.ai.meeting_summarize import Minutes
from sidelinja_worker.jobs.ai.text import group_for_combine, split_text
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.services.ai_errors import describe_error
from sidelinja_worker.services.ai_gateway import parse_answer, strict_schema


def test_split_text_is_lossless_and_respects_the_budget() -> None:
    text = "".join(
        f"[0:{i // 60:02d}:{i % 60:02d}] setning nummer {i} om byvalget.\n" for i in range(200)
    )
    text += "ett veldig langt ord " * 100 + "\n" + "x" * 250  # a long line; a word over budget
    parts = split_text(text, 120)
    assert "".join(parts) == text
    assert len(parts) > 1 and all(len(p) <= 120 for p in parts)
    # Lines are never cut where they fit: every short line is whole in one part.
    assert all(any(line in p for p in parts) for line in text.splitlines()[:200])


def test_split_text_short_input_is_one_part() -> None:
    assert split_text("kort", 100) == ["kort"]


def test_group_for_combine_always_makes_progress() -> None:
    items = ["a" * 90] * 5  # each alone nearly fills the budget
    groups = group_for_combine(items, 100)
    assert sum(len(g) for g in groups) == 5 and all(len(g) >= 2 for g in groups)
    assert len(groups) < 5
    assert group_for_combine(["a", "b", "c"], 100) == [["a", "b", "c"]]


def test_strict_schema_inlines_refs_and_requires_every_property() -> None:
    schema = strict_schema(openrouter_analyze.Analysis)
    assert "$defs" not in str(schema) and "$ref" not in str(schema)
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {
        "title_suggestions",
        "summary",
        "chapters",
        "topics",
        "people",
    }
    person = schema["properties"]["people"]["items"]
    assert person["required"] == ["name", "role"] and person["additionalProperties"] is False
    assert {"type": "null"} in person["properties"]["role"]["anyOf"]  # optional = nullable
    chapter = schema["properties"]["chapters"]["items"]
    assert "title" in chapter["properties"]  # a property named "title" is not a schema title


def test_parse_answer_accepts_a_fenced_answer_and_names_what_is_wrong() -> None:
    minutes = parse_answer(
        Minutes, '```json\n{"summary": "s", "decisions": [], "action_points": []}\n```'
    )
    assert minutes.summary == "s"
    with pytest.raises(Exception, match="action_points"):
        parse_answer(Minutes, '{"summary": "s", "decisions": []}')
    with pytest.raises(Exception, match="empty"):
        parse_answer(Minutes, None)


def test_error_text_keeps_the_gateway_message_and_useful_metadata() -> None:
    text = describe_error(
        402, {"message": "Insufficient credits", "metadata": {"limit_source": "key"}}
    )
    assert text == "AI gateway 402: Insufficient credits (limit_source: key)"
    text = describe_error(
        403, {"message": "flagged", "metadata": {"reasons": ["violence", "hate"]}}
    )
    assert text == "AI gateway 403: flagged (reasons: violence, hate)"


def test_settings_resolve_job_over_workspace_over_default() -> None:
    task = openrouter_analyze.TASK
    assert resolve_settings({}, task).model == DEFAULT_MODEL
    raw = {
        "ai": {
            "model": "a/ws",
            "names": ["Tromsø", " "],
            "context_tokens": 500,
            "openrouter_analyze": {"model": "a/job", "prompt": "P"},
        }
    }
    got = resolve_settings(raw, task)
    assert (got.model, got.prompt, got.names, got.context_tokens) == (
        "a/job",
        "P",
        ("Tromsø",),
        500,
    )
    with pytest.raises(PermanentError, match="ai.openrouter_analyze: context_tokens"):
        resolve_settings({"ai": {"openrouter_analyze": {"context_tokens": "many"}}}, task)


def test_transcript_source_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        TranscriptSource.model_validate({"transcript_ref": "ep1", "text": "hei"})
    with pytest.raises(ValueError, match="exactly one"):
        TranscriptSource.model_validate({})


def test_split_dictation_is_joined_locally_without_losing_text() -> None:
    a = Note(title="A", body="Første del.", tasks=[NoteTask(what="Ring Kari")])
    b = Note(
        title="B", body="Andre del.", tasks=[NoteTask(what="Ring Kari"), NoteTask(what="Send")]
    )
    merged = merge_notes([a, b])
    assert merged.body == "Første del.\n\nAndre del."
    assert [t.what for t in merged.tasks] == ["Ring Kari", "Send"]
