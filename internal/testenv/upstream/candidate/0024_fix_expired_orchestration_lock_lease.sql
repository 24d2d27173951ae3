-- Upstream's candidate fix, port.
--
-- This is NOT upstream's text. duroxide-pg-migrations wrote it from the
-- facts published about upstream's branch file
-- migrations/0024_fix_expired_orchestration_lock_lease.sql (microsoft/duroxide-pg,
-- commit 459765a, issue #21, unreleased), in upstream's format, so that the
-- adoption tests and the repros can meet a schema as a duroxide-pg release
-- carrying that fix would leave it: applied the way upstream's runner
-- applies a migration (comments cut, one transaction, its row
-- (24, '0024_fix_expired_orchestration_lock_lease.sql') in
-- _duroxide_migrations).
--
-- It follows every detail the facts state about the branch file, so that
-- it behaves as upstream's text does, plans included: DROP FUNCTION IF
-- EXISTS before CREATE OR REPLACE, in one format() whose two arguments are
-- both the schema (%1$I qualifies the tables, %2$L is the key's literal);
-- the iteration bound a named constant, checked at the top of the loop;
-- the clock recomputed with a cast (which rounds) at the top of every
-- iteration and after the try-lock; the candidate reset to NULL at the top
-- of every iteration; phase 1 and phase 3 each in two branches on
-- p_min_version_packed; the claim's upsert without an alias, then GET
-- DIAGNOSTICS; the messages, history and KV snapshot inside the loop, then
-- RETURN QUERY and RETURN. Where the facts say nothing (names of the
-- variables other than v_call_start and v_now_ms, the order of the
-- DECLAREs, the layout) the port chose, so its text, and its fingerprint,
-- still differ from upstream's (upstream's text as its runner leaves it
-- has fingerprint 378d41386c1abb6a0489168b0a090513; the pack's guards know
-- both).
--
-- Migration 0024: fix expired orchestration lock lease (issue #21)
--
-- What it changes, as upstream's candidate does: only
-- fetch_orchestration_item, rebuilt on version 19's body with the same
-- signature, defaults and result columns; every step after the claim
-- (messages, attempt_count, history fallback, KV snapshot) is 19's.
--   1. Clock: v_now_ms is p_now_ms plus the time elapsed since the
--      function's entry (clock_timestamp()), recomputed at the top of every
--      iteration and again after the advisory try-lock. It replaces
--      p_now_ms in every predicate, in locked_until and in locked_at. The
--      database clock is never an absolute time: the caller's epoch stays
--      the only time reference.
--   2. Advisory lock: pg_try_advisory_xact_lock on hashtext of the schema's
--      name, a dot and the instance id (the schema baked in as a literal
--      when the migration runs): schema-scoped, never waited for. A
--      candidate whose key is taken joins a skip list; the candidate query
--      excludes skipped instances.
--   3. Skip, not retry: a candidate that fails the row-locked re-check, or
--      whose instance_locks upsert touches no row, joins the skip list too.
--   4. Bound: at most 50 iterations, then no row.
--
-- Rolling upgrade (upstream's note): during a mixed deployment the old and
-- the new keys do not exclude each other; correctness rests on
-- instance_locks and SKIP LOCKED.

DO $$
DECLARE
    v_schema_name TEXT := current_schema();
BEGIN
    EXECUTE format($fmt$
DROP FUNCTION IF EXISTS %1$I.fetch_orchestration_item(BIGINT, BIGINT, BIGINT, BIGINT);

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
    v_call_start TIMESTAMPTZ := clock_timestamp();
    c_max_iterations CONSTANT INTEGER := 50;
    v_iterations INTEGER := 0;
    v_now_ms BIGINT;
    v_skipped TEXT[] := ARRAY[]::TEXT[];
    v_instance_id TEXT;
    v_verified_instance TEXT;
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
        -- The bound, checked before any work of the iteration.
        v_iterations := v_iterations + 1;
        IF v_iterations > c_max_iterations THEN
            RETURN;
        END IF;

        -- The caller's clock, carried forward by the time spent in here.
        v_now_ms := p_now_ms + (EXTRACT(EPOCH FROM (clock_timestamp() - v_call_start)) * 1000)::BIGINT;
        v_instance_id := NULL;

        -- Phase 1: the oldest eligible message of an instance not skipped
        -- yet and without a live lease. With a version range, the current
        -- execution's pinned version must lie in it (an unpinned one
        -- passes); without one, the queue alone is read.
        IF p_min_version_packed IS NOT NULL THEN
            SELECT q.instance_id INTO v_instance_id
            FROM %1$I.orchestrator_queue q
            LEFT JOIN %1$I.instances i ON i.instance_id = q.instance_id
            LEFT JOIN %1$I.executions e
                   ON e.instance_id = i.instance_id
                  AND e.execution_id = i.current_execution_id
            WHERE q.visible_at <= TO_TIMESTAMP(v_now_ms / 1000.0)
              AND NOT (q.instance_id = ANY(v_skipped))
              AND NOT EXISTS (
                  SELECT 1 FROM %1$I.instance_locks il
                  WHERE il.instance_id = q.instance_id
                    AND il.locked_until > v_now_ms
              )
              AND (e.duroxide_version_major IS NULL
                   OR (e.duroxide_version_major::BIGINT * 1000000
                       + e.duroxide_version_minor * 1000
                       + e.duroxide_version_patch)
                      BETWEEN p_min_version_packed AND p_max_version_packed)
            ORDER BY q.visible_at, q.id
            LIMIT 1;
        ELSE
            SELECT q.instance_id INTO v_instance_id
            FROM %1$I.orchestrator_queue q
            WHERE q.visible_at <= TO_TIMESTAMP(v_now_ms / 1000.0)
              AND NOT (q.instance_id = ANY(v_skipped))
              AND NOT EXISTS (
                  SELECT 1 FROM %1$I.instance_locks il
                  WHERE il.instance_id = q.instance_id
                    AND il.locked_until > v_now_ms
              )
            ORDER BY q.visible_at, q.id
            LIMIT 1;
        END IF;

        IF v_instance_id IS NULL THEN
            RETURN;
        END IF;

        -- Phase 2: the schema-scoped key, never waited for.
        IF NOT pg_try_advisory_xact_lock(hashtext(%2$L || '.' || v_instance_id)) THEN
            v_skipped := array_append(v_skipped, v_instance_id);
            CONTINUE;
        END IF;

        v_now_ms := p_now_ms + (EXTRACT(EPOCH FROM (clock_timestamp() - v_call_start)) * 1000)::BIGINT;

        -- Phase 3: the same test under a row lock, skipping rows another
        -- transaction holds.
        v_verified_instance := NULL;
        IF p_min_version_packed IS NOT NULL THEN
            SELECT q.instance_id INTO v_verified_instance
            FROM %1$I.orchestrator_queue q
            LEFT JOIN %1$I.instances i ON i.instance_id = q.instance_id
            LEFT JOIN %1$I.executions e
                   ON e.instance_id = i.instance_id
                  AND e.execution_id = i.current_execution_id
            WHERE q.instance_id = v_instance_id
              AND q.visible_at <= TO_TIMESTAMP(v_now_ms / 1000.0)
              AND NOT EXISTS (
                  SELECT 1 FROM %1$I.instance_locks il
                  WHERE il.instance_id = q.instance_id
                    AND il.locked_until > v_now_ms
              )
              AND (e.duroxide_version_major IS NULL
                   OR (e.duroxide_version_major::BIGINT * 1000000
                       + e.duroxide_version_minor * 1000
                       + e.duroxide_version_patch)
                      BETWEEN p_min_version_packed AND p_max_version_packed)
            FOR UPDATE OF q SKIP LOCKED;
        ELSE
            SELECT q.instance_id INTO v_verified_instance
            FROM %1$I.orchestrator_queue q
            WHERE q.instance_id = v_instance_id
              AND q.visible_at <= TO_TIMESTAMP(v_now_ms / 1000.0)
              AND NOT EXISTS (
                  SELECT 1 FROM %1$I.instance_locks il
                  WHERE il.instance_id = q.instance_id
                    AND il.locked_until > v_now_ms
              )
            FOR UPDATE OF q SKIP LOCKED;
        END IF;

        IF v_verified_instance IS NULL THEN
            v_skipped := array_append(v_skipped, v_instance_id);
            CONTINUE;
        END IF;

        -- The claim: a lease taken over only once it has expired.
        v_lock_token := 'lock_' || gen_random_uuid()::TEXT;
        v_locked_until := v_now_ms + p_lock_timeout_ms;

        INSERT INTO %1$I.instance_locks (instance_id, lock_token, locked_until, locked_at)
        VALUES (v_instance_id, v_lock_token, v_locked_until, v_now_ms)
        ON CONFLICT (instance_id) DO UPDATE
        SET lock_token = EXCLUDED.lock_token,
            locked_until = EXCLUDED.locked_until,
            locked_at = EXCLUDED.locked_at
        WHERE %1$I.instance_locks.locked_until <= v_now_ms;

        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            v_skipped := array_append(v_skipped, v_instance_id);
            CONTINUE;
        END IF;

        -- Step 3: every visible message of the instance not leased at
        -- v_now_ms gets the lease.
        UPDATE %1$I.orchestrator_queue q
        SET lock_token = v_lock_token,
            locked_until = v_locked_until,
            attempt_count = q.attempt_count + 1
        WHERE q.instance_id = v_instance_id
          AND q.visible_at <= TO_TIMESTAMP(v_now_ms / 1000.0)
          AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms);

        -- Step 4: the claimed messages in id order, their highest attempt.
        SELECT COALESCE(jsonb_agg(q.work_item::JSONB ORDER BY q.id), '[]'::JSONB),
               COALESCE(MAX(q.attempt_count), 1)
        INTO v_messages, v_attempt_count
        FROM %1$I.orchestrator_queue q
        WHERE q.lock_token = v_lock_token;

        -- Step 5: the instance's metadata and the current execution's history.
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
            -- Step 6: no instance row yet; all of its history, and name,
            -- version and execution from the first event or message.
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

        -- The KV snapshot of the instance (every execution).
        SELECT COALESCE(jsonb_object_agg(k.key, jsonb_build_object('value', k.value,
                                                                   'last_updated_at_ms', k.last_updated_at_ms)),
                        '{}'::JSONB)
        INTO v_kv_snapshot
        FROM %1$I.kv_store k
        WHERE k.instance_id = v_instance_id;

        RETURN QUERY
        SELECT v_instance_id, v_name, v_version, v_execution_id,
               v_history, v_messages, v_lock_token, v_attempt_count, v_kv_snapshot;
        RETURN;
    END LOOP;
END;
$body$ LANGUAGE plpgsql;
$fmt$, v_schema_name, v_schema_name);

    RAISE NOTICE 'Migration 0024: fetch_orchestration_item skips contended instances, scopes its advisory key to the schema, stops after 50 iterations and measures time spent in the call';
END $$;
