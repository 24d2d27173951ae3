-- 0006_use_rust_timestamps.sql
--
-- Upstream version 6: timestamps come from the application clock (p_now_ms,
-- epoch milliseconds) instead of the database clock. Pure function
-- redefinition; each signature change is DROP + CREATE.
--
-- * enqueue_worker_work(text) -> enqueue_worker_work(p_work_item, p_now_ms):
--   visible_at = created_at = to_timestamp(p_now_ms / 1000.0).
-- * abandon_work_item(text, bigint, boolean) -> abandon_work_item(p_lock_token,
--   p_now_ms, p_delay_ms, p_ignore_attempt): always clears the lease;
--   visible_at = now + delay for a positive delay, else now. Final at 19.
-- * abandon_orchestration_item(text, bigint, boolean) ->
--   abandon_orchestration_item(p_lock_token, p_now_ms, p_delay_ms,
--   p_ignore_attempt): visible_at = now + delay for a positive delay, else
--   unchanged. Final at 19.
-- * ack_worker(text, text, text) -> ack_worker(p_lock_token, p_instance_id,
--   p_completion_json, p_now_ms): a completion needs an instance id and
--   p_now_ms (two new errors) and is enqueued with p_now_ms timestamps.
-- * New legacy functions that upstream's provider never calls:
--   enqueue_orchestration_work, enqueue_completion, enqueue_message and
--   ack_orchestration. They survive to 19 (cleanup_schema never drops them).
--
-- Upstream quirks kept knowingly:
-- * ack_orchestration is dead on arrival: it writes instances.status and
--   instances.completed_at, which have never existed, and inserts history
--   without event_id / event_type. With a known token it always fails with
--   42703 (`column "completed_at" does not exist` when the instance row
--   exists, `column "status" of relation "instances" does not exist` when it
--   does not). It exists only so that the catalog matches upstream's.
-- * Upstream precedes each legacy function with a drop of a signature that
--   never existed, and also drops ack_worker(text, text, text, bigint) before
--   creating it; not copied.
--
-- Locks: no table lock: it only replaces functions (a call in flight finishes
-- on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only drops and re-creates functions (a call in
-- flight finishes on the old text, the next call uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up

DROP FUNCTION IF EXISTS enqueue_worker_work(text);

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

DROP FUNCTION IF EXISTS abandon_work_item(text, bigint, boolean);

-- +goose StatementBegin
CREATE FUNCTION abandon_work_item(
    p_lock_token text,
    p_now_ms bigint,
    p_delay_ms bigint DEFAULT NULL,
    p_ignore_attempt boolean DEFAULT false
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_visible_at timestamptz;
BEGIN
    -- NULL, zero or negative delay: visible right away.
    IF p_delay_ms IS NOT NULL AND p_delay_ms > 0 THEN
        v_visible_at := to_timestamp((p_now_ms + p_delay_ms) / 1000.0);
    ELSE
        v_visible_at := to_timestamp(p_now_ms / 1000.0);
    END IF;

    -- Release the lease; no expiry check, so an expired token that nobody
    -- has re-claimed can still abandon. A NULL p_ignore_attempt acts as false.
    UPDATE worker_queue w
    SET lock_token = NULL,
        locked_until = NULL,
        visible_at = v_visible_at,
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

DROP FUNCTION IF EXISTS abandon_orchestration_item(text, bigint, boolean);

-- +goose StatementBegin
CREATE FUNCTION abandon_orchestration_item(
    p_lock_token text,
    p_now_ms bigint,
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
    -- messages keep their place in the queue. A NULL p_ignore_attempt acts as
    -- false. Zero messages is not an error.
    UPDATE orchestrator_queue q
    SET lock_token = NULL,
        locked_until = NULL,
        visible_at = CASE
            WHEN p_delay_ms IS NOT NULL AND p_delay_ms > 0
                THEN to_timestamp((p_now_ms + p_delay_ms) / 1000.0)
            ELSE q.visible_at
        END,
        attempt_count = CASE
            WHEN p_ignore_attempt THEN GREATEST(0, q.attempt_count - 1)
            ELSE q.attempt_count
        END
    WHERE q.lock_token = p_lock_token;

    -- Matched on the token alone.
    DELETE FROM instance_locks l
    WHERE l.lock_token = p_lock_token;

    RETURN v_instance_id;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION enqueue_orchestration_work(p_instance_id text, p_work_item text, p_now_ms bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Legacy, not called by upstream's provider.
    INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
    VALUES (p_instance_id, p_work_item, to_timestamp(p_now_ms / 1000.0), to_timestamp(p_now_ms / 1000.0));
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION enqueue_completion(p_instance_id text, p_completion_json text, p_now_ms bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Legacy, not called by upstream's provider.
    INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
    VALUES (p_instance_id, p_completion_json, to_timestamp(p_now_ms / 1000.0), to_timestamp(p_now_ms / 1000.0));
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION enqueue_message(p_instance_id text, p_work_item text, p_visible_at_ms bigint, p_now_ms bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- Legacy, not called by upstream's provider.
    INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
    VALUES (p_instance_id, p_work_item, to_timestamp(p_visible_at_ms / 1000.0), to_timestamp(p_now_ms / 1000.0));
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION ack_orchestration(p_lock_token text, p_state_json jsonb, p_now_ms bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_now timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_instance_id text;
    v_status text;
BEGIN
    -- Legacy and dead (upstream quirk kept knowingly): instances has no
    -- status or completed_at column, so with a known token this function
    -- always fails with 42703 and changes nothing. Nothing calls it.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token';
    END IF;

    v_status := p_state_json ->> 'status';

    IF EXISTS (SELECT 1 FROM instances i WHERE i.instance_id = v_instance_id) THEN
        -- Fails: column "completed_at" does not exist.
        UPDATE instances
        SET status = v_status,
            completed_at = CASE WHEN v_status IN ('Completed', 'Failed') THEN v_now ELSE completed_at END,
            updated_at = v_now
        WHERE instance_id = v_instance_id;
    ELSE
        -- Fails: column "status" of relation "instances" does not exist.
        INSERT INTO instances (instance_id, orchestration_name, orchestration_version, status, created_at, updated_at)
        VALUES (v_instance_id, p_state_json ->> 'orchestration_name', p_state_json ->> 'orchestration_version',
                v_status, v_now, v_now);
    END IF;

    -- Never reached; would fail too (no event_id / event_type).
    INSERT INTO history (instance_id, execution_id, event_data, created_at)
    SELECT v_instance_id, (p_state_json ->> 'execution_id')::bigint, ev.value::text, v_now
    FROM jsonb_array_elements(p_state_json -> 'history') AS ev;

    DELETE FROM orchestrator_queue q
    WHERE q.lock_token = p_lock_token;

    DELETE FROM instance_locks l
    WHERE l.instance_id = v_instance_id
      AND l.lock_token = p_lock_token;
END;
$fn$;
-- +goose StatementEnd

DROP FUNCTION IF EXISTS ack_worker(text, text, text);

-- +goose StatementBegin
CREATE FUNCTION ack_worker(
    p_lock_token text,
    p_instance_id text DEFAULT NULL,
    p_completion_json text DEFAULT NULL,
    p_now_ms bigint DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    -- No expiry check in this version.
    DELETE FROM worker_queue w
    WHERE w.lock_token = p_lock_token;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Worker queue item not found or already processed';
    END IF;

    -- Hand the completion to the orchestration (none for a cancelled activity).
    IF p_completion_json IS NOT NULL THEN
        IF p_instance_id IS NULL THEN
            RAISE EXCEPTION 'p_instance_id is required when p_completion_json is provided';
        END IF;
        IF p_now_ms IS NULL THEN
            RAISE EXCEPTION 'p_now_ms is required when p_completion_json is provided';
        END IF;

        INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
        VALUES (p_instance_id, p_completion_json, to_timestamp(p_now_ms / 1000.0), to_timestamp(p_now_ms / 1000.0));
    END IF;
END;
$fn$;
-- +goose StatementEnd

INSERT INTO _duroxide_migrations (version, name) VALUES (6, '0006_use_rust_timestamps.sql');

-- +goose Down

DELETE FROM _duroxide_migrations WHERE version = 6;

DROP FUNCTION ack_worker(text, text, text, bigint);
DROP FUNCTION ack_orchestration(text, jsonb, bigint);
DROP FUNCTION enqueue_message(text, text, bigint, bigint);
DROP FUNCTION enqueue_completion(text, text, bigint);
DROP FUNCTION enqueue_orchestration_work(text, text, bigint);
DROP FUNCTION abandon_orchestration_item(text, bigint, bigint, boolean);
DROP FUNCTION abandon_work_item(text, bigint, bigint, boolean);
DROP FUNCTION enqueue_worker_work(text, bigint);

-- Re-create the version-5 forms, copied verbatim from the newest earlier
-- file defining each: enqueue_worker_work, abandon_orchestration_item and
-- ack_worker from 0002_create_stored_procedures.sql, abandon_work_item from
-- 0005_add_visible_at_to_worker_queue.sql.

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
