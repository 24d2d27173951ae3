-- 0012_require_timestamps.sql
--
-- Upstream version 12: the application clock for ack_orchestration_item, and
-- explicit NOT NULL timestamps.
--
-- Functions:
-- * The 7-argument ack_orchestration_item is replaced by an 8-argument one
--   with p_now_ms bigint as the new 2nd argument. The lease check compares
--   locked_until > p_now_ms, and every timestamp it writes is
--   to_timestamp(p_now_ms / 1000.0): instances.created_at/updated_at on
--   insert, updated_at on both instance updates, executions.started_at,
--   completed_at, history.created_at, and the queue rows' visible_at and
--   created_at.
--
-- Tables: each of these eight columns loses its DEFAULT CURRENT_TIMESTAMP,
-- has its NULLs backfilled with the database NOW(), then becomes NOT NULL:
--   instances.created_at, instances.updated_at, executions.started_at,
--   history.created_at, orchestrator_queue.visible_at,
--   orchestrator_queue.created_at, worker_queue.visible_at,
--   worker_queue.created_at.
--
-- Upstream quirk kept knowingly: append_history (0002, never redefined)
-- inserts history rows without created_at, so from this version on every
-- non-empty call fails with 23502 (not-null violation on history.created_at).
--
-- Down: restores the 7-argument ack_orchestration_item of 0011, the defaults
-- and the nullability of the eight columns. It cannot un-backfill: rows whose
-- NULL timestamps were filled with NOW() by the Up keep those values.
--
-- Locks: ACCESS EXCLUSIVE on instances, ACCESS EXCLUSIVE on executions, ACCESS
-- EXCLUSIVE on history, ACCESS EXCLUSIVE on orchestrator_queue, ACCESS
-- EXCLUSIVE on worker_queue, each to commit (DROP DEFAULT, a backfill of NULL
-- timestamps, SET NOT NULL): every read and write of the five tables waits.
-- Duration: grows with the rows of the five tables, history usually the
-- largest: each is read in full twice (the backfill's scan, SET NOT NULL's
-- check), and rows with a NULL are rewritten.
--
-- Down locks: ACCESS EXCLUSIVE on worker_queue, ACCESS EXCLUSIVE on
-- orchestrator_queue, ACCESS EXCLUSIVE on history, ACCESS EXCLUSIVE on
-- executions, ACCESS EXCLUSIVE on instances, each to commit (DROP NOT NULL,
-- SET DEFAULT): every read and write of the five tables waits.
-- Down duration: milliseconds, whatever the tables hold: dropping NOT NULL and
-- setting a default are catalog changes, no row is read.

-- squawk-ignore-file adding-not-nullable-field, ban-drop-not-null -- upstream's own statements (its history 1..19 re-written for goose: the catalog must be the one upstream's runner makes; a Down undoes its Up)
-- +goose Up

DROP FUNCTION IF EXISTS ack_orchestration_item(text, bigint, jsonb, jsonb, jsonb, jsonb, jsonb);

-- +goose StatementBegin
CREATE FUNCTION ack_orchestration_item(
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

    -- 8. Enqueue worker items; ActivityExecute items carry their identity.
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord) ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id)
            VALUES (v_elem::text, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::bigint,
                    (v_activity ->> 'id')::bigint);
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

ALTER TABLE instances ALTER COLUMN created_at DROP DEFAULT;
UPDATE instances SET created_at = NOW() WHERE created_at IS NULL;
ALTER TABLE instances ALTER COLUMN created_at SET NOT NULL;

ALTER TABLE instances ALTER COLUMN updated_at DROP DEFAULT;
UPDATE instances SET updated_at = NOW() WHERE updated_at IS NULL;
ALTER TABLE instances ALTER COLUMN updated_at SET NOT NULL;

ALTER TABLE executions ALTER COLUMN started_at DROP DEFAULT;
UPDATE executions SET started_at = NOW() WHERE started_at IS NULL;
ALTER TABLE executions ALTER COLUMN started_at SET NOT NULL;

ALTER TABLE history ALTER COLUMN created_at DROP DEFAULT;
UPDATE history SET created_at = NOW() WHERE created_at IS NULL;
ALTER TABLE history ALTER COLUMN created_at SET NOT NULL;

ALTER TABLE orchestrator_queue ALTER COLUMN visible_at DROP DEFAULT;
UPDATE orchestrator_queue SET visible_at = NOW() WHERE visible_at IS NULL;
ALTER TABLE orchestrator_queue ALTER COLUMN visible_at SET NOT NULL;

ALTER TABLE orchestrator_queue ALTER COLUMN created_at DROP DEFAULT;
UPDATE orchestrator_queue SET created_at = NOW() WHERE created_at IS NULL;
ALTER TABLE orchestrator_queue ALTER COLUMN created_at SET NOT NULL;

