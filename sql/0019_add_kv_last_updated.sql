-- 0019_add_kv_last_updated.sql (upstream duroxide-pg schema version 19)
--
-- What changes:
--   * kv_store.last_updated_at_ms bigint NOT NULL DEFAULT 0 (existing rows
--     get 0).
--   * fetch_orchestration_item (same signature and outputs): each member of
--     out_kv_snapshot becomes {"value": <text>, "last_updated_at_ms": <bigint>}.
--   * ack_orchestration_item (same signature): a 'set' KV mutation also
--     writes last_updated_at_ms from the mutation, on insert and on update.
--   * prune_executions: the kv_store delete is removed; KV is instance-scoped
--     and survives pruning.
--   * cleanup_schema and delete_instances_atomic are not redefined.
--
-- Why: a last-updated timestamp per key, and KV retention across pruning.
--
-- These are the version-19 bodies of fetch_orchestration_item,
-- ack_orchestration_item and prune_executions (orchestration.md sections 3
-- and 4, management-and-evolution.md 1.3.9).
--
-- Upstream quirks kept knowingly:
--   * The column is added with a plain ADD COLUMN, as upstream does (it is
--     the one upstream migration that fails if re-applied, with 42701).
--   * A 'set' mutation without last_updated_at_ms writes an explicit NULL
--     and fails NOT NULL (23502); the default 0 does not apply.
--   * fetch_orchestration_item keeps the defects of 0017 (stale p_now_ms,
--     blocking advisory lock, unbounded retry loop); this pack's 0020
--     addresses them.
--
-- Locks: ACCESS EXCLUSIVE on kv_store, to commit (ADD COLUMN with a constant
-- default), and replaces functions.
-- Duration: milliseconds, whatever kv_store holds: a constant default is a
-- catalog change.
--
-- Down locks: ACCESS EXCLUSIVE on kv_store, to commit (DROP COLUMN
-- last_updated_at_ms): every read and write of kv_store waits; it also
-- replaces functions.
-- Down duration: milliseconds, whatever kv_store holds: a dropped column is a
-- catalog change.

