"""Settings come from the environment in one place, with clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.config import DEFAULTS, Settings, redact_url
from core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_defaults_need_nothing_but_leave_the_database_unset() -> None:
    settings = Settings.from_env({})
    assert settings.database_url is None
    assert settings.llm_provider == "rules"
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.idempotency_redis_url == settings.redis_url
    assert settings.worker_threads == 8
    with pytest.raises(ConfigError, match="DATABASE_URL is not set") as info:
        settings.require_database_url()
    assert info.value.variable == "DATABASE_URL"


def test_idle_sessions_default_to_half_an_hour_then_complete() -> None:
    assert (
        Settings.from_env({}).session_idle_seconds,
        Settings.from_env({}).session_idle_action,
    ) == (
        1800,
        "complete",
    )
    settings = Settings.from_env({"SESSION_IDLE_SECONDS": "5", "SESSION_IDLE_ACTION": " Abandon "})
    assert (settings.session_idle_seconds, settings.session_idle_action) == (5, "abandon")


def test_idempotency_records_follow_redis_url_unless_set_apart() -> None:
    shared = Settings.from_env({"REDIS_URL": "redis://broker:6379/0"})
    assert shared.idempotency_redis_url == "redis://broker:6379/0"
    apart = Settings.from_env(
        {"REDIS_URL": "redis://broker:6379/0", "IDEMPOTENCY_REDIS_URL": " redis://cache:6379/1 "}
    )
    assert (apart.redis_url, apart.idempotency_redis_url) == (
        "redis://broker:6379/0",
        "redis://cache:6379/1",
    )


def test_the_scheduler_prunes_only_when_asked() -> None:
    assert Settings.from_env({}).prune_done_after_days is None
    assert Settings.from_env({"PRUNE_DONE_AFTER_DAYS": "30"}).prune_done_after_days == 30


def test_llm_base_url_selects_the_openai_provider() -> None:
    settings = Settings.from_env({"LLM_BASE_URL": "http://127.0.0.1:9/v1/"})
    assert settings.llm_provider == "openai"
    assert settings.llm_base_url == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"MAX_RETRIES": "many"}, "MAX_RETRIES"),
        ({"WORKER_THREADS": "0"}, "WORKER_THREADS"),
        ({"LLM_PROVIDER": "magic"}, "LLM_PROVIDER"),
        ({"LLM_PROVIDER": "openai"}, "LLM_BASE_URL"),
        ({"DATABASE_URL": "mysql://x"}, "DATABASE_URL"),
        ({"REDIS_URL": "http://x"}, "REDIS_URL"),
        ({"IDEMPOTENCY_REDIS_URL": "memcached://x"}, "IDEMPOTENCY_REDIS_URL"),
        ({"RETRY_MIN_BACKOFF_MS": "500", "RETRY_MAX_BACKOFF_MS": "100"}, "RETRY_MAX_BACKOFF_MS"),
        ({"SESSION_IDLE_SECONDS": "0"}, "SESSION_IDLE_SECONDS"),
        ({"SESSION_IDLE_SECONDS": "soon"}, "SESSION_IDLE_SECONDS"),
        ({"SESSION_IDLE_ACTION": "delete"}, "SESSION_IDLE_ACTION"),
        ({"PRUNE_DONE_AFTER_DAYS": "0"}, "PRUNE_DONE_AFTER_DAYS"),
        ({"PRUNE_DONE_AFTER_DAYS": "a month"}, "PRUNE_DONE_AFTER_DAYS"),
    ],
)
def test_invalid_values_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=variable) as info:
        Settings.from_env(env)
    assert info.value.variable == variable


def test_redacted_settings_hide_secrets() -> None:
    settings = Settings.from_env(
        {
            "DATABASE_URL": "postgresql://ibex:hunter2@db:5432/ibex",
            "MEMORY_SERVICE_TOKEN": "ibex_secret_token",
            "LLM_API_KEY": "sk-secret",
        }
    )
    text = repr(settings.redacted())
    assert "hunter2" not in text and "ibex_secret_token" not in text and "sk-secret" not in text
    assert "postgresql://ibex:***@db:5432/ibex" in text
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


CONFIGURATION = ROOT / "docs" / "configuration.md"


def _table_row(text: str, name: str) -> re.Match[str] | None:
    return re.search(rf"^\| `{name}` \| ([^|]*) \|", text, flags=re.MULTILINE)


def test_env_example_readme_and_the_configuration_table_list_every_variable() -> None:
    example = (ROOT / ".env.example").read_text()
    listed = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", example, flags=re.MULTILINE))
    readme = (ROOT / "README.md").read_text()
    table = CONFIGURATION.read_text()
    for name in DEFAULTS:
        assert name in listed, f"{name} missing from .env.example"
        assert f"`{name}`" in readme, f"{name} missing from README.md"
        assert _table_row(table, name), f"{name} missing from docs/configuration.md"


def test_the_configuration_table_gives_the_defaults_of_the_code() -> None:
    table = CONFIGURATION.read_text()
    for name, default in DEFAULTS.items():
        row = _table_row(table, name)
        assert row, name
        if default is not None:
            assert row.group(1).strip().startswith(f"`{default}`"), (
                f"{name}: docs/configuration.md says {row.group(1).strip()!r}, the code {default!r}"
            )


def test_procfile_variables_are_in_the_configuration_table_and_env_example() -> None:
    procfile = (ROOT / "Procfile").read_text()
    used = dict.fromkeys(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", procfile))
    defaults = dict(re.findall(r"\$\{([A-Z][A-Z0-9_]*):-([^}]*)\}", procfile))
    assert {"PORT", "WEB_CONCURRENCY", "WEB_THREADS", "WORKER_PROCESSES"} <= set(used)
    example = (ROOT / ".env.example").read_text()
    table = CONFIGURATION.read_text()
    for name in used:
        row = _table_row(table, name)
        assert row, f"{name} (Procfile) missing from the table of docs/configuration.md"
        listed = re.search(rf"^#?\s*{name}=(.*)$", example, flags=re.MULTILINE)
        assert listed, f"{name} (Procfile) missing from .env.example"
        if name in defaults:
            # The documented default is the Procfile's.
            assert row.group(1).strip() == f"`{defaults[name]}`", name
            assert listed.group(1).strip() == defaults[name], name


def test_env_example_leaves_off_what_the_table_says_is_off_by_default() -> None:
    example = (ROOT / ".env.example").read_text()
    table = CONFIGURATION.read_text()
    off = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \| unset", table, flags=re.MULTILINE)
    assert "METRICS_PORT" in off
    for name in off:
        assert not re.search(rf"^{name}=.", example, flags=re.MULTILINE), (
            f"{name} is unset by default (docs/configuration.md) but set in .env.example"
        )
