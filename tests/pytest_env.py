"""Point the test run at the real services before Django configures itself.

Loaded with `-p tests.pytest_env` (pyproject.toml), so it runs before pytest-django
imports the settings. The tests use the real PostgreSQL and Redis on 127.0.0.1;
`make test` starts them when they are down.
"""

import os
import tempfile

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/deployhub")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("DEPLOYHUB_VAR_DIR", tempfile.mkdtemp(prefix="deployhub-test-var-"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "deployhub.settings")
# Playwright's sync API keeps an event loop in the test thread; the ORM calls between
# its steps are still synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
