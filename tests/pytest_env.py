"""Point the test run at the real services before Django configures itself.

Loaded with `-p tests.pytest_env` (pyproject.toml), so it runs before pytest-django
imports the settings. The tests use the real PostgreSQL and Redis on 127.0.0.1;
`make test` starts them when they are down.
"""

import os
import tempfile

# Under pytest-xdist each process gets a broker database (15, 14, ...) and a var folder of its
# own: each empties its broker database at start. pytest-django gives each a test database.
# The workers inherit the controller's environment, so what it defaulted is defaulted again.
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
DEFAULTED = "DEPLOYHUB_TEST_DEFAULTED"
defaults = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/deployhub",
    "CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{15 - WORKER}",
    "DEPLOYHUB_VAR_DIR": tempfile.mkdtemp(prefix=f"deployhub-test-var-{WORKER}-"),
}
# Workers started by tests read no config file of this machine's (/etc/deployhub/worker.json
# or ~/.config/deployhub/worker.json, workers/config.py): one that is not there.
defaults["DEPLOYHUB_WORKER_CONFIG"] = os.path.join(defaults["DEPLOYHUB_VAR_DIR"], "worker.json")
inherited = set(os.environ.get(DEFAULTED, "").split(","))
for name, value in defaults.items():
    if name not in os.environ or name in inherited:
        os.environ[name] = value
        inherited.add(name)
os.environ[DEFAULTED] = ",".join(sorted(inherited - {""}))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "deployhub.settings")
# Playwright's sync API keeps an event loop in the test thread; the ORM calls between
# its steps are still synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
