-- Copyright (c) Microsoft Corporation.
-- Licensed under the MIT License.
--
-- Migration 0028: bound the batched worker fetch's leases by the database clock
--
-- What: fetch_work_items as 0022 (add batched worker fetch) defines it,
-- with two expressions changed and one constant added: the lease of each
-- item it takes (worker_queue.locked_until) and of each session it claims
-- (sessions.locked_until) run from the later of the caller's timestamp and
-- the database clock, but the database clock may move them later by at
-- most c_max_clock_lead_ms (30000 ms):
--
--     p_now_ms + LEAST(GREATEST(db_ms - p_now_ms, 0), c_max_clock_lead_ms)
--              + p_lock_timeout_ms
--
-- (the session's with COALESCE(p_session_lock_timeout_ms,
-- p_lock_timeout_ms) in place of p_lock_timeout_ms). Everything else is
-- 0022's: what is visible, whether an item's or a session's lease is live,
-- whether a session may be taken over, last_activity_at, the scan, the
-- tag modes, the isolation check and the indexes.
--
-- Why: the lease was p_now_ms + p_lock_timeout_ms, and the provider takes
-- p_now_ms before its statement has a pooled connection. With p_now_ms
-- 10 s stale and a 5 s lock timeout, the item's lease ended 5 s before the
-- function returned, and the worker's ack with that token fails. With
-- this change the lease has 5 s left by the database clock.
--
-- The bound, and what it costs: as in 0027. 30000 ms is the provider's
-- sqlx pool acquire timeout, so every wait a fetch survives is within it;
-- beyond it the lease is 0022's plus 30 s; a crashed worker's item is
-- available again at most c_max_clock_lead_ms + p_lock_timeout_ms after
-- its claim, by the caller's clock.
--
-- Rolling upgrade: same signature, defaults and result; workers running
-- 0022 and workers running this version respect each other's leases.

DO $$
DECLARE
    v_schema_name TEXT := current_schema();
BEGIN
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
    c_max_clock_lead_ms CONSTANT BIGINT := 30000;
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
                    p_now_ms + LEAST(GREATEST((EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT - p_now_ms, 0), c_max_clock_lead_ms)
                    + COALESCE(p_session_lock_timeout_ms, p_lock_timeout_ms), p_now_ms)
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
            locked_until = p_now_ms + LEAST(GREATEST((EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT - p_now_ms, 0), c_max_clock_lead_ms) + p_lock_timeout_ms,
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

    RAISE NOTICE 'Migration 0028: fetch_work_items leases run from the later of the caller''s clock and the database clock, the database clock leading by at most 30000 ms';
END $$;
