-- 0008_remove_execution_state.sql
--
-- Upstream version 8: withdraw 0007. Pure function redefinition.
--
-- * fetch_work_item(bigint,bigint) goes back to 3 output columns (result type
--   changes, so drop + create), with the body of 0005.
-- * renew_work_item_lock(text,bigint,bigint) goes back to RETURNS void
--   (drop + create), with the body of 0002.
--
-- Both bodies below are copied verbatim from those files, so the functions at
-- version 8 are identical to the ones at version 6.
--
-- Locks: no table lock: it only replaces functions (a call in flight finishes
-- on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only drops and re-creates functions (a call in
-- flight finishes on the old text, the next call uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up

DROP FUNCTION IF EXISTS fetch_work_item(bigint, bigint);

-- fetch_work_item as of 0005, copied verbatim from 0005_add_visible_at_to_worker_queue.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fetch_work_item(p_now_ms bigint, p_lock_timeout_ms bigint)
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

DROP FUNCTION IF EXISTS renew_work_item_lock(text, bigint, bigint);

-- renew_work_item_lock as of 0002, copied verbatim from 0002_create_stored_procedures.sql.
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

INSERT INTO _duroxide_migrations (version, name) VALUES (8, '0008_remove_execution_state.sql');

-- +goose Down

DELETE FROM _duroxide_migrations WHERE version = 8;

DROP FUNCTION IF EXISTS fetch_work_item(bigint, bigint);

-- fetch_work_item as of 0007, copied verbatim from 0007_add_execution_state_support.sql.
-- +goose StatementBegin
CREATE FUNCTION fetch_work_item(p_now_ms bigint, p_lock_timeout_ms bigint)
RETURNS TABLE(out_work_item text, out_lock_token text, out_attempt_count integer, out_execution_state text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_id bigint;
    v_work_item text;
    v_attempt_count integer;
    v_lock_token text;
    v_activity jsonb;
    v_instance_id text;
    v_execution_id bigint;
    v_status text;
    v_state text;
BEGIN
    -- Oldest visible item that is unlocked or whose lease has expired.
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

    UPDATE worker_queue w
    SET lock_token = v_lock_token,
        locked_until = p_now_ms + p_lock_timeout_ms,
        attempt_count = w.attempt_count + 1
    WHERE w.id = v_id
    RETURNING w.work_item, w.attempt_count INTO v_work_item, v_attempt_count;

    -- State of the execution the activity belongs to.
    v_activity := v_work_item::jsonb -> 'ActivityExecute';
    v_instance_id := v_activity ->> 'instance';
    v_execution_id := (v_activity ->> 'execution_id')::bigint;

    v_state := 'Missing';
    IF v_instance_id IS NOT NULL AND v_execution_id IS NOT NULL THEN
        SELECT e.status INTO v_status
        FROM executions e
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = v_execution_id;
        IF FOUND THEN
            IF v_status = 'Running' THEN
                v_state := 'Running';
            ELSE
                v_state := 'Terminal:' || v_status;
            END IF;
        END IF;
    END IF;

    RETURN QUERY SELECT v_work_item, v_lock_token, v_attempt_count, v_state;
END;
$fn$;
-- +goose StatementEnd

DROP FUNCTION IF EXISTS renew_work_item_lock(text, bigint, bigint);

-- renew_work_item_lock as of 0007, copied verbatim from 0007_add_execution_state_support.sql.
-- +goose StatementBegin
CREATE FUNCTION renew_work_item_lock(p_lock_token text, p_now_ms bigint, p_extend_secs bigint)
RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_work_item text;
    v_activity jsonb;
    v_instance_id text;
    v_execution_id bigint;
    v_status text;
    v_state text;
BEGIN
    -- The lease must still be live.
    SELECT w.work_item INTO v_work_item
    FROM worker_queue w
    WHERE w.lock_token = p_lock_token
      AND w.locked_until > p_now_ms
    LIMIT 1;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Lock token invalid, expired, or already acked';
    END IF;

    -- State of the execution the activity belongs to.
    v_activity := v_work_item::jsonb -> 'ActivityExecute';
    v_instance_id := v_activity ->> 'instance';
    v_execution_id := (v_activity ->> 'execution_id')::bigint;

    v_state := 'Missing';
    IF v_instance_id IS NOT NULL AND v_execution_id IS NOT NULL THEN
        SELECT e.status INTO v_status
        FROM executions e
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = v_execution_id;
        IF FOUND THEN
            IF v_status = 'Running' THEN
                v_state := 'Running';
            ELSE
                v_state := 'Terminal:' || v_status;
            END IF;
        END IF;
    END IF;

    -- Only a running execution gets its activity lease extended.
    IF v_state = 'Running' THEN
        UPDATE worker_queue w
        SET locked_until = p_now_ms + p_extend_secs * 1000
        WHERE w.lock_token = p_lock_token
          AND w.locked_until > p_now_ms;
    END IF;

    RETURN v_state;
END;
$fn$;
-- +goose StatementEnd
