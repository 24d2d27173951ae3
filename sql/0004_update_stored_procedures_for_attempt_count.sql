-- 0004_update_stored_procedures_for_attempt_count.sql
--
-- Upstream version 4: a re-issue of the queue functions "for attempt_count".
-- Pure function redefinition (bodies only; signatures unchanged).
--
-- Real behaviour changes:
-- * fetch_work_item(bigint, bigint): the visible_at test is removed; any row
--   that is unleased or whose lease expired is eligible, delayed or not.
-- * abandon_work_item(text, bigint, boolean): with a positive delay the row
--   KEEPS its lock_token and locked_until becomes (DB clock in ms) + delay, so
--   the delay is served as a lease; without a delay the lease is cleared.
--   visible_at is never touched. Attempt handling and the error are unchanged.
--
-- Both changes are reverted by 0005 (back to 0002's bodies).
--
-- Upstream also re-issues abandon_orchestration_item, fetch_orchestration_item
-- and renew_orchestration_item_lock here with behaviour identical to 0002;
-- those no-op redefinitions are not repeated, so their 0002 text stays.
--
-- Locks: no table lock: it only replaces functions (a call in flight finishes
-- on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only replaces functions (a call in flight
-- finishes on the old text, the next call uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up

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
    -- Lowest id among rows that are unleased or whose lease expired (no
    -- visibility test in this version); rows locked by other fetchers are
    -- skipped, not waited for.
    SELECT w.id INTO v_id
    FROM worker_queue w
    WHERE w.lock_token IS NULL OR w.locked_until <= p_now_ms
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
CREATE OR REPLACE FUNCTION abandon_work_item(
    p_lock_token text,
    p_delay_ms bigint DEFAULT NULL,
    p_ignore_attempt boolean DEFAULT false
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    IF p_delay_ms IS NOT NULL AND p_delay_ms > 0 THEN
        -- Delay by keeping the lease until DB-now + delay.
        UPDATE worker_queue w
        SET locked_until = floor(extract(epoch FROM NOW()) * 1000)::bigint + p_delay_ms,
            attempt_count = CASE
                WHEN p_ignore_attempt THEN GREATEST(0, w.attempt_count - 1)
                ELSE w.attempt_count
            END
        WHERE w.lock_token = p_lock_token;
    ELSE
        -- No delay: release the lease at once.
        UPDATE worker_queue w
        SET lock_token = NULL,
            locked_until = NULL,
            attempt_count = CASE
                WHEN p_ignore_attempt THEN GREATEST(0, w.attempt_count - 1)
                ELSE w.attempt_count
            END
        WHERE w.lock_token = p_lock_token;
    END IF;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token or already acked';
    END IF;
END;
$fn$;
-- +goose StatementEnd

INSERT INTO _duroxide_migrations (version, name) VALUES (4, '0004_update_stored_procedures_for_attempt_count.sql');

-- +goose Down

DELETE FROM _duroxide_migrations WHERE version = 4;

-- Back to the 0002 bodies (copied verbatim from 0002_create_stored_procedures.sql).

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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION abandon_work_item(
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
