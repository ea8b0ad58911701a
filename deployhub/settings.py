"""DeployHub settings, read from the environment.

With nothing set, a fresh checkout runs embedded: SQLite, kombu's filesystem
broker and local storage, all under `var/`. See docs/configuration.md for the variables.
"""

import ipaddress
import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from workers.broker import celery_config

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name, default=""):
    return os.environ.get(name, default)


def env_bool(name, default=False):
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_int(name, default):
    return int(os.environ.get(name, default))


def env_list(name, default):
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


PRODUCTION = env_str("DEPLOYHUB_ENV", "embedded") == "production"
VAR_DIR = Path(env_str("DEPLOYHUB_VAR_DIR", str(BASE_DIR / "var"))).resolve()
# The database, the broker's messages, the key and the uploads: for this user only (0700).
VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)


def _private_file(path):
    """Create an empty file only its owner may read (0600), unless it exists already."""
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


def _secret_key():
    """Return SECRET_KEY from the environment, or one generated once and kept in var/.

    Production refuses to start without one, or with one that is easy to guess: it
    signs sessions, password resets and (through HKDF) the engines devices trust.
    """
    value = env_str("SECRET_KEY")
    if PRODUCTION and (weakness := _weakness(value)):
        raise ImproperlyConfigured(
            f"SECRET_KEY {weakness}: DEPLOYHUB_ENV=production needs a random key of 50 or more "
            "characters. Make one with: "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"
        )
    if value:
        return value
    path = VAR_DIR / "secret_key"
    if not path.exists():
        _private_file(path)
        path.write_text(secrets.token_urlsafe(50))
    return path.read_text().strip()


def _weakness(key):
    """Say what makes a key guessable, as Django's `check --deploy` judges it and for the
    placeholders people paste; "" when nothing does."""
    if not key:
        return "must be set"
    if "changeme" in key.lower().replace("-", "").replace("_", ""):
        return "is a placeholder (changeme)"
    if key.startswith("django-insecure-"):
        return "is Django's insecure development key (django-insecure-...)"
    if len(key) < 50:
        return f"is {len(key)} characters long"
    if len(set(key)) < 5:
        return f"has {len(set(key))} different characters"
    return ""


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEPLOYHUB_DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "deployhub.teams",
    "deployhub.registry",
    "deployhub.devices",
    "deployhub.jobs",
    "deployhub.conversions",
    "deployhub.evaluation",
    "deployhub.benchmarks",
    "deployhub.engines",
    "deployhub.parity",
    "deployhub.releases",
    "deployhub.figures",
    "deployhub.demo",
    # The API's docs (/api/docs/) from django-ninja's own templates and assets, not a CDN.
    "ninja",
]

MIDDLEWARE = [
    # First, so it sees every answer: /api/v1/ errors are JSON whichever layer made them.
    "deployhub.api.errors.ApiErrorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "deployhub.teams.actor.ActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Late, so it sees a view's error first: database down 503, storage full 507, as JSON.
    "deployhub.outage.OutageMiddleware",
    # Last, so it has the view's answer to replace: a locked-out sign-in gets the lockout page.
    "deployhub.teams.throttle.SignInLockoutMiddleware",
]

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # Models' results JSON (benchmarks/exports.py), the latest body of each, kept per process
    # while nothing it shows changes: 1.9 MB and 160 ms of CPU to build for 1,200 runs.
    "results": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "results",
        "TIMEOUT": 600,
        "OPTIONS": {"MAX_ENTRIES": env_int("DEPLOYHUB_RESULTS_CACHE_ENTRIES", 8)},
    },
}

ROOT_URLCONF = "deployhub.urls"
WSGI_APPLICATION = "deployhub.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "deployhub.teams.context.current_team",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'deployhub.sqlite3'}"),
        # Kept a minute: opening a PostgreSQL connection per request cost every API call
        # (a device's claim) about 4 ms here. Each gunicorn thread keeps one.
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
        # A kept connection is checked (SELECT 1) before each request's first query and each
        # hub task: a restarted database costs no request. The devices service turns it off
        # (docker-compose.yml): a third of a heartbeat's round trips, for one retried 503.
        conn_health_checks=env_bool("DATABASE_CONN_HEALTH_CHECKS", True),
    )
}
# A server with many threads (the device API, holding HTTPS devices' asks for work: 1,024
# per process) shares a pool of this many connections per process instead of keeping one
# per thread, which would outgrow PostgreSQL's max_connections. 0: no pool.
DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 0)
if DATABASE_POOL_MAX_SIZE and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"].update(CONN_MAX_AGE=0, CONN_HEALTH_CHECKS=False)
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(2, DATABASE_POOL_MAX_SIZE),
        "max_size": DATABASE_POOL_MAX_SIZE,
        "timeout": 10,  # a request waits this long for a connection, then fails (a 503)
    }
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The web server, the hub worker and the reaper share one file: wait, don't fail.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
    if (database_file := Path(DATABASES["default"]["NAME"])).is_absolute():
        # Made here for its user only: SQLite gives its -wal and -shm files the same mode.
        _private_file(database_file)
