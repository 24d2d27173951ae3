-- Upstream's batched worker fetch, port.
--
-- This is NOT upstream's text. duroxide-pg-migrations wrote it from the
-- facts published about upstream's branch file
-- migrations/0022_add_batched_worker_fetch.sql (microsoft/duroxide-pg,
-- commit d4d15e6, branch waldemort/batched-worker-fetch-pg, unreleased),
-- in upstream's format, so that the tests can meet a schema as a
-- duroxide-pg release carrying that file would leave it: applied the way
-- upstream's runner applies a migration (comments cut, one transaction,
-- its row (22, '0022_add_batched_worker_fetch.sql') in
-- _duroxide_migrations). Its function text, and so its fingerprint,
-- differs from upstream's; where the facts leave a detail open (the exact
-- index columns, the order of the steps of one claim) this port chose one.
--
-- Migration 0022: add batched worker fetch
--
-- What it adds, as upstream's branch file does:
--   * fetch_work_items(p_now_ms, p_lock_timeout_ms, p_owner_id,
--     p_session_lock_timeout_ms, p_tag_filter, p_tag_mode, p_max_items,
--     p_max_new_sessions): up to p_max_items worker items in one call,
--     as rows (out_work_item, out_lock_token, out_attempt_count).
--       - it refuses to run unless the transaction is read committed;
--       - no row for p_max_items <= 0 or tag mode 'none';
--       - it reads up to LEAST(GREATEST(p_max_items * 4, p_max_items), 1024)
--         candidates, ORDER BY session_id NULLS FIRST, id, locked with
--         FOR UPDATE OF q SKIP LOCKED; eligibility and tag modes are
--         fetch_work_item's (sessions joined the same way);
--       - it claims at most p_max_new_sessions sessions it does not hold
--         yet per call (an insert-or-update of the session row with
--         locked_until = p_now_ms + COALESCE(session timeout, lock
--         timeout)), and skips an item whose session another worker owns;
--       - each item it takes gets a token 'lock_' || uuid, locked_until =
--         p_now_ms + p_lock_timeout_ms and attempt_count + 1, by an UPDATE
--         ... RETURNING.
--   * four partial indexes on worker_queue: the unlocked items without a
--     session or tag, the unlocked items of a session, the unlocked tagged
--     items, and the leased items by locked_until.
--
-- The provider calls it when the runtime asks for a batch.

DO $$
DECLARE
    v_schema_name TEXT := current_schema();
