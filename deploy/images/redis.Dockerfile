# Redis from Debian's redis-server package (already in the base), run as its redis user in /data
# as the official image does.
ARG BASE
FROM ${BASE}
RUN mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
EXPOSE 6379
CMD ["redis-server"]