# PostgreSQL: the claim every job's dispatch waits on runs as a prepared statement, parsed once
# per connection and planned once from its sixth run (deployhub/core/handwritten.py): planning it
# took longer than running it. Django's own queries are never prepared. Behind PgBouncer in
# transaction pooling mode, PgBouncer 1.22 or later with max_prepared_statements set carries
# it (psycopg sends DEALLOCATE ALL after a rollback, which 1.21 does not handle); turn it off
# behind an older one.
DEPLOYHUB_PREPARED_STATEMENTS = env_bool("DATABASE_PREPARED_STATEMENTS", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Sign-in throttling (deployhub/teams/throttle.py): failed sign-ins are counted per username
# and address, and per address for any username (password spraying), each over a window from
# its first failure. Reaching a limit locks that username out from that address, or that
# address out for every username, for the lockout; a refused attempt meanwhile neither counts
# nor extends it, and signing in clears the count of its own username and address.
AUTHENTICATION_BACKENDS = [
    "deployhub.teams.throttle.SignInThrottle",
    "django.contrib.auth.backends.ModelBackend",
]
DEPLOYHUB_LOGIN_FAILURE_LIMIT = env_int("DEPLOYHUB_LOGIN_FAILURE_LIMIT", 10)
DEPLOYHUB_LOGIN_ADDRESS_FAILURE_LIMIT = env_int("DEPLOYHUB_LOGIN_ADDRESS_FAILURE_LIMIT", 100)
DEPLOYHUB_LOGIN_WINDOW_MINUTES = env_int("DEPLOYHUB_LOGIN_WINDOW_MINUTES", 15)
DEPLOYHUB_LOGIN_LOCKOUT_MINUTES = env_int("DEPLOYHUB_LOGIN_LOCKOUT_MINUTES", 15)
# Made-up API and device tokens: this many from one address within the lockout locks it out.
DEPLOYHUB_TOKEN_FAILURE_LIMIT = env_int("DEPLOYHUB_TOKEN_FAILURE_LIMIT", 30)
DEPLOYHUB_TOKEN_LOCKOUT_SECONDS = env_int("DEPLOYHUB_TOKEN_LOCKOUT_SECONDS", 600)
# Reverse proxies in front of the hub that append to X-Forwarded-For; 0: the peer is the client.
DEPLOYHUB_PROXY_COUNT = env_int("DEPLOYHUB_PROXY_COUNT", 0)
# /metrics (Prometheus) answers a scraper that sends this token as a bearer token, or one
# calling from these networks (the caller's address as above); everyone else gets a 403.
DEPLOYHUB_METRICS_TOKEN = env_str("DEPLOYHUB_METRICS_TOKEN")
DEPLOYHUB_METRICS_NETWORKS = [
    str(ipaddress.ip_network(network))
    for network in env_list("DEPLOYHUB_METRICS_NETWORKS", "127.0.0.1/32,::1/128")
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "models"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(mode=0o700, exist_ok=True)
WHITENOISE_USE_FINDERS = True

STORAGE_ROOT = Path(env_str("DEPLOYHUB_STORAGE_ROOT", str(VAR_DIR / "media"))).resolve()
MEDIA_ROOT = STORAGE_ROOT
MEDIA_URL = "/media/"  # never served directly: downloads go through views
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
if S3_BUCKET := env_str("DEPLOYHUB_S3_BUCKET"):
    # Models, datasets, artifacts and engines in an S3-compatible bucket (pip extra "s3").
    # Credentials come the usual boto3 way (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...).
    STORAGES["default"] = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": S3_BUCKET,
            "endpoint_url": env_str("DEPLOYHUB_S3_ENDPOINT_URL") or None,
            "region_name": env_str("DEPLOYHUB_S3_REGION") or None,
            "location": env_str("DEPLOYHUB_S3_PREFIX", ""),
            "default_acl": None,
            "file_overwrite": False,
            "querystring_auth": True,
        },
    }
