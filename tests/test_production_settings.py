"""Production mode passes Django's deployment checks and refuses a guessable SECRET_KEY.

Each test starts a fresh Python with DEPLOYHUB_ENV=production, as a deployment
does, so what is checked is what settings.py makes of the environment.
"""

import json
import os
import secrets
import subprocess
import sys

import pytest

from tests.conftest import ROOT

REFUSED = "DEPLOYHUB_ENV=production needs a random key of 50 or more characters"

SHOW = """
import json
from django.conf import settings
names = ["SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS",
         "SECURE_HSTS_PRELOAD", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
         "SECURE_PROXY_SSL_HEADER"]
print(json.dumps({name: getattr(settings, name) for name in names}))
"""

REQUESTS = """
from django.test import Client
client = Client(raise_request_exception=False)
login = client.get("/login/")
health = client.get("/healthz")
proxied = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")
print(login.status_code, login.get("Location"), health.status_code, proxied.status_code)
"""


def production(tmp_path, **env):
    """The environment of a production hub (a random key, SQLite in tmp_path) plus env."""
    ours = ("DEPLOYHUB_", "DJANGO_", "SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL")
    base = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    return {
        **base,
        "DEPLOYHUB_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEPLOYHUB_VAR_DIR": str(tmp_path),
        "ALLOWED_HOSTS": "hub.example.com,testserver",
        **env,
    }


def manage(env, *args):
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def shell(env, code):
    return manage(env, "shell", "--verbosity", "0", "-c", code)


def test_check_deploy_is_clean_in_production(tmp_path):
    result = manage(production(tmp_path), "check", "--deploy", "--fail-level", "WARNING")

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_warns_when_production_is_told_it_has_no_tls(tmp_path):
    env = production(tmp_path, DEPLOYHUB_TLS="false")

    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")

    assert result.returncode != 0
    for check in ("W004", "W008", "W012", "W016"):  # HSTS, redirect, both cookies
        assert f"security.{check}" in result.stderr


def test_production_serves_https_only_by_default(tmp_path):
    result = shell(production(tmp_path), SHOW)

    assert json.loads(result.stdout) == {
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": False,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_PROXY_SSL_HEADER": None,
    }, result.stderr


def test_each_https_setting_comes_from_the_environment(tmp_path):
    env = production(
        tmp_path,
        DEPLOYHUB_SSL_REDIRECT="false",
        DEPLOYHUB_HSTS_SECONDS="600",
        DEPLOYHUB_HSTS_INCLUDE_SUBDOMAINS="false",
        DEPLOYHUB_HSTS_PRELOAD="true",
        DEPLOYHUB_SECURE_COOKIES="false",
        DEPLOYHUB_TRUST_X_FORWARDED_PROTO="true",
    )

    assert json.loads(shell(env, SHOW).stdout) == {
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 600,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_HSTS_PRELOAD": True,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
    }


def test_plain_http_is_redirected_but_the_health_probe_and_a_tls_proxy_are_not(tmp_path):
    env = production(tmp_path, DEPLOYHUB_PROXY_COUNT="1")

    result = shell(env, REQUESTS)

    login, location, health, proxied = result.stdout.split()
    assert (login, location) == ("301", "https://testserver/login/"), result.stderr
    assert health != "301" and proxied == "200"


# Fixed, not random: pytest-xdist's workers must collect the same test ids.
LONG_VARIED = "Qm7xP2vL9kR4tW8zN3bH6jD1fS5gC0yA-uE_iO7pK2nM9rT4wV8xZ3qB6hJ1lF5dG0s"


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("changeme", "is a placeholder (changeme)"),
        ("CHANGE_ME-" + LONG_VARIED, "is a placeholder (changeme)"),
        ("s3cret-" + "x" * 20, "is 27 characters long"),
        ("django-insecure-" + LONG_VARIED, "is Django's insecure development key"),
        ("abcd" * 20, "has 4 different characters"),
        ("", "must be set"),
    ],
)
def test_production_refuses_a_guessable_secret_key(tmp_path, key, why):
    result = manage(production(tmp_path, SECRET_KEY=key), "check")

    assert result.returncode != 0
    assert f"SECRET_KEY {why}" in result.stderr and REFUSED in result.stderr
    assert "secrets.token_urlsafe(50)" in result.stderr
