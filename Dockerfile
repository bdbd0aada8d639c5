# One image for every coxswain service; the compose file picks the module to run.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# git for versions; bubblewrap is the command sandbox the runner puts every command in.
RUN apt-get update && apt-get install -y --no-install-recommends git bubblewrap && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY shared shared
COPY cli cli
COPY services services
RUN pip install .
RUN useradd --create-home --uid 10001 cox && mkdir -p /workspaces && chown cox /workspaces
USER cox
ENV COX_ROOT=/workspaces
CMD ["python", "-m", "cox_gateway"]
