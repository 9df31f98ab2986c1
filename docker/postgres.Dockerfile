# PostgreSQL 15 for a cluster of batond nodes (docker/compose.yaml, profile "cluster"),
# from Debian's own packages on debian:bookworm-slim, like baton's image: no other
# registry is needed to build it, only Debian's archive.
#
#   docker build -f docker/postgres.Dockerfile -t baton-postgres:15 docker
#   docker run -d --name baton-pg --network NET -v baton-pg-data:/var/lib/postgresql/data \
#              -e POSTGRES_PASSWORD=... baton-postgres:15
#
# At its first start on an empty data volume, docker/postgres-entrypoint.sh runs initdb
# and creates the role and the database batond uses (POSTGRES_USER and POSTGRES_DB,
# both "baton" by default, the database owned by the role; batond creates its own
# schema). Later starts find the cluster on the volume and only start the server.
#
# Authentication over the network: with POSTGRES_PASSWORD set, scram-sha-256 for that
# role on that database, and nothing else (the superuser postgres has no password and
# can only connect on the container's own Unix socket: `docker exec CTR psql`). With
# POSTGRES_PASSWORD empty, trust for that role on that database: anyone who can reach
# port 5432 is batond; only for a private network of throwaway containers.
#
# Durability as batond expects it: fsync, synchronous_commit and full_page_writes on
# (a commit batond acknowledges is on disk). The server listens on every interface of
# the container; publish nothing (the compose file does not): batond reaches it on the
# compose network as postgres:5432.
#
# The server runs as user postgres (uid 999, fixed so that a bind-mounted data
# directory can be chown'ed to it). SIGINT is its stop signal (PostgreSQL's "fast"
# shutdown: open sessions, batond's among them, are closed; SIGTERM's "smart" shutdown
# would wait for every batond to disconnect first).

FROM debian:bookworm-slim

LABEL org.opencontainers.image.title="baton-postgres" \
      org.opencontainers.image.description="PostgreSQL 15 from Debian's packages, for a cluster of batond nodes"

# The user first, with a fixed uid, so the packages adopt it. postgresql-common first,
# told not to create the "main" cluster, so that installing postgresql-15 creates and
# starts nothing (the entrypoint makes the cluster on the volume).
RUN groupadd --system --gid 999 postgres \
 && useradd --system --uid 999 --gid postgres --home-dir /var/lib/postgresql \
      --no-create-home --shell /bin/bash postgres \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      postgresql-common \
 && sed -ri 's/^#?[[:space:]]*create_main_cluster[[:space:]]*=.*/create_main_cluster = false/' \
      /etc/postgresql-common/createcluster.conf \
 && grep -qx 'create_main_cluster = false' /etc/postgresql-common/createcluster.conf \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data \
 && test ! -e /var/lib/postgresql/15/main

COPY postgres-entrypoint.sh /usr/local/bin/baton-postgres-entrypoint
# Fails the build here when the server or the script cannot run.
RUN chmod 0755 /usr/local/bin/baton-postgres-entrypoint \
 && /usr/lib/postgresql/15/bin/postgres --version \
 && sh -n /usr/local/bin/baton-postgres-entrypoint

# The Unix socket is in /tmp (unix_socket_directories, set at initdb; PGHOST for psql,
# pg_ctl and pg_isready): writable with a read-only root filesystem, where podman hides
# the image's /run under a tmpfs of its own.
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data \
    PGHOST=/tmp \
    POSTGRES_USER=baton \
    POSTGRES_DB=baton
USER 999:999
WORKDIR /var/lib/postgresql
VOLUME /var/lib/postgresql/data
EXPOSE 5432

# Ready means the real server accepts TCP connections: during the first start's setup
# only the Unix socket is open, so batond is not let in before its role exists.
HEALTHCHECK --interval=5s --timeout=5s --start-period=30s --retries=5 \
  CMD ["sh", "-c", "exec pg_isready -q -h 127.0.0.1 -p 5432 -U \"$POSTGRES_USER\" -d \"$POSTGRES_DB\""]

STOPSIGNAL SIGINT
ENTRYPOINT ["baton-postgres-entrypoint"]
