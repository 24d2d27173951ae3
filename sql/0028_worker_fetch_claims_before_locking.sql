-- 0028_worker_fetch_claims_before_locking.sql
-- Fixes: fetch_work_item
-- Leaves: fetch_work_item as upstream 22
--
-- Not an upstream migration: this pack's second fix of the worker queue's
-- fetch, after 0025. Records nothing in _duroxide_migrations.
--
-- What: redefines fetch_work_item with 0025's signature, defaults, RETURNS
-- TABLE, clock model, session handling, leases and bounds; only the way a
-- call takes its candidate item changes.
--
-- Why: 0025 still waited, rarely, on another fetch. Its candidate query
-- locks the lowest claimable row with FOR UPDATE SKIP LOCKED through the
-- statement's snapshot. When the row version that snapshot saw has just
-- been updated by a fetch that committed its lease (between the visibility
-- test and the lock), PostgreSQL locks the version seen and then walks the
-- row's update chain to lock the newer versions too, and that walk waits
-- for a transaction holding a newer version without regard to SKIP LOCKED
-- (heap_lock_updated_tuple). The newer version is held by a third call that
-- locked it in its own candidate scan, found it leased on its re-check and
-- keeps the lock until its call ends. Measured with 16 fetchers (the worker
-- test, log_lock_waits = on, deadlock_timeout = 1ms, 200 runs each):
-- 7 fetches waiting 4-64 ms on PostgreSQL 15, 10 waiting 4-49 ms on 16, and
-- 779 and 981 ack_worker calls waiting (median about 8 ms) at their DELETE
-- on fetches holding the row being acked, which they would never take.
-- The lease is written after the wait (0025's clock model), so no lease is
-- shortened; the wait is latency, and one fetch's lock on a row it does not
-- take holding up another's ack.
--
-- The fix: the candidate query reads without a row lock, leaving out the
-- items this call already tried; the call claims the item with
-- pg_try_advisory_xact_lock(1401, item id folded into an integer) (class
-- 1400 is 0025's session claim, 2700 0027's queue heads, the one-key space
-- 0020's instance locks) and moves on when another call holds it; then a
-- new statement, whose snapshot follows the claim, re-checks the row
-- (visible and unleased by the caller's clock carried forward) and locks
-- it with FOR UPDATE SKIP LOCKED. A row some call leased meanwhile fails
-- the re-check before it is locked, so no call locks a row it does not
-- take, and no update chain is walked. A collision on an item counts
-- against 0025's bound of 32 tries, as a contended session does. Two items
-- whose ids fold to the same integer only make one call skip the other
-- once. With the same 200 runs on 15 and on 16: no fetch waited.
--
-- Which fetch it replaces: upstream's text (16-23), the pack's 0016 text,
-- 0025's fix, or this fix (installed again); anything else fails with
-- SQLSTATE 55000 and changes nothing, as 0025's guard.
--
-- Upstream's branch fix of the same function's generic plan (its branch
-- file 0022_fix_fetch_work_item_generic_plan.sql, unreleased; the port the
-- pack's tests use) is known too and left as it is (behaves_as 22): its
-- candidate query has a second bound, on the database clock, that the
-- plan PL/pgSQL caches after five calls can use, and this fix's has not,
-- so installing this fix over it would undo a change of upstream's. 0031,
-- whose plan sees its bound, installs the pack's fix over it.
--
-- Down identifies the definition the same way and restores 0025's fix over
-- any definition of version 19's behaviour, leaves upstream's branch fix as
-- it is, and refuses an unknown one.
--
-- Locks: no table lock: it only replaces functions (a call in flight finishes
-- on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only replaces a function (a call in flight
-- finishes on the old text, the next call uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up
-- +goose StatementBegin
DO $guard$
DECLARE
    v_function record;
    v_raw text;
    v_normalized text;
    v_definition text;
    v_behaves_as integer;
BEGIN
    FOR v_function IN
        SELECT f.name, f.arguments
        FROM (VALUES
            ('fetch_work_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text')
        ) AS f(name, arguments)
    LOOP
        SELECT md5(p.prosrc), md5(replace(p.prosrc, n.nspname || '.', '@schema@.'))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND THEN
            RAISE EXCEPTION '0028: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition, k.behaves_as INTO v_definition, v_behaves_as
        FROM (VALUES
            ('fetch_work_item', '5d3e664fd9550cee498ff683f89ab5a4', 'upstream 16-23', 19, false),
            ('fetch_work_item', '312d6f164b022ab783b7ce4a9ac3e1e8', 'pack 0016', 19, false),
            ('fetch_work_item', '0824e901fca4ea95922a3ab8856bcd81', 'pack 0025 fix', 19, true),
            ('fetch_work_item', '4cc18c70dcdb8fa716f37e121b074580', 'pack 0028 fix', 19, true),
            ('fetch_work_item', 'e565496d53e1b807954d6fe004d40772', 'upstream branch 0022 generic-plan fix, port', 22, false)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0028: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        IF v_behaves_as >= 22 THEN
            -- Upstream's branch fix of the generic plan (its 0022): its
            -- candidate query has a bound the cached plan can use, which
            -- this fix's has not. Left as it is; 0031 installs the pack's
            -- fix, whose plan sees its bound, over it.
            RAISE NOTICE '0028: % is %; its cached plan sees a visibility bound this fix''s does not: left as it is (0031 installs the pack''s fix over it)', v_function.name, v_definition;
            RETURN;
        END IF;
        RAISE NOTICE '0028: % was %; installing the fix', v_function.name, v_definition;
    END LOOP;
CREATE OR REPLACE FUNCTION fetch_work_item(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_owner_id text DEFAULT NULL,
    p_session_lock_timeout_ms bigint DEFAULT NULL,
    p_tag_filter text[] DEFAULT NULL,
    p_tag_mode text DEFAULT 'default_only'
)
RETURNS TABLE(out_work_item text, out_lock_token text, out_attempt_count integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- At most this many sessions are tried per call.
    c_max_candidates CONSTANT integer := 32;
    -- Longest lease accepted: one day.
    c_max_lock_timeout_ms CONSTANT bigint := 86400000;
    -- Advisory lock class of session claims, in the two-key space (the
    -- orchestration fetch's instance locks use the one-key space).
    c_session_claim CONSTANT integer := 1400;
    -- Advisory lock class of item claims, next to the sessions' (two-key
    -- space): the second key is the item id folded into an integer.
    c_item_claim CONSTANT integer := 1401;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;       -- database clock, read just before returning
    v_lease_start bigint;
    v_tried text[] := '{}';
    v_tried_items bigint[] := ARRAY[]::bigint[];
    v_id bigint;
    v_session_id text;
    v_session_owner text;
    v_session_until bigint;
    v_session_activity bigint;
    v_lock_token text;
BEGIN
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'fetch_work_item: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_lock_timeout_ms IS NULL OR p_lock_timeout_ms <= 0 OR p_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_lock_timeout_ms must be between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_session_lock_timeout_ms <= 0 OR p_session_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_session_lock_timeout_ms must be NULL or between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_session_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;

    IF p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

    FOR v_attempt IN 1..c_max_candidates LOOP
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        v_session_id := NULL;

        -- Candidate: the lowest id that is visible and unleased by the
        -- caller's clock, row-locked without waiting (SKIP LOCKED).
        IF p_owner_id IS NULL THEN
            -- Without an owner, session-bound items are never eligible.
            SELECT q.id INTO v_id
            FROM worker_queue q
            WHERE q.visible_at <= to_timestamp(v_now_ms / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND q.session_id IS NULL
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
              AND NOT (q.id = ANY (v_tried_items))
            ORDER BY q.id
            LIMIT 1;
        ELSE
            -- With an owner: items without a session, items of a live
            -- session this owner holds, and items of a session with no live
            -- row, leaving out the sessions this call already skipped.
            SELECT q.id, q.session_id INTO v_id, v_session_id
            FROM worker_queue q
            LEFT JOIN sessions s
                   ON s.session_id = q.session_id
                  AND s.locked_until > v_now_ms
            WHERE q.visible_at <= to_timestamp(v_now_ms / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND (q.session_id IS NULL
                   OR ((s.worker_id = p_owner_id OR s.session_id IS NULL)
                       AND NOT (q.session_id = ANY (v_tried))))
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
              AND NOT (q.id = ANY (v_tried_items))
            ORDER BY q.id
            LIMIT 1;
        END IF;

        IF NOT FOUND THEN
            RETURN;  -- nothing claimable
        END IF;

        -- Claim the item without waiting (an advisory try-lock: another
        -- call trying the same item moves on), then lock its row in a new
        -- statement, whose snapshot is taken after the claim: a row another
        -- call leased meanwhile is rejected by the re-check before it is
        -- locked, so no call locks a row it does not take, and none waits
        -- on the newer version of a row it saw (see the header).
        v_tried_items := v_tried_items || v_id;
        IF NOT pg_try_advisory_xact_lock(c_item_claim, (v_id % 2147483647)::integer) THEN
            CONTINUE;
        END IF;
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        PERFORM 1 FROM worker_queue q
         WHERE q.id = v_id
           AND q.visible_at <= to_timestamp(v_now_ms / 1000.0)
           AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;

        -- Claim (or keep) the item's session for this owner, never waiting
        -- on it: a session another call is claiming, or whose row another
        -- session holds (a renewal, an activity stamp, a cleanup), is
        -- skipped with all its items, and the next candidate is tried.
        IF v_session_id IS NOT NULL THEN
            v_tried := v_tried || v_session_id;
            IF NOT pg_try_advisory_xact_lock(c_session_claim, hashtext(v_session_id)) THEN
                CONTINUE;
            END IF;

            SELECT s.worker_id, s.locked_until, s.last_activity_at
              INTO v_session_owner, v_session_until, v_session_activity
            FROM sessions s
            WHERE s.session_id = v_session_id
            FOR UPDATE SKIP LOCKED;

            IF FOUND THEN
                v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
                IF v_session_until > v_now_ms AND v_session_owner <> p_owner_id THEN
                    CONTINUE;  -- another owner took it since the candidate query
                END IF;
                IF v_session_owner <> p_owner_id THEN
                    -- An expired session of another owner: nothing of it is kept.
                    v_session_until := NULL;
                    v_session_activity := NULL;
                END IF;
            ELSE
                IF EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = v_session_id) THEN
                    CONTINUE;  -- the row exists and another session holds it
                END IF;
                -- No row: create it (the lease is written below). Only a
                -- call holding the claim lock inserts, so this cannot wait.
                INSERT INTO sessions (session_id, worker_id, locked_until, last_activity_at)
                VALUES (v_session_id, p_owner_id, p_now_ms, p_now_ms)
                ON CONFLICT (session_id) DO NOTHING;
                IF NOT FOUND THEN
                    CONTINUE;
                END IF;
                v_session_until := NULL;
                v_session_activity := NULL;
            END IF;
        END IF;

        -- The leases start now, after every step that could take time: the
        -- later of the caller's clock and the database's, plus the timeout.
        v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
        v_lease_start := greatest(v_now_ms, v_db_ms);

        IF v_session_id IS NOT NULL THEN
            -- A session this owner already holds keeps a later expiry and a
            -- later activity stamp than these.
            UPDATE sessions
               SET worker_id = p_owner_id,
                   locked_until = greatest(v_session_until,
                       v_lease_start + coalesce(p_session_lock_timeout_ms, p_lock_timeout_ms)),
                   last_activity_at = greatest(v_session_activity, v_now_ms)
             WHERE session_id = v_session_id;
        END IF;

        v_lock_token := 'lock_' || gen_random_uuid()::text;
        UPDATE worker_queue
           SET lock_token = v_lock_token,
               locked_until = v_lease_start + p_lock_timeout_ms,
               attempt_count = attempt_count + 1
         WHERE id = v_id
        RETURNING work_item, attempt_count INTO out_work_item, out_attempt_count;

        out_lock_token := v_lock_token;
        RETURN NEXT;
        RETURN;
    END LOOP;
    -- Every session tried was contended: no row, the caller polls again.
END;
$fn$;
END;
$guard$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $guard$
DECLARE
    v_function record;
    v_raw text;
    v_normalized text;
    v_definition text;
    v_behaves_as integer;
BEGIN
    FOR v_function IN
        SELECT f.name, f.arguments
        FROM (VALUES
            ('fetch_work_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text')
        ) AS f(name, arguments)
    LOOP
        SELECT md5(p.prosrc), md5(replace(p.prosrc, n.nspname || '.', '@schema@.'))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND THEN
            RAISE EXCEPTION '0028: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition, k.behaves_as INTO v_definition, v_behaves_as
        FROM (VALUES
            ('fetch_work_item', '5d3e664fd9550cee498ff683f89ab5a4', 'upstream 16-23', 19, false),
            ('fetch_work_item', '312d6f164b022ab783b7ce4a9ac3e1e8', 'pack 0016', 19, false),
            ('fetch_work_item', '0824e901fca4ea95922a3ab8856bcd81', 'pack 0025 fix', 19, true),
            ('fetch_work_item', '4cc18c70dcdb8fa716f37e121b074580', 'pack 0028 fix', 19, true),
            ('fetch_work_item', 'e565496d53e1b807954d6fe004d40772', 'upstream branch 0022 generic-plan fix, port', 22, false)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0028: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        IF v_behaves_as >= 22 THEN
            RAISE NOTICE '0028: % is %, which does not carry this fix: left as it is', v_function.name, v_definition;
            RETURN;
        END IF;
        RAISE NOTICE '0028: % was %; restoring 0025''s fix', v_function.name, v_definition;
    END LOOP;
CREATE OR REPLACE FUNCTION fetch_work_item(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_owner_id text DEFAULT NULL,
    p_session_lock_timeout_ms bigint DEFAULT NULL,
    p_tag_filter text[] DEFAULT NULL,
    p_tag_mode text DEFAULT 'default_only'
)
RETURNS TABLE(out_work_item text, out_lock_token text, out_attempt_count integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- At most this many sessions are tried per call.
    c_max_candidates CONSTANT integer := 32;
    -- Longest lease accepted: one day.
    c_max_lock_timeout_ms CONSTANT bigint := 86400000;
    -- Advisory lock class of session claims, in the two-key space (the
    -- orchestration fetch's instance locks use the one-key space).
    c_session_claim CONSTANT integer := 1400;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;       -- database clock, read just before returning
    v_lease_start bigint;
    v_tried text[] := '{}';
    v_id bigint;
    v_session_id text;
    v_session_owner text;
    v_session_until bigint;
    v_session_activity bigint;
    v_lock_token text;
BEGIN
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'fetch_work_item: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_lock_timeout_ms IS NULL OR p_lock_timeout_ms <= 0 OR p_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_lock_timeout_ms must be between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_session_lock_timeout_ms <= 0 OR p_session_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_session_lock_timeout_ms must be NULL or between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_session_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;

    IF p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

    FOR v_attempt IN 1..c_max_candidates LOOP
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        v_session_id := NULL;

        -- Candidate: the lowest id that is visible and unleased by the
        -- caller's clock, row-locked without waiting (SKIP LOCKED).
        IF p_owner_id IS NULL THEN
            -- Without an owner, session-bound items are never eligible.
            SELECT q.id INTO v_id
            FROM worker_queue q
            WHERE q.visible_at <= to_timestamp(v_now_ms / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND q.session_id IS NULL
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
            ORDER BY q.id
            LIMIT 1
            FOR UPDATE OF q SKIP LOCKED;
        ELSE
            -- With an owner: items without a session, items of a live
            -- session this owner holds, and items of a session with no live
            -- row, leaving out the sessions this call already skipped.
            SELECT q.id, q.session_id INTO v_id, v_session_id
            FROM worker_queue q
            LEFT JOIN sessions s
                   ON s.session_id = q.session_id
                  AND s.locked_until > v_now_ms
            WHERE q.visible_at <= to_timestamp(v_now_ms / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND (q.session_id IS NULL
                   OR ((s.worker_id = p_owner_id OR s.session_id IS NULL)
                       AND NOT (q.session_id = ANY (v_tried))))
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
            ORDER BY q.id
            LIMIT 1
            FOR UPDATE OF q SKIP LOCKED;
        END IF;

        IF NOT FOUND THEN
            RETURN;  -- nothing claimable
        END IF;

        -- Claim (or keep) the item's session for this owner, never waiting
        -- on it: a session another call is claiming, or whose row another
        -- session holds (a renewal, an activity stamp, a cleanup), is
        -- skipped with all its items, and the next candidate is tried.
        IF v_session_id IS NOT NULL THEN
            v_tried := v_tried || v_session_id;
            IF NOT pg_try_advisory_xact_lock(c_session_claim, hashtext(v_session_id)) THEN
                CONTINUE;
            END IF;

            SELECT s.worker_id, s.locked_until, s.last_activity_at
              INTO v_session_owner, v_session_until, v_session_activity
            FROM sessions s
            WHERE s.session_id = v_session_id
            FOR UPDATE SKIP LOCKED;

            IF FOUND THEN
                v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
                IF v_session_until > v_now_ms AND v_session_owner <> p_owner_id THEN
                    CONTINUE;  -- another owner took it since the candidate query
                END IF;
                IF v_session_owner <> p_owner_id THEN
                    -- An expired session of another owner: nothing of it is kept.
                    v_session_until := NULL;
                    v_session_activity := NULL;
                END IF;
            ELSE
                IF EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = v_session_id) THEN
                    CONTINUE;  -- the row exists and another session holds it
                END IF;
                -- No row: create it (the lease is written below). Only a
                -- call holding the claim lock inserts, so this cannot wait.
                INSERT INTO sessions (session_id, worker_id, locked_until, last_activity_at)
                VALUES (v_session_id, p_owner_id, p_now_ms, p_now_ms)
                ON CONFLICT (session_id) DO NOTHING;
                IF NOT FOUND THEN
                    CONTINUE;
                END IF;
                v_session_until := NULL;
                v_session_activity := NULL;
            END IF;
        END IF;

        -- The leases start now, after every step that could take time: the
        -- later of the caller's clock and the database's, plus the timeout.
        v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
        v_lease_start := greatest(v_now_ms, v_db_ms);

        IF v_session_id IS NOT NULL THEN
            -- A session this owner already holds keeps a later expiry and a
            -- later activity stamp than these.
            UPDATE sessions
               SET worker_id = p_owner_id,
                   locked_until = greatest(v_session_until,
                       v_lease_start + coalesce(p_session_lock_timeout_ms, p_lock_timeout_ms)),
                   last_activity_at = greatest(v_session_activity, v_now_ms)
             WHERE session_id = v_session_id;
        END IF;

        v_lock_token := 'lock_' || gen_random_uuid()::text;
        UPDATE worker_queue
           SET lock_token = v_lock_token,
               locked_until = v_lease_start + p_lock_timeout_ms,
               attempt_count = attempt_count + 1
         WHERE id = v_id
        RETURNING work_item, attempt_count INTO out_work_item, out_attempt_count;

        out_lock_token := v_lock_token;
        RETURN NEXT;
        RETURN;
    END LOOP;
    -- Every session tried was contended: no row, the caller polls again.
END;
$fn$;
END;
$guard$;
-- +goose StatementEnd