-- squawk-ignore-file ban-drop-column -- upstream's own statements (its history 1..19 re-written for goose: the catalog must be the one upstream's runner makes; a Down undoes its Up)
-- +goose Up
ALTER TABLE kv_store ADD COLUMN last_updated_at_ms bigint NOT NULL DEFAULT 0;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fetch_orchestration_item(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_min_version_packed bigint DEFAULT NULL,
    p_max_version_packed bigint DEFAULT NULL
)
RETURNS TABLE(
    out_instance_id text,
    out_orchestration_name text,
    out_orchestration_version text,
    out_execution_id bigint,
    out_history jsonb,
    out_messages jsonb,
    out_lock_token text,
    out_attempt_count integer,
    out_kv_snapshot jsonb
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_now timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_instance_id text;
    v_found_instance text;
    v_lock_token text;
    v_locked_until bigint;
    v_rows integer;
    v_messages jsonb;
    v_attempt_count integer;
    v_name text;
    v_version text;
    v_execution_id bigint;
    v_history jsonb;
    v_first_message jsonb;
    v_kv_snapshot jsonb;
BEGIN
    -- Steps 1-5 repeat until a lease is taken. Upstream quirks kept: the
    -- loop has no iteration cap and no back-off, every iteration uses the
    -- same p_now_ms, and advisory locks taken in abandoned iterations stay
    -- held until the transaction ends.
    LOOP
        -- 1. Peek (no row locks): the instance of the oldest visible message
        --    whose instance has no live lease and passes the version filter.
        SELECT q.instance_id INTO v_instance_id
        FROM orchestrator_queue q
        LEFT JOIN instances i ON i.instance_id = q.instance_id
        LEFT JOIN executions e
               ON e.instance_id = i.instance_id
              AND e.execution_id = i.current_execution_id
        WHERE q.visible_at <= v_now
          AND NOT EXISTS (
              SELECT 1
              FROM instance_locks l
              WHERE l.instance_id = q.instance_id
                AND l.locked_until > p_now_ms
          )
          -- Version filter, active only when p_min_version_packed is given: the
          -- current execution is unpinned (or missing), or its packed version
          -- lies in [min, max]. A NULL minor/patch or a NULL max fails the test.
          AND (p_min_version_packed IS NULL
               OR e.duroxide_version_major IS NULL
               OR e.duroxide_version_major::bigint * 1000000
                  + e.duroxide_version_minor * 1000
                  + e.duroxide_version_patch
                  BETWEEN p_min_version_packed AND p_max_version_packed)
        ORDER BY q.visible_at, q.id
        LIMIT 1;

        IF NOT FOUND THEN
            RETURN;  -- the only way out without a row
        END IF;

        -- 2. Serialise fetchers of this instance (blocking, until commit).
        PERFORM pg_advisory_xact_lock(hashtext(v_instance_id));

        -- 3. Re-check (same predicate) under a row lock, skipping rows other
        --    transactions hold. Selecting INTO one variable locks only the
        --    first row produced.
        SELECT q.instance_id INTO v_found_instance
        FROM orchestrator_queue q
        LEFT JOIN instances i ON i.instance_id = q.instance_id
        LEFT JOIN executions e
               ON e.instance_id = i.instance_id
              AND e.execution_id = i.current_execution_id
        WHERE q.instance_id = v_instance_id
          AND q.visible_at <= v_now
          AND NOT EXISTS (
              SELECT 1
              FROM instance_locks l
              WHERE l.instance_id = q.instance_id
                AND l.locked_until > p_now_ms
          )
          -- Version filter, active only when p_min_version_packed is given: the
          -- current execution is unpinned (or missing), or its packed version
          -- lies in [min, max]. A NULL minor/patch or a NULL max fails the test.
          AND (p_min_version_packed IS NULL
               OR e.duroxide_version_major IS NULL
               OR e.duroxide_version_major::bigint * 1000000
                  + e.duroxide_version_minor * 1000
                  + e.duroxide_version_patch
                  BETWEEN p_min_version_packed AND p_max_version_packed)
        FOR UPDATE OF q SKIP LOCKED;

        IF NOT FOUND THEN
            CONTINUE;
        END IF;

        -- 4. Mint the lease.
        v_lock_token := 'lock_' || gen_random_uuid()::text;
        v_locked_until := p_now_ms + p_lock_timeout_ms;

        -- 5. Take the instance lease; an existing lease is taken over only if it
        --    has expired.
        INSERT INTO instance_locks AS l (instance_id, lock_token, locked_until, locked_at)
        VALUES (v_instance_id, v_lock_token, v_locked_until, p_now_ms)
        ON CONFLICT (instance_id) DO UPDATE
        SET lock_token = EXCLUDED.lock_token,
            locked_until = EXCLUDED.locked_until,
            locked_at = EXCLUDED.locked_at
        WHERE l.locked_until <= p_now_ms;

        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            CONTINUE;
        END IF;

        EXIT;
    END LOOP;

    -- 6. Claim every visible, unleased (or expired) message of the instance.
    UPDATE orchestrator_queue q
    SET lock_token = v_lock_token,
        locked_until = v_locked_until,
        attempt_count = q.attempt_count + 1
    WHERE q.instance_id = v_instance_id
      AND q.visible_at <= v_now
      AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms);

    -- 7. The claimed messages in id order, and their highest attempt count
    --    (1 when nothing was claimed).
    SELECT COALESCE(jsonb_agg(q.work_item::jsonb ORDER BY q.id), '[]'::jsonb),
           COALESCE(MAX(q.attempt_count), 1)
    INTO v_messages, v_attempt_count
    FROM orchestrator_queue q
    WHERE q.lock_token = v_lock_token;

    -- 8. Instance metadata and history.
    SELECT i.orchestration_name, i.orchestration_version, i.current_execution_id
    INTO v_name, v_version, v_execution_id
    FROM instances i
    WHERE i.instance_id = v_instance_id;

    IF FOUND THEN
        -- Known instance: history of the current execution.
        v_version := COALESCE(v_version, 'unknown');

        SELECT COALESCE(jsonb_agg(h.event_data::jsonb ORDER BY h.event_id), '[]'::jsonb)
        INTO v_history
        FROM history h
        WHERE h.instance_id = v_instance_id
          AND h.execution_id = v_execution_id;
    ELSE
        -- No instance row yet: all history of the instance, and name, version
        -- and execution from the first history event or the first message.
        SELECT COALESCE(jsonb_agg(h.event_data::jsonb ORDER BY h.execution_id, h.event_id), '[]'::jsonb)
        INTO v_history
        FROM history h
        WHERE h.instance_id = v_instance_id;

        v_first_message := v_messages -> 0;

        IF jsonb_array_length(v_history) > 0 AND (v_history -> 0) ? 'OrchestrationStarted' THEN
            -- Name and version may be NULL here; no 'unknown' default.
            v_name := v_history -> 0 -> 'OrchestrationStarted' ->> 'name';
            v_version := v_history -> 0 -> 'OrchestrationStarted' ->> 'version';
            v_execution_id := 1;
        ELSIF v_first_message ? 'StartOrchestration' THEN
            v_name := v_first_message -> 'StartOrchestration' ->> 'orchestration';
            v_version := COALESCE(v_first_message -> 'StartOrchestration' ->> 'version', 'unknown');
            v_execution_id := COALESCE((v_first_message -> 'StartOrchestration' ->> 'execution_id')::bigint, 1);
        ELSIF v_first_message ? 'ContinueAsNew' THEN
            v_name := v_first_message -> 'ContinueAsNew' ->> 'orchestration';
            v_version := COALESCE(v_first_message -> 'ContinueAsNew' ->> 'version', 'unknown');
            v_execution_id := 1;
        ELSE
            v_name := 'Unknown';
            v_version := 'unknown';
            v_execution_id := 1;
        END IF;
    END IF;

    -- 9. KV snapshot of the instance (all executions):
    --    key -> {"value": <text>, "last_updated_at_ms": <bigint>}.
    SELECT COALESCE(jsonb_object_agg(k.key, jsonb_build_object('value', k.value,
                                                               'last_updated_at_ms', k.last_updated_at_ms)),
                    '{}'::jsonb)
    INTO v_kv_snapshot
    FROM kv_store k
    WHERE k.instance_id = v_instance_id;

    RETURN QUERY
    SELECT v_instance_id, v_name, v_version, v_execution_id,
           v_history, v_messages, v_lock_token, v_attempt_count, v_kv_snapshot;