BEGIN
    EXECUTE format('CREATE INDEX IF NOT EXISTS idx_worker_queue_fetch_default_unlocked ON %1$I.worker_queue (id) WHERE lock_token IS NULL AND session_id IS NULL AND tag IS NULL', v_schema_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS idx_worker_queue_fetch_session_unlocked ON %1$I.worker_queue (session_id, id) WHERE lock_token IS NULL AND session_id IS NOT NULL', v_schema_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS idx_worker_queue_fetch_tag_unlocked ON %1$I.worker_queue (tag, id) WHERE lock_token IS NULL AND tag IS NOT NULL', v_schema_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS idx_worker_queue_lock_expiry ON %1$I.worker_queue (locked_until) WHERE lock_token IS NOT NULL', v_schema_name);

    EXECUTE format($fmt$
CREATE OR REPLACE FUNCTION %1$I.fetch_work_items(
    p_now_ms BIGINT,
    p_lock_timeout_ms BIGINT,
    p_owner_id TEXT DEFAULT NULL,
    p_session_lock_timeout_ms BIGINT DEFAULT NULL,
    p_tag_filter TEXT[] DEFAULT NULL,
    p_tag_mode TEXT DEFAULT 'default_only',
    p_max_items INTEGER DEFAULT 1,
    p_max_new_sessions INTEGER DEFAULT 0
)
RETURNS TABLE(
    out_work_item TEXT,
    out_lock_token TEXT,
    out_attempt_count INTEGER
) AS $body$
DECLARE
    v_scan_limit INTEGER;
    v_taken INTEGER := 0;
    v_new_sessions INTEGER := 0;
    v_held TEXT[] := ARRAY[]::TEXT[];
    v_refused TEXT[] := ARRAY[]::TEXT[];
    v_candidate RECORD;
    v_rows INTEGER;
    v_lock_token TEXT;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fetch_work_items requires READ COMMITTED isolation, got %%',
            current_setting('transaction_isolation');
    END IF;

    IF p_max_items <= 0 OR p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    v_scan_limit := LEAST(GREATEST(p_max_items * 4, p_max_items), 1024);

    FOR v_candidate IN
        SELECT q.id, q.session_id, s.worker_id AS live_owner
        FROM %1$I.worker_queue q
        LEFT JOIN %1$I.sessions s
               ON s.session_id = q.session_id
              AND s.locked_until > p_now_ms
        WHERE q.visible_at <= TO_TIMESTAMP(p_now_ms / 1000.0)
          AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms)
          AND (
                q.session_id IS NULL
             OR (p_owner_id IS NOT NULL AND (s.session_id IS NULL OR s.worker_id = p_owner_id))
          )
          AND (
                (p_tag_mode = 'default_only' AND q.tag IS NULL)
             OR (p_tag_mode = 'tags' AND q.tag = ANY(p_tag_filter))
             OR (p_tag_mode = 'default_and' AND (q.tag IS NULL OR q.tag = ANY(p_tag_filter)))
             OR (p_tag_mode = 'any')
          )
        ORDER BY q.session_id NULLS FIRST, q.id
        LIMIT v_scan_limit
        FOR UPDATE OF q SKIP LOCKED
    LOOP
        EXIT WHEN v_taken >= p_max_items;

        IF v_candidate.session_id IS NOT NULL
           AND NOT (v_candidate.session_id = ANY(v_held)) THEN
            IF v_candidate.session_id = ANY(v_refused) THEN
                CONTINUE;
            END IF;
            IF v_candidate.live_owner IS NULL THEN
                IF v_new_sessions >= p_max_new_sessions THEN
                    CONTINUE;
                END IF;
            END IF;

            INSERT INTO %1$I.sessions (session_id, worker_id, locked_until, last_activity_at)
            VALUES (v_candidate.session_id, p_owner_id,
                    p_now_ms + COALESCE(p_session_lock_timeout_ms, p_lock_timeout_ms), p_now_ms)
            ON CONFLICT (session_id) DO UPDATE
            SET worker_id = EXCLUDED.worker_id,
                locked_until = EXCLUDED.locked_until,
                last_activity_at = EXCLUDED.last_activity_at
            WHERE %1$I.sessions.locked_until <= p_now_ms
               OR %1$I.sessions.worker_id = p_owner_id;

            GET DIAGNOSTICS v_rows = ROW_COUNT;
            IF v_rows = 0 THEN
                v_refused := array_append(v_refused, v_candidate.session_id);
                CONTINUE;
            END IF;
            v_held := array_append(v_held, v_candidate.session_id);
            IF v_candidate.live_owner IS NULL THEN
                v_new_sessions := v_new_sessions + 1;
            END IF;
        END IF;

        v_lock_token := 'lock_' || gen_random_uuid()::TEXT;

        UPDATE %1$I.worker_queue q
        SET lock_token = v_lock_token,
            locked_until = p_now_ms + p_lock_timeout_ms,
            attempt_count = q.attempt_count + 1
        WHERE q.id = v_candidate.id
        RETURNING q.work_item, q.lock_token, q.attempt_count
        INTO out_work_item, out_lock_token, out_attempt_count;

        v_taken := v_taken + 1;
        RETURN NEXT;
    END LOOP;
END;
$body$ LANGUAGE plpgsql;
$fmt$, v_schema_name);

    RAISE NOTICE 'Migration 0022: added fetch_work_items (batched worker fetch) and its partial indexes on worker_queue';
END $$;
