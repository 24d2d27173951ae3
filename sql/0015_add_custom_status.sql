-- 0015_add_custom_status.sql (upstream duroxide-pg schema version 15)
--
-- What changes:
--   * instances.custom_status text (nullable) and
--     instances.custom_status_version integer NOT NULL DEFAULT 0 (existing
--     rows get 0).
--   * ack_orchestration_item (same signature):
--       - metadata.custom_status_action 'set' stores custom_status_value,
--         'clear' sets it NULL; both increment custom_status_version;
--         anything else does nothing;
--       - orchestrator items of variant QueueMessage are routed to their
--         "instance" field (before, they went to the acking instance).
--   * ack_worker (same signature): when p_now_ms is given, only a live
--     lease (locked_until > p_now_ms) can be acked; an expired one gives
--     'Worker queue item not found or already processed'.
--   * New get_custom_status(p_instance_id, p_last_seen_version).
--   * cleanup_schema(): its drop list adds get_custom_status(text, bigint).
--
-- Why: orchestration custom status (set from the runtime, polled by
-- clients by version), and no acking of a worker lease that has expired.
--
-- Like upstream, the file ends with a RAISE NOTICE.
--
-- Locks: ACCESS EXCLUSIVE on instances, to commit (two ADD COLUMN, one with a
-- constant default).
-- Duration: milliseconds, whatever instances holds: the columns are a catalog
-- change.
--
-- Down locks: ACCESS EXCLUSIVE on instances, to commit (two DROP COLUMN: the
-- custom statuses are gone): every read and write of instances waits; it also
-- replaces functions.
-- Down duration: milliseconds, whatever instances holds: a dropped column is a
-- catalog change.

