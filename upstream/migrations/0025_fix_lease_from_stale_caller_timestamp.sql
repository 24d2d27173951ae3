-- Copyright (c) Microsoft Corporation.
-- Licensed under the MIT License.
--
-- Migration 0025: fix lease from a stale caller timestamp (issue #21)
--
-- What: fetch_orchestration_item as 0024 defines it, with one change: the
-- lease it hands out (instance_locks.locked_until and the claimed
-- messages' locked_until) runs from the later of the caller's clock
-- carried forward (0024's v_now_ms) and the database clock
-- (clock_timestamp()), plus p_lock_timeout_ms. Everything else is 0024's:
-- every visibility and liveness test, the steal condition and locked_at
-- stay on the caller's clock, the key stays schema-scoped, the skip list
-- and the bound of 50 iterations stay.
--
-- Why: 0024 measures time from the function's entry only. The runtime
-- mints p_now_ms before its statement reaches the function: a wait for a
-- pooled connection (sqlx pool, DUROXIDE_PG_POOL_MAX), in a PgBouncer
-- queue, or a dispatcher thread descheduled between now_millis() and the
-- query, is invisible to 0024, so its lease can be dead on arrival as
-- version 19's was. Measured on PostgreSQL 15 with p_now_ms 10 s stale
-- and a 5 s lock timeout: 0024 returns a lease 5 s in the past by the
-- database clock; with this change 5 s in the future. The real runtime's
-- figures (a pool whose connection another statement holds) are in the
-- README next to this file.
--
-- The database clock enters only the lease's end, and only to lengthen
-- it: a caller whose clock runs ahead of the database's still gets a full
-- lease by its own clock (its ack and renewals compare with their own
-- p_now_ms), and a caller whose clock is behind, or whose timestamp went
-- stale before the call, gets a full lease by the database's. The
-- caller's epoch stays the reference for every decision, as chosen in
-- versions 6 and 12.
--
-- Rolling upgrade: same signature and result; a fetch running 0024 and
-- one running this version take the same schema-scoped key.

DO $$
DECLARE
    v_schema_name TEXT := current_schema();
BEGIN
    EXECUTE format($fmt$
CREATE OR REPLACE FUNCTION %1$I.fetch_orchestration_item(
    p_now_ms BIGINT,
    p_lock_timeout_ms BIGINT,
    p_min_version_packed BIGINT DEFAULT NULL,
    p_max_version_packed BIGINT DEFAULT NULL
)
RETURNS TABLE(
    out_instance_id TEXT,
    out_orchestration_name TEXT,
    out_orchestration_version TEXT,
    out_execution_id BIGINT,
    out_history JSONB,
    out_messages JSONB,
    out_lock_token TEXT,
    out_attempt_count INTEGER,
    out_kv_snapshot JSONB
) AS $body$
DECLARE
    v_entry TIMESTAMPTZ := clock_timestamp();
    v_now_ms BIGINT;
    v_now TIMESTAMPTZ;
    v_skipped TEXT[] := ARRAY[]::TEXT[];
    v_iterations INTEGER := 0;
    v_instance_id TEXT;
    v_found_instance TEXT;
    v_lock_token TEXT;
    v_locked_until BIGINT;
    v_rows INTEGER;
    v_messages JSONB;
    v_attempt_count INTEGER;
    v_name TEXT;
    v_version TEXT;
    v_execution_id BIGINT;
    v_history JSONB;
    v_first_message JSONB;
    v_kv_snapshot JSONB;
BEGIN
    LOOP
        v_iterations := v_iterations + 1;
        IF v_iterations > 50 THEN
            RETURN;
        END IF;

        -- The caller's clock, carried forward by the time spent in here.
        v_now_ms := p_now_ms + floor(EXTRACT(EPOCH FROM (clock_timestamp() - v_entry)) * 1000)::BIGINT;
        v_now := to_timestamp(v_now_ms / 1000.0);

        -- The oldest eligible message of an instance not skipped yet.
        SELECT q.instance_id INTO v_instance_id
        FROM %1$I.orchestrator_queue q
        LEFT JOIN %1$I.instances i ON i.instance_id = q.instance_id
        LEFT JOIN %1$I.executions e
               ON e.instance_id = i.instance_id
              AND e.execution_id = i.current_execution_id
        WHERE q.visible_at <= v_now
          AND NOT (q.instance_id = ANY(v_skipped))
          AND NOT EXISTS (
              SELECT 1
              FROM %1$I.instance_locks l
              WHERE l.instance_id = q.instance_id
                AND l.locked_until > v_now_ms
          )
          AND (p_min_version_packed IS NULL
               OR e.duroxide_version_major IS NULL
               OR e.duroxide_version_major * 1000000
                  + e.duroxide_version_minor * 1000
                  + e.duroxide_version_patch
                  BETWEEN p_min_version_packed AND p_max_version_packed)
        ORDER BY q.visible_at, q.id
        LIMIT 1;

        IF NOT FOUND THEN
            RETURN;
        END IF;

        -- Schema-scoped key, never waited for.
        IF NOT pg_try_advisory_xact_lock(hashtext(%1$L || '.' || v_instance_id)) THEN
            v_skipped := array_append(v_skipped, v_instance_id);
            CONTINUE;
        END IF;

        v_now_ms := p_now_ms + floor(EXTRACT(EPOCH FROM (clock_timestamp() - v_entry)) * 1000)::BIGINT;
        v_now := to_timestamp(v_now_ms / 1000.0);

        SELECT q.instance_id INTO v_found_instance
        FROM %1$I.orchestrator_queue q
        LEFT JOIN %1$I.instances i ON i.instance_id = q.instance_id
        LEFT JOIN %1$I.executions e
               ON e.instance_id = i.instance_id
              AND e.execution_id = i.current_execution_id
        WHERE q.instance_id = v_instance_id
          AND q.visible_at <= v_now
          AND NOT EXISTS (
              SELECT 1
              FROM %1$I.instance_locks l
              WHERE l.instance_id = q.instance_id
                AND l.locked_until > v_now_ms
          )
          AND (p_min_version_packed IS NULL
               OR e.duroxide_version_major IS NULL
               OR e.duroxide_version_major * 1000000
                  + e.duroxide_version_minor * 1000
                  + e.duroxide_version_patch
                  BETWEEN p_min_version_packed AND p_max_version_packed)
        FOR UPDATE OF q SKIP LOCKED;

        IF NOT FOUND THEN
            v_skipped := array_append(v_skipped, v_instance_id);
            CONTINUE;
        END IF;

        v_lock_token := 'lock_' || gen_random_uuid()::TEXT;
        -- The lease runs from the later of the caller's clock carried
        -- forward and the database clock: full by either.
        v_locked_until := GREATEST(v_now_ms, floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT)
                          + p_lock_timeout_ms;

        INSERT INTO %1$I.instance_locks AS l (instance_id, lock_token, locked_until, locked_at)
        VALUES (v_instance_id, v_lock_token, v_locked_until, v_now_ms)
        ON CONFLICT (instance_id) DO UPDATE
        SET lock_token = EXCLUDED.lock_token,
            locked_until = EXCLUDED.locked_until,
            locked_at = EXCLUDED.locked_at
        WHERE l.locked_until <= v_now_ms;

        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            v_skipped := array_append(v_skipped, v_instance_id);
            CONTINUE;
        END IF;

        EXIT;
    END LOOP;

    UPDATE %1$I.orchestrator_queue q
    SET lock_token = v_lock_token,
        locked_until = v_locked_until,
        attempt_count = q.attempt_count + 1
    WHERE q.instance_id = v_instance_id
      AND q.visible_at <= v_now
      AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms);

    SELECT COALESCE(jsonb_agg(q.work_item::JSONB ORDER BY q.id), '[]'::JSONB),
           COALESCE(MAX(q.attempt_count), 1)
    INTO v_messages, v_attempt_count
    FROM %1$I.orchestrator_queue q
    WHERE q.lock_token = v_lock_token;

    SELECT i.orchestration_name, i.orchestration_version, i.current_execution_id
    INTO v_name, v_version, v_execution_id
    FROM %1$I.instances i
    WHERE i.instance_id = v_instance_id;

    IF FOUND THEN
        v_version := COALESCE(v_version, 'unknown');

        SELECT COALESCE(jsonb_agg(h.event_data::JSONB ORDER BY h.event_id), '[]'::JSONB)
        INTO v_history
        FROM %1$I.history h
        WHERE h.instance_id = v_instance_id
          AND h.execution_id = v_execution_id;
    ELSE
        SELECT COALESCE(jsonb_agg(h.event_data::JSONB ORDER BY h.execution_id, h.event_id), '[]'::JSONB)
        INTO v_history
        FROM %1$I.history h
        WHERE h.instance_id = v_instance_id;

        v_first_message := v_messages -> 0;

        IF jsonb_array_length(v_history) > 0 AND (v_history -> 0) ? 'OrchestrationStarted' THEN
            v_name := v_history -> 0 -> 'OrchestrationStarted' ->> 'name';
            v_version := v_history -> 0 -> 'OrchestrationStarted' ->> 'version';
            v_execution_id := 1;
        ELSIF v_first_message ? 'StartOrchestration' THEN
            v_name := v_first_message -> 'StartOrchestration' ->> 'orchestration';
            v_version := COALESCE(v_first_message -> 'StartOrchestration' ->> 'version', 'unknown');
            v_execution_id := COALESCE((v_first_message -> 'StartOrchestration' ->> 'execution_id')::BIGINT, 1);
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

    SELECT COALESCE(jsonb_object_agg(k.key, jsonb_build_object('value', k.value,
                                                               'last_updated_at_ms', k.last_updated_at_ms)),
                    '{}'::JSONB)
    INTO v_kv_snapshot
    FROM %1$I.kv_store k
    WHERE k.instance_id = v_instance_id;

    RETURN QUERY
    SELECT v_instance_id, v_name, v_version, v_execution_id,
           v_history, v_messages, v_lock_token, v_attempt_count, v_kv_snapshot;
END;
$body$ LANGUAGE plpgsql;
$fmt$, v_schema_name);

    RAISE NOTICE 'Migration 0025: fetch_orchestration_item leases run from the later of the caller''s clock and the database clock';
END $$;
