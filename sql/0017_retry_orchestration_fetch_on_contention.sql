-- 0017_retry_orchestration_fetch_on_contention.sql (upstream duroxide-pg schema version 17)
--
-- What changes (a pure function redefinition):
--   * fetch_orchestration_item keeps its signature and its 8 output columns.
--     Its candidate selection becomes a loop: when the locked re-check finds
--     no row (another fetcher holds it) or the instance-lock upsert affects
--     no row (a live lease appeared), it starts again from the peek instead
--     of returning nothing. It returns no row only when the peek finds no
--     candidate at all.
--
-- Why: a fetcher that loses a race should not report "no work" while
-- other instances have claimable messages.
--
-- Upstream quirks kept knowingly (the fetch defect class described in
-- orchestration.md section 13; fixes belong after 19):
--   * The loop has no iteration cap, no back-off and no fresh timestamp:
--     every iteration uses the caller's p_now_ms. A candidate whose rows
--     are row-locked by a transaction that does not take the advisory lock
--     is picked again and again until that transaction ends (spin).
--   * The advisory lock is blocking, and the locks taken in abandoned
--     iterations stay held until the transaction ends, so two fetchers can
--     deadlock (40P01).
--   * Like upstream, the file ends with a RAISE NOTICE.
--
-- Locks: no table lock: it only replaces functions (a call in flight finishes
-- on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only drops and re-creates a function (a call
-- in flight finishes on the old text, the next call uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up
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
    out_attempt_count integer
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

    RETURN QUERY
    SELECT v_instance_id, v_name, v_version, v_execution_id,
           v_history, v_messages, v_lock_token, v_attempt_count;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
BEGIN
    RAISE NOTICE 'Migration 0017: fetch_orchestration_item now retries candidate selection on contention';
END;
$do$;
-- +goose StatementEnd

INSERT INTO _duroxide_migrations (version, name) VALUES (17, '0017_retry_orchestration_fetch_on_contention.sql');

-- +goose Down
DELETE FROM _duroxide_migrations WHERE version = 17;

DROP FUNCTION IF EXISTS fetch_orchestration_item(bigint, bigint, bigint, bigint);
-- fetch_orchestration_item as of version 16, copied verbatim from 0013_add_capability_filtering.sql.
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
    out_attempt_count integer
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
BEGIN
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
        RETURN;
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
        RETURN;
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
        RETURN;
    END IF;

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

    RETURN QUERY
    SELECT v_instance_id, v_name, v_version, v_execution_id,
           v_history, v_messages, v_lock_token, v_attempt_count;
END;
$fn$;
-- +goose StatementEnd
