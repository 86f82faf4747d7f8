"""The platform's default priority per job type, used when a Python or CLI enqueuer names none.

A table of names, not of handlers, so the client gives a job type its default even in a process that
does not run that type (the web app's own types, or a type whose handler lands later)."""

DEFAULT_PRIORITIES: dict[str, int] = {
    "whisper_transcribe": 5,
    "srt_parse": 5,
    "openrouter_analyze": 5,
    "research_clip": 10,
    "dictation_cleanup": 10,
    "meeting_summarize": 5,
    "valgomat_generate_profile": 5,
    "valgomat_moderation": 5,
    "generate_embeddings": 1,
    "stats_parse": 1,
    "prompt_eval": 1,
    "noop": 0,
}


def default_priority(job_type: str) -> int:
    return DEFAULT_PRIORITIES.get(job_type, 0)
