-- 0023_add_get_instance_stats.sql (upstream duroxide-pg schema version 21)
--
-- Port of upstream's version 21, 0021_add_get_instance_stats.sql (goose
-- number 0023: see 0022's header). Records upstream's row
-- (21, '0021_add_get_instance_stats.sql').
--
-- What changes:
--   * get_instance_stats(p_instance) (new): one row (found, history event
--     count and bytes of the current execution, queue_pending_count = the
--     number of carry_forward_events of the current execution's event 1, KV
--     user key count and value bytes over kv_store and kv_delta).
--   * cleanup_schema also drops get_instance_stats.
--   * No table, column or index changes.
--
-- Why: duroxide's Client::get_orchestration_stats (duroxide-pg 0.1.28).
--
-- Upstream quirks kept knowingly (they are its contract, and duroxide-pg's
-- validation tests encode them):
--   * queue_pending_count does not read orchestrator_queue;
--   * a kv_store key tombstoned in kv_delta is still counted, and a key in
--     both tables counts its bytes twice;
--   * invalid JSON in event 1 makes the call fail with 22P02.
--
-- Re-application over a database where duroxide-pg's runner already
-- applied upstream's 21 is clean: the functions are replaced by the pack's
-- (same signatures; like upstream, get_instance_stats is replaced without
-- a DROP, so a different function of that name makes it fail with 42P13),
-- the row is kept. It refuses, changing nothing, when row 21 names another
-- file.
--
-- Down drops get_instance_stats and restores cleanup_schema verbatim from
-- 0022_add_kv_delta.sql. It refuses, changing nothing, while
-- _duroxide_migrations records an upstream version above 21 (see 0022).
--
-- Locks: no table lock: it only replaces functions (a call in flight finishes
-- on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only drops get_instance_stats and replaces
-- cleanup_schema (a call in flight finishes on the old text).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up
-- +goose StatementBegin
DO $guard$
DECLARE
    v_name text;
BEGIN
    SELECT m.name INTO v_name FROM _duroxide_migrations m WHERE m.version = 21;
    IF FOUND AND v_name <> '0021_add_get_instance_stats.sql' THEN
        RAISE EXCEPTION '0023: _duroxide_migrations records version 21 as %, not 0021_add_get_instance_stats.sql; nothing was changed', v_name
            USING ERRCODE = '55000';
    END IF;
END;
$guard$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION get_instance_stats(p_instance text)
RETURNS TABLE(out_found boolean, out_history_event_count bigint, out_history_size_bytes bigint,
              out_queue_pending_count bigint, out_kv_user_key_count bigint, out_kv_total_value_bytes bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_execution_id bigint;
    v_events bigint;
    v_event_bytes bigint;
    v_pending bigint := 0;
    v_keys bigint;
    v_value_bytes bigint;
    v_started text;
    v_started_json jsonb;
BEGIN
    -- Only the instances row decides whether the instance exists.
    SELECT i.current_execution_id INTO v_execution_id
    FROM instances i
    WHERE i.instance_id = p_instance;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint;
        RETURN;
    END IF;

    -- History of the current execution only: events and their bytes in the
    -- database encoding.
    SELECT count(*), coalesce(sum(octet_length(h.event_data)), 0)
    INTO v_events, v_event_bytes
    FROM history h
    WHERE h.instance_id = p_instance
      AND h.execution_id = v_execution_id;

    -- Messages carried into this execution by continue-as-new: the length
    -- of the top-level carry_forward_events array of its event 1. Invalid
    -- JSON there fails the call (22P02).
    SELECT h.event_data INTO v_started
    FROM history h
    WHERE h.instance_id = p_instance
      AND h.execution_id = v_execution_id
      AND h.event_id = 1;
    IF FOUND THEN
        v_started_json := v_started::jsonb;
        IF jsonb_typeof(v_started_json -> 'carry_forward_events') = 'array' THEN
            v_pending := jsonb_array_length(v_started_json -> 'carry_forward_events');
        END IF;
    END IF;

    -- User keys: every stored key, and every live delta key.
    SELECT count(*) INTO v_keys
    FROM (
        SELECT s.key FROM kv_store s WHERE s.instance_id = p_instance
        UNION
        SELECT d.key FROM kv_delta d WHERE d.instance_id = p_instance AND d.value IS NOT NULL
    ) k;

    -- Value bytes of both tables (tombstones add nothing).
    SELECT coalesce((SELECT sum(octet_length(s.value)) FROM kv_store s WHERE s.instance_id = p_instance), 0)
         + coalesce((SELECT sum(octet_length(d.value)) FROM kv_delta d WHERE d.instance_id = p_instance), 0)
    INTO v_value_bytes;

    RETURN QUERY SELECT true, v_events, v_event_bytes, v_pending, v_keys, v_value_bytes;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION cleanup_schema()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Test teardown: drop every table (owned sequences go with them),
    -- including the bookkeeping table, so the next migration starts afresh.
    DROP TABLE IF EXISTS sessions CASCADE;
    DROP TABLE IF EXISTS kv_delta CASCADE;
    DROP TABLE IF EXISTS kv_store CASCADE;
    DROP TABLE IF EXISTS instances CASCADE;
    DROP TABLE IF EXISTS executions CASCADE;
    DROP TABLE IF EXISTS history CASCADE;
    DROP TABLE IF EXISTS orchestrator_queue CASCADE;
    DROP TABLE IF EXISTS worker_queue CASCADE;
    DROP TABLE IF EXISTS instance_locks CASCADE;
    DROP TABLE IF EXISTS _duroxide_migrations CASCADE;

    -- Then the functions, by exact signature (some no longer exist; IF EXISTS
    -- skips them). Dropping the running function is fine. Upstream quirk
    -- kept: the four legacy functions of 0006 are not dropped.
    DROP FUNCTION IF EXISTS cleanup_schema();
    DROP FUNCTION IF EXISTS list_instances();
    DROP FUNCTION IF EXISTS list_executions(text);
    DROP FUNCTION IF EXISTS latest_execution_id(text);
    DROP FUNCTION IF EXISTS list_instances_by_status(text);
    DROP FUNCTION IF EXISTS get_instance_info(text);
    DROP FUNCTION IF EXISTS get_execution_info(text, bigint);
    DROP FUNCTION IF EXISTS get_system_metrics();
    DROP FUNCTION IF EXISTS get_queue_depths(bigint);
    DROP FUNCTION IF EXISTS enqueue_worker_work(text, bigint, text, bigint, bigint, text);
    DROP FUNCTION IF EXISTS enqueue_worker_work(text, bigint, text, bigint, bigint, text, text);
    DROP FUNCTION IF EXISTS ack_worker(text, text, text, bigint);
    DROP FUNCTION IF EXISTS renew_work_item_lock(text, bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_work_item(bigint, bigint, text, bigint);
    DROP FUNCTION IF EXISTS fetch_work_item(bigint, bigint, text, bigint, text[], text);
    DROP FUNCTION IF EXISTS abandon_work_item(text, bigint, bigint, boolean);
    DROP FUNCTION IF EXISTS enqueue_orchestrator_work(text, text, timestamptz, text, text, bigint);
    DROP FUNCTION IF EXISTS fetch_orchestration_item(bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_orchestration_item(bigint, bigint, bigint, bigint);
    DROP FUNCTION IF EXISTS ack_orchestration_item(text, bigint, bigint, jsonb, jsonb, jsonb, jsonb, jsonb);
    DROP FUNCTION IF EXISTS abandon_orchestration_item(text, bigint, bigint, boolean);
    DROP FUNCTION IF EXISTS renew_orchestration_item_lock(text, bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_history(text);
    DROP FUNCTION IF EXISTS fetch_history_with_execution(text, bigint);
    DROP FUNCTION IF EXISTS append_history(text, bigint, jsonb);
    DROP FUNCTION IF EXISTS list_children(text);
    DROP FUNCTION IF EXISTS get_parent_id(text);
    DROP FUNCTION IF EXISTS delete_instances_atomic(text[], boolean);
    DROP FUNCTION IF EXISTS prune_executions(text, integer, bigint);
    DROP FUNCTION IF EXISTS renew_session_lock(text[], bigint, bigint, bigint);
    DROP FUNCTION IF EXISTS cleanup_orphaned_sessions(bigint);
    DROP FUNCTION IF EXISTS get_custom_status(text, bigint);
    DROP FUNCTION IF EXISTS get_kv_value(text, text);
    DROP FUNCTION IF EXISTS get_kv_all_values(text);
    DROP FUNCTION IF EXISTS get_instance_stats(text);
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
BEGIN
    RAISE NOTICE 'Migration 0021: Added get_instance_stats stored procedure';
END;
$do$;
-- +goose StatementEnd

INSERT INTO _duroxide_migrations (version, name) VALUES (21, '0021_add_get_instance_stats.sql')
ON CONFLICT (version) DO NOTHING;

-- +goose Down
-- +goose StatementBegin
DO $guard$
DECLARE
    v_later text;
BEGIN
    SELECT string_agg(m.version::text, ', ' ORDER BY m.version) INTO v_later
    FROM _duroxide_migrations m
    WHERE m.version > 21;
    IF v_later IS NOT NULL THEN
        RAISE EXCEPTION '0023: _duroxide_migrations records upstream version(s) % above 21: duroxide-pg''s runner applied them on top of this migration; nothing was changed', v_later
            USING ERRCODE = '55000',
                  HINT = 'Run `harness migrate up` first (the pack''s ports of those versions then own them), then go down.';
    END IF;
END;
$guard$;
-- +goose StatementEnd

DROP FUNCTION get_instance_stats(text);

-- cleanup_schema as of version 20, verbatim from 0022_add_kv_delta.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION cleanup_schema()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Test teardown: drop every table (owned sequences go with them),
    -- including the bookkeeping table, so the next migration starts afresh.
    DROP TABLE IF EXISTS sessions CASCADE;
    DROP TABLE IF EXISTS kv_delta CASCADE;
    DROP TABLE IF EXISTS kv_store CASCADE;
    DROP TABLE IF EXISTS instances CASCADE;
    DROP TABLE IF EXISTS executions CASCADE;
    DROP TABLE IF EXISTS history CASCADE;
    DROP TABLE IF EXISTS orchestrator_queue CASCADE;
    DROP TABLE IF EXISTS worker_queue CASCADE;
    DROP TABLE IF EXISTS instance_locks CASCADE;
    DROP TABLE IF EXISTS _duroxide_migrations CASCADE;

    -- Then the functions, by exact signature (some no longer exist; IF EXISTS
    -- skips them). Dropping the running function is fine. Upstream quirk
    -- kept: the four legacy functions of 0006 are not dropped.
    DROP FUNCTION IF EXISTS cleanup_schema();
    DROP FUNCTION IF EXISTS list_instances();
    DROP FUNCTION IF EXISTS list_executions(text);
    DROP FUNCTION IF EXISTS latest_execution_id(text);
    DROP FUNCTION IF EXISTS list_instances_by_status(text);
    DROP FUNCTION IF EXISTS get_instance_info(text);
    DROP FUNCTION IF EXISTS get_execution_info(text, bigint);
    DROP FUNCTION IF EXISTS get_system_metrics();
    DROP FUNCTION IF EXISTS get_queue_depths(bigint);
    DROP FUNCTION IF EXISTS enqueue_worker_work(text, bigint, text, bigint, bigint, text);
    DROP FUNCTION IF EXISTS enqueue_worker_work(text, bigint, text, bigint, bigint, text, text);
    DROP FUNCTION IF EXISTS ack_worker(text, text, text, bigint);
    DROP FUNCTION IF EXISTS renew_work_item_lock(text, bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_work_item(bigint, bigint, text, bigint);
    DROP FUNCTION IF EXISTS fetch_work_item(bigint, bigint, text, bigint, text[], text);
    DROP FUNCTION IF EXISTS abandon_work_item(text, bigint, bigint, boolean);
    DROP FUNCTION IF EXISTS enqueue_orchestrator_work(text, text, timestamptz, text, text, bigint);
    DROP FUNCTION IF EXISTS fetch_orchestration_item(bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_orchestration_item(bigint, bigint, bigint, bigint);
    DROP FUNCTION IF EXISTS ack_orchestration_item(text, bigint, bigint, jsonb, jsonb, jsonb, jsonb, jsonb);
    DROP FUNCTION IF EXISTS abandon_orchestration_item(text, bigint, bigint, boolean);
    DROP FUNCTION IF EXISTS renew_orchestration_item_lock(text, bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_history(text);
    DROP FUNCTION IF EXISTS fetch_history_with_execution(text, bigint);
    DROP FUNCTION IF EXISTS append_history(text, bigint, jsonb);
    DROP FUNCTION IF EXISTS list_children(text);
    DROP FUNCTION IF EXISTS get_parent_id(text);
    DROP FUNCTION IF EXISTS delete_instances_atomic(text[], boolean);
    DROP FUNCTION IF EXISTS prune_executions(text, integer, bigint);
    DROP FUNCTION IF EXISTS renew_session_lock(text[], bigint, bigint, bigint);
    DROP FUNCTION IF EXISTS cleanup_orphaned_sessions(bigint);
    DROP FUNCTION IF EXISTS get_custom_status(text, bigint);
    DROP FUNCTION IF EXISTS get_kv_value(text, text);
    DROP FUNCTION IF EXISTS get_kv_all_values(text);
END;
$fn$;
-- +goose StatementEnd

DELETE FROM _duroxide_migrations WHERE version = 21;