ALTER TABLE worker_queue ALTER COLUMN visible_at DROP DEFAULT;
UPDATE worker_queue SET visible_at = NOW() WHERE visible_at IS NULL;
ALTER TABLE worker_queue ALTER COLUMN visible_at SET NOT NULL;

ALTER TABLE worker_queue ALTER COLUMN created_at DROP DEFAULT;
UPDATE worker_queue SET created_at = NOW() WHERE created_at IS NULL;
ALTER TABLE worker_queue ALTER COLUMN created_at SET NOT NULL;

-- +goose StatementBegin
DO $do$
BEGIN
    RAISE NOTICE 'Migration 0012: Timestamp columns now require explicit values (aligned with duroxide-pg-opt)';
END;
$do$;
-- +goose StatementEnd

INSERT INTO _duroxide_migrations (version, name) VALUES (12, '0012_require_timestamps.sql');

-- +goose Down

DELETE FROM _duroxide_migrations WHERE version = 12;

ALTER TABLE worker_queue ALTER COLUMN created_at DROP NOT NULL;
ALTER TABLE worker_queue ALTER COLUMN created_at SET DEFAULT CURRENT_TIMESTAMP;
ALTER TABLE worker_queue ALTER COLUMN visible_at DROP NOT NULL;
ALTER TABLE worker_queue ALTER COLUMN visible_at SET DEFAULT CURRENT_TIMESTAMP;
ALTER TABLE orchestrator_queue ALTER COLUMN created_at DROP NOT NULL;
ALTER TABLE orchestrator_queue ALTER COLUMN created_at SET DEFAULT CURRENT_TIMESTAMP;
ALTER TABLE orchestrator_queue ALTER COLUMN visible_at DROP NOT NULL;
ALTER TABLE orchestrator_queue ALTER COLUMN visible_at SET DEFAULT CURRENT_TIMESTAMP;
ALTER TABLE history ALTER COLUMN created_at DROP NOT NULL;
ALTER TABLE history ALTER COLUMN created_at SET DEFAULT CURRENT_TIMESTAMP;
ALTER TABLE executions ALTER COLUMN started_at DROP NOT NULL;
ALTER TABLE executions ALTER COLUMN started_at SET DEFAULT CURRENT_TIMESTAMP;
ALTER TABLE instances ALTER COLUMN updated_at DROP NOT NULL;
ALTER TABLE instances ALTER COLUMN updated_at SET DEFAULT CURRENT_TIMESTAMP;
ALTER TABLE instances ALTER COLUMN created_at DROP NOT NULL;
ALTER TABLE instances ALTER COLUMN created_at SET DEFAULT CURRENT_TIMESTAMP;

DROP FUNCTION IF EXISTS ack_orchestration_item(text, bigint, bigint, jsonb, jsonb, jsonb, jsonb, jsonb);

-- ack_orchestration_item as of 0011, copied verbatim from 0011_fix_cancellation_ordering.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ack_orchestration_item(
    p_lock_token text,
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
    -- Database clock, truncated to whole milliseconds.
    v_now_ms bigint := floor(extract(epoch FROM now()) * 1000)::bigint;
    v_now timestamptz := to_timestamp(v_now_ms / 1000.0);
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
      AND l.locked_until > v_now_ms;

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
                               parent_instance_id)
        VALUES (v_instance_id, v_orchestration_name, v_orchestration_version, p_execution_id,
                v_parent_instance_id)
        ON CONFLICT (instance_id) DO NOTHING;

        -- A parent, once recorded, is never overwritten.
        UPDATE instances i
        SET orchestration_name = v_orchestration_name,
            orchestration_version = v_orchestration_version,
            parent_instance_id = COALESCE(i.parent_instance_id, v_parent_instance_id)
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 4. Ensure the execution row (even when no instance row exists).
    INSERT INTO executions (instance_id, execution_id, status, started_at)
    VALUES (v_instance_id, p_execution_id, 'Running', v_now)
    ON CONFLICT (instance_id, execution_id) DO NOTHING;

    -- 5. The current execution never moves backwards.
    UPDATE instances i
    SET current_execution_id = GREATEST(i.current_execution_id, p_execution_id)
    WHERE i.instance_id = v_instance_id;

    -- 6. Append the history delta (no conflict handling).
    IF p_history_delta IS NOT NULL AND jsonb_array_length(p_history_delta) > 0 THEN
        INSERT INTO history (instance_id, execution_id, event_id, event_type, event_data)
        SELECT v_instance_id, p_execution_id, (h.ev ->> 'event_id')::bigint, h.ev ->> 'event_type', h.ev ->> 'event_data'
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

    -- 8. Enqueue worker items; ActivityExecute items carry their identity.
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord) ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id)
            VALUES (v_elem::text, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::bigint,
                    (v_activity ->> 'id')::bigint);
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
