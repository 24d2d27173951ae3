-- Upstream's continued-as-new ack, port.
--
-- This is NOT upstream's text. duroxide-pg-migrations wrote it from the
-- facts published about upstream's branch file
-- migrations/0024_continue_as_new_completed_at.sql (microsoft/duroxide-pg,
-- commit 7dfd1e0, unreleased; ../shared/spec/upstream-in-flight.md), in
-- upstream's format, so that the tests can meet a schema as a duroxide-pg
-- release carrying that file would leave it: applied the way upstream's
-- runner applies a migration (comments cut, one transaction, its row
-- (24, '0024_continue_as_new_completed_at.sql') in _duroxide_migrations).
-- Its function text, and so its fingerprint, differs from upstream's.
-- Another branch file also claims version 24 (upstream's candidate fix of
-- the fetch): the number alone does not say which one a database holds.
--
-- Migration 0024: a continued-as-new execution records its completion time
--
-- What it changes: ack_orchestration_item (the 8-argument form, same
-- signature, defaults and result), rebuilt on version 20's body (KV
-- mutations go to kv_delta, a terminal turn folds them into kv_store):
--   1. The terminal flag is set for Completed, ContinuedAsNew and Failed.
--   2. The status step stamps completed_at with the call's timestamp when
--      the turn is terminal, NULL otherwise: a ContinuedAsNew execution now
--      gets one (version 20 stamped Completed and Failed only).
--   3. The KV merge runs on that same flag.
-- The lease check stays version 20's: a plain read of the token's
-- instance_locks row, live at p_now_ms, no row lock.
--
-- Then, once: every ContinuedAsNew execution without completed_at gets the
-- created_at of its last history event whose serialized type is
-- OrchestrationContinuedAsNew; a WARNING counts those left without one.

DO $$
DECLARE
    v_schema_name TEXT := current_schema();
    v_filled BIGINT;
    v_left BIGINT;
