#!/bin/sh
# Entry point of the stand-in postgres:15 image: the official image's contract, in short.
# First start on an empty PGDATA: initdb with POSTGRES_USER/POSTGRES_PASSWORD, create
# POSTGRES_DB; every start: run the server as the postgres user. Arguments after
# "postgres" go to the server (e.g. -c listen_addresses=127.0.0.1).
set -eu
if [ "${1:-postgres}" != postgres ]; then
  exec "$@"
fi
[ "$#" -gt 0 ] && shift
PGDATA="${PGDATA:-/var/lib/postgresql/data}"
export PGDATA
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" postgres "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "error: database is uninitialized and POSTGRES_PASSWORD is not set" >&2
    exit 1
  fi
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 >/dev/null
  rm -f "$pwfile"
  printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
  printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
  pg_ctl --silent --wait --options="-c listen_addresses=''" start
  if [ "$db" != postgres ]; then
    psql --quiet --no-psqlrc -v ON_ERROR_STOP=1 --username="$user" --dbname=postgres \
      --set=db="$db" <<'SQL'
CREATE DATABASE :"db";
SQL
  fi
  pg_ctl --silent --wait --mode=fast stop
  echo "stand-in postgres: initialised $PGDATA (user $user, database $db)"
fi
exec postgres "$@"