END;
$fn$;
-- +goose StatementEnd

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

    -- 7c. KV mutations, in array order (later ones see earlier ones). A JSON
    --     null or a non-array kv_mutations fails with 22023.
    IF p_metadata -> 'kv_mutations' IS NOT NULL AND jsonb_array_length(p_metadata -> 'kv_mutations') > 0 THEN
        FOR v_elem IN
            SELECT m.item FROM jsonb_array_elements(p_metadata -> 'kv_mutations') WITH ORDINALITY AS m(item, ord)
            ORDER BY m.ord
        LOOP
            IF v_elem ->> 'action' = 'set' THEN
                -- A missing last_updated_at_ms is written as an explicit NULL
                -- and fails NOT NULL (23502): the column default 0 does not apply.
                INSERT INTO kv_store (instance_id, key, value, execution_id, last_updated_at_ms)
                VALUES (v_instance_id, v_elem ->> 'key', v_elem ->> 'value', p_execution_id,
                        (v_elem ->> 'last_updated_at_ms')::bigint)
                ON CONFLICT (instance_id, key) DO UPDATE
                SET value = EXCLUDED.value,
                    execution_id = EXCLUDED.execution_id,
                    last_updated_at_ms = EXCLUDED.last_updated_at_ms;
            ELSIF v_elem ->> 'action' = 'clear_key' THEN
                DELETE FROM kv_store k
                WHERE k.instance_id = v_instance_id
                  AND k.key = v_elem ->> 'key';
            ELSIF v_elem ->> 'action' = 'clear_all' THEN
                DELETE FROM kv_store k
                WHERE k.instance_id = v_instance_id;
            END IF;
        END LOOP;
    END IF;

    -- 8. Enqueue worker items; ActivityExecute items carry their identity, session and tag.
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord) ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id,
                                      session_id, tag)
            VALUES (v_elem::text, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::bigint,
                    (v_activity ->> 'id')::bigint,
                    v_activity ->> 'session_id',
                    v_activity ->> 'tag');
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
CREATE OR REPLACE FUNCTION prune_executions(p_instance_id text, p_keep_last integer DEFAULT NULL,
                                 p_completed_before_ms bigint DEFAULT NULL)
