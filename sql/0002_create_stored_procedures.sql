-- 0002_create_stored_procedures.sql
--
-- Upstream version 2: the first full set of stored functions (22 of them).
-- Creations only; no table changes.
--
-- Final at this version (never redefined before 19): list_instances,
-- list_executions, latest_execution_id, list_instances_by_status,
-- get_execution_info, get_system_metrics, get_queue_depths, fetch_history,
-- fetch_history_with_execution, append_history, enqueue_orchestrator_work,
-- renew_orchestration_item_lock (upstream re-issues the last one and
-- get_queue_depths unchanged in 0004/0005; this pack does not).
--
-- Early forms, replaced later:
-- * get_instance_info: 8 columns (0010 adds parent_instance_id).
-- * enqueue_worker_work(p_work_item): DB clock (0006: p_now_ms).
-- * ack_worker(token, instance, completion): DB clock (0006: p_now_ms).
-- * renew_work_item_lock: no session handling (0014).
-- * fetch_work_item(p_now_ms, p_lock_timeout_ms): lowest id among visible,
--   unleased rows, SKIP LOCKED (0004 drops the visibility test, 0005 restores
--   it, later versions add sessions and tags).
-- * abandon_work_item(token, delay, ignore_attempt): clears the lease and
--   sets visible_at = NOW() + delay (DB clock; 0006: p_now_ms).
-- * fetch_orchestration_item(p_now_ms, p_lock_timeout_ms): peek, advisory
--   lock, re-check, lease upsert, claim; gives up (no rows) if the re-check or
--   the upsert fails (0017 turns that into a retry loop).
-- * ack_orchestration_item (6 arguments): DB clock for the lease check and
--   for every stored timestamp (0012 switches to p_now_ms).
-- * abandon_orchestration_item(token, delay, ignore_attempt): DB clock for
--   the delay (0006: p_now_ms).
-- * cleanup_schema: drops the 7 tables and this version's signatures.
--
-- Upstream quirks kept knowingly:
-- * Upstream edited this file after later migrations existed: cleanup_schema
--   already names 0010's functions, and the worker functions already use
--   attempt_count, which only appears in 0003. fetch_work_item and the two
--   abandon functions therefore fail if called at exactly version 2
--   (PL/pgSQL resolves columns at first call, not at creation).
-- * append_history inserts history rows without created_at. From 0012 on
--   (created_at NOT NULL, no default) every non-empty call fails with 23502;
--   upstream never fixed it before 19.
-- * upstream also drops abandon_orchestration_item(text, bigint), a signature
--   that never existed; not copied.
--
-- Locks: no table lock: it only replaces functions (a call in flight finishes
-- on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only drops functions (a call in flight
-- finishes; the next call of a dropped function fails).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION cleanup_schema()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Test teardown: drop every table (owned sequences go with them),
    -- including the bookkeeping table, so the next migration starts afresh.
    DROP TABLE IF EXISTS instances CASCADE;
    DROP TABLE IF EXISTS executions CASCADE;
    DROP TABLE IF EXISTS history CASCADE;
    DROP TABLE IF EXISTS orchestrator_queue CASCADE;
    DROP TABLE IF EXISTS worker_queue CASCADE;
    DROP TABLE IF EXISTS instance_locks CASCADE;
    DROP TABLE IF EXISTS _duroxide_migrations CASCADE;

    -- Then the functions, by exact signature (some do not exist yet at this
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
    DROP FUNCTION IF EXISTS enqueue_worker_work(text, bigint, text, bigint, bigint);
    DROP FUNCTION IF EXISTS ack_worker(text, text, text, bigint);
    DROP FUNCTION IF EXISTS renew_work_item_lock(text, bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_work_item(bigint, bigint);
    DROP FUNCTION IF EXISTS abandon_work_item(text, bigint, bigint, boolean);
    DROP FUNCTION IF EXISTS enqueue_orchestrator_work(text, text, timestamptz, text, text, bigint);
    DROP FUNCTION IF EXISTS fetch_orchestration_item(bigint, bigint);
    DROP FUNCTION IF EXISTS ack_orchestration_item(text, bigint, jsonb, jsonb, jsonb, jsonb, jsonb);
    DROP FUNCTION IF EXISTS abandon_orchestration_item(text, bigint, bigint, boolean);
    DROP FUNCTION IF EXISTS renew_orchestration_item_lock(text, bigint, bigint);
    DROP FUNCTION IF EXISTS fetch_history(text);
    DROP FUNCTION IF EXISTS fetch_history_with_execution(text, bigint);
    DROP FUNCTION IF EXISTS append_history(text, bigint, jsonb);
    DROP FUNCTION IF EXISTS list_children(text);
    DROP FUNCTION IF EXISTS get_parent_id(text);
    DROP FUNCTION IF EXISTS delete_instances_atomic(text[], boolean);
    DROP FUNCTION IF EXISTS prune_executions(text, integer, bigint);
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION list_instances()
RETURNS TABLE(instance_id text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Newest first; no tie-breaker.
    RETURN QUERY
    SELECT i.instance_id
    FROM instances i
    ORDER BY i.created_at DESC;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION list_executions(p_instance_id text)
RETURNS TABLE(execution_id bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    RETURN QUERY
    SELECT e.execution_id
    FROM executions e
    WHERE e.instance_id = p_instance_id
    ORDER BY e.execution_id;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION latest_execution_id(p_instance_id text)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_execution_id bigint;
BEGIN
    -- NULL (not an error) when the instance does not exist.
    SELECT i.current_execution_id INTO v_execution_id
    FROM instances i
    WHERE i.instance_id = p_instance_id;

    RETURN v_execution_id;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION list_instances_by_status(p_status text)
RETURNS TABLE(instance_id text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Status of the current execution; instances without that row never match.
    RETURN QUERY
    SELECT i.instance_id
    FROM instances i
    JOIN executions e
      ON e.instance_id = i.instance_id
     AND e.execution_id = i.current_execution_id
    WHERE e.status = p_status
    ORDER BY i.created_at DESC;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION get_instance_info(p_instance_id text)
RETURNS TABLE(
    instance_id text,
    orchestration_name text,
    orchestration_version text,
    current_execution_id bigint,
    created_at timestamptz,
    updated_at timestamptz,
    status text,
    output text
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- The instance with its current execution; the join is outer, so status
    -- and output are NULL when that execution row is missing.
    RETURN QUERY
    SELECT i.instance_id,
           i.orchestration_name,
           COALESCE(i.orchestration_version, 'unknown'),
           i.current_execution_id,
           i.created_at,
           i.updated_at,
           e.status,
           e.output
    FROM instances i
    LEFT JOIN executions e
      ON e.instance_id = i.instance_id
     AND e.execution_id = i.current_execution_id
    WHERE i.instance_id = p_instance_id;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION get_execution_info(p_instance_id text, p_execution_id bigint)
RETURNS TABLE(
    execution_id bigint,
    status text,
    output text,
    started_at timestamptz,
    completed_at timestamptz,
    event_count bigint
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    RETURN QUERY
    SELECT e.execution_id,
           e.status,
           e.output,
           e.started_at,
           e.completed_at,
           (SELECT count(*)
            FROM history h
            WHERE h.instance_id = e.instance_id
              AND h.execution_id = e.execution_id)
    FROM executions e
    WHERE e.instance_id = p_instance_id
      AND e.execution_id = p_execution_id;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION get_system_metrics()
RETURNS TABLE(
    total_instances bigint,
    total_executions bigint,
    running_instances bigint,
    completed_instances bigint,
    failed_instances bigint,
    total_events bigint
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Always one row. The status buckets look at each instance's current
    -- execution only; any other status counts in none of them.
    RETURN QUERY
    SELECT (SELECT count(*) FROM instances),
           (SELECT count(*) FROM executions),
           (SELECT count(DISTINCT i.instance_id)
            FROM instances i
            JOIN executions e
              ON e.instance_id = i.instance_id
             AND e.execution_id = i.current_execution_id
            WHERE e.status = 'Running'),
           (SELECT count(DISTINCT i.instance_id)
            FROM instances i
            JOIN executions e
              ON e.instance_id = i.instance_id
             AND e.execution_id = i.current_execution_id
            WHERE e.status = 'Completed'),
           (SELECT count(DISTINCT i.instance_id)
            FROM instances i
            JOIN executions e
              ON e.instance_id = i.instance_id
             AND e.execution_id = i.current_execution_id
            WHERE e.status = 'Failed'),
           (SELECT count(*) FROM history);
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION get_queue_depths(p_now_ms bigint)
RETURNS TABLE(orchestrator_queue bigint, worker_queue bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Visible and unleased rows of each queue. Instance locks, sessions and
    -- tags are ignored.
    RETURN QUERY
    SELECT (SELECT count(*)
            FROM orchestrator_queue q
            WHERE q.visible_at <= to_timestamp(p_now_ms / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms)),
           (SELECT count(*)
            FROM worker_queue w
            WHERE w.visible_at <= to_timestamp(p_now_ms / 1000.0)
              AND (w.lock_token IS NULL OR w.locked_until <= p_now_ms));
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION enqueue_worker_work(p_work_item text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    INSERT INTO worker_queue (work_item, visible_at, created_at)
    VALUES (p_work_item, NOW(), NOW());
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION ack_worker(
    p_lock_token text,
    p_instance_id text DEFAULT NULL,
    p_completion_json text DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    DELETE FROM worker_queue w
    WHERE w.lock_token = p_lock_token;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Worker queue item not found or already processed';
    END IF;

    -- Hand the completion to the orchestration (none for a cancelled activity).
    IF p_completion_json IS NOT NULL THEN
        INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
        VALUES (p_instance_id, p_completion_json, NOW(), NOW());
    END IF;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION renew_work_item_lock(p_lock_token text, p_now_ms bigint, p_extend_secs bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- The extension is in seconds and replaces the old expiry outright.
    UPDATE worker_queue w
    SET locked_until = p_now_ms + p_extend_secs * 1000
    WHERE w.lock_token = p_lock_token
      AND w.locked_until > p_now_ms;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Lock token invalid, expired, or already acked';
    END IF;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION fetch_work_item(p_now_ms bigint, p_lock_timeout_ms bigint)
RETURNS TABLE(out_work_item text, out_lock_token text, out_attempt_count integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_id bigint;
    v_lock_token text;
BEGIN
    -- Lowest id among visible rows that are unleased or whose lease expired;
    -- rows locked by other fetchers are skipped, not waited for.
    SELECT w.id INTO v_id
    FROM worker_queue w
    WHERE w.visible_at <= to_timestamp(p_now_ms / 1000.0)
      AND (w.lock_token IS NULL OR w.locked_until <= p_now_ms)
    ORDER BY w.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED;

    IF NOT FOUND THEN
        RETURN;
    END IF;

    v_lock_token := 'lock_' || gen_random_uuid()::text;

    RETURN QUERY
    UPDATE worker_queue w
    SET lock_token = v_lock_token,
        locked_until = p_now_ms + p_lock_timeout_ms,
        attempt_count = w.attempt_count + 1
    WHERE w.id = v_id
    RETURNING w.work_item, w.lock_token, w.attempt_count;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION abandon_work_item(
    p_lock_token text,
    p_delay_ms bigint DEFAULT NULL,
    p_ignore_attempt boolean DEFAULT false
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Release the lease (no expiry check) and make the row visible again,
    -- after the delay when one is given. The DB clock is used.
    UPDATE worker_queue w
    SET lock_token = NULL,
        locked_until = NULL,
        visible_at = CASE
            WHEN p_delay_ms IS NOT NULL AND p_delay_ms > 0
                THEN NOW() + p_delay_ms * INTERVAL '1 millisecond'
            ELSE NOW()
        END,
        attempt_count = CASE
            WHEN p_ignore_attempt THEN GREATEST(0, w.attempt_count - 1)
            ELSE w.attempt_count
        END
    WHERE w.lock_token = p_lock_token;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token or already acked';
    END IF;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION enqueue_orchestrator_work(
    p_instance_id text,
    p_work_item text,
    p_visible_at timestamptz,
    p_orchestration_name text DEFAULT NULL,
    p_orchestration_version text DEFAULT NULL,
    p_execution_id bigint DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- The last three parameters are accepted and ignored. created_at is the
    -- DB clock; the work item is stored verbatim.
    INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
    VALUES (p_instance_id, p_work_item, p_visible_at, NOW());
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION fetch_orchestration_item(p_now_ms bigint, p_lock_timeout_ms bigint)
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
    --    whose instance has no live lease.
    SELECT q.instance_id INTO v_instance_id
    FROM orchestrator_queue q
    WHERE q.visible_at <= v_now
      AND NOT EXISTS (
          SELECT 1
          FROM instance_locks l
          WHERE l.instance_id = q.instance_id
            AND l.locked_until > p_now_ms
      )
    ORDER BY q.visible_at, q.id
    LIMIT 1;

    IF NOT FOUND THEN
        RETURN;
    END IF;

    -- 2. Serialise fetchers of this instance (blocking, until commit).
    PERFORM pg_advisory_xact_lock(hashtext(v_instance_id));

    -- 3. Re-check under a row lock, skipping rows other transactions hold.
    --    Selecting INTO one variable locks only the first row produced.
    SELECT q.instance_id INTO v_found_instance
    FROM orchestrator_queue q
    WHERE q.instance_id = v_instance_id
      AND q.visible_at <= v_now
      AND NOT EXISTS (
          SELECT 1
          FROM instance_locks l
          WHERE l.instance_id = q.instance_id
            AND l.locked_until > p_now_ms
      )
    FOR UPDATE SKIP LOCKED;

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

-- +goose StatementBegin
CREATE FUNCTION abandon_orchestration_item(
    p_lock_token text,
    p_delay_ms bigint DEFAULT NULL,
    p_ignore_attempt boolean DEFAULT false
)
RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_instance_id text;
BEGIN
    -- No expiry check: an expired but present lease can be abandoned.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token';
    END IF;

    -- Unlock the messages. Without a positive delay visible_at is kept, so the
    -- messages keep their place in the queue. The DB clock is used.
    UPDATE orchestrator_queue q
    SET lock_token = NULL,
        locked_until = NULL,
        visible_at = CASE
            WHEN p_delay_ms IS NOT NULL AND p_delay_ms > 0
                THEN NOW() + p_delay_ms * INTERVAL '1 millisecond'
            ELSE q.visible_at
        END,
        attempt_count = CASE
            WHEN p_ignore_attempt THEN GREATEST(0, q.attempt_count - 1)
            ELSE q.attempt_count
        END
    WHERE q.lock_token = p_lock_token;

    DELETE FROM instance_locks l
    WHERE l.lock_token = p_lock_token;

    RETURN v_instance_id;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION renew_orchestration_item_lock(p_lock_token text, p_now_ms bigint, p_extend_secs bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_locked_until bigint := p_now_ms + p_extend_secs * 1000;
BEGIN
    -- The extension is in seconds and replaces the old expiry outright (it
    -- can shorten the lease); only a live lease can be renewed.
    UPDATE instance_locks l
    SET locked_until = v_locked_until
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Lock token invalid, expired, or already released';
    END IF;

    UPDATE orchestrator_queue q
    SET locked_until = v_locked_until
    WHERE q.lock_token = p_lock_token;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION fetch_history(p_instance_id text)
RETURNS TABLE(out_event_data text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_execution_id bigint;
BEGIN
    -- Latest execution by the executions table (not current_execution_id),
    -- 1 when there is none.
    SELECT COALESCE(MAX(e.execution_id), 1) INTO v_execution_id
    FROM executions e
    WHERE e.instance_id = p_instance_id;

    RETURN QUERY
    SELECT h.event_data
    FROM history h
    WHERE h.instance_id = p_instance_id
      AND h.execution_id = v_execution_id
    ORDER BY h.event_id;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION fetch_history_with_execution(p_instance_id text, p_execution_id bigint)
RETURNS TABLE(out_event_data text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    RETURN QUERY
    SELECT h.event_data
    FROM history h
    WHERE h.instance_id = p_instance_id
      AND h.execution_id = p_execution_id
    ORDER BY h.event_id;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION append_history(p_instance_id text, p_execution_id bigint, p_events jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    IF p_events IS NULL OR jsonb_array_length(p_events) = 0 THEN
        RETURN;
    END IF;

    IF EXISTS (
        SELECT 1
        FROM jsonb_array_elements(p_events) AS e(ev)
        WHERE e.ev ->> 'event_id' IS NULL
           OR (e.ev ->> 'event_id')::bigint <= 0
    ) THEN
        RAISE EXCEPTION 'Invalid event_id in append_history';
    END IF;

    -- Upstream quirk kept: created_at is not supplied. From version 12 on the
    -- column is NOT NULL without a default, so every non-empty call fails
    -- with 23502 (even when every row would be a duplicate).
    INSERT INTO history (instance_id, execution_id, event_id, event_type, event_data)
    SELECT p_instance_id, p_execution_id, (e.ev ->> 'event_id')::bigint, e.ev ->> 'event_type', e.ev ->> 'event_data'
    FROM jsonb_array_elements(p_events) AS e(ev)
    ON CONFLICT (instance_id, execution_id, event_id) DO NOTHING;
END;
$fn$;
-- +goose StatementEnd

INSERT INTO _duroxide_migrations (version, name) VALUES (2, '0002_create_stored_procedures.sql');

-- +goose Down

DELETE FROM _duroxide_migrations WHERE version = 2;

DROP FUNCTION append_history(text, bigint, jsonb);
DROP FUNCTION fetch_history_with_execution(text, bigint);
DROP FUNCTION fetch_history(text);
DROP FUNCTION renew_orchestration_item_lock(text, bigint, bigint);
DROP FUNCTION abandon_orchestration_item(text, bigint, boolean);
DROP FUNCTION ack_orchestration_item(text, bigint, jsonb, jsonb, jsonb, jsonb);
DROP FUNCTION fetch_orchestration_item(bigint, bigint);
DROP FUNCTION enqueue_orchestrator_work(text, text, timestamptz, text, text, bigint);
DROP FUNCTION abandon_work_item(text, bigint, boolean);
DROP FUNCTION fetch_work_item(bigint, bigint);
DROP FUNCTION renew_work_item_lock(text, bigint, bigint);
DROP FUNCTION ack_worker(text, text, text);
DROP FUNCTION enqueue_worker_work(text);
DROP FUNCTION get_queue_depths(bigint);
DROP FUNCTION get_system_metrics();
DROP FUNCTION get_execution_info(text, bigint);
DROP FUNCTION get_instance_info(text);
DROP FUNCTION list_instances_by_status(text);
DROP FUNCTION latest_execution_id(text);
DROP FUNCTION list_executions(text);
DROP FUNCTION list_instances();
DROP FUNCTION cleanup_schema();
