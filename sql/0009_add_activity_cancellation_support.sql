-- 0009_add_activity_cancellation_support.sql
--
-- Upstream version 9: identify activity rows in worker_queue so that an
-- orchestration turn can cancel them ("lock stealing").
--
-- Tables:
-- * worker_queue gets instance_id text, execution_id bigint, activity_id bigint
--   (all nullable, no backfill: existing rows keep NULLs) and the index
--   idx_worker_activity_lookup (instance_id, execution_id, activity_id).
--   Upstream adds the columns from a DO block after probing
--   information_schema and creates the index IF NOT EXISTS; under goose the
--   file runs exactly once, so plain ALTER TABLE / CREATE INDEX are used.
--
-- Functions:
-- * enqueue_worker_work(text,bigint) is replaced by the 5-argument
--   enqueue_worker_work(p_work_item, p_now_ms, p_instance_id, p_execution_id,
--   p_activity_id), which stores the three identification columns.
-- * The 6-argument ack_orchestration_item is replaced by a 7-argument one with
--   p_cancelled_activities jsonb DEFAULT '[]' (array of
--   {instance, execution_id, activity_id}); each element deletes the matching
--   worker_queue rows whatever their lock state. ActivityExecute worker items
--   now fill instance_id / execution_id / activity_id (from .instance,
--   .execution_id, .id), other variants get NULLs; worker items get an explicit
--   visible_at. Timestamps come from the database clock truncated to whole
--   milliseconds (the application clock only arrives in 0012).
--
-- Upstream quirk kept knowingly: in this version the cancelled activities are
-- deleted BEFORE the turn's worker items are inserted, so an activity that is
-- scheduled and cancelled in the same turn survives. 0011 swaps the order.
--
-- Locks: ACCESS EXCLUSIVE on worker_queue, to commit (three ADD COLUMN, then
-- idx_worker_activity_lookup built under that lock): every read and write of
-- the worker queue waits.
-- Duration: grows with worker_queue's rows (the index build reads and sorts
-- them all); the columns are a catalog change.
--
-- Down locks: ACCESS EXCLUSIVE on worker_queue, to commit (DROP INDEX
-- idx_worker_activity_lookup, three DROP COLUMN): every read and write of the
-- worker queue waits; it also replaces functions.
-- Down duration: milliseconds, whatever worker_queue holds: dropping an index
-- or a column reads no row.

-- squawk-ignore-file ban-drop-column, require-concurrent-index-creation, require-concurrent-index-deletion -- upstream's own statements (its history 1..19 re-written for goose: the catalog must be the one upstream's runner makes; a Down undoes its Up)
-- +goose Up

ALTER TABLE worker_queue ADD COLUMN instance_id text;
ALTER TABLE worker_queue ADD COLUMN execution_id bigint;
ALTER TABLE worker_queue ADD COLUMN activity_id bigint;

CREATE INDEX idx_worker_activity_lookup ON worker_queue (instance_id, execution_id, activity_id);

DROP FUNCTION IF EXISTS enqueue_worker_work(text, bigint);

-- +goose StatementBegin
CREATE FUNCTION enqueue_worker_work(
    p_work_item text,
    p_now_ms bigint,
    p_instance_id text DEFAULT NULL,
    p_execution_id bigint DEFAULT NULL,
    p_activity_id bigint DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id)
    VALUES (p_work_item, to_timestamp(p_now_ms / 1000.0), to_timestamp(p_now_ms / 1000.0),
            p_instance_id, p_execution_id, p_activity_id);
END;
$fn$;
-- +goose StatementEnd

DROP FUNCTION IF EXISTS ack_orchestration_item(text, bigint, jsonb, jsonb, jsonb, jsonb);