RETURNS TABLE(instances_processed bigint, executions_deleted bigint, events_deleted bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_current_execution_id bigint;
    v_candidates bigint[];
    v_executions bigint := 0;
    v_events bigint := 0;
    v_execution_id bigint;
    v_row_count bigint;
BEGIN
    SELECT i.current_execution_id INTO v_current_execution_id
    FROM instances i
    WHERE i.instance_id = p_instance_id;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Instance % not found', p_instance_id;
    END IF;

    -- Candidates: never the current execution, never a Running one.
    -- completed_before: a NULL completed_at fails the test (kept).
    -- keep_last: protects the p_keep_last highest execution ids of the
    -- instance, counting all of them (a negative value makes LIMIT raise).
    SELECT array_agg(e.execution_id ORDER BY e.execution_id) INTO v_candidates
    FROM executions e
    WHERE e.instance_id = p_instance_id
      AND e.execution_id <> v_current_execution_id
      AND e.status <> 'Running'
      AND (p_completed_before_ms IS NULL
           OR e.completed_at < to_timestamp(p_completed_before_ms / 1000.0))
      AND (p_keep_last IS NULL
           OR e.execution_id NOT IN (SELECT k.execution_id
                                     FROM executions k
                                     WHERE k.instance_id = p_instance_id
                                     ORDER BY k.execution_id DESC
                                     LIMIT p_keep_last));

    IF v_candidates IS NULL THEN
        RETURN QUERY SELECT 1::bigint, 0::bigint, 0::bigint;
        RETURN;
    END IF;

    -- Per candidate execution: its history (counted). KV is instance-scoped
    -- and survives the pruning of the execution that last wrote it.
    FOREACH v_execution_id IN ARRAY v_candidates LOOP
        DELETE FROM history h
        WHERE h.instance_id = p_instance_id
          AND h.execution_id = v_execution_id;
        GET DIAGNOSTICS v_row_count = ROW_COUNT;
        v_events := v_events + v_row_count;
    END LOOP;

    DELETE FROM executions e
    WHERE e.instance_id = p_instance_id
      AND e.execution_id = ANY(v_candidates);
    GET DIAGNOSTICS v_executions = ROW_COUNT;

    RETURN QUERY SELECT 1::bigint, v_executions, v_events;
END;
$fn$;
-- +goose StatementEnd

INSERT INTO _duroxide_migrations (version, name) VALUES (19, '0019_add_kv_last_updated.sql');

-- +goose Down
DELETE FROM _duroxide_migrations WHERE version = 19;

DROP FUNCTION IF EXISTS fetch_orchestration_item(bigint, bigint, bigint, bigint);
-- fetch_orchestration_item as of version 18, copied verbatim from 0018_add_kv_store.sql.
-- +goose StatementBegin
CREATE FUNCTION fetch_orchestration_item(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_min_version_packed bigint DEFAULT NULL,
    p_max_version_packed bigint DEFAULT NULL
)
RETURNS TABLE(
    out_instance_id text,
    out_orchestration_name text,
    out_orchestration_version text,
    out_execution_id bigint,
    out_history jsonb,
    out_messages jsonb,
    out_lock_token text,
    out_attempt_count integer,
    out_kv_snapshot jsonb
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_now timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_instance_id text;
    v_found_instance text;
    v_lock_token text;
    v_locked_until bigint;
    v_rows integer;
    v_messages jsonb;
    v_attempt_count integer;
    v_name text;
    v_version text;
    v_execution_id bigint;
    v_history jsonb;
    v_first_message jsonb;
    v_kv_snapshot jsonb;
BEGIN
    -- Steps 1-5 repeat until a lease is taken. Upstream quirks kept: the
    -- loop has no iteration cap and no back-off, every iteration uses the
    -- same p_now_ms, and advisory locks taken in abandoned iterations stay
    -- held until the transaction ends.
    LOOP
        -- 1. Peek (no row locks): the instance of the oldest visible message
        --    whose instance has no live lease and passes the version filter.
        SELECT q.instance_id INTO v_instance_id
        FROM orchestrator_queue q
        LEFT JOIN instances i ON i.instance_id = q.instance_id
        LEFT JOIN executions e
               ON e.instance_id = i.instance_id
              AND e.execution_id = i.current_execution_id
        WHERE q.visible_at <= v_now
          AND NOT EXISTS (
              SELECT 1
              FROM instance_locks l
              WHERE l.instance_id = q.instance_id
                AND l.locked_until > p_now_ms
          )
          -- Version filter, active only when p_min_version_packed is given: the
          -- current execution is unpinned (or missing), or its packed version
          -- lies in [min, max]. A NULL minor/patch or a NULL max fails the test.
          AND (p_min_version_packed IS NULL
               OR e.duroxide_version_major IS NULL
               OR e.duroxide_version_major::bigint * 1000000
                  + e.duroxide_version_minor * 1000
                  + e.duroxide_version_patch
                  BETWEEN p_min_version_packed AND p_max_version_packed)
        ORDER BY q.visible_at, q.id
        LIMIT 1;

        IF NOT FOUND THEN
            RETURN;  -- the only way out without a row
        END IF;

        -- 2. Serialise fetchers of this instance (blocking, until commit).
        PERFORM pg_advisory_xact_lock(hashtext(v_instance_id));

        -- 3. Re-check (same predicate) under a row lock, skipping rows other
        --    transactions hold. Selecting INTO one variable locks only the
        --    first row produced.
        SELECT q.instance_id INTO v_found_instance
        FROM orchestrator_queue q
        LEFT JOIN instances i ON i.instance_id = q.instance_id
        LEFT JOIN executions e
               ON e.instance_id = i.instance_id
              AND e.execution_id = i.current_execution_id
        WHERE q.instance_id = v_instance_id
          AND q.visible_at <= v_now
          AND NOT EXISTS (
              SELECT 1
              FROM instance_locks l
              WHERE l.instance_id = q.instance_id
                AND l.locked_until > p_now_ms
          )
          -- Version filter, active only when p_min_version_packed is given: the
          -- current execution is unpinned (or missing), or its packed version
          -- lies in [min, max]. A NULL minor/patch or a NULL max fails the test.
          AND (p_min_version_packed IS NULL
               OR e.duroxide_version_major IS NULL
               OR e.duroxide_version_major::bigint * 1000000
                  + e.duroxide_version_minor * 1000
                  + e.duroxide_version_patch
                  BETWEEN p_min_version_packed AND p_max_version_packed)
        FOR UPDATE OF q SKIP LOCKED;

        IF NOT FOUND THEN
            CONTINUE;
        END IF;

        -- 4. Mint the lease.
        v_lock_token := 'lock_' || gen_random_uuid()::text;
        v_locked_until := p_now_ms + p_lock_timeout_ms;

        -- 5. Take the instance lease; an existing lease is taken over only if it
        --    has expired.
        INSERT INTO instance_locks AS l (instance_id, lock_token, locked_until, locked_at)
        VALUES (v_instance_id, v_lock_token, v_locked_until, p_now_ms)
        ON CONFLICT (instance_id) DO UPDATE
        SET lock_token = EXCLUDED.lock_token,
            locked_until = EXCLUDED.locked_until,
            locked_at = EXCLUDED.locked_at
        WHERE l.locked_until <= p_now_ms;

        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            CONTINUE;
        END IF;

        EXIT;
    END LOOP;

    -- 6. Claim every visible, unleased (or expired) message of the instance.
    UPDATE orchestrator_queue q
    SET lock_token = v_lock_token,
        locked_until = v_locked_until,
        attempt_count = q.attempt_count + 1
    WHERE q.instance_id = v_instance_id
      AND q.visible_at <= v_now
      AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms);

    -- 7. The claimed messages in id order, and their highest attempt count
    --    (1 when nothing was claimed).
    SELECT COALESCE(jsonb_agg(q.work_item::jsonb ORDER BY q.id), '[]'::jsonb),
           COALESCE(MAX(q.attempt_count), 1)
    INTO v_messages, v_attempt_count
    FROM orchestrator_queue q
    WHERE q.lock_token = v_lock_token;

    -- 8. Instance metadata and history.
    SELECT i.orchestration_name, i.orchestration_version, i.current_execution_id
    INTO v_name, v_version, v_execution_id
    FROM instances i
    WHERE i.instance_id = v_instance_id;

    IF FOUND THEN
        -- Known instance: history of the current execution.
        v_version := COALESCE(v_version, 'unknown');

        SELECT COALESCE(jsonb_agg(h.event_data::jsonb ORDER BY h.event_id), '[]'::jsonb)
        INTO v_history
        FROM history h
        WHERE h.instance_id = v_instance_id
          AND h.execution_id = v_execution_id;
    ELSE
        -- No instance row yet: all history of the instance, and name, version
        -- and execution from the first history event or the first message.
        SELECT COALESCE(jsonb_agg(h.event_data::jsonb ORDER BY h.execution_id, h.event_id), '[]'::jsonb)
        INTO v_history
        FROM history h
        WHERE h.instance_id = v_instance_id;

        v_first_message := v_messages -> 0;

        IF jsonb_array_length(v_history) > 0 AND (v_history -> 0) ? 'OrchestrationStarted' THEN
            -- Name and version may be NULL here; no 'unknown' default.
            v_name := v_history -> 0 -> 'OrchestrationStarted' ->> 'name';
            v_version := v_history -> 0 -> 'OrchestrationStarted' ->> 'version';
            v_execution_id := 1;
        ELSIF v_first_message ? 'StartOrchestration' THEN
            v_name := v_first_message -> 'StartOrchestration' ->> 'orchestration';
            v_version := COALESCE(v_first_message -> 'StartOrchestration' ->> 'version', 'unknown');
            v_execution_id := COALESCE((v_first_message -> 'StartOrchestration' ->> 'execution_id')::bigint, 1);
        ELSIF v_first_message ? 'ContinueAsNew' THEN
            v_name := v_first_message -> 'ContinueAsNew' ->> 'orchestration';
            v_version := COALESCE(v_first_message -> 'ContinueAsNew' ->> 'version', 'unknown');
            v_execution_id := 1;
        ELSE
            v_name := 'Unknown';
            v_version := 'unknown';
            v_execution_id := 1;
        END IF;
    END IF;

    -- 9. KV snapshot of the instance (all executions): key -> value.
    SELECT COALESCE(jsonb_object_agg(k.key, k.value), '{}'::jsonb)
    INTO v_kv_snapshot
    FROM kv_store k
    WHERE k.instance_id = v_instance_id;

    RETURN QUERY
    SELECT v_instance_id, v_name, v_version, v_execution_id,
           v_history, v_messages, v_lock_token, v_attempt_count, v_kv_snapshot;
END;
$fn$;
-- +goose StatementEnd

DROP FUNCTION IF EXISTS ack_orchestration_item(text, bigint, bigint, jsonb, jsonb, jsonb, jsonb, jsonb);
-- ack_orchestration_item as of version 18, copied verbatim from 0018_add_kv_store.sql.
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

    -- 7c. KV mutations, in array order (later ones see earlier ones). A JSON
    --     null or a non-array kv_mutations fails with 22023.
    IF p_metadata -> 'kv_mutations' IS NOT NULL AND jsonb_array_length(p_metadata -> 'kv_mutations') > 0 THEN
        FOR v_elem IN
            SELECT m.item FROM jsonb_array_elements(p_metadata -> 'kv_mutations') WITH ORDINALITY AS m(item, ord)
            ORDER BY m.ord
        LOOP
            IF v_elem ->> 'action' = 'set' THEN
                INSERT INTO kv_store (instance_id, key, value, execution_id)
                VALUES (v_instance_id, v_elem ->> 'key', v_elem ->> 'value', p_execution_id)
                ON CONFLICT (instance_id, key) DO UPDATE
                SET value = EXCLUDED.value,
                    execution_id = EXCLUDED.execution_id;
            ELSIF v_elem ->> 'action' = 'clear_key' THEN
                DELETE FROM kv_store k
                WHERE k.instance_id = v_instance_id
                  AND k.key = v_elem ->> 'key';
            ELSIF v_elem ->> 'action' = 'clear_all' THEN
                DELETE FROM kv_store k
                WHERE k.instance_id = v_instance_id;
            END IF;
        END LOOP;
    END IF;

    -- 8. Enqueue worker items; ActivityExecute items carry their identity, session and tag.
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord) ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id,
                                      session_id, tag)
            VALUES (v_elem::text, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::bigint,
                    (v_activity ->> 'id')::bigint,
                    v_activity ->> 'session_id',
                    v_activity ->> 'tag');
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

