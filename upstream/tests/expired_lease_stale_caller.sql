-- Regression test: the leases duroxide-pg's fetches hand out are valid at
-- return when the caller's timestamp went stale before the call, and the
-- database clock lengthens them by a bounded amount only (issue #21).
--
-- Needs psql and nothing else: no extension, no superuser, no set-up by
-- hand. Two modes:
--
--   1. It makes its own schema from the migrations in your checkout,
--      applied in the order of the `migrations` list below, checks it and
--      drops it (everything runs in one transaction that is rolled back).
--      The role needs the CREATE right on the database, as the provider's
--      role has (it creates its schema on connect):
--
--        psql "$DATABASE_URL" -X -f tests/expired_lease_stale_caller.sql
--
--   2. It checks a schema the provider made (-v schema=NAME): it inserts
--      its own rows, calls the functions and rolls everything back. The
--      role needs what the provider's role has on that schema:
--
--        psql "$DATABASE_URL" -X -v schema=duroxide -f tests/expired_lease_stale_caller.sql
--
-- Variables (psql -v):
--   schema             a schema the provider made (mode 2); without it, mode 1
--   migrations         mode 1: the migration files to apply, in order,
--                      separated by spaces; default: the list below. psql
--                      cannot list a directory, so this list is the one
--                      line to keep up to date when a migration is added
--   migrations_dir     mode 1: where they are, relative to this file's
--                      directory (or absolute, no spaces); default ../migrations
--   self_made_schema   mode 1: the schema's name; default
--                      expired_lease_stale_caller (it must not exist)
--   max_clock_lead_ms  the bound the checks expect when the function does
--                      not declare c_max_clock_lead_ms; default 30000
--
-- How mode 1 applies the files with psql alone: this file includes itself
-- (\ir) once per file of the list, with expired_lease_step set; each step
-- applies the first file as duroxide-pg's runner does (search_path set to
-- the schema, then the file, then its row in _duroxide_migrations) and
-- passes the rest of the list on. Keep this file's name, or change the two
-- \ir lines that name it.
--
-- Output: TAP. A plan line, then one "ok N - ..." or "not ok N - ..." line
-- per check with its figures; "ok N - ... # SKIP reason" where the schema
-- lacks what a check needs (no fetch_work_items: the batched worker fetch
-- is not applied). psql exits 3 when a check fails, 0 otherwise. The
-- queued rows carry negative ids, so no sequence moves.
--
-- Checks (p_lock_timeout_ms 5000 in each; stale means p_now_ms behind the
-- database clock; a lease's time left is locked_until minus the database
-- clock, read right after the call returns):
--   1-3  fetch_orchestration_item, reproduction A: one visible message,
--        p_now_ms 10000 ms stale. It claims the message; the lease has
--        more than 4000 ms left; an ack with the token and a fresh
--        timestamp succeeds.
--   4    fetch_orchestration_item, the bound: p_now_ms stale by the bound
--        plus 30000 ms. The lease ends no later than p_now_ms + bound +
--        lock timeout (plus the time the call itself took, which the
--        function carries its clock forward by).
--   5-8  fetch_work_items, reproduction A: as 1-3 for one visible item
--        (tag mode 'tags', a tag of its own, so no other item is taken),
--        and for an item of a session: the session's lease has more than
--        4000 ms left.
--   9    fetch_work_items, the bound: the item's and the session's leases
--        end no later than p_now_ms + bound + timeout.

\set ON_ERROR_STOP on
\set QUIET on

\if :{?expired_lease_step}
-- One step of mode 1: apply the first file of expired_lease_pending.
SELECT f[1] AS expired_lease_file,
       split_part(f[1], '_', 1)::BIGINT AS expired_lease_version,
       rtrim(:'migrations_dir', '/') || '/' || f[1] AS expired_lease_path,
       NULLIF(array_to_string(f[2:], ' '), '') AS expired_lease_pending
