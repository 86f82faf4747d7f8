"""Every job type this program runs. A new job type is a new module and one line below."""

from sidelinja_worker.jobs import noop
from sidelinja_worker.jobs.ai import (
    dictation_cleanup,
    meeting_summarize,
    openrouter_analyze,
    research_clip,
)
from sidelinja_worker.jobs.knowledge import (
    generate_embeddings,
    prompt_eval,
    prompt_eval_case,
    valgomat_generate_profile,
    valgomat_moderation,
)
from sidelinja_worker.jobs.stats import stats_parse
from sidelinja_worker.jobs.transcripts import srt_parse, whisper_transcribe
from sidelinja_worker.queue.registry import Registry

REGISTRY = Registry(
    [
        noop.JOB_TYPE,
        whisper_transcribe.JOB_TYPE,
        srt_parse.JOB_TYPE,
        openrouter_analyze.JOB_TYPE,
        research_clip.JOB_TYPE,
        dictation_cleanup.JOB_TYPE,
        meeting_summarize.JOB_TYPE,
        stats_parse.JOB_TYPE,
        generate_embeddings.JOB_TYPE,
        valgomat_generate_profile.JOB_TYPE,
        valgomat_moderation.JOB_TYPE,
        prompt_eval.JOB_TYPE,
        prompt_eval_case.CASE_JOB_TYPE,
        prompt_eval_case.SCORE_JOB_TYPE,
    ]
)