# Uploads stream to disk inside the storage root, never into the web process's memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 256 * 1024
FILE_UPLOAD_TEMP_DIR = STORAGE_ROOT / "tmp"
STORAGE_ROOT.mkdir(mode=0o700, parents=True, exist_ok=True)
FILE_UPLOAD_TEMP_DIR.mkdir(mode=0o700, exist_ok=True)
# Stored files and their folders are the hub's user's only.
FILE_UPLOAD_PERMISSIONS = 0o600
FILE_UPLOAD_DIRECTORY_PERMISSIONS = 0o700
DATA_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
DEPLOYHUB_MAX_UPLOAD_BYTES = env_int("DEPLOYHUB_MAX_UPLOAD_BYTES", 2 * 1024**3)
FILE_UPLOAD_HANDLERS = ["deployhub.registry.uploads.HashingUploadHandler"]
DEPLOYHUB_EXPORT_OPSET = env_int("DEPLOYHUB_EXPORT_OPSET", 17)
# Uploaded models are parsed in a child process under these limits, never in the web process.
DEPLOYHUB_VALIDATION_MEMORY_MB = env_int("DEPLOYHUB_VALIDATION_MEMORY_MB", 8192)
DEPLOYHUB_VALIDATION_TIMEOUT = env_int("DEPLOYHUB_VALIDATION_TIMEOUT", 600)
# Zip bombs: an archive (and each member) may unpack to this many times its compressed size;
# files up to the allowance may compress better (a config, labels.csv). Checked as it unpacks.
DEPLOYHUB_MAX_UNPACK_RATIO = env_int("DEPLOYHUB_MAX_UNPACK_RATIO", 100)
DEPLOYHUB_UNPACK_ALLOWANCE_BYTES = env_int("DEPLOYHUB_UNPACK_ALLOWANCE_BYTES", 100 * 1024)

# Celery (hub side: it enqueues job ids and runs the reaper with beat).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", f"filesystem://{VAR_DIR / 'broker'}")
CELERY = celery_config(CELERY_BROKER_URL)
CELERY_HUB_QUEUE = "hub"

# Jobs and devices.
DEPLOYHUB_JOB_LEASE_SECONDS = env_int("DEPLOYHUB_JOB_LEASE_SECONDS", 30)
DEPLOYHUB_JOB_MAX_ATTEMPTS = env_int("DEPLOYHUB_JOB_MAX_ATTEMPTS", 3)
DEPLOYHUB_REAPER_INTERVAL = env_int("DEPLOYHUB_REAPER_INTERVAL", 5)
DEPLOYHUB_HEARTBEAT_INTERVAL = env_int("DEPLOYHUB_HEARTBEAT_INTERVAL", 10)
# A device missing heartbeats for this long is shown offline.
DEPLOYHUB_OFFLINE_AFTER = env_int("DEPLOYHUB_OFFLINE_AFTER", 35)
# HTTPS mode (POST /api/v1/device/work): the longest a device's ask for work is held open
# (each ask counts as a heartbeat: an HTTPS device shows offline after this and 15 s more;
# under the 60 s at which common proxies drop an idle request), and how many asks one hub
# process holds at once (0: its server's threads less a few, so other calls are served).
DEPLOYHUB_POLL_SECONDS = env_int("DEPLOYHUB_POLL_SECONDS", 50)
DEPLOYHUB_POLL_MAX_WAITERS = env_int("DEPLOYHUB_POLL_MAX_WAITERS", 0)

# Text that everyone then reads. A person's longer text is refused, saying so; a device's
# log or error is cut to its end (where a build says why it failed); a bigger fingerprint
# is refused (a worker's own is a few KiB: a cut one would describe another machine).
DEPLOYHUB_MAX_TEXT_CHARS = env_int("DEPLOYHUB_MAX_TEXT_CHARS", 10_000)
DEPLOYHUB_MAX_LOG_CHARS = env_int("DEPLOYHUB_MAX_LOG_CHARS", 200_000)
DEPLOYHUB_MAX_FINGERPRINT_BYTES = env_int("DEPLOYHUB_MAX_FINGERPRINT_BYTES", 64 * 1024)

