# The platform image used by the Helm chart: one image with every console script
# (sless-api, sless-operator, sless-events, sless). Function code never runs here: functions run from
# their own images (runtimes/*/Dockerfile plus the generated build context).
#
#   docker build -t <registry>/sless:<version> .
#
# Runs as uid/gid 10001 (the chart's podSecurityContext) with a read-only root filesystem; it writes
# only to /tmp (an emptyDir in the chart).
# BASE_IMAGE: any Debian-like image with Python 3.11 and pip (e.g. from a registry the builder reaches).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core core
COPY api api
COPY operator operator
RUN python -m venv /opt/sless \
 && /opt/sless/bin/pip install --no-cache-dir --disable-pip-version-check . \
 && find /opt/sless -name '__pycache__' -prune -exec rm -rf {} +

FROM ${BASE_IMAGE}
ENV PATH=/opt/sless/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SLESS_BACKEND=kubernetes \
    SLESS_BIND=0.0.0.0:8090 \
    HOME=/tmp
COPY --from=build /opt/sless /opt/sless
COPY runtimes /opt/sless/runtimes
ENV SLESS_RUNTIMES_DIR=/opt/sless/runtimes
USER 10001:10001
EXPOSE 8090
CMD ["sless-api"]