-- squawk-ignore-file ban-drop-column, prefer-bigint-over-int -- upstream's own statements (its history 1..19 re-written for goose: the catalog must be the one upstream's runner makes; a Down undoes its Up)
-- +goose Up
ALTER TABLE instances ADD COLUMN custom_status text;
ALTER TABLE instances ADD COLUMN custom_status_version integer NOT NULL DEFAULT 0;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ack_orchestration_item(
    p_lock_token text,
    p_now_ms bigint,
    p_execution_id bigint,
    p_history_delta jsonb,
    p_worker_items jsonb,
    p_orchestrator_items jsonb,
    p_metadata jsonb,
    p_cancelled_activities jsonb DEFAULT '[]'::jsonb
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Every timestamp written comes from the caller's clock.
    v_now timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_instance_id text;
    v_orchestration_name text;
    v_orchestration_version text;
    v_parent_instance_id text;
    v_status text;
    v_output text;
    v_elem jsonb;
    v_activity jsonb;
    v_target_instance text;
    v_fire_at_ms bigint;
    v_visible_at timestamptz;
BEGIN
    -- 1. The lease must exist and still be live.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token';
    END IF;

    -- 2. Metadata.
    v_orchestration_name := p_metadata ->> 'orchestration_name';
    v_orchestration_version := p_metadata ->> 'orchestration_version';
    v_parent_instance_id := p_metadata ->> 'parent_instance_id';
    v_status := p_metadata ->> 'status';
    v_output := p_metadata ->> 'output';

    -- 3. Create or refresh the instance row (only when name and version are known).
    IF v_orchestration_name IS NOT NULL AND v_orchestration_version IS NOT NULL THEN
        INSERT INTO instances (instance_id, orchestration_name, orchestration_version, current_execution_id,
                               parent_instance_id, created_at, updated_at)
        VALUES (v_instance_id, v_orchestration_name, v_orchestration_version, p_execution_id,
                v_parent_instance_id, v_now, v_now)
        ON CONFLICT (instance_id) DO NOTHING;

        -- A parent, once recorded, is never overwritten.
        UPDATE instances i
        SET orchestration_name = v_orchestration_name,
            orchestration_version = v_orchestration_version,
            parent_instance_id = COALESCE(i.parent_instance_id, v_parent_instance_id),
            updated_at = v_now
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 4. Ensure the execution row (even when no instance row exists).
    INSERT INTO executions (instance_id, execution_id, status, started_at)
    VALUES (v_instance_id, p_execution_id, 'Running', v_now)
    ON CONFLICT (instance_id, execution_id) DO NOTHING;

    -- 5. The current execution never moves backwards.
    UPDATE instances i
    SET current_execution_id = GREATEST(i.current_execution_id, p_execution_id),
        updated_at = v_now
    WHERE i.instance_id = v_instance_id;

    -- 6. Append the history delta (no conflict handling).
    IF p_history_delta IS NOT NULL AND jsonb_array_length(p_history_delta) > 0 THEN
        INSERT INTO history (instance_id, execution_id, event_id, event_type, event_data, created_at)
        SELECT v_instance_id, p_execution_id, (h.ev ->> 'event_id')::bigint, h.ev ->> 'event_type', h.ev ->> 'event_data',
               v_now
        FROM jsonb_array_elements(p_history_delta) WITH ORDINALITY AS h(ev, ord)
        ORDER BY h.ord;
    END IF;

    -- 7. Execution status; completed_at only for Completed/Failed, NULL otherwise.
    IF v_status IS NOT NULL THEN
        UPDATE executions e
        SET status = v_status,
            output = v_output,
            completed_at = CASE WHEN v_status IN ('Completed', 'Failed') THEN v_now ELSE NULL END
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 7a. Pin the execution to a duroxide version (a JSON null skips this).
    IF p_metadata ? 'pinned_duroxide_version'
       AND p_metadata ->> 'pinned_duroxide_version' IS NOT NULL
       AND p_metadata ->> 'pinned_duroxide_version' <> 'null' THEN
        UPDATE executions e
        SET duroxide_version_major = (p_metadata -> 'pinned_duroxide_version' ->> 'major')::integer,
            duroxide_version_minor = (p_metadata -> 'pinned_duroxide_version' ->> 'minor')::integer,
            duroxide_version_patch = (p_metadata -> 'pinned_duroxide_version' ->> 'patch')::integer
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 7b. Custom status: 'set' stores the value, 'clear' nulls it; both bump
    --     the version. Any other action (or none) does nothing.
    IF p_metadata ->> 'custom_status_action' = 'set' THEN
        UPDATE instances i
        SET custom_status = p_metadata ->> 'custom_status_value',
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    ELSIF p_metadata ->> 'custom_status_action' = 'clear' THEN
        UPDATE instances i
        SET custom_status = NULL,
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 8. Enqueue worker items; ActivityExecute items carry their identity and session.
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord) ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id,
                                      session_id)
            VALUES (v_elem::text, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::bigint,
                    (v_activity ->> 'id')::bigint,
                    v_activity ->> 'session_id');
        END LOOP;
    END IF;

    -- 9. Cancel activities, after the worker items were inserted, so that an
    --    activity scheduled and cancelled in the same turn ends up absent.
    IF p_cancelled_activities IS NOT NULL AND jsonb_array_length(p_cancelled_activities) > 0 THEN
        FOR v_elem IN
            SELECT c.item FROM jsonb_array_elements(p_cancelled_activities) WITH ORDINALITY AS c(item, ord) ORDER BY c.ord
        LOOP
            DELETE FROM worker_queue w
            WHERE w.instance_id = v_elem ->> 'instance'
              AND w.execution_id = (v_elem ->> 'execution_id')::bigint
              AND w.activity_id = (v_elem ->> 'activity_id')::bigint;
        END LOOP;
    END IF;

    -- 10. Enqueue orchestrator items, routed by work-item variant.
    IF p_orchestrator_items IS NOT NULL AND jsonb_array_length(p_orchestrator_items) > 0 THEN
        FOR v_elem IN
            SELECT o.item FROM jsonb_array_elements(p_orchestrator_items) WITH ORDINALITY AS o(item, ord) ORDER BY o.ord
        LOOP
            v_fire_at_ms := NULL;
            IF v_elem ? 'StartOrchestration' THEN
                v_target_instance := v_elem -> 'StartOrchestration' ->> 'instance';
            ELSIF v_elem ? 'ContinueAsNew' THEN
                v_target_instance := v_elem -> 'ContinueAsNew' ->> 'instance';
            ELSIF v_elem ? 'TimerFired' THEN
                v_target_instance := v_elem -> 'TimerFired' ->> 'instance';
                v_fire_at_ms := (v_elem -> 'TimerFired' ->> 'fire_at_ms')::bigint;
            ELSIF v_elem ? 'ActivityCompleted' THEN
                v_target_instance := v_elem -> 'ActivityCompleted' ->> 'instance';
            ELSIF v_elem ? 'ActivityFailed' THEN
                v_target_instance := v_elem -> 'ActivityFailed' ->> 'instance';
            ELSIF v_elem ? 'ExternalRaised' THEN
                v_target_instance := v_elem -> 'ExternalRaised' ->> 'instance';
            ELSIF v_elem ? 'CancelInstance' THEN
                v_target_instance := v_elem -> 'CancelInstance' ->> 'instance';
            ELSIF v_elem ? 'SubOrchCompleted' THEN
                v_target_instance := v_elem -> 'SubOrchCompleted' ->> 'parent_instance';
            ELSIF v_elem ? 'SubOrchFailed' THEN
                v_target_instance := v_elem -> 'SubOrchFailed' ->> 'parent_instance';
            ELSIF v_elem ? 'QueueMessage' THEN
                v_target_instance := v_elem -> 'QueueMessage' ->> 'instance';
            ELSE
                v_target_instance := v_instance_id;
            END IF;

            -- A timer becomes visible at its fire time (even a past one).
            IF v_fire_at_ms IS NOT NULL AND v_fire_at_ms > 0 THEN
                v_visible_at := to_timestamp(v_fire_at_ms / 1000.0);
            ELSE
                v_visible_at := v_now;
            END IF;

            INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
            VALUES (v_target_instance, v_elem::text, v_visible_at, v_now);
        END LOOP;
    END IF;

    -- 11. Consume the messages claimed by this lease.
    DELETE FROM orchestrator_queue q
    WHERE q.lock_token = p_lock_token;

    -- 12. Release the lease.
    DELETE FROM instance_locks l
    WHERE l.instance_id = v_instance_id
      AND l.lock_token = p_lock_token;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ack_worker(
    p_lock_token text,
    p_instance_id text DEFAULT NULL,
    p_completion_json text DEFAULT NULL,
    p_now_ms bigint DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_session_id text;
    v_row_count bigint;
BEGIN
    -- Remember the item's session (plain read) before deleting it.
    SELECT session_id INTO v_session_id
    FROM worker_queue
    WHERE lock_token = p_lock_token;

    -- With p_now_ms the lease must still be live; without it, any state.
    IF p_now_ms IS NOT NULL THEN
        DELETE FROM worker_queue
        WHERE lock_token = p_lock_token
          AND locked_until > p_now_ms;
    ELSE
        DELETE FROM worker_queue
        WHERE lock_token = p_lock_token;
    END IF;

    GET DIAGNOSTICS v_row_count = ROW_COUNT;
    IF v_row_count = 0 THEN
        RAISE EXCEPTION 'Worker queue item not found or already processed';
    END IF;

    IF p_completion_json IS NOT NULL THEN
        IF p_instance_id IS NULL THEN
            RAISE EXCEPTION 'p_instance_id is required when p_completion_json is provided';
        END IF;
        IF p_now_ms IS NULL THEN
            RAISE EXCEPTION 'p_now_ms is required when p_completion_json is provided';
        END IF;

        INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
        VALUES (p_instance_id, p_completion_json,
                to_timestamp(p_now_ms / 1000.0), to_timestamp(p_now_ms / 1000.0));
    END IF;

    -- Session piggy-back: stamp activity on a still-live session (no
    -- owner check, locked_until unchanged).
    IF v_session_id IS NOT NULL AND p_now_ms IS NOT NULL THEN
        UPDATE sessions
        SET last_activity_at = p_now_ms
        WHERE session_id = v_session_id
          AND locked_until > p_now_ms;
    END IF;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION get_custom_status(
    p_instance_id text,
    p_last_seen_version bigint
)
RETURNS TABLE(out_custom_status text, out_custom_status_version bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- A row only when the stored version is newer than the caller's.
    RETURN QUERY
    SELECT i.custom_status, i.custom_status_version::bigint
    FROM instances i
    WHERE i.instance_id = p_instance_id
      AND i.custom_status_version > p_last_seen_version;
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
    DROP TABLE IF EXISTS instances CASCADE;
    DROP TABLE IF EXISTS executions CASCADE;
    DROP TABLE IF EXISTS history CASCADE;
    DROP TABLE IF EXISTS orchestrator_queue CASCADE;
    DROP TABLE IF EXISTS worker_queue CASCADE;
    DROP TABLE IF EXISTS instance_locks CASCADE;
    DROP TABLE IF EXISTS _duroxide_migrations CASCADE;

    -- Then the functions, by exact signature (some do not exist at this
    -- version; IF EXISTS skips them). Dropping the running function is fine.
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
    DROP FUNCTION IF EXISTS ack_worker(text, text, text, bigint);
    DROP FUNCTION IF EXISTS renew_work_item_lock(text, bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_work_item(bigint, bigint, text, bigint);
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
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
BEGIN
    RAISE NOTICE 'Migration 0015: Added custom status support (custom_status/custom_status_version columns, get_custom_status function, updated ack_orchestration_item)';
END;
$do$;
-- +goose StatementEnd

INSERT INTO _duroxide_migrations (version, name) VALUES (15, '0015_add_custom_status.sql');

-- +goose Down
DELETE FROM _duroxide_migrations WHERE version = 15;

DROP FUNCTION IF EXISTS get_custom_status(text, bigint);

DROP FUNCTION IF EXISTS ack_orchestration_item(text, bigint, bigint, jsonb, jsonb, jsonb, jsonb, jsonb);
-- ack_orchestration_item as of version 14, copied verbatim from 0014_add_session_support.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ack_orchestration_item(
    p_lock_token text,
    p_now_ms bigint,
    p_execution_id bigint,
    p_history_delta jsonb,
    p_worker_items jsonb,
    p_orchestrator_items jsonb,
    p_metadata jsonb,
    p_cancelled_activities jsonb DEFAULT '[]'::jsonb
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Every timestamp written comes from the caller's clock.
    v_now timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_instance_id text;
    v_orchestration_name text;
    v_orchestration_version text;
    v_parent_instance_id text;
    v_status text;
    v_output text;
    v_elem jsonb;
    v_activity jsonb;
    v_target_instance text;
    v_fire_at_ms bigint;
    v_visible_at timestamptz;
BEGIN
    -- 1. The lease must exist and still be live.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token';
    END IF;

    -- 2. Metadata.
    v_orchestration_name := p_metadata ->> 'orchestration_name';
    v_orchestration_version := p_metadata ->> 'orchestration_version';
    v_parent_instance_id := p_metadata ->> 'parent_instance_id';
    v_status := p_metadata ->> 'status';
    v_output := p_metadata ->> 'output';

    -- 3. Create or refresh the instance row (only when name and version are known).
    IF v_orchestration_name IS NOT NULL AND v_orchestration_version IS NOT NULL THEN
        INSERT INTO instances (instance_id, orchestration_name, orchestration_version, current_execution_id,
                               parent_instance_id, created_at, updated_at)
        VALUES (v_instance_id, v_orchestration_name, v_orchestration_version, p_execution_id,
                v_parent_instance_id, v_now, v_now)
        ON CONFLICT (instance_id) DO NOTHING;

        -- A parent, once recorded, is never overwritten.
        UPDATE instances i
        SET orchestration_name = v_orchestration_name,
            orchestration_version = v_orchestration_version,
            parent_instance_id = COALESCE(i.parent_instance_id, v_parent_instance_id),
            updated_at = v_now
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 4. Ensure the execution row (even when no instance row exists).
    INSERT INTO executions (instance_id, execution_id, status, started_at)
    VALUES (v_instance_id, p_execution_id, 'Running', v_now)
    ON CONFLICT (instance_id, execution_id) DO NOTHING;

    -- 5. The current execution never moves backwards.
    UPDATE instances i
    SET current_execution_id = GREATEST(i.current_execution_id, p_execution_id),
        updated_at = v_now
    WHERE i.instance_id = v_instance_id;

    -- 6. Append the history delta (no conflict handling).
    IF p_history_delta IS NOT NULL AND jsonb_array_length(p_history_delta) > 0 THEN
        INSERT INTO history (instance_id, execution_id, event_id, event_type, event_data, created_at)
        SELECT v_instance_id, p_execution_id, (h.ev ->> 'event_id')::bigint, h.ev ->> 'event_type', h.ev ->> 'event_data',
               v_now
        FROM jsonb_array_elements(p_history_delta) WITH ORDINALITY AS h(ev, ord)
        ORDER BY h.ord;
    END IF;

    -- 7. Execution status; completed_at only for Completed/Failed, NULL otherwise.
    IF v_status IS NOT NULL THEN
        UPDATE executions e
        SET status = v_status,
            output = v_output,
            completed_at = CASE WHEN v_status IN ('Completed', 'Failed') THEN v_now ELSE NULL END
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 7a. Pin the execution to a duroxide version (a JSON null skips this).
    IF p_metadata ? 'pinned_duroxide_version'
       AND p_metadata ->> 'pinned_duroxide_version' IS NOT NULL
       AND p_metadata ->> 'pinned_duroxide_version' <> 'null' THEN
        UPDATE executions e
        SET duroxide_version_major = (p_metadata -> 'pinned_duroxide_version' ->> 'major')::integer,
            duroxide_version_minor = (p_metadata -> 'pinned_duroxide_version' ->> 'minor')::integer,
            duroxide_version_patch = (p_metadata -> 'pinned_duroxide_version' ->> 'patch')::integer
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 8. Enqueue worker items; ActivityExecute items carry their identity and session.
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord) ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id,
                                      session_id)
            VALUES (v_elem::text, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::bigint,
                    (v_activity ->> 'id')::bigint,
                    v_activity ->> 'session_id');
        END LOOP;
    END IF;

    -- 9. Cancel activities, after the worker items were inserted, so that an
    --    activity scheduled and cancelled in the same turn ends up absent.
    IF p_cancelled_activities IS NOT NULL AND jsonb_array_length(p_cancelled_activities) > 0 THEN
        FOR v_elem IN
            SELECT c.item FROM jsonb_array_elements(p_cancelled_activities) WITH ORDINALITY AS c(item, ord) ORDER BY c.ord
        LOOP
            DELETE FROM worker_queue w
            WHERE w.instance_id = v_elem ->> 'instance'
              AND w.execution_id = (v_elem ->> 'execution_id')::bigint
              AND w.activity_id = (v_elem ->> 'activity_id')::bigint;
        END LOOP;
    END IF;

    -- 10. Enqueue orchestrator items, routed by work-item variant.
    IF p_orchestrator_items IS NOT NULL AND jsonb_array_length(p_orchestrator_items) > 0 THEN
        FOR v_elem IN
            SELECT o.item FROM jsonb_array_elements(p_orchestrator_items) WITH ORDINALITY AS o(item, ord) ORDER BY o.ord
        LOOP
            v_fire_at_ms := NULL;
            IF v_elem ? 'StartOrchestration' THEN
                v_target_instance := v_elem -> 'StartOrchestration' ->> 'instance';
            ELSIF v_elem ? 'ContinueAsNew' THEN
                v_target_instance := v_elem -> 'ContinueAsNew' ->> 'instance';
            ELSIF v_elem ? 'TimerFired' THEN
                v_target_instance := v_elem -> 'TimerFired' ->> 'instance';
                v_fire_at_ms := (v_elem -> 'TimerFired' ->> 'fire_at_ms')::bigint;
            ELSIF v_elem ? 'ActivityCompleted' THEN
                v_target_instance := v_elem -> 'ActivityCompleted' ->> 'instance';
            ELSIF v_elem ? 'ActivityFailed' THEN
                v_target_instance := v_elem -> 'ActivityFailed' ->> 'instance';
            ELSIF v_elem ? 'ExternalRaised' THEN
                v_target_instance := v_elem -> 'ExternalRaised' ->> 'instance';
            ELSIF v_elem ? 'CancelInstance' THEN
                v_target_instance := v_elem -> 'CancelInstance' ->> 'instance';
            ELSIF v_elem ? 'SubOrchCompleted' THEN
                v_target_instance := v_elem -> 'SubOrchCompleted' ->> 'parent_instance';
            ELSIF v_elem ? 'SubOrchFailed' THEN
                v_target_instance := v_elem -> 'SubOrchFailed' ->> 'parent_instance';
            ELSE
                v_target_instance := v_instance_id;
            END IF;

            -- A timer becomes visible at its fire time (even a past one).
            IF v_fire_at_ms IS NOT NULL AND v_fire_at_ms > 0 THEN
                v_visible_at := to_timestamp(v_fire_at_ms / 1000.0);
            ELSE
                v_visible_at := v_now;
            END IF;

            INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
            VALUES (v_target_instance, v_elem::text, v_visible_at, v_now);
        END LOOP;
    END IF;

    -- 11. Consume the messages claimed by this lease.
    DELETE FROM orchestrator_queue q
    WHERE q.lock_token = p_lock_token;

    -- 12. Release the lease.
    DELETE FROM instance_locks l
    WHERE l.instance_id = v_instance_id
      AND l.lock_token = p_lock_token;
END;
$fn$;
-- +goose StatementEnd

DROP FUNCTION IF EXISTS ack_worker(text, text, text, bigint);
-- ack_worker as of version 14, copied verbatim from 0014_add_session_support.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ack_worker(
    p_lock_token text,
    p_instance_id text DEFAULT NULL,
    p_completion_json text DEFAULT NULL,
    p_now_ms bigint DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_session_id text;
    v_row_count bigint;
BEGIN
    -- Remember the item's session (plain read) before deleting it.
    SELECT session_id INTO v_session_id
    FROM worker_queue
    WHERE lock_token = p_lock_token;

    DELETE FROM worker_queue
    WHERE lock_token = p_lock_token;

    GET DIAGNOSTICS v_row_count = ROW_COUNT;
    IF v_row_count = 0 THEN
        RAISE EXCEPTION 'Worker queue item not found or already processed';
    END IF;

    IF p_completion_json IS NOT NULL THEN
        IF p_instance_id IS NULL THEN
            RAISE EXCEPTION 'p_instance_id is required when p_completion_json is provided';
        END IF;
        IF p_now_ms IS NULL THEN
            RAISE EXCEPTION 'p_now_ms is required when p_completion_json is provided';
        END IF;

        INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
        VALUES (p_instance_id, p_completion_json,
                to_timestamp(p_now_ms / 1000.0), to_timestamp(p_now_ms / 1000.0));
    END IF;

    -- Session piggy-back: stamp activity on a still-live session (no
    -- owner check, locked_until unchanged).
    IF v_session_id IS NOT NULL AND p_now_ms IS NOT NULL THEN
        UPDATE sessions
        SET last_activity_at = p_now_ms
        WHERE session_id = v_session_id
          AND locked_until > p_now_ms;
    END IF;
END;
$fn$;
-- +goose StatementEnd

DROP FUNCTION IF EXISTS cleanup_schema();
-- cleanup_schema as of version 14, copied verbatim from 0014_add_session_support.sql.
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
    DROP TABLE IF EXISTS instances CASCADE;
    DROP TABLE IF EXISTS executions CASCADE;
    DROP TABLE IF EXISTS history CASCADE;
    DROP TABLE IF EXISTS orchestrator_queue CASCADE;
    DROP TABLE IF EXISTS worker_queue CASCADE;
    DROP TABLE IF EXISTS instance_locks CASCADE;
    DROP TABLE IF EXISTS _duroxide_migrations CASCADE;

    -- Then the functions, by exact signature (some do not exist at this
    -- version; IF EXISTS skips them). Dropping the running function is fine.
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
    DROP FUNCTION IF EXISTS ack_worker(text, text, text, bigint);
    DROP FUNCTION IF EXISTS renew_work_item_lock(text, bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_work_item(bigint, bigint, text, bigint);
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
END;
$fn$;
-- +goose StatementEnd

ALTER TABLE instances DROP COLUMN custom_status_version;
ALTER TABLE instances DROP COLUMN custom_status;