# Email (release reviews and decisions): printed to the console unless SMTP is configured.
EMAIL_BACKEND = env_str("DEPLOYHUB_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("DEPLOYHUB_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("DEPLOYHUB_EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("DEPLOYHUB_EMAIL_USER")
EMAIL_HOST_PASSWORD = env_str("DEPLOYHUB_EMAIL_PASSWORD")
EMAIL_USE_TLS = env_bool("DEPLOYHUB_EMAIL_TLS")
DEFAULT_FROM_EMAIL = env_str("DEPLOYHUB_EMAIL_FROM", "deployhub@localhost")
# Seconds between a failed webhook delivery and each retry (one more attempt per value).
DEPLOYHUB_WEBHOOK_RETRY_DELAYS = [
    int(s) for s in env_list("DEPLOYHUB_WEBHOOK_RETRY_DELAYS", "30,120,600,3600")
]
# Networks webhooks never reach (teams/addresses.py), checked on every address a webhook's
# host resolves to when it is sent, by rule, named when one refuses:
# 1. Always refused, by kind: the hub's own host (loopback), cloud metadata services
#    (169.254.169.254, AWS's fd00:ec2::254, Alibaba's 100.100.100.200), link-local, "this
#    network", multicast, reserved and local-use NAT64. Nothing opens them, except loopback in
#    the embedded run (DEPLOYHUB_WEBHOOK_OPEN_NETWORKS=127.0.0.1/32,::1/128: a receiver on the
#    developer's own machine); production (DEPLOYHUB_ENV=production) never reaches it.
# 2. Private networks, unless DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE: off by default in production
#    (a hub serving teams it does not trust), on in the embedded run (a CI server on the LAN).
# 3. DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS, the operator's own additions.
# DEPLOYHUB_WEBHOOK_OPEN_NETWORKS opens a network inside rules 2 and 3 (one CI server's
# subnet). A mistyped network stops the hub here, named.
WEBHOOK_ALWAYS_CLOSED = {
    "loopback, the hub's own host": ["127.0.0.0/8", "::1/128"],
    "a cloud metadata service": ["169.254.169.254/32", "fd00:ec2::254/128", "100.100.100.200/32"],
    "link-local": ["169.254.0.0/16", "fe80::/10"],
    '"this network", which reaches the hub\'s own host': ["0.0.0.0/8", "::/128"],
    "multicast": ["224.0.0.0/4", "ff00::/8"],
    "reserved": ["240.0.0.0/4"],
    "local-use NAT64, where the IPv4 address it carries varies": ["64:ff9b:1::/48"],
}
WEBHOOK_CLOSED_NETWORKS = [net for nets in WEBHOOK_ALWAYS_CLOSED.values() for net in nets]
WEBHOOK_PRIVATE_NETWORKS = [
    *("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"),
]
DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE = env_bool("DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE", not PRODUCTION)
DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS = [
    str(ipaddress.ip_network(network))
    for network in [*WEBHOOK_CLOSED_NETWORKS, *env_list("DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS", "")]
]
DEPLOYHUB_WEBHOOK_OPEN_NETWORKS = [
    str(ipaddress.ip_network(network))
    for network in env_list("DEPLOYHUB_WEBHOOK_OPEN_NETWORKS", "")
]
# Where people reach the hub, for links in email.
DEPLOYHUB_PUBLIC_URL = env_str("DEPLOYHUB_PUBLIC_URL", "http://127.0.0.1:8000")
# The worker wheel /downloads/ serves (deployhub/core/worker_dist.py): built from the hub's own
# source when unset; a hub installed as a package, with no source beside it, names its wheel.
DEPLOYHUB_WORKER_WHEEL = env_str("DEPLOYHUB_WORKER_WHEEL")

if PRODUCTION:
    # Production is served over HTTPS (DEPLOYHUB_TLS, on by default): plain HTTP is redirected,
    # browsers are told to use HTTPS only for a year (HSTS), cookies travel encrypted only. A
    # hub on plain HTTP, the compose stack on a laptop, sets DEPLOYHUB_TLS=false.
    TLS = env_bool("DEPLOYHUB_TLS", True)
    SECURE_SSL_REDIRECT = env_bool("DEPLOYHUB_SSL_REDIRECT", TLS)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # a load balancer probes over plain HTTP
    SECURE_HSTS_SECONDS = env_int("DEPLOYHUB_HSTS_SECONDS", 365 * 24 * 3600 if TLS else 0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DEPLOYHUB_HSTS_INCLUDE_SUBDOMAINS", True)
    # Preloading puts the domain in browsers' built-in lists, hard to undo: the operator's
    # decision (hstspreload.org asks software not to default to it), so off unless asked for,
    # and its reminder (security.W021) is silenced while it is off.
    SECURE_HSTS_PRELOAD = env_bool("DEPLOYHUB_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        SILENCED_SYSTEM_CHECKS = ["security.W021"]
    SESSION_COOKIE_SECURE = env_bool("DEPLOYHUB_SECURE_COOKIES", TLS)
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
    # Behind a reverse proxy that terminates TLS, its X-Forwarded-Proto says the request was
    # HTTPS (the proxy must set it, overwriting the client's).
    if env_bool("DEPLOYHUB_TRUST_X_FORWARDED_PROTO", DEPLOYHUB_PROXY_COUNT > 0):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # A refused request (4xx) is one line: Django would add the traceback of its PermissionDenied.
    "formatters": {"hub": {"()": "deployhub.request_log.OneLineClientErrors"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "hub"}},
    "root": {"handlers": ["console"], "level": env_str("DEPLOYHUB_LOG_LEVEL", "WARNING")},
}