FROM (SELECT regexp_split_to_array(btrim(:'expired_lease_pending'), '\s+') AS f) AS l
\gset
SET LOCAL search_path TO :"schema", pg_temp;
\ir :expired_lease_path
INSERT INTO :"schema"._duroxide_migrations (version, name)
VALUES (:expired_lease_version, :'expired_lease_file');
\if :{?expired_lease_pending}
\ir expired_lease_stale_caller.sql
\endif

\else

\pset pager off
\pset format unaligned
\pset tuples_only on

\if :{?migrations}
\else
\set migrations '0001_initial_schema.sql 0002_create_stored_procedures.sql 0003_add_attempt_count.sql 0004_update_stored_procedures_for_attempt_count.sql 0005_add_visible_at_to_worker_queue.sql 0006_use_rust_timestamps.sql 0007_add_execution_state_support.sql 0008_remove_execution_state.sql 0009_add_activity_cancellation_support.sql 0010_add_deletion_and_pruning_support.sql 0011_fix_cancellation_ordering.sql 0012_require_timestamps.sql 0013_add_capability_filtering.sql 0014_add_session_support.sql 0015_add_custom_status.sql 0016_add_activity_tags.sql 0017_retry_orchestration_fetch_on_contention.sql 0018_add_kv_store.sql 0019_add_kv_last_updated.sql 0020_add_kv_delta.sql 0021_add_get_instance_stats.sql 0023_partial_secondary_indexes.sql 0024_fix_expired_orchestration_lock_lease.sql'
\endif
\if :{?migrations_dir}
\else
\set migrations_dir '../migrations'
\endif
\if :{?max_clock_lead_ms}
\else
\set max_clock_lead_ms 30000
\endif
\if :{?schema}
\set expired_lease_self_made false
\else
\set expired_lease_self_made true
\if :{?self_made_schema}
\set schema :self_made_schema
\else
\set schema expired_lease_stale_caller
\endif
\endif

BEGIN;
-- A fetch that waits on an advisory key or a row lock errors out instead
-- of hanging; no NOTICE of a migration clutters the output.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '120s';
SET LOCAL client_min_messages = warning;

SELECT set_config('expired_lease.schema', :'schema', true) AS expired_lease_ignored,
       set_config('expired_lease.self_made', :'expired_lease_self_made', true) AS expired_lease_ignored,
       set_config('expired_lease.max_clock_lead_ms', :'max_clock_lead_ms', true) AS expired_lease_ignored
\gset

\if :expired_lease_self_made
DO $$
BEGIN
    IF to_regnamespace(current_setting('expired_lease.schema')) IS NOT NULL THEN
        RAISE EXCEPTION 'schema % exists: mode 1 makes its own (pass -v self_made_schema=NAME), or check that one with -v schema=%',
            current_setting('expired_lease.schema'), current_setting('expired_lease.schema');
    END IF;
END $$;
CREATE SCHEMA :"schema";
CREATE TABLE :"schema"._duroxide_migrations (
    version BIGINT PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP
);
\set expired_lease_step 1
\set expired_lease_pending :migrations
\ir expired_lease_stale_caller.sql
\unset expired_lease_step
RESET search_path;
\endif

-- Preflight: the orchestration functions exist; a header line says what
-- is under test; the bound each fetch declares (or the default).
DO $$
DECLARE
    s TEXT := current_setting('expired_lease.schema');
    v_newest TEXT := 'none';
    v_bound TEXT;
