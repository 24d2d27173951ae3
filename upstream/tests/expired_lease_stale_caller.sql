-- Regression test: the orchestration lease is valid when fetch returns,
-- even when the caller's timestamp went stale before the call (issue #21).
--
-- Needs only psql and PostgreSQL (contrib's dblink for the held-key case).
-- Run it against a database whose schema has been migrated by duroxide-pg:
--
--   psql "$DATABASE_URL" -X -v schema=duroxide -f tests/expired_lease_stale_caller.sql
--
-- Variables (psql -v):
--   schema       the provider's schema (default: public)
--   dblink_conn  the connection string the competing session uses; by
--                default it is built from psql's own HOST, PORT, DBNAME and
--                USER. The server opens that connection, not psql: give a
--                password here when the server asks for one (PGPASSWORD and
--                ~/.pgpass on the client do not reach it), and the address
--                the server sees (inside a container: localhost:5432).
--
-- Everything runs in one transaction that is rolled back at the end, and
-- each case also undoes itself: no row, sequence value, extension or lock
-- is left behind (the queued rows carry negative ids, so no sequence is
-- advanced). Its output is TAP: one "ok N - ..." or "not ok N - ..." line
-- per check, with the figures. psql exits 3 when a check fails.
--
-- Checks:
--   1-3  reproduction A: one visible message; fetch_orchestration_item with
--        p_now_ms 10 s behind the database clock and a 5 s lock timeout.
--        The lease it returns (instance_locks.locked_until) must be more
--        than 4000 ms ahead of the database clock, and an ack with the
--        returned token and a fresh timestamp must succeed.
--   4-7  held key: a competing session holds both advisory keys, the plain
--        hashtext(instance_id) and the schema-scoped
--        hashtext('<schema>' || '.' || instance_id), on the older of two
--        queued instances. A fetch with a 1 s lock timeout returns within
--        2 s, returns the other instance, and its lease is ahead of the
--        database clock.

\set ON_ERROR_STOP on
\set QUIET on
\if :{?schema}
\else
\set schema public
\endif
\if :{?dblink_conn}
\else
\set dblink_conn ''
\endif
\pset pager off
\pset format unaligned
\pset tuples_only on

BEGIN;
-- A fetch that waits on an advisory key (a version before the candidate)
-- errors out instead of hanging.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';
SET LOCAL client_min_messages = warning;

SELECT set_config('expired_lease.schema', :'schema', true) AS _schema,
       set_config('expired_lease.dblink_conn',
                  CASE WHEN :'dblink_conn' <> '' THEN :'dblink_conn'
                       ELSE (SELECT string_agg(k || '=''' || replace(replace(v, '\', '\\'), '''', '\''') || '''', ' ')
                             FROM (VALUES ('host', :'HOST'), ('port', :'PORT'),
                                          ('dbname', :'DBNAME'), ('user', :'USER')) AS p(k, v))
                  END, true) AS _dblink_conn
\gset

CREATE TEMP TABLE expired_lease_checks (
    n      INTEGER PRIMARY KEY,
    name   TEXT NOT NULL,
    ok     BOOLEAN NOT NULL,
    detail TEXT NOT NULL
) ON COMMIT DROP;

-- Preflight: the functions exist; a header that says what is under test.
DO $$
DECLARE
    s TEXT := current_setting('expired_lease.schema');
    v_newest TEXT := 'no _duroxide_migrations table';
BEGIN
    IF to_regprocedure(format('%I.fetch_orchestration_item(bigint,bigint,bigint,bigint)', s)) IS NULL
       OR to_regprocedure(format('%I.ack_orchestration_item(text,bigint,bigint,jsonb,jsonb,jsonb,jsonb,jsonb)', s)) IS NULL THEN
        RAISE EXCEPTION 'schema % has no fetch_orchestration_item(bigint, bigint, bigint, bigint) or no ack_orchestration_item(8 arguments); pass the provider''s schema with -v schema=NAME', s;
    END IF;
    IF to_regclass(format('%I._duroxide_migrations', s)) IS NOT NULL THEN
        EXECUTE format('SELECT COALESCE(max(version)::text || '' ('' || max(name) FILTER (WHERE version = (SELECT max(version) FROM %1$I._duroxide_migrations)) || '')'', ''none'') FROM %1$I._duroxide_migrations', s)
        INTO v_newest;
    END IF;
    PERFORM set_config('expired_lease.header',
                       format('# expired_lease_stale_caller: schema %s, newest recorded migration %s, %s',
                              s, v_newest, split_part(version(), ' on ', 1)), true);
END $$;

\echo 1..7
SELECT current_setting('expired_lease.header');

-- Reproduction A.
DO $$
DECLARE
    s TEXT := current_setting('expired_lease.schema');
    c_stale_ms CONSTANT BIGINT := 10000;
    c_timeout_ms CONSTANT BIGINT := 5000;
    c_want_left_ms CONSTANT BIGINT := 4000;
    v_instance TEXT := 'expired-lease-stale-caller-a-' || gen_random_uuid();
    v_now_ms BIGINT;
    v_got TEXT;
    v_token TEXT;
    v_until BIGINT;
    v_left BIGINT;
    v_ack_err TEXT;
    v_left_msgs BIGINT;
    v_left_locks BIGINT;
    v_err TEXT;
BEGIN
    BEGIN
        -- The oldest message of the queue, whatever else it holds.
        EXECUTE format('INSERT INTO %I.orchestrator_queue (id, instance_id, work_item, visible_at, created_at)
                        VALUES ($1, $2, $3, $4, $4)', s)
        USING -1::BIGINT, v_instance,
              jsonb_build_object('StartOrchestration', jsonb_build_object(
                  'instance', v_instance, 'orchestration', 'ExpiredLeaseProbe', 'version', '1.0.0',
                  'input', 'null', 'execution_id', 1))::TEXT,
              to_timestamp(1);

        -- The caller minted its timestamp, then waited 10 s (for a pooled
        -- connection, in a PgBouncer queue) before its statement ran.
        v_now_ms := floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT - c_stale_ms;
        EXECUTE format('SELECT out_instance_id, out_lock_token FROM %I.fetch_orchestration_item($1, $2)', s)
        INTO v_got, v_token
        USING v_now_ms, c_timeout_ms;
        IF v_token IS NOT NULL THEN
            EXECUTE format('SELECT locked_until FROM %I.instance_locks WHERE lock_token = $1', s)
            INTO v_until USING v_token;
            v_left := v_until - floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT;

            -- The turn is done at once; the runtime acks with a fresh timestamp.
            BEGIN
                EXECUTE format('SELECT %I.ack_orchestration_item($1, $2, 1, ''[]''::jsonb, ''[]''::jsonb, ''[]''::jsonb, $3, ''[]''::jsonb)', s)
                USING v_token, floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT,
                      jsonb_build_object('orchestration_name', 'ExpiredLeaseProbe',
                                         'orchestration_version', '1.0.0', 'status', 'Running');
            EXCEPTION WHEN OTHERS THEN
                v_ack_err := SQLSTATE || ' ' || SQLERRM;
            END;
            EXECUTE format('SELECT (SELECT count(*) FROM %1$I.orchestrator_queue WHERE instance_id = $1),
                                   (SELECT count(*) FROM %1$I.instance_locks WHERE instance_id = $1)', s)
            INTO v_left_msgs, v_left_locks USING v_instance;
        END IF;
        RAISE EXCEPTION 'undo' USING ERRCODE = 'U0001';
    EXCEPTION
        WHEN SQLSTATE 'U0001' THEN NULL;
        WHEN OTHERS THEN v_err := SQLSTATE || ' ' || SQLERRM;
    END;

    INSERT INTO pg_temp.expired_lease_checks VALUES
    (1, 'reproduction A: the fetch claims the one visible message',
     v_err IS NULL AND v_got = v_instance,
     CASE WHEN v_err IS NOT NULL THEN 'error: ' || v_err
          WHEN v_got IS NULL THEN 'the fetch returned no row'
          WHEN v_got <> v_instance THEN 'it claimed another instance, ' || v_got
          ELSE 'p_now_ms ' || c_stale_ms || ' ms behind the database clock' END),
    (2, 'reproduction A: the lease is valid at return',
     v_left IS NOT NULL AND v_left > c_want_left_ms,
     CASE WHEN v_left IS NULL THEN 'no lease to measure'
          ELSE v_left || ' ms left by the database clock, want > ' || c_want_left_ms
               || '; p_now_ms ' || c_stale_ms || ' ms behind, lock timeout ' || c_timeout_ms || ' ms' END),
    (3, 'reproduction A: an ack with the returned token and a fresh timestamp succeeds',
     v_token IS NOT NULL AND v_ack_err IS NULL AND v_left_msgs = 0 AND v_left_locks = 0,
     CASE WHEN v_token IS NULL THEN 'no token to ack'
          WHEN v_ack_err IS NOT NULL THEN 'ack failed: ' || v_ack_err
          ELSE 'acked; ' || v_left_msgs || ' message(s) and ' || v_left_locks || ' lease(s) left' END);
END $$;

SELECT CASE WHEN ok THEN 'ok' ELSE 'not ok' END || ' ' || n || ' - ' || name || ' (' || detail || ')'
FROM pg_temp.expired_lease_checks WHERE n BETWEEN 1 AND 3 ORDER BY n;

-- Held key: upstream's own regression case, against a real second session.
DO $$
DECLARE
    s TEXT := current_setting('expired_lease.schema');
    c_timeout_ms CONSTANT BIGINT := 1000;
    c_bound_ms CONSTANT BIGINT := 2000;
    c_conn CONSTANT TEXT := 'expired_lease_stale_caller';
    v_older TEXT := 'expired-lease-stale-caller-older-' || gen_random_uuid();
    v_newer TEXT := 'expired-lease-stale-caller-newer-' || gen_random_uuid();
    v_ext TEXT;
    v_connected BOOLEAN := false;
    v_pid INTEGER;
    v_held BIGINT;
    v_start TIMESTAMPTZ;
    v_elapsed BIGINT;
    v_got TEXT;
    v_token TEXT;
    v_until BIGINT;
    v_left BIGINT;
    v_setup_err TEXT;
    v_detail TEXT;
    v_err TEXT;
BEGIN
    BEGIN
        SELECT n.nspname INTO v_ext
        FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
        WHERE e.extname = 'dblink';
        IF v_ext IS NULL THEN
            BEGIN
                EXECUTE format('CREATE EXTENSION dblink SCHEMA %I', s);
                v_ext := s;
            EXCEPTION WHEN OTHERS THEN
                v_setup_err := 'dblink (contrib) is needed for the competing session: ' || SQLERRM;
            END;
        END IF;

        IF v_setup_err IS NULL THEN
            EXECUTE format('INSERT INTO %I.orchestrator_queue (id, instance_id, work_item, visible_at, created_at)
                            VALUES ($1, $2, $3, $4, $4), ($5, $6, $7, $8, $8)', s)
            USING -2::BIGINT, v_older,
                  jsonb_build_object('StartOrchestration', jsonb_build_object(
                      'instance', v_older, 'orchestration', 'ExpiredLeaseProbe', 'version', '1.0.0',
                      'input', 'null', 'execution_id', 1))::TEXT,
                  to_timestamp(2),
                  -3::BIGINT, v_newer,
                  jsonb_build_object('StartOrchestration', jsonb_build_object(
                      'instance', v_newer, 'orchestration', 'ExpiredLeaseProbe', 'version', '1.0.0',
                      'input', 'null', 'execution_id', 1))::TEXT,
                  to_timestamp(3);
            BEGIN
                EXECUTE format('SELECT %I.dblink_connect($1, $2)', v_ext)
                USING c_conn, current_setting('expired_lease.dblink_conn');
                v_connected := true;
                -- The competing session takes both keys on the older instance,
                -- session-level: held until it disconnects.
                EXECUTE format('SELECT pid::INTEGER FROM %I.dblink($1, $2) AS t(pid TEXT)', v_ext)
                INTO v_pid
                USING c_conn, format('SELECT pg_backend_pid()::TEXT FROM (SELECT pg_advisory_lock(hashtext(%L)), pg_advisory_lock(hashtext(%L))) AS k',
                                     v_older, s || '.' || v_older);
                SELECT count(*) INTO v_held
                FROM pg_locks WHERE locktype = 'advisory' AND pid = v_pid AND granted;
                IF v_held <> 2 THEN
                    v_setup_err := 'the competing session (pid ' || v_pid || ') holds ' || v_held || ' advisory keys, want 2';
                END IF;
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
                v_setup_err := 'the competing session: ' || SQLSTATE || ' ' || SQLERRM
                               || COALESCE(': ' || NULLIF(regexp_replace(v_detail, '\s+', ' ', 'g'), ''), '')
                               || ' (set -v dblink_conn=''host=... port=... dbname=... user=... password=...'' as the server sees it)';
            END;
        END IF;

        IF v_setup_err IS NULL THEN
            BEGIN
                v_start := clock_timestamp();
                EXECUTE format('SELECT out_instance_id, out_lock_token FROM %I.fetch_orchestration_item($1, $2)', s)
                INTO v_got, v_token
                USING floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, c_timeout_ms;
                v_elapsed := floor(EXTRACT(EPOCH FROM (clock_timestamp() - v_start)) * 1000)::BIGINT;
                IF v_token IS NOT NULL THEN
                    EXECUTE format('SELECT locked_until FROM %I.instance_locks WHERE lock_token = $1', s)
                    INTO v_until USING v_token;
                    v_left := v_until - floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT;
                END IF;
            EXCEPTION WHEN OTHERS THEN
                v_elapsed := floor(EXTRACT(EPOCH FROM (clock_timestamp() - v_start)) * 1000)::BIGINT;
                v_err := SQLSTATE || ' ' || SQLERRM || ' after ' || v_elapsed || ' ms';
            END;
        END IF;

        IF v_connected THEN
            EXECUTE format('SELECT %I.dblink_disconnect($1)', v_ext) USING c_conn;
            v_connected := false;
        END IF;
        RAISE EXCEPTION 'undo' USING ERRCODE = 'U0001';
    EXCEPTION
        WHEN SQLSTATE 'U0001' THEN NULL;
        WHEN OTHERS THEN v_setup_err := COALESCE(v_setup_err, SQLSTATE || ' ' || SQLERRM);
    END;

    INSERT INTO pg_temp.expired_lease_checks VALUES
    (4, 'held key: a competing session holds the plain and the schema-scoped key of the older instance',
     v_setup_err IS NULL,
     COALESCE(v_setup_err, 'pid ' || v_pid || ', 2 advisory keys')),
    (5, 'held key: the fetch returns within ' || c_bound_ms || ' ms',
     v_setup_err IS NULL AND v_err IS NULL AND v_elapsed < c_bound_ms,
     CASE WHEN v_setup_err IS NOT NULL THEN 'not run'
          WHEN v_err IS NOT NULL THEN 'error: ' || v_err
          ELSE v_elapsed || ' ms, lock timeout ' || c_timeout_ms || ' ms' END),
    (6, 'held key: the fetch returns the other instance',
     v_setup_err IS NULL AND v_err IS NULL AND v_got = v_newer,
     CASE WHEN v_setup_err IS NOT NULL OR v_err IS NOT NULL THEN 'not run'
          WHEN v_got IS NULL THEN 'the fetch returned no row'
          WHEN v_got = v_older THEN 'it claimed the held instance'
          WHEN v_got <> v_newer THEN 'it claimed another instance, ' || v_got
          ELSE 'the newer instance' END),
    (7, 'held key: the lease is in the future by the database clock',
     v_left IS NOT NULL AND v_left > 0,
     CASE WHEN v_left IS NULL THEN 'no lease to measure'
          ELSE v_left || ' ms left by the database clock, want > 0' END);
END $$;

SELECT CASE WHEN ok THEN 'ok' ELSE 'not ok' END || ' ' || n || ' - ' || name || ' (' || detail || ')'
FROM pg_temp.expired_lease_checks WHERE n BETWEEN 4 AND 7 ORDER BY n;

SELECT count(*) FILTER (WHERE NOT ok) AS failed,
       count(*) AS total,
       count(*) = 7 AND bool_and(ok) AS all_ok
FROM pg_temp.expired_lease_checks
\gset

ROLLBACK;

\if :all_ok
\echo '# all' :total 'checks passed; everything was rolled back'
\else
\echo '#' :failed 'of' :total 'checks failed; everything was rolled back'
DO $$ BEGIN RAISE EXCEPTION 'expired_lease_stale_caller: a check failed (see the "not ok" lines)'; END $$;
\endif
