# One image for every coxswain service; the compose file picks the module to run.
# BASE is the official python:3.11-slim; deploy/images/build (./dev images) passes its own Debian
# base instead, and PIP_ARGS=--no-index with every wheel in deploy/images/wheels (no registry).
ARG BASE=python:3.11-slim
FROM scratch AS sources
COPY pyproject.toml README.md /src/
COPY shared /src/shared
COPY cli /src/cli
COPY services /src/services

FROM ${BASE}
ARG PIP_ARGS=""
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# bubblewrap: every command the runner starts runs in its sandbox. The local base has both.
RUN if ! command -v bwrap >/dev/null || ! command -v git >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends bubblewrap git \
      && rm -rf /var/lib/apt/lists/*; fi
RUN python -m venv /opt/cox
ENV PATH=/opt/cox/bin:$PATH
# The dependencies first, from deploy/images/requirements.txt alone (pyproject.toml's dependencies):
# this layer is rebuilt only when they change, not when a dev extra or a tool setting does.
COPY deploy/images/wheels/ /tmp/wheels/
COPY deploy/images/requirements.txt /tmp/requirements.txt
# uv (a wheel among them) installs them in seconds; bytecode is compiled here, as pip would, since
# the image's user cannot write it at run time.
RUN pip install -q $PIP_ARGS --find-links /tmp/wheels uv \
    && uv pip install -q --python /opt/cox/bin/python --compile-bytecode $PIP_ARGS --find-links /tmp/wheels \
       -r /tmp/requirements.txt \
    && pip uninstall -q -y uv
# The image runs as cox (not root): commands run as cox in bwrap's user namespace, no drop needed.
# cox-sandbox is there for a runner started as root (docker run --user 0): every sandboxed
# process then runs as that unprivileged user ([sandbox] user). Before the sources: cached.
RUN useradd --create-home --uid 10001 cox && mkdir -p /workspaces && chown cox /workspaces \
    && useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin cox-sandbox
# The sources last, gathered in a stage of their own and copied in one step: a step of that stage
# commits a layer of a few files, where each step here (even an ENV) commits one over the whole
# image: ~7 s each on this machine's fuse-overlayfs engine, minutes on a loaded one. A change of
# the sources rebuilds three steps (copy, install, user) where it rebuilt eight.
ENV COX_ROOT=/workspaces
CMD ["python", "-m", "cox_gateway"]
COPY --from=sources /src/ /app/
RUN pip install $PIP_ARGS --no-deps --no-build-isolation . && rm -rf /tmp/wheels
USER cox