BEGIN
    IF to_regprocedure(format('%I.fetch_orchestration_item(bigint,bigint,bigint,bigint)', s)) IS NULL
       OR to_regprocedure(format('%I.ack_orchestration_item(text,bigint,bigint,jsonb,jsonb,jsonb,jsonb,jsonb)', s)) IS NULL THEN
        RAISE EXCEPTION 'schema % has no fetch_orchestration_item(bigint, bigint, bigint, bigint) or no ack_orchestration_item (8 arguments): pass the provider''s schema with -v schema=NAME', s;
    END IF;
    IF to_regclass(format('%I._duroxide_migrations', s)) IS NOT NULL THEN
        EXECUTE format('SELECT version || '' ('' || name || '')'' FROM %I._duroxide_migrations ORDER BY version DESC LIMIT 1', s)
        INTO v_newest;
    END IF;
    PERFORM set_config('expired_lease.header',
                       format('# expired_lease_stale_caller: schema %s (%s), newest recorded migration %s, %s',
                              s, CASE current_setting('expired_lease.self_made') WHEN 'true' THEN 'made by this script' ELSE 'given' END,
                              COALESCE(v_newest, 'none'), split_part(version(), ' on ', 1)), true);
    FOR v_bound IN SELECT 'fetch_orchestration_item' UNION ALL SELECT 'fetch_work_items' LOOP
        PERFORM set_config('expired_lease.bound_' || v_bound,
                           COALESCE((SELECT substring(p.prosrc FROM 'c_max_clock_lead_ms\s+CONSTANT\s+BIGINT\s*:=\s*(\d+)')
                                     FROM pg_proc p
                                     WHERE p.pronamespace = s::regnamespace AND p.proname = v_bound
                                     LIMIT 1),
                                    current_setting('expired_lease.max_clock_lead_ms')), true);
    END LOOP;
END $$;

\echo 1..9
SELECT current_setting('expired_lease.header');

-- 1-3: fetch_orchestration_item, reproduction A.
DO $$
DECLARE
    s TEXT := current_setting('expired_lease.schema');
    c_stale_ms CONSTANT BIGINT := 10000;
    c_timeout_ms CONSTANT BIGINT := 5000;
    c_want_left_ms CONSTANT BIGINT := 4000;
    v_instance TEXT := 'expired-lease-stale-caller-a-' || gen_random_uuid();
    v_got TEXT;
    v_token TEXT;
    v_left BIGINT;
    v_ack_err TEXT;
    v_left_msgs BIGINT;
    v_left_locks BIGINT;
    v_err TEXT;
