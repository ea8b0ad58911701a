# One image for the hub (web, hub worker) and CPU device workers.
FROM python:3.11-slim
# Two malloc arenas: a threaded gunicorn worker otherwise keeps one per thread (memory grows
# under load without leaking: make bench's load row measured 129 MB with the default, 73 with 2).
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 MALLOC_ARENA_MAX=2
WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY deployhub ./deployhub
COPY workers ./workers
COPY templates ./templates
COPY static ./static
# The CPU device worker runs every CPU backend auto mode uses, as `make run`'s does.
ARG EXTRAS=web,worker,openvino
RUN pip install ".[${EXTRAS}]"
RUN useradd --create-home deployhub && mkdir -p /data && chown deployhub /data
USER deployhub
ENV DEPLOYHUB_VAR_DIR=/data
EXPOSE 8000