DROP FUNCTION IF EXISTS prune_executions(text, integer, bigint);
-- prune_executions as of version 18, copied verbatim from 0018_add_kv_store.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION prune_executions(p_instance_id text, p_keep_last integer DEFAULT NULL,
                                 p_completed_before_ms bigint DEFAULT NULL)
RETURNS TABLE(instances_processed bigint, executions_deleted bigint, events_deleted bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_current_execution_id bigint;
    v_candidates bigint[];
    v_executions bigint := 0;
    v_events bigint := 0;
    v_execution_id bigint;
    v_row_count bigint;
BEGIN
    SELECT i.current_execution_id INTO v_current_execution_id
    FROM instances i
    WHERE i.instance_id = p_instance_id;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Instance % not found', p_instance_id;
    END IF;

    -- Candidates: never the current execution, never a Running one.
    -- completed_before: a NULL completed_at fails the test (kept).
    -- keep_last: protects the p_keep_last highest execution ids of the
    -- instance, counting all of them (a negative value makes LIMIT raise).
    SELECT array_agg(e.execution_id ORDER BY e.execution_id) INTO v_candidates
    FROM executions e
    WHERE e.instance_id = p_instance_id
      AND e.execution_id <> v_current_execution_id
      AND e.status <> 'Running'
      AND (p_completed_before_ms IS NULL
           OR e.completed_at < to_timestamp(p_completed_before_ms / 1000.0))
      AND (p_keep_last IS NULL
           OR e.execution_id NOT IN (SELECT k.execution_id
                                     FROM executions k
                                     WHERE k.instance_id = p_instance_id
                                     ORDER BY k.execution_id DESC
                                     LIMIT p_keep_last));

    IF v_candidates IS NULL THEN
        RETURN QUERY SELECT 1::bigint, 0::bigint, 0::bigint;
        RETURN;
    END IF;

    -- Per candidate execution: its history (counted), and the KV rows it
    -- was the last to write.
    FOREACH v_execution_id IN ARRAY v_candidates LOOP
        DELETE FROM history h
        WHERE h.instance_id = p_instance_id
          AND h.execution_id = v_execution_id;
        GET DIAGNOSTICS v_row_count = ROW_COUNT;
        v_events := v_events + v_row_count;

        DELETE FROM kv_store k
        WHERE k.instance_id = p_instance_id
          AND k.execution_id = v_execution_id;
    END LOOP;

    DELETE FROM executions e
    WHERE e.instance_id = p_instance_id
      AND e.execution_id = ANY(v_candidates);
    GET DIAGNOSTICS v_executions = ROW_COUNT;

    RETURN QUERY SELECT 1::bigint, v_executions, v_events;
END;
$fn$;
-- +goose StatementEnd

ALTER TABLE kv_store DROP COLUMN last_updated_at_ms;