BEGIN
    BEGIN
        -- The oldest message of the queue, whatever else it holds.
        EXECUTE format('INSERT INTO %I.orchestrator_queue (id, instance_id, work_item, visible_at, created_at)
                        VALUES (-1, $1, $2, to_timestamp(1), to_timestamp(1))', s)
        USING v_instance,
              jsonb_build_object('StartOrchestration', jsonb_build_object(
                  'instance', v_instance, 'orchestration', 'ExpiredLeaseProbe', 'version', '1.0.0',
                  'input', 'null', 'execution_id', 1))::TEXT;

        -- The caller took its timestamp, then waited 10 s (for a pooled
        -- connection, in a PgBouncer queue) before its statement ran.
        EXECUTE format('SELECT out_instance_id, out_lock_token FROM %I.fetch_orchestration_item($1, $2)', s)
        INTO v_got, v_token
        USING (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT - c_stale_ms, c_timeout_ms;
        IF v_token IS NOT NULL THEN
            EXECUTE format('SELECT locked_until - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT
                            FROM %I.instance_locks WHERE lock_token = $1', s)
            INTO v_left USING v_token;

            -- The turn is done at once; the runtime acks with a fresh timestamp.
            BEGIN
                EXECUTE format('SELECT %I.ack_orchestration_item($1, $2, 1, ''[]''::jsonb, ''[]''::jsonb, ''[]''::jsonb, $3, ''[]''::jsonb)', s)
                USING v_token, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT,
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

    PERFORM set_config('expired_lease.line_1', format('%s 1 - fetch_orchestration_item, reproduction A: it claims the one visible message (%s)',
        CASE WHEN v_err IS NULL AND v_got = v_instance THEN 'ok' ELSE 'not ok' END,
        CASE WHEN v_err IS NOT NULL THEN 'error: ' || v_err
             WHEN v_got IS NULL THEN 'it returned no row'
             WHEN v_got <> v_instance THEN 'it claimed another instance, ' || v_got
             ELSE 'p_now_ms ' || c_stale_ms || ' ms stale' END), true);
    PERFORM set_config('expired_lease.line_2', format('%s 2 - fetch_orchestration_item, reproduction A: the lease is valid at return (%s)',
        CASE WHEN v_left > c_want_left_ms THEN 'ok' ELSE 'not ok' END,
        CASE WHEN v_left IS NULL THEN 'no lease to measure'
             ELSE v_left || ' ms left by the database clock, want > ' || c_want_left_ms
                  || '; p_now_ms ' || c_stale_ms || ' ms stale, lock timeout ' || c_timeout_ms || ' ms' END), true);
    PERFORM set_config('expired_lease.line_3', format('%s 3 - fetch_orchestration_item, reproduction A: an ack with the token and a fresh timestamp succeeds (%s)',
        CASE WHEN v_token IS NOT NULL AND v_ack_err IS NULL AND v_left_msgs = 0 AND v_left_locks = 0 THEN 'ok' ELSE 'not ok' END,
        CASE WHEN v_token IS NULL THEN 'no token to ack'
             WHEN v_ack_err IS NOT NULL THEN 'ack failed: ' || v_ack_err
             ELSE 'acked; ' || v_left_msgs || ' message(s) and ' || v_left_locks || ' lease(s) left' END), true);
END $$;

-- 4: fetch_orchestration_item, the bound.
DO $$
DECLARE
    s TEXT := current_setting('expired_lease.schema');
    c_bound_ms CONSTANT BIGINT := current_setting('expired_lease.bound_fetch_orchestration_item')::BIGINT;
    c_stale_ms CONSTANT BIGINT := c_bound_ms + 30000;
    c_timeout_ms CONSTANT BIGINT := 5000;
    v_instance TEXT := 'expired-lease-stale-caller-b-' || gen_random_uuid();
    v_now_ms BIGINT;
    v_start TIMESTAMPTZ;
    v_call_ms BIGINT;
    v_token TEXT;
    v_until BIGINT;
    v_left BIGINT;
    v_err TEXT;
BEGIN
    BEGIN
        EXECUTE format('INSERT INTO %I.orchestrator_queue (id, instance_id, work_item, visible_at, created_at)
                        VALUES (-2, $1, $2, to_timestamp(1), to_timestamp(1))', s)
        USING v_instance,
              jsonb_build_object('StartOrchestration', jsonb_build_object(
                  'instance', v_instance, 'orchestration', 'ExpiredLeaseProbe', 'version', '1.0.0',
                  'input', 'null', 'execution_id', 1))::TEXT;
        v_now_ms := (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT - c_stale_ms;
        v_start := clock_timestamp();
        EXECUTE format('SELECT out_lock_token FROM %I.fetch_orchestration_item($1, $2)', s)
        INTO v_token USING v_now_ms, c_timeout_ms;
        v_call_ms := ceil(EXTRACT(EPOCH FROM (clock_timestamp() - v_start)) * 1000)::BIGINT;
        IF v_token IS NOT NULL THEN
            EXECUTE format('SELECT locked_until, locked_until - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT
                            FROM %I.instance_locks WHERE lock_token = $1', s)
            INTO v_until, v_left USING v_token;
        END IF;
        RAISE EXCEPTION 'undo' USING ERRCODE = 'U0001';
    EXCEPTION
        WHEN SQLSTATE 'U0001' THEN NULL;
        WHEN OTHERS THEN v_err := SQLSTATE || ' ' || SQLERRM;
    END;

    PERFORM set_config('expired_lease.line_4', format('%s 4 - fetch_orchestration_item, the bound: a lease ends no later than p_now_ms + bound + lock timeout (%s)',
        CASE WHEN v_err IS NULL AND v_until IS NOT NULL AND v_until - v_now_ms <= c_bound_ms + c_timeout_ms + v_call_ms THEN 'ok' ELSE 'not ok' END,
        CASE WHEN v_err IS NOT NULL THEN 'error: ' || v_err
             WHEN v_until IS NULL THEN 'no lease to measure'
             ELSE 'it ends ' || (v_until - v_now_ms) || ' ms after p_now_ms, want <= bound ' || c_bound_ms
                  || ' + lock timeout ' || c_timeout_ms || ' + ' || v_call_ms || ' ms spent in the call; p_now_ms '
                  || c_stale_ms || ' ms stale, ' || v_left || ' ms left by the database clock' END), true);
END $$;

-- 5-9: fetch_work_items.
DO $$
DECLARE
    s TEXT := current_setting('expired_lease.schema');
    c_bound_ms CONSTANT BIGINT := current_setting('expired_lease.bound_fetch_work_items')::BIGINT;
    c_stale_ms CONSTANT BIGINT := 10000;
    c_timeout_ms CONSTANT BIGINT := 5000;
    c_want_left_ms CONSTANT BIGINT := 4000;
    c_worker CONSTANT TEXT := 'expired-lease-stale-caller-worker';
    v_tag TEXT := 'expired-lease-stale-caller-' || gen_random_uuid();
    v_session TEXT := 'expired-lease-stale-caller-session-' || gen_random_uuid();
    v_skip TEXT;
    v_now_ms BIGINT;
    v_token TEXT;
    v_left BIGINT;
    v_ack_err TEXT;
    v_left_items BIGINT;
    v_err TEXT;
    v_s_token TEXT;
    v_s_left BIGINT;
    v_s_item_left BIGINT;
    v_s_err TEXT;
    v_b_now_ms BIGINT;
    v_b_until BIGINT;
    v_b_session_until BIGINT;
    v_b_err TEXT;
BEGIN
    IF to_regprocedure(format('%I.fetch_work_items(bigint,bigint,text,bigint,text[],text,integer,integer)', s)) IS NULL THEN
        v_skip := 'schema ' || s || ' has no fetch_work_items(bigint, bigint, text, bigint, text[], text, integer, integer): the batched worker fetch (0022_add_batched_worker_fetch.sql) is not applied';
    ELSIF to_regprocedure(format('%I.ack_worker(text,text,text,bigint)', s)) IS NULL THEN
        v_skip := 'schema ' || s || ' has no ack_worker(text, text, text, bigint)';
    END IF;
    IF v_skip IS NOT NULL THEN
        PERFORM set_config('expired_lease.line_' || n, format('ok %s - %s # SKIP %s', n, name, v_skip), true)
        FROM (VALUES (5, 'fetch_work_items, reproduction A: it claims the one visible item'),
                     (6, 'fetch_work_items, reproduction A: the lease is valid at return'),
                     (7, 'fetch_work_items, reproduction A: an ack with the token and a fresh timestamp succeeds'),
                     (8, 'fetch_work_items, reproduction A: the session''s lease is valid at return'),
                     (9, 'fetch_work_items, the bound: leases end no later than p_now_ms + bound + timeout')) AS c(n, name);
        RETURN;
    END IF;

    -- 5-7: one item of no session, p_now_ms 10 s stale.
    BEGIN
        EXECUTE format('INSERT INTO %I.worker_queue (id, work_item, visible_at, created_at, tag)
                        VALUES (-1, ''{}'', to_timestamp(1), to_timestamp(1), $1)', s)
        USING v_tag;
        EXECUTE format('SELECT out_lock_token FROM %I.fetch_work_items($1, $2, NULL, NULL, $3, ''tags'', 1, 0)', s)
        INTO v_token
        USING (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT - c_stale_ms, c_timeout_ms, ARRAY[v_tag];
        IF v_token IS NOT NULL THEN
            EXECUTE format('SELECT locked_until - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT
                            FROM %I.worker_queue WHERE lock_token = $1', s)
            INTO v_left USING v_token;
            BEGIN
                EXECUTE format('SELECT %I.ack_worker($1, NULL, NULL, $2)', s)
                USING v_token, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT;
            EXCEPTION WHEN OTHERS THEN
                v_ack_err := SQLSTATE || ' ' || SQLERRM;
            END;
            EXECUTE format('SELECT count(*) FROM %I.worker_queue WHERE id = -1', s) INTO v_left_items;
        END IF;
        RAISE EXCEPTION 'undo' USING ERRCODE = 'U0001';
    EXCEPTION
        WHEN SQLSTATE 'U0001' THEN NULL;
        WHEN OTHERS THEN v_err := SQLSTATE || ' ' || SQLERRM;
    END;

    -- 8: one item of a session no worker holds, p_now_ms 10 s stale.
    BEGIN
        EXECUTE format('INSERT INTO %I.worker_queue (id, work_item, visible_at, created_at, tag, session_id)
                        VALUES (-2, ''{}'', to_timestamp(1), to_timestamp(1), $1, $2)', s)
        USING v_tag, v_session;
        EXECUTE format('SELECT out_lock_token FROM %I.fetch_work_items($1, $2, $3, $2, $4, ''tags'', 1, 1)', s)
        INTO v_s_token
        USING (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT - c_stale_ms, c_timeout_ms, c_worker, ARRAY[v_tag];
        EXECUTE format('SELECT (SELECT locked_until FROM %1$I.sessions WHERE session_id = $1) - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT,
                               (SELECT locked_until FROM %1$I.worker_queue WHERE id = -2) - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT', s)
        INTO v_s_left, v_s_item_left USING v_session;
        RAISE EXCEPTION 'undo' USING ERRCODE = 'U0001';
    EXCEPTION
        WHEN SQLSTATE 'U0001' THEN NULL;
        WHEN OTHERS THEN v_s_err := SQLSTATE || ' ' || SQLERRM;
    END;

    -- 9: an item of a session, p_now_ms stale by the bound and 30 s more.
    BEGIN
        EXECUTE format('INSERT INTO %I.worker_queue (id, work_item, visible_at, created_at, tag, session_id)
                        VALUES (-3, ''{}'', to_timestamp(1), to_timestamp(1), $1, $2)', s)
        USING v_tag, v_session;
        v_b_now_ms := (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT - (c_bound_ms + 30000);
        EXECUTE format('SELECT count(*) FROM %I.fetch_work_items($1, $2, $3, $2, $4, ''tags'', 1, 1)', s)
        USING v_b_now_ms, c_timeout_ms, c_worker, ARRAY[v_tag];
        EXECUTE format('SELECT (SELECT locked_until FROM %1$I.worker_queue WHERE id = -3 AND lock_token IS NOT NULL),
                               (SELECT locked_until FROM %1$I.sessions WHERE session_id = $1)', s)
        INTO v_b_until, v_b_session_until USING v_session;
        RAISE EXCEPTION 'undo' USING ERRCODE = 'U0001';
    EXCEPTION
        WHEN SQLSTATE 'U0001' THEN NULL;
        WHEN OTHERS THEN v_b_err := SQLSTATE || ' ' || SQLERRM;
    END;

    PERFORM set_config('expired_lease.line_5', format('%s 5 - fetch_work_items, reproduction A: it claims the one visible item (%s)',
        CASE WHEN v_err IS NULL AND v_token IS NOT NULL THEN 'ok' ELSE 'not ok' END,
        CASE WHEN v_err IS NOT NULL THEN 'error: ' || v_err
             WHEN v_token IS NULL THEN 'it returned no row'
             ELSE 'p_now_ms ' || c_stale_ms || ' ms stale' END), true);
    PERFORM set_config('expired_lease.line_6', format('%s 6 - fetch_work_items, reproduction A: the lease is valid at return (%s)',
        CASE WHEN v_left > c_want_left_ms THEN 'ok' ELSE 'not ok' END,
        CASE WHEN v_left IS NULL THEN 'no lease to measure'
             ELSE v_left || ' ms left by the database clock, want > ' || c_want_left_ms
                  || '; p_now_ms ' || c_stale_ms || ' ms stale, lock timeout ' || c_timeout_ms || ' ms' END), true);
    PERFORM set_config('expired_lease.line_7', format('%s 7 - fetch_work_items, reproduction A: an ack with the token and a fresh timestamp succeeds (%s)',
        CASE WHEN v_token IS NOT NULL AND v_ack_err IS NULL AND v_left_items = 0 THEN 'ok' ELSE 'not ok' END,
        CASE WHEN v_token IS NULL THEN 'no token to ack'
             WHEN v_ack_err IS NOT NULL THEN 'ack failed: ' || v_ack_err
             ELSE 'acked; ' || v_left_items || ' item(s) left' END), true);
    PERFORM set_config('expired_lease.line_8', format('%s 8 - fetch_work_items, reproduction A: the session''s lease is valid at return (%s)',
        CASE WHEN v_s_err IS NULL AND v_s_token IS NOT NULL AND v_s_left > c_want_left_ms THEN 'ok' ELSE 'not ok' END,
        CASE WHEN v_s_err IS NOT NULL THEN 'error: ' || v_s_err
             WHEN v_s_token IS NULL THEN 'it claimed no item of the session'
             ELSE 'the session''s lease: ' || v_s_left || ' ms left by the database clock, want > ' || c_want_left_ms
                  || ' (its item''s: ' || v_s_item_left || ' ms); p_now_ms ' || c_stale_ms || ' ms stale, lock timeouts ' || c_timeout_ms || ' ms' END), true);
    PERFORM set_config('expired_lease.line_9', format('%s 9 - fetch_work_items, the bound: leases end no later than p_now_ms + bound + timeout (%s)',
        CASE WHEN v_b_err IS NULL AND v_b_until IS NOT NULL AND v_b_session_until IS NOT NULL
                  AND v_b_until - v_b_now_ms <= c_bound_ms + c_timeout_ms
                  AND v_b_session_until - v_b_now_ms <= c_bound_ms + c_timeout_ms THEN 'ok' ELSE 'not ok' END,
        CASE WHEN v_b_err IS NOT NULL THEN 'error: ' || v_b_err
             WHEN v_b_until IS NULL OR v_b_session_until IS NULL THEN 'no lease to measure'
             ELSE 'the item''s ends ' || (v_b_until - v_b_now_ms) || ' ms and the session''s '
                  || (v_b_session_until - v_b_now_ms) || ' ms after p_now_ms, want <= bound ' || c_bound_ms
                  || ' + timeout ' || c_timeout_ms || '; p_now_ms ' || (c_bound_ms + 30000) || ' ms stale' END), true);
END $$;

SELECT current_setting('expired_lease.line_' || n) FROM generate_series(1, 9) AS n ORDER BY n;

SELECT count(*) FILTER (WHERE line LIKE 'not ok%') AS expired_lease_failed,
       count(*) FILTER (WHERE line LIKE '%# SKIP%') AS expired_lease_skipped,
       count(*) FILTER (WHERE line LIKE 'not ok%') = 0 AS expired_lease_all_ok
FROM (SELECT current_setting('expired_lease.line_' || n) AS line FROM generate_series(1, 9) AS n) AS l
\gset

ROLLBACK;

\if :expired_lease_all_ok
\echo '# all 9 checks passed,' :expired_lease_skipped 'of them skipped; everything was rolled back'
\else
\echo '#' :expired_lease_failed 'of 9 checks failed; everything was rolled back'
DO $$ BEGIN RAISE EXCEPTION 'expired_lease_stale_caller: a check failed (see the "not ok" lines)'; END $$;
\endif

\endif