BEGIN
    EXECUTE format($fmt$
CREATE OR REPLACE FUNCTION %1$I.ack_orchestration_item(
    p_lock_token TEXT,
    p_now_ms BIGINT,
    p_execution_id BIGINT,
    p_history_delta JSONB,
    p_worker_items JSONB,
    p_orchestrator_items JSONB,
    p_metadata JSONB,
    p_cancelled_activities JSONB DEFAULT '[]'::JSONB
)
RETURNS VOID AS $body$
DECLARE
    v_now TIMESTAMPTZ := to_timestamp(p_now_ms / 1000.0);
    v_instance_id TEXT;
    v_orchestration_name TEXT;
    v_orchestration_version TEXT;
    v_parent_instance_id TEXT;
    v_status TEXT;
    v_output TEXT;
    v_is_terminal BOOLEAN;
    v_elem JSONB;
    v_activity JSONB;
    v_target_instance TEXT;
    v_fire_at_ms BIGINT;
    v_visible_at TIMESTAMPTZ;
BEGIN
    -- The lease: the token's row, still live at the caller's time.
    SELECT l.instance_id INTO v_instance_id
    FROM %1$I.instance_locks l
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token';
    END IF;

    v_orchestration_name := p_metadata ->> 'orchestration_name';
    v_orchestration_version := p_metadata ->> 'orchestration_version';
    v_parent_instance_id := p_metadata ->> 'parent_instance_id';
    v_status := p_metadata ->> 'status';
    v_output := p_metadata ->> 'output';
    -- One set of terminal statuses for the completion time and the KV merge.
    v_is_terminal := v_status IN ('Completed', 'ContinuedAsNew', 'Failed');

    IF v_orchestration_name IS NOT NULL AND v_orchestration_version IS NOT NULL THEN
        INSERT INTO %1$I.instances (instance_id, orchestration_name, orchestration_version,
                                    current_execution_id, parent_instance_id, created_at, updated_at)
        VALUES (v_instance_id, v_orchestration_name, v_orchestration_version,
                p_execution_id, v_parent_instance_id, v_now, v_now)
        ON CONFLICT (instance_id) DO NOTHING;

        UPDATE %1$I.instances i
        SET orchestration_name = v_orchestration_name,
            orchestration_version = v_orchestration_version,
            parent_instance_id = COALESCE(i.parent_instance_id, v_parent_instance_id),
            updated_at = v_now
        WHERE i.instance_id = v_instance_id;
    END IF;

    INSERT INTO %1$I.executions (instance_id, execution_id, status, started_at)
    VALUES (v_instance_id, p_execution_id, 'Running', v_now)
    ON CONFLICT (instance_id, execution_id) DO NOTHING;

    UPDATE %1$I.instances i
    SET current_execution_id = GREATEST(i.current_execution_id, p_execution_id),
        updated_at = v_now
    WHERE i.instance_id = v_instance_id;

    IF p_history_delta IS NOT NULL AND jsonb_array_length(p_history_delta) > 0 THEN
        INSERT INTO %1$I.history (instance_id, execution_id, event_id, event_type, event_data, created_at)
        SELECT v_instance_id, p_execution_id, (d.ev ->> 'event_id')::BIGINT,
               d.ev ->> 'event_type', d.ev ->> 'event_data', v_now
        FROM jsonb_array_elements(p_history_delta) WITH ORDINALITY AS d(ev, ord)
        ORDER BY d.ord;
    END IF;

    -- Status, output, and the completion time of every terminal turn.
    IF v_status IS NOT NULL THEN
        UPDATE %1$I.executions e
        SET status = v_status,
            output = v_output,
            completed_at = CASE WHEN v_is_terminal THEN v_now ELSE NULL END
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    IF p_metadata ? 'pinned_duroxide_version'
       AND p_metadata ->> 'pinned_duroxide_version' IS NOT NULL
       AND p_metadata ->> 'pinned_duroxide_version' <> 'null' THEN
        UPDATE %1$I.executions e
        SET duroxide_version_major = (p_metadata -> 'pinned_duroxide_version' ->> 'major')::INTEGER,
            duroxide_version_minor = (p_metadata -> 'pinned_duroxide_version' ->> 'minor')::INTEGER,
            duroxide_version_patch = (p_metadata -> 'pinned_duroxide_version' ->> 'patch')::INTEGER
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    IF p_metadata ->> 'custom_status_action' = 'set' THEN
        UPDATE %1$I.instances i
        SET custom_status = p_metadata ->> 'custom_status_value',
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    ELSIF p_metadata ->> 'custom_status_action' = 'clear' THEN
        UPDATE %1$I.instances i
        SET custom_status = NULL,
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- KV mutations land in kv_delta; a NULL value is a tombstone.
    IF p_metadata -> 'kv_mutations' IS NOT NULL AND jsonb_array_length(p_metadata -> 'kv_mutations') > 0 THEN
        FOR v_elem IN
            SELECT m.item
            FROM jsonb_array_elements(p_metadata -> 'kv_mutations') WITH ORDINALITY AS m(item, ord)
            ORDER BY m.ord
        LOOP
            IF v_elem ->> 'action' = 'set' THEN
                INSERT INTO %1$I.kv_delta (instance_id, key, value, last_updated_at_ms)
                VALUES (v_instance_id, v_elem ->> 'key', v_elem ->> 'value',
                        COALESCE((v_elem ->> 'last_updated_at_ms')::BIGINT, p_now_ms))
                ON CONFLICT (instance_id, key) DO UPDATE
                SET value = EXCLUDED.value,
                    last_updated_at_ms = EXCLUDED.last_updated_at_ms;
            ELSIF v_elem ->> 'action' = 'clear_key' THEN
                INSERT INTO %1$I.kv_delta (instance_id, key, value, last_updated_at_ms)
                VALUES (v_instance_id, v_elem ->> 'key', NULL, p_now_ms)
                ON CONFLICT (instance_id, key) DO UPDATE
                SET value = NULL,
                    last_updated_at_ms = EXCLUDED.last_updated_at_ms;
            ELSIF v_elem ->> 'action' = 'clear_all' THEN
                UPDATE %1$I.kv_delta d
                SET value = NULL,
                    last_updated_at_ms = p_now_ms
                WHERE d.instance_id = v_instance_id;

                INSERT INTO %1$I.kv_delta (instance_id, key, value, last_updated_at_ms)
                SELECT s.instance_id, s.key, NULL, p_now_ms
                FROM %1$I.kv_store s
                WHERE s.instance_id = v_instance_id
                  AND NOT EXISTS (
                      SELECT 1 FROM %1$I.kv_delta d
                      WHERE d.instance_id = s.instance_id AND d.key = s.key);
            END IF;
        END LOOP;
    END IF;

    -- A terminal turn folds the delta into kv_store and empties it.
    IF v_is_terminal THEN
        INSERT INTO %1$I.kv_store (instance_id, key, value, execution_id, last_updated_at_ms)
        SELECT d.instance_id, d.key, d.value, p_execution_id, d.last_updated_at_ms
        FROM %1$I.kv_delta d
        WHERE d.instance_id = v_instance_id
          AND d.value IS NOT NULL
        ON CONFLICT (instance_id, key) DO UPDATE
        SET value = EXCLUDED.value,
            execution_id = EXCLUDED.execution_id,
            last_updated_at_ms = EXCLUDED.last_updated_at_ms;

        DELETE FROM %1$I.kv_store s
        USING %1$I.kv_delta d
        WHERE s.instance_id = v_instance_id
          AND d.instance_id = s.instance_id
          AND d.key = s.key
          AND d.value IS NULL;

        DELETE FROM %1$I.kv_delta d
        WHERE d.instance_id = v_instance_id;
    END IF;

    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item
            FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord)
            ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO %1$I.worker_queue (work_item, visible_at, created_at, instance_id,
                                           execution_id, activity_id, session_id, tag)
            VALUES (v_elem::TEXT, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::BIGINT,
                    (v_activity ->> 'id')::BIGINT,
                    v_activity ->> 'session_id',
                    v_activity ->> 'tag');
        END LOOP;
    END IF;

    -- Cancellations after the inserts: scheduled and cancelled in one turn
    -- means absent.
    IF p_cancelled_activities IS NOT NULL AND jsonb_array_length(p_cancelled_activities) > 0 THEN
        FOR v_elem IN
            SELECT c.item
            FROM jsonb_array_elements(p_cancelled_activities) WITH ORDINALITY AS c(item, ord)
            ORDER BY c.ord
        LOOP
            DELETE FROM %1$I.worker_queue w
            WHERE w.instance_id = v_elem ->> 'instance'
              AND w.execution_id = (v_elem ->> 'execution_id')::BIGINT
              AND w.activity_id = (v_elem ->> 'activity_id')::BIGINT;
        END LOOP;
    END IF;

    IF p_orchestrator_items IS NOT NULL AND jsonb_array_length(p_orchestrator_items) > 0 THEN
        FOR v_elem IN
            SELECT o.item
            FROM jsonb_array_elements(p_orchestrator_items) WITH ORDINALITY AS o(item, ord)
            ORDER BY o.ord
        LOOP
            v_fire_at_ms := NULL;
            IF v_elem ? 'StartOrchestration' THEN
                v_target_instance := v_elem -> 'StartOrchestration' ->> 'instance';
            ELSIF v_elem ? 'ContinueAsNew' THEN
                v_target_instance := v_elem -> 'ContinueAsNew' ->> 'instance';
            ELSIF v_elem ? 'TimerFired' THEN
                v_target_instance := v_elem -> 'TimerFired' ->> 'instance';
                v_fire_at_ms := (v_elem -> 'TimerFired' ->> 'fire_at_ms')::BIGINT;
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

            IF v_fire_at_ms IS NOT NULL AND v_fire_at_ms > 0 THEN
                v_visible_at := to_timestamp(v_fire_at_ms / 1000.0);
            ELSE
                v_visible_at := v_now;
            END IF;

            INSERT INTO %1$I.orchestrator_queue (instance_id, work_item, visible_at, created_at)
            VALUES (v_target_instance, v_elem::TEXT, v_visible_at, v_now);
        END LOOP;
    END IF;

    DELETE FROM %1$I.orchestrator_queue q
    WHERE q.lock_token = p_lock_token;

    DELETE FROM %1$I.instance_locks l
    WHERE l.instance_id = v_instance_id
      AND l.lock_token = p_lock_token;
