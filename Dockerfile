# The pgworker image: the package built into a wheel from this checkout and installed in a slim
# Python, run as an unprivileged user, `pgworker` as the entrypoint. Your handlers go into an image
# of your own built FROM this one (README, Containers):
#   docker build -t pgworker-queue .                           # the package alone
#   docker build --build-arg EXTRAS=metrics -t pgworker-queue . # with optional features
# tests/test_packaging.py runs these RUN steps' commands in fresh virtualenvs and lints this file.

FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sql ./sql
COPY pgworker ./pgworker
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PGWORKER_HEALTH_FILE=/tmp/pgworker-health.json
COPY --from=build /wheels /wheels
RUN echo "$(echo /wheels/pgworker_queue-*.whl)${EXTRAS:+[${EXTRAS}]}" > /wheels/requirements.txt \
    && pip install --no-cache-dir --requirement /wheels/requirements.txt \
    && rm -rf /wheels
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /app pgworker
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /app
# `pgworker run` stops claiming on SIGTERM and hands running jobs back after --shutdown-timeout:
# give the container at least that long to stop (docker stop -t, terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
# `pgworker run` rewrites $PGWORKER_HEALTH_FILE at each heartbeat (a third of the lease);
# `pgworker health` exits 0 while it is younger than the lease and every service is ok or retrying.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["pgworker", "health", "--health-file", "/tmp/pgworker-health.json"]
ENTRYPOINT ["pgworker"]
CMD ["--help"]
