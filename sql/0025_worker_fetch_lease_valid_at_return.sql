-- 0025_worker_fetch_lease_valid_at_return.sql
-- Fixes: fetch_work_item
-- Leaves: fetch_work_item as upstream 22
--
-- Not an upstream migration: this pack's fix of the worker queue's fetch,
-- the activity-side twin of 0020. Records nothing in _duroxide_migrations.
--
-- What: redefines fetch_work_item with the same signature, defaults and
-- RETURNS TABLE, and the same results and side effects for the same
-- database state when nothing contends (only the lock token and the lease
-- and activity times differ).
--
-- Why: at version 19 (unchanged by upstream up to 23) the function
--   1. writes the item lease, and computes the session lease, from p_now_ms,
--      a time the caller minted before the call, and then can WAIT: the
--      sessions insert-or-update blocks on any transaction holding that
--      session's row (another fetch's upsert, a renewal, an activity stamp,
--      a cleanup) or inserting it. After a wait of W ms, or with a p_now_ms
--      that is W ms stale, the lease it returns has lost W ms; with W above
--      the lock timeout it is dead at return and the activity's ack_worker
--      is refused ('Worker queue item not found or already processed');
--   2. the session row is one contention point for every fetcher that
--      picked any item of that session: they all queue behind it, then
--      return nothing;
--   3. the session upsert replaces the expiry without comparing: it can
--      shorten a later expiry the same owner holds (one a renewal it waited
--      on just wrote).
--
-- The fix:
--   * Never wait on a session. A call first takes a transaction-scoped
--     advisory lock on the session id (pg_try_advisory_xact_lock, class
--     1400 of the two-key space, so it never meets 0020's instance locks),
--     then the session row with SKIP LOCKED. A session another call is
--     claiming, or whose row another transaction holds, is skipped with
--     all its items, and the next candidate is tried in the same call.
--     Only a call holding the claim lock inserts a session row, so the
--     insert cannot wait on an in-flight insert either.
--   * Bounded. At most 32 sessions are tried per call (a session is
--     skipped only while another transaction holds it, so 32 covers a
--     fleet of 32 workers contending on the oldest sessions), then the call
--     returns no row. Items without a session, and a fetcher without an
--     owner, need one candidate, as at 19.
--   * Clock model, as 0020's: "now" for every visibility, lease and
--     session-liveness decision is the caller's clock carried forward
--     (p_now_ms plus the time elapsed since the statement started), re-read
--     after every step that can take time. The leases are written last, as
--     the later of that caller-clock now and the database clock, plus the
--     timeout: the item lease with p_lock_timeout_ms, the session lease with
--     p_session_lock_timeout_ms (or p_lock_timeout_ms). They are valid when
--     returned by both clocks, so a caller whose clock runs ahead still acks
--     within its own lease.
--   * Never shorter. A session this owner already holds keeps a later
--     expiry and a later last_activity_at than the call's; last_activity_at
--     is otherwise the caller's clock carried forward.
--   * Bad input is rejected with SQLSTATE 22023 naming the parameter:
--     p_now_ms NULL or negative; p_lock_timeout_ms NULL, <= 0 or above one
--     day; p_session_lock_timeout_ms <= 0 or above one day (NULL still
--     means p_lock_timeout_ms). Version 19 returned no row for a NULL
--     p_now_ms and handed out leases already expired for a non-positive
--     timeout.
--
-- Audit of every function that writes a lease, an expiry or a delay (the
-- worker path and the orchestration renewal; fetch_orchestration_item and
-- ack_orchestration_item are 0020's and 0021's):
--   fetch_work_item                 stale lease and a wait on the session row: fixed here.
--   renew_work_item_lock            expiry computed before its row-lock wait, may shorten: fixed by 0026.
--   renew_session_lock              expiry computed before its row-lock waits, may shorten: fixed by 0026.
--   renew_orchestration_item_lock   expiry computed before its row-lock wait, may shorten: fixed by 0026.
--   abandon_work_item               writes no lease; its delay counts from p_now_ms, so a delay can end
--                                   early by the time it waited: a re-delivery slightly early, never
--                                   two holders. Left as upstream's.
--   abandon_orchestration_item      the same. Left as upstream's.
--   ack_worker                      writes no lease; after a wait it re-checks the token against the
--                                   newest row, so a re-claimed item is refused. Left as upstream's.
--   cleanup_orphaned_sessions       writes no lease; after a wait it re-checks locked_until, so a
--                                   renewed session is kept. Left as upstream's.
--   enqueue_worker_work, enqueue_orchestrator_work, get_queue_depths: no lease, no wait.
--
-- Which fetch it fixes. Upstream has not changed fetch_work_item since its
-- version 16 (19, 20, 21 and 23 have the same text), so one fixed definition
-- serves every database from 19 on. The guard below first identifies the
-- installed definition by its fingerprint (the md5 of its source, the
-- schema's name replaced by @schema@, as the fingerprint package of the
-- harness computes it): upstream's text, the pack's 0016 text, or this fix (installed again,
-- no change). Anything else makes it fail with SQLSTATE 55000 naming the
-- function, and the transaction changes nothing.
--
-- Upstream's branch fix of the same function's generic plan (its branch
-- file 0022_fix_fetch_work_item_generic_plan.sql, unreleased; the port the
-- pack's tests use) is known too and left as it is (behaves_as 22): its
-- candidate query has a second bound, on the database clock, that the
-- plan PL/pgSQL caches after five calls can use, and this fix's has not,
-- so installing this fix over it would undo a change of upstream's. 0031,
-- whose plan sees its bound, installs the pack's fix over it.
--
-- Down identifies the definition the same way and restores version 19's
-- definition (the pack's 0016 text, behaviourally identical to upstream's)
-- over the fix or a 19 definition, leaves upstream's branch fix as it is,
-- and refuses an unknown one.
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
            RAISE EXCEPTION '0025: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition, k.behaves_as INTO v_definition, v_behaves_as
        FROM (VALUES
            ('fetch_work_item', '5d3e664fd9550cee498ff683f89ab5a4', 'upstream 16-23', 19, false),
            ('fetch_work_item', '312d6f164b022ab783b7ce4a9ac3e1e8', 'pack 0016', 19, false),
            ('fetch_work_item', '0824e901fca4ea95922a3ab8856bcd81', 'pack 0025 fix', 19, true),
            ('fetch_work_item', 'e565496d53e1b807954d6fe004d40772', 'upstream branch 0022 generic-plan fix, port', 22, false)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0025: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        IF v_behaves_as >= 22 THEN
            -- Upstream's branch fix of the generic plan (its 0022): its
            -- candidate query has a bound the cached plan can use, which
            -- this fix's has not. Left as it is; 0031 installs the pack's
            -- fix, whose plan sees its bound, over it.
            RAISE NOTICE '0025: % is %; its cached plan sees a visibility bound this fix''s does not: left as it is (0031 installs the pack''s fix over it)', v_function.name, v_definition;
            RETURN;
        END IF;
        RAISE NOTICE '0025: % was %; installing the fix', v_function.name, v_definition;
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
            RAISE EXCEPTION '0025: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition, k.behaves_as INTO v_definition, v_behaves_as
        FROM (VALUES
            ('fetch_work_item', '5d3e664fd9550cee498ff683f89ab5a4', 'upstream 16-23', 19, false),
            ('fetch_work_item', '312d6f164b022ab783b7ce4a9ac3e1e8', 'pack 0016', 19, false),
            ('fetch_work_item', '0824e901fca4ea95922a3ab8856bcd81', 'pack 0025 fix', 19, true),
            ('fetch_work_item', 'e565496d53e1b807954d6fe004d40772', 'upstream branch 0022 generic-plan fix, port', 22, false)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0025: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        IF v_behaves_as >= 22 THEN
            RAISE NOTICE '0025: % is %, which does not carry this fix: left as it is', v_function.name, v_definition;
            RETURN;
        END IF;
        RAISE NOTICE '0025: % was %; restoring version 19''s definition', v_function.name, v_definition;
    END LOOP;
    -- Restore version 19's definition, verbatim from 0016_add_activity_tags.sql.
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
    v_now_ts timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_id bigint;
    v_session_id text;
    v_lock_token text;
    v_work_item text;
    v_attempt_count integer;
    v_session_locked_until bigint;
    v_row_count bigint;
BEGIN
    IF p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    -- Candidate: the lowest id that is visible and unleased, row-locked
    -- without waiting (SKIP LOCKED).
    IF p_owner_id IS NULL THEN
        -- Without an owner, session-bound items are never eligible.
        SELECT q.id, q.session_id INTO v_id, v_session_id
        FROM worker_queue q
        WHERE q.visible_at <= v_now_ts
          AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms)
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
        -- With an owner: items without a session, items of a live session
        -- this owner holds, and items of a session with no live row.
        SELECT q.id, q.session_id INTO v_id, v_session_id
        FROM worker_queue q
        LEFT JOIN sessions s
               ON s.session_id = q.session_id
              AND s.locked_until > p_now_ms
        WHERE q.visible_at <= v_now_ts
          AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms)
          AND (q.session_id IS NULL
               OR s.worker_id = p_owner_id
               OR s.session_id IS NULL)
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
        RETURN;
    END IF;

    -- Claim the item.
    v_lock_token := 'lock_' || gen_random_uuid()::text;

    UPDATE worker_queue
    SET lock_token = v_lock_token,
        locked_until = p_now_ms + p_lock_timeout_ms,
        attempt_count = attempt_count + 1
    WHERE id = v_id
    RETURNING work_item, attempt_count INTO v_work_item, v_attempt_count;

    -- Claim (or renew) the session for this owner: a session row is taken
    -- over only when it has expired or already belongs to this owner.
    IF p_owner_id IS NOT NULL AND v_session_id IS NOT NULL THEN
        v_session_locked_until := p_now_ms + COALESCE(p_session_lock_timeout_ms, p_lock_timeout_ms);

        INSERT INTO sessions (session_id, worker_id, locked_until, last_activity_at)
        VALUES (v_session_id, p_owner_id, v_session_locked_until, p_now_ms)
        ON CONFLICT (session_id) DO UPDATE
        SET worker_id = EXCLUDED.worker_id,
            locked_until = EXCLUDED.locked_until,
            last_activity_at = EXCLUDED.last_activity_at
        WHERE sessions.locked_until <= p_now_ms
           OR sessions.worker_id = p_owner_id;

        GET DIAGNOSTICS v_row_count = ROW_COUNT;
        IF v_row_count = 0 THEN
            -- Another owner got the session first: undo the claim (the
            -- token is cleared, not restored) and return nothing.
            UPDATE worker_queue
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
$fn$;
END;
$guard$;
-- +goose StatementEnd