END;
$body$ LANGUAGE plpgsql;
$fmt$, v_schema_name);

    -- Backfill, once: a ContinuedAsNew execution without a completion time
    -- gets the time of its last OrchestrationContinuedAsNew event.
    EXECUTE format($fmt$
UPDATE %1$I.executions e
SET completed_at = last_can.created_at
FROM (
    SELECT DISTINCT ON (h.instance_id, h.execution_id)
           h.instance_id, h.execution_id, h.created_at
    FROM %1$I.history h
    WHERE (h.event_data::JSONB ->> 'type') = 'OrchestrationContinuedAsNew'
    ORDER BY h.instance_id, h.execution_id, h.event_id DESC
) AS last_can
WHERE e.instance_id = last_can.instance_id
  AND e.execution_id = last_can.execution_id
  AND e.status = 'ContinuedAsNew'
  AND e.completed_at IS NULL
$fmt$, v_schema_name);
    GET DIAGNOSTICS v_filled = ROW_COUNT;

    EXECUTE format($fmt$
SELECT count(*)
FROM %1$I.executions e
WHERE e.status = 'ContinuedAsNew'
  AND e.completed_at IS NULL
$fmt$, v_schema_name) INTO v_left;

    IF v_left > 0 THEN
        RAISE WARNING 'Migration 0024: % ContinuedAsNew execution(s) have no OrchestrationContinuedAsNew event; completed_at left NULL', v_left;
    END IF;

    RAISE NOTICE 'Migration 0024: ack_orchestration_item records completed_at for ContinuedAsNew; % execution(s) backfilled', v_filled;
END $$;
