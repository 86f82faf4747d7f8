"""The settings object is the one source of configuration: the CLI's flags, the environment
variables, their defaults and parsing, and the configuration table in docs/operations.md."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from sidelinja_worker import settings
from sidelinja_worker.cli.main import build_parser
from sidelinja_worker.queue.config import SERVICE_ENV, ServiceConfig
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.settings import WorkerSettings

ROOT = Path(__file__).resolve().parent.parent
TABLE_START = "<!-- configuration table: python -m sidelinja_worker.settings --markdown -->"
TABLE_END = "<!-- end of the configuration table -->"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for _, meta in settings.fields():
        monkeypatch.delenv(meta.env, raising=False)
        monkeypatch.delenv(f"{meta.env}_FILE", raising=False)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction | argparse._HelpAction)
        for option in action.option_strings
    }


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["run", "demo", "admin"])
def test_every_configuration_flag_comes_from_the_settings(command: str) -> None:
    wanted = {
        flag
        for name, meta in settings.fields()
        if (command in meta.commands or settings.GLOBAL in meta.commands)
        and (flag := settings.flag_of(name, meta))
    }
    assert _options(_subparser(command)) == wanted


def test_global_flags_are_the_settings_global_fields() -> None:
    wanted = {
        flag
        for name, meta in settings.fields()
        if settings.GLOBAL in meta.commands and (flag := settings.flag_of(name, meta))
    }
    assert _options(build_parser()) == wanted


def test_defaults_build_the_engines_defaults() -> None:
    loaded = settings.load()
    assert loaded.worker_settings(("noop",)) == WorkerSettings()
    assert loaded.service_config() == ServiceConfig({})
    assert loaded.database is None and loaded.level == "INFO"


def test_flags_win_over_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDELINJA_MAX_CONCURRENT", "5")
    monkeypatch.setenv("SIDELINJA_LEASE", "2m")
    monkeypatch.setenv("AI_GATEWAY_URL", "http://env")
    monkeypatch.setenv("SIDELINJA_ADMIN_BIND", "0.0.0.0:9000")
    loaded = settings.load({"max_concurrent": "8", "ai_gateway_url": "http://flag"})
    worker = loaded.worker_settings(("noop",))
    assert (worker.max_concurrent, worker.lease_s) == (8, 120.0)
    assert loaded.service_config().get("AI_GATEWAY_URL") == "http://flag"
    assert loaded.admin_bind == "0.0.0.0:9000"


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDELINJA_BURST", "")
    monkeypatch.setenv("SIDELINJA_LEASE", "")
    monkeypatch.setenv("MEDIA_ROOT", "")
    loaded = settings.load()
    assert (loaded.burst, loaded.lease, loaded.service_config().get("MEDIA_ROOT")) == (
        False,
        60.0,
        None,
    )


BOOLEANS = [
    name for name, _ in settings.fields() if settings.Settings.model_fields[name].annotation is bool
]


@pytest.mark.parametrize("name", BOOLEANS)
def test_one_rule_for_every_boolean(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = settings.Settings.model_fields[name].validation_alias
    assert isinstance(env, str)
    words = {"on": True, "YES": True, "1": True, "true": True}
    words |= {"off": False, "No": False, "0": False, "false": False}
    for word, value in words.items():
        monkeypatch.setenv(env, word)
        assert getattr(settings.load(), name) is value, (env, word)
    monkeypatch.setenv(env, "maybe")
    with pytest.raises(UserError, match=f"{env}: 'maybe' is not on/off, true/false, yes/no or 1/0"):
        settings.load()


DURATIONS = [
    "poll_interval",
    "lease",
    "grace",
    "max_timeout",
    "keep_completed",
    "keep_errors",
    "admin_read_timeout",
]


@pytest.mark.parametrize("name", DURATIONS)
def test_one_rule_for_every_duration(name: str) -> None:
    assert getattr(settings.load({name: "1m30s"}), name) == 90.0
    assert getattr(settings.load({name: "1.5s"}), name) == 1.5
    with pytest.raises(UserError, match="a unit is needed, e.g. 10s or 10m"):
        settings.load({name: "10"})
    with pytest.raises(UserError, match="must not be negative"):
        settings.load({name: "-1s"})


def test_lower_bounds_name_the_flag_and_its_variable() -> None:
    for name, value, message in [
        ("max_concurrent", "0", "--max-concurrent / SIDELINJA_MAX_CONCURRENT must be 1 to 10000"),
        ("lease", "500ms", "--lease / SIDELINJA_LEASE must be 1s to 1d"),
        ("lease", "2d", "--lease / SIDELINJA_LEASE must be 1s to 1d"),
        ("poll_interval", "1ms", "--poll-interval / SIDELINJA_POLL_INTERVAL must be 10ms to 1h"),
        ("keep_errors", "99999999999999d", "--keep-errors / SIDELINJA_KEEP_ERRORS must be at most"),
        ("metrics_port", "70000", "--metrics-port / SIDELINJA_METRICS_PORT must be a port"),
        ("admin_read_timeout", "0s", "--read-timeout / SIDELINJA_ADMIN_READ_TIMEOUT must be 100ms"),
        ("log_level", "loud", "--log-level / SIDELINJA_LOG_LEVEL must be one of debug, info"),
    ]:
        with pytest.raises(UserError, match=message):
            settings.load({name: value})
    with pytest.raises(UserError, match="unknown job types in --types: bogus"):
        settings.load({"types": "noop, bogus"}).worker_settings(("noop",))


def test_secrets_have_no_flag_come_from_a_file_and_never_print(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secrets = [meta.env for _, meta in settings.fields() if meta.secret]
    assert set(secrets) >= {
        "DATABASE_URL",
        "FORGEJO_TOKEN",
        "AI_GATEWAY_KEY",
        "LIVEKIT_API_SECRET",
        "WHISPER_API_KEY",
        "SPACETIMEDB_TOKEN",
    }
    assert all(settings.flag_of(n, m) is None for n, m in settings.fields() if m.secret)
    for env in secrets:
        path = tmp_path / env
        path.write_text(f"hemmelig-{env}\n")
        monkeypatch.setenv(f"{env}_FILE", str(path))
    loaded = settings.load()
    assert loaded.service_config().get("FORGEJO_TOKEN") == "hemmelig-FORGEJO_TOKEN"
    assert loaded.database == "hemmelig-DATABASE_URL"
    assert "hemmelig" not in repr(loaded) and "hemmelig" not in str(loaded)
    monkeypatch.setenv("AI_GATEWAY_KEY", "hemmelig-too")
    with pytest.raises(UserError) as both:
        settings.load()
    assert "AI_GATEWAY_KEY and AI_GATEWAY_KEY_FILE are both set" in str(both.value)
    assert "hemmelig" not in str(both.value)
    monkeypatch.delenv("AI_GATEWAY_KEY")
    monkeypatch.setenv("FORGEJO_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(UserError, match="FORGEJO_TOKEN_FILE: cannot read"):
        settings.load()


def test_whitespace_around_a_database_url_or_a_secret_file_is_dropped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DATABASE_URL", " postgresql://u:hemmelig@h/db\n")
    assert settings.load().database == "postgresql://u:hemmelig@h/db"
    monkeypatch.delenv("DATABASE_URL")
    path = tmp_path / "url"
    path.write_text("\n  postgresql://u:hemmelig@h/db \r\n")
    monkeypatch.setenv("DATABASE_URL_FILE", str(path))
    assert settings.load().database == "postgresql://u:hemmelig@h/db"


@pytest.mark.parametrize("text", ["1M", "30M", "1h30M", " 2M "])
def test_an_uppercase_m_is_refused_as_minutes_or_months(text: str) -> None:
    with pytest.raises(UserError) as refused:
        settings.load({"keep_completed": text})
    message = str(refused.value)
    assert "--keep-completed / SIDELINJA_KEEP_COMPLETED" in message
    assert "minutes or months" in message and "m for minutes" in message and "d for days" in message
    assert settings.load({"keep_completed": "1MS"}).keep_completed == 0.001


def test_the_engine_reads_the_same_service_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    services = [m.env for _, m in settings.fields() if m.section == "services"]
    assert list(SERVICE_ENV) == services
    (tmp_path / "token").write_text("t0k\n")
    monkeypatch.setenv("FORGEJO_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("MEDIA_ROOT", "/srv/media")
    assert ServiceConfig.from_env() == settings.load().service_config()


def test_the_docs_configuration_table_is_the_generated_one() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "sidelinja_worker.settings", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert printed == settings.markdown()
    docs = (ROOT / "docs" / "operations.md").read_text()
    table = docs.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0]
    assert table.strip() == printed.strip(), (
        "docs/operations.md's configuration table is stale: paste the output of "
        "`python -m sidelinja_worker.settings --markdown` between its markers"
    )