-- +goose StatementBegin
CREATE FUNCTION ack_orchestration_item(
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
    v_status := p_metadata ->> 'status';
    v_output := p_metadata ->> 'output';

    -- 3. Create or refresh the instance row (only when name and version are known).
    IF v_orchestration_name IS NOT NULL AND v_orchestration_version IS NOT NULL THEN
        INSERT INTO instances (instance_id, orchestration_name, orchestration_version, current_execution_id)
        VALUES (v_instance_id, v_orchestration_name, v_orchestration_version, p_execution_id)
        ON CONFLICT (instance_id) DO NOTHING;

        UPDATE instances i
        SET orchestration_name = v_orchestration_name,
            orchestration_version = v_orchestration_version
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

    -- 8. Cancel activities (upstream quirk at 9..10: before the worker items
    --    of this turn are inserted).
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

    -- 9. Enqueue worker items; ActivityExecute items carry their identity.
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

INSERT INTO _duroxide_migrations (version, name) VALUES (9, '0009_add_activity_cancellation_support.sql');

-- +goose Down

DELETE FROM _duroxide_migrations WHERE version = 9;

DROP FUNCTION IF EXISTS ack_orchestration_item(text, bigint, jsonb, jsonb, jsonb, jsonb, jsonb);

-- ack_orchestration_item as of 0002, copied verbatim from 0002_create_stored_procedures.sql.
-- +goose StatementBegin
CREATE FUNCTION ack_orchestration_item(
    p_lock_token text,
    p_execution_id bigint,
    p_history_delta jsonb,
    p_worker_items jsonb,
    p_orchestrator_items jsonb,
    p_metadata jsonb
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- This version runs on the database clock.
    v_now timestamptz := NOW();
    v_now_ms bigint := floor(extract(epoch FROM NOW()) * 1000)::bigint;
    v_instance_id text;
    v_orchestration_name text;
    v_orchestration_version text;
    v_status text;
    v_output text;
    v_elem jsonb;
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
    v_status := p_metadata ->> 'status';
    v_output := p_metadata ->> 'output';

    -- 3. Create or refresh the instance row (only when name and version are known).
    IF v_orchestration_name IS NOT NULL AND v_orchestration_version IS NOT NULL THEN
        INSERT INTO instances (instance_id, orchestration_name, orchestration_version, current_execution_id)
        VALUES (v_instance_id, v_orchestration_name, v_orchestration_version, p_execution_id)
        ON CONFLICT (instance_id) DO NOTHING;

        UPDATE instances i
        SET orchestration_name = v_orchestration_name,
            orchestration_version = v_orchestration_version
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 4. Ensure the execution row (even when no instance row exists).
    INSERT INTO executions (instance_id, execution_id, status)
    VALUES (v_instance_id, p_execution_id, 'Running')
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

    -- 8. Enqueue worker items (stored as jsonb text).
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        INSERT INTO worker_queue (work_item, created_at)
        SELECT w.item::text, v_now
        FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord)
        ORDER BY w.ord;
    END IF;

    -- 9. Enqueue orchestrator items, routed by work-item variant.
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

    -- 10. Consume the messages claimed by this lease.
    DELETE FROM orchestrator_queue q
    WHERE q.lock_token = p_lock_token;

    -- 11. Release the lease.
    DELETE FROM instance_locks l
    WHERE l.instance_id = v_instance_id
      AND l.lock_token = p_lock_token;
END;
$fn$;
-- +goose StatementEnd

DROP FUNCTION IF EXISTS enqueue_worker_work(text, bigint, text, bigint, bigint);

-- enqueue_worker_work as of 0006, copied verbatim from 0006_use_rust_timestamps.sql.
-- +goose StatementBegin
CREATE FUNCTION enqueue_worker_work(p_work_item text, p_now_ms bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    INSERT INTO worker_queue (work_item, visible_at, created_at)
    VALUES (p_work_item, to_timestamp(p_now_ms / 1000.0), to_timestamp(p_now_ms / 1000.0));
END;
$fn$;
-- +goose StatementEnd

DROP INDEX IF EXISTS idx_worker_activity_lookup;

ALTER TABLE worker_queue DROP COLUMN activity_id;
ALTER TABLE worker_queue DROP COLUMN execution_id;
ALTER TABLE worker_queue DROP COLUMN instance_id;
