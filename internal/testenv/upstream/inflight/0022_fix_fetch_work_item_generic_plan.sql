-- Upstream's branch fix of the worker fetch's generic plan, port.
--
-- This is NOT upstream's text. duroxide-pg-migrations wrote it from the
-- facts published about upstream's branch file
-- migrations/0022_fix_fetch_work_item_generic_plan.sql (microsoft/duroxide-pg,
-- commit d89ec56, unreleased), in upstream's format, so that the tests can
-- meet a schema as a duroxide-pg release carrying that file would leave
-- it: applied the way upstream's runner applies a migration (comments cut,
-- one transaction, its row (22, '0022_fix_fetch_work_item_generic_plan.sql')
-- in _duroxide_migrations). Its function text, and so its fingerprint,
-- differs from upstream's.
--
-- Migration 0022: fix fetch_work_item generic plan
--
-- What it changes, as upstream's branch file does: the 4- and 6-argument
-- fetch_work_item are dropped, and the 6-argument one is created again
-- with version 16's behaviour (unchanged up to 23) and one more condition
-- in both candidate queries, with and without an owner:
--   q.visible_at <= statement_timestamp()
-- beside the caller's bound q.visible_at <= TO_TIMESTAMP(p_now_ms / 1000.0).
--
-- Why (upstream's reason): PL/pgSQL caches a generic plan after about
-- five calls of a session; in it the caller's bound is an unknown value,
-- and the plan walks the primary key in id order, reading every item
-- scheduled for later on every poll. statement_timestamp() is stable, so
-- the planner can estimate the second bound in a generic plan and read
-- idx_worker_visible up to it.
--
-- Trade (upstream's own caveat): a due item now also waits for the
-- database clock to reach its visible_at, so a worker whose clock runs
-- ahead of the database's sees it late by the skew.
--
-- Unchanged: the lease is p_now_ms + p_lock_timeout_ms, the claim an
-- UPDATE of the row the candidate query locked with FOR UPDATE OF q SKIP
-- LOCKED, the session insert-or-update and its undo as before.

DO $$
DECLARE
    v_schema_name TEXT := current_schema();
BEGIN
    EXECUTE format('DROP FUNCTION IF EXISTS %1$I.fetch_work_item(BIGINT, BIGINT, TEXT, BIGINT)', v_schema_name);
    EXECUTE format('DROP FUNCTION IF EXISTS %1$I.fetch_work_item(BIGINT, BIGINT, TEXT, BIGINT, TEXT[], TEXT)', v_schema_name);

    EXECUTE format($fmt$
CREATE FUNCTION %1$I.fetch_work_item(
    p_now_ms BIGINT,
    p_lock_timeout_ms BIGINT,
    p_owner_id TEXT DEFAULT NULL,
    p_session_lock_timeout_ms BIGINT DEFAULT NULL,
    p_tag_filter TEXT[] DEFAULT NULL,
    p_tag_mode TEXT DEFAULT 'default_only'
)
RETURNS TABLE(
    out_work_item TEXT,
    out_lock_token TEXT,
    out_attempt_count INTEGER
) AS $body$
DECLARE
    v_id BIGINT;
    v_session_id TEXT;
    v_work_item TEXT;
    v_attempt_count INTEGER;
    v_lock_token TEXT;
    v_session_until BIGINT;
    v_rows INTEGER;
BEGIN
    IF p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    IF p_owner_id IS NULL THEN
        -- No owner: items bound to a session are never eligible.
        SELECT q.id, q.session_id
        INTO v_id, v_session_id
        FROM %1$I.worker_queue q
        WHERE q.visible_at <= TO_TIMESTAMP(p_now_ms / 1000.0)
          AND q.visible_at <= statement_timestamp()
          AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms)
          AND q.session_id IS NULL
          AND (
                (p_tag_mode = 'default_only' AND q.tag IS NULL)
             OR (p_tag_mode = 'tags' AND q.tag = ANY(p_tag_filter))
             OR (p_tag_mode = 'default_and' AND (q.tag IS NULL OR q.tag = ANY(p_tag_filter)))
             OR (p_tag_mode = 'any')
          )
        ORDER BY q.id
        LIMIT 1
        FOR UPDATE OF q SKIP LOCKED;
    ELSE
        -- An owner: items without a session, items of a session this
        -- owner holds, items of a session nobody holds.
        SELECT q.id, q.session_id
        INTO v_id, v_session_id
        FROM %1$I.worker_queue q
        LEFT JOIN %1$I.sessions s
               ON s.session_id = q.session_id
              AND s.locked_until > p_now_ms
        WHERE q.visible_at <= TO_TIMESTAMP(p_now_ms / 1000.0)
          AND q.visible_at <= statement_timestamp()
          AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms)
          AND (q.session_id IS NULL
               OR s.worker_id = p_owner_id
               OR s.session_id IS NULL)
          AND (
                (p_tag_mode = 'default_only' AND q.tag IS NULL)
             OR (p_tag_mode = 'tags' AND q.tag = ANY(p_tag_filter))
             OR (p_tag_mode = 'default_and' AND (q.tag IS NULL OR q.tag = ANY(p_tag_filter)))
             OR (p_tag_mode = 'any')
          )
        ORDER BY q.id
        LIMIT 1
        FOR UPDATE OF q SKIP LOCKED;
    END IF;

    IF NOT FOUND THEN
        RETURN;
    END IF;

    v_lock_token := 'lock_' || gen_random_uuid()::TEXT;

    UPDATE %1$I.worker_queue
    SET lock_token = v_lock_token,
        locked_until = p_now_ms + p_lock_timeout_ms,
        attempt_count = attempt_count + 1
    WHERE id = v_id
    RETURNING work_item, attempt_count
    INTO v_work_item, v_attempt_count;

    IF p_owner_id IS NOT NULL AND v_session_id IS NOT NULL THEN
        v_session_until := p_now_ms + COALESCE(p_session_lock_timeout_ms, p_lock_timeout_ms);

        INSERT INTO %1$I.sessions (session_id, worker_id, locked_until, last_activity_at)
        VALUES (v_session_id, p_owner_id, v_session_until, p_now_ms)
        ON CONFLICT (session_id) DO UPDATE
        SET worker_id = EXCLUDED.worker_id,
            locked_until = EXCLUDED.locked_until,
            last_activity_at = EXCLUDED.last_activity_at
        WHERE %1$I.sessions.locked_until <= p_now_ms
           OR %1$I.sessions.worker_id = p_owner_id;

        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            -- Another owner took the session first: give the item back.
            UPDATE %1$I.worker_queue
            SET lock_token = NULL,
                locked_until = NULL,
                attempt_count = attempt_count - 1
            WHERE id = v_id;
            RETURN;
        END IF;
    END IF;

    out_work_item := v_work_item;
    out_lock_token := v_lock_token;
    out_attempt_count := v_attempt_count;
    RETURN NEXT;
END;
$body$ LANGUAGE plpgsql;
$fmt$, v_schema_name);

    RAISE NOTICE 'Migration 0022: fetch_work_item also bounds visibility by statement_timestamp(), so its cached generic plan can use idx_worker_visible';
END $$;
