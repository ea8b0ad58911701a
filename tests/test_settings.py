"""Settings come from the environment, with embedded defaults and a safe production mode."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRINT = (
    "import deployhub.settings as s; "
    "print(s.SECRET_KEY, s.DEBUG, s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL)"
)


def settings_in(env, var_dir):
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY", "DEPLOYHUB_ENV")
    }
    return subprocess.run(
        [sys.executable, "-c", PRINT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**clean, "DEPLOYHUB_VAR_DIR": str(var_dir), **env},
    )


def test_it_runs_embedded_with_nothing_set(tmp_path):
    result = settings_in({}, tmp_path)
    key, debug, engine, broker = result.stdout.split()
    assert debug == "False" and engine.endswith("sqlite3")
    assert broker == f"filesystem://{tmp_path / 'broker'}"
    assert (tmp_path / "secret_key").read_text() == key


def test_it_keeps_the_generated_secret_key_across_starts(tmp_path):
    first = settings_in({}, tmp_path).stdout.split()[0]
    assert settings_in({}, tmp_path).stdout.split()[0] == first


def test_it_refuses_production_without_a_secret_key(tmp_path):
    result = settings_in({"DEPLOYHUB_ENV": "production"}, tmp_path)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr
    assert not (tmp_path / "secret_key").exists()


def test_it_reads_the_database_and_broker_from_the_environment(tmp_path):
    env = {
        "DATABASE_URL": "postgres://u@db:5432/x",
        "CELERY_BROKER_URL": "redis://r:6379/0",
        "SECRET_KEY": "kQ7-vX2pLm9" * 5,
        "DEPLOYHUB_ENV": "production",
    }
    _, debug, engine, broker = settings_in(env, tmp_path).stdout.split()
    assert engine == "django.db.backends.postgresql" and broker == "redis://r:6379/0"
    assert debug == "False"
